"""A small asyncio MQTT client on the broker's own sans-IO codec, for the bridges' two legs.

Why not paho (which the bridges used first): paho runs each connection's network loop on a
thread of its own in pure Python, so every message crossed a bridge through two thread
hand-offs fighting the broker's event loop for the GIL (0.58x mosquitto's bridge,
docs/bridging-out.md "Performance").  A :class:`Link` is an :class:`asyncio.Protocol` in the
broker's own event loop: bytes are decoded by :class:`broker.packets.Decoder`, packets are
handed to ``on_packet`` synchronously, and every write of one loop iteration leaves in one
``transport.write`` (writes are coalesced until the loop runs the flush it scheduled).

The client chooses the packet identifiers of its PUBLISHes itself (the bridge reuses the
identifiers of the broker the message comes from: what makes QoS 2 exactly once across a
reconnection, :mod:`uplink._bridge`), so this module keeps no QoS state: it is a framed,
typed pipe with CONNECT/CONNACK, SUBSCRIBE/SUBACK, and keep-alive.

Transports: TCP, TLS (the event loop's ``ssl``), WebSocket and secure WebSocket (the sans-IO
``websockets.client.ClientProtocol`` between the socket and the decoder, subprotocol ``mqtt``,
binary frames).  Per packet the work is O(size) (decode/encode).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable
from typing import cast

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from broker.packets import (
    Connack,
    Connect,
    Decoder,
    MalformedPacket,
    Packet,
    Pingreq,
    Pingresp,
    Suback,
    Subscribe,
    SubscriptionRequest,
    encode,
)

__all__ = ["Link", "LinkError", "open_link"]


class LinkError(Exception):
    """A connection that could not be opened or set up (its message says why)."""


class Link(asyncio.Protocol):
    """One client connection.  ``on_packet`` gets every packet but CONNACK, SUBACK and
    PINGRESP (in the event loop, in order) once :meth:`release` was called (until then they
    are kept); ``on_lost`` is called once when it ends."""

    def __init__(
        self,
        version: int,
        on_packet: Callable[[Packet], None],
        on_lost: Callable[[str], None],
        ws_url: str | None = None,
    ) -> None:
        self.version = version
        self.on_packet = on_packet
        self.on_lost = on_lost
        self.decoder = Decoder(version, server=False)
        self.transport: asyncio.Transport | None = None
        self.connack: asyncio.Future[Connack] = asyncio.get_running_loop().create_future()
        self._subacks: dict[int, asyncio.Future[Suback]] = {}
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._closed = False
        #: packets that came before :meth:`release` (those in the CONNACK's read)
        self._early: list[Packet] | None = []
        self.last_rx = time.monotonic()
        self.last_tx = time.monotonic()
        self.ws: ClientProtocol | None = None
        self._ws_open: asyncio.Future[None] | None = None
        if ws_url is not None:
            self.ws = ClientProtocol(parse_uri(ws_url), subprotocols=[Subprotocol("mqtt")])
            self._ws_open = asyncio.get_running_loop().create_future()

    # ---- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        ws = self.ws
        if ws is not None:
            ws.send_request(ws.connect())
            self.transport.write(b"".join(ws.data_to_send()))

    def data_received(self, data: bytes) -> None:
        self.last_rx = time.monotonic()
        ws = self.ws
        if ws is not None:
            data = self._unframe(ws, data)
            if not data:
                return
        try:
            packets = self.decoder.feed(data)
        except MalformedPacket as exc:
            self.abort(f"malformed packet from the broker: {exc}")
            return
        on_packet = self.on_packet
        for p in packets:
            match p:
                case Connack():
                    if not self.connack.done():
                        self.connack.set_result(p)
                case Suback(packet_id=pid):
                    fut = self._subacks.pop(pid, None)
                    if fut is not None and not fut.done():
                        fut.set_result(p)
                case Pingresp():
                    pass
                case _:
                    early = self._early
                    if early is not None:
                        early.append(p)
                    else:
                        on_packet(p)
            if self._closed:
                return

    def _unframe(self, ws: ClientProtocol, data: bytes) -> bytes:
        """The MQTT bytes of the WebSocket frames in ``data`` (O(len(data)))."""
        ws.receive_data(data)
        payload: list[bytes] = []
        for event in ws.events_received():
            if isinstance(event, Frame):
                if event.opcode in (Opcode.BINARY, Opcode.CONT):
                    payload.append(bytes(event.data))
            elif isinstance(event, Response) and self._ws_open is not None and not self._ws_open.done():
                if ws.handshake_exc is not None:
                    self._ws_open.set_exception(LinkError(f"WebSocket upgrade refused: {ws.handshake_exc}"))
                else:
                    self._ws_open.set_result(None)
        pending = ws.data_to_send()
        if pending and self.transport is not None:
            self.transport.write(b"".join(pending))
        return b"".join(payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(f"{type(exc).__name__}: {exc}" if exc is not None else "connection closed by the broker")

    def _lost(self, why: str) -> None:
        if self._closed:
            return
        self._closed = True
        err = LinkError(why)
        for fut in (self.connack, self._ws_open, *self._subacks.values()):
            if fut is not None and not fut.done():
                fut.set_exception(err)
                fut.exception()  # retrieved: nobody may wait any more
        self._subacks.clear()
        self.on_lost(why)

    def release(self) -> None:
        """Start handing packets to ``on_packet`` (those that came since the CONNACK first)."""
        early, self._early = self._early, None
        for p in early or ():
            if self._closed:
                return
            self.on_packet(p)

    # ---- writing --------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, packet: Packet) -> None:
        """Queue ``packet``; everything queued in one loop iteration leaves in one write."""
        self.write(encode(packet, self.version))

    def write(self, data: bytes) -> None:
        if self._closed:
            return
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        t = self.transport
        if not out or t is None or self._closed or t.is_closing():
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        ws = self.ws
        if ws is not None:
            ws.send_binary(data)
            data = b"".join(ws.data_to_send())
        t.write(data)
        self.last_tx = time.monotonic()

    def abort(self, why: str) -> None:
        """Drop the connection now (nothing more is written)."""
        if self.transport is not None:
            self.transport.abort()
        self._lost(why)

    async def close(self) -> None:
        """Send what is queued and close (a DISCONNECT is the caller's to send first)."""
        self.flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self._lost("closed")

    # ---- requests ---------------------------------------------------------------------------

    async def subscribe(self, packet_id: int, requests: tuple[SubscriptionRequest, ...]) -> Suback:
        fut: asyncio.Future[Suback] = asyncio.get_running_loop().create_future()
        self._subacks[packet_id] = fut
        self.send(Subscribe(packet_id, requests))
        return await fut

    def keep_alive(self, interval: float) -> None:
        """Called periodically: a PINGREQ when nothing was sent for ``interval`` seconds; the
        connection is dropped when nothing came for twice the interval (O(1))."""
        now = time.monotonic()
        if now - self.last_rx > 2 * interval:
            self.abort(f"no packet from the broker for {now - self.last_rx:.0f} s (keep-alive)")
        elif now - self.last_tx >= interval:
            self.send(Pingreq())
            self.last_tx = now


async def open_link(
    host: str,
    port: int,
    connect: Connect,
    *,
    on_packet: Callable[[Packet], None],
    on_lost: Callable[[str], None],
    tls: ssl.SSLContext | None = None,
    ws_path: str | None = None,
) -> tuple[Link, Connack]:
    """Connect, send ``connect`` and wait for the CONNACK (the caller bounds the time).

    Raises OSError (unreachable), ssl.SSLError (TLS) and LinkError (WebSocket upgrade
    refused, connection closed before the CONNACK)."""
    loop = asyncio.get_running_loop()
    version = 5 if connect.protocol_level == 5 else 4
    ws_url = None
    if ws_path is not None:
        ws_url = f"{'wss' if tls is not None else 'ws'}://{host}:{port}{ws_path}"

    def factory() -> Link:
        return Link(version, on_packet, on_lost, ws_url)

    _, link = await loop.create_connection(
        factory, host, port, ssl=tls, server_hostname=host if tls is not None else None
    )
    try:
        if link._ws_open is not None:
            await link._ws_open
        link.send(connect)
        connack = await link.connack
    except BaseException:
        with contextlib.suppress(Exception):
            link.abort("connection attempt abandoned")
        raise
    return link, connack
