"""The asyncio transport: a thin ``asyncio.Protocol`` adapter around the sans-IO core.

Bytes go into the streaming :class:`~broker.packets.Decoder`; decoded packets go into the
:class:`~broker._session.Connection` machine; after each ``data_received`` the core's dirty
connections are flushed with one ``transport.write`` each (write coalescing across the
whole fan-out of the packets just read).  ``pause_writing``/``resume_writing`` (the
transport's high-water mark) mark a slow consumer: QoS 0 traffic to it is dropped and
counted, QoS 1/2 traffic queues in its session up to the configured bound.

Protocols rather than streams: no per-read task switches and no intermediate buffers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import cast

from broker._session import Connection, Core
from broker.packets import Decoder, MalformedPacket

__all__ = ["MQTTProtocol"]

log = logging.getLogger("broker")

_monotonic = time.monotonic


class MQTTProtocol(asyncio.Protocol):
    """One TCP connection of the broker."""

    __slots__ = ("conn", "core", "decoder", "transport")

    def __init__(self, core: Core) -> None:
        self.core = core
        self.decoder = Decoder(None, max_packet_size=core.config.max_packet_size, server=True)
        self.transport: asyncio.Transport | None = None
        self.conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = cast(asyncio.Transport, transport)
        self.transport = t
        peer = t.get_extra_info("peername")
        t.set_write_buffer_limits(high=1 << 20)
        self.conn = Connection(self.core, t.write, t.close, _monotonic(), str(peer))

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None or conn.close_requested:
            return
        core = self.core
        try:
            core.stats.bytes_received += len(data)
            try:
                packets = self.decoder.feed(data)
            except MalformedPacket as exc:
                conn.version = self.decoder.version or conn.version
                conn.malformed(exc)
            else:
                conn.received(packets, _monotonic())
            core.flush()
        except Exception:  # never into the event loop
            log.exception("connection %s: unexpected error", conn.peer)
            if self.transport is not None:
                self.transport.abort()

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.paused = True

    def resume_writing(self) -> None:
        conn = self.conn
        if conn is not None:
            conn.paused = False
            if conn.session is not None:
                self.core.drain(conn.session, _monotonic())
                self.core.flush()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        conn = self.conn
        if conn is None:
            return
        try:
            conn.transport_closed = True
            conn.lost(_monotonic())
            self.core.flush()
        except Exception:
            log.exception("connection %s: error while closing", conn.peer)
