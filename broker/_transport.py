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

#: seconds a closing connection waits for the peer to close its side
LINGER = 2.0


class MQTTProtocol(asyncio.Protocol):
    """One TCP connection of the broker."""

    __slots__ = ("conn", "core", "decoder", "linger", "transport")

    def __init__(self, core: Core) -> None:
        self.core = core
        self.decoder = Decoder(None, max_packet_size=core.config.max_packet_size, server=True)
        self.transport: asyncio.Transport | None = None
        self.conn: Connection | None = None
        self.linger: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = cast(asyncio.Transport, transport)
        self.transport = t
        peer = t.get_extra_info("peername")
        t.set_write_buffer_limits(high=1 << 20)
        self.conn = Connection(self.core, t.write, self._close, _monotonic(), str(peer))

    def _close(self) -> None:
        """Lingering close: flush, half-close, discard what the peer still sends, then close.

        Closing a socket with unread input makes the kernel send RST, which can destroy the
        DISCONNECT (and its reason code) before the client read it; so the write side is
        shut first and the connection closes when the peer does (at most LINGER seconds).
        """
        t = self.transport
        if t is None or t.is_closing():
            return
        if t.can_write_eof():
            if not t.is_reading():
                t.resume_reading()
            try:
                t.write_eof()
            except OSError:  # the peer is gone already
                t.close()
                return
            self.linger = asyncio.get_running_loop().call_later(LINGER, t.close)
        else:
            t.close()

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
        # the peer does not read: stop reading it too, so its requests cannot pile up answers
        if self.conn is not None:
            self.conn.paused = True
        if self.transport is not None and self.transport.is_reading():
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        conn = self.conn
        t = self.transport
        if t is not None and not t.is_closing() and not t.is_reading():
            t.resume_reading()
        if conn is not None:
            conn.paused = False
            if conn.session is not None:
                self.core.drain(conn.session, _monotonic())
                self.core.flush()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.linger is not None:
            self.linger.cancel()
        conn = self.conn
        if conn is None:
            return
        try:
            conn.transport_closed = True
            conn.lost(_monotonic())
            self.core.flush()
        except Exception:
            log.exception("connection %s: error while closing", conn.peer)
