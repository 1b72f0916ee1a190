"""MQTT over WebSocket (issue 7, item 4): subprotocol ``mqtt``, binary frames.

:class:`WebSocketProtocol` is :class:`~broker.net._transport.MQTTProtocol` with the sans-IO
WebSocket machine of the ``websockets`` package (``websockets.server.ServerProtocol``)
between the socket and the MQTT decoder: bytes from the socket go to the WebSocket
machine; the payload of every binary (and continuation) frame goes to ``_feed``, the same
entry as plain TCP (the frames of one read are joined and fed at once, so the core
handles them as one TCP read: one flush per read), so an MQTT packet may span frames and a
frame may hold several packets (MQTT over WebSocket is a byte stream, MQTT 5.0 section 6).
MQTT output is sent as one binary frame per flush (the core's write coalescing gives one
frame per fan-out).  Ping
frames are answered by the machine; text frames close the connection with 1003.

No task per connection, no streams: the same protocol-callback model, write buffer limits
and slow-consumer handling as TCP.  TLS (``wss``) is the event loop's, as for TCP.  The
HTTP upgrade must ask for the listener's path (``/mqtt`` by default; 404 otherwise); the
``mqtt`` subprotocol is selected when offered (clients that offer none are accepted too,
as mosquitto does).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, cast

from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from broker.core import Core
from broker.net._transport import LINGER, MQTTProtocol

if TYPE_CHECKING:
    from broker.net._admission import ListenerPolicy

__all__ = ["WebSocketProtocol"]

log = logging.getLogger("broker")

_BINARY = Opcode.BINARY
_CONT = Opcode.CONT
_TEXT = Opcode.TEXT
_SUBPROTOCOLS = [Subprotocol("mqtt")]


def _select(protocol: ServerProtocol, offered: object) -> Subprotocol | None:
    return _SUBPROTOCOLS[0] if isinstance(offered, list) and "mqtt" in offered else None


class WebSocketProtocol(MQTTProtocol):
    """One WebSocket connection carrying MQTT (``ws_path``: the accepted request path)."""

    __slots__ = ("path", "ws")

    def __init__(
        self,
        core: Core,
        policy: ListenerPolicy | None,
        registry: set[MQTTProtocol] | None,
        path: str = "/mqtt",
    ) -> None:
        super().__init__(core, policy, registry)
        self.path = path
        # max_size None: the MQTT decoder bounds packets (max_packet_size), not messages
        self.ws = ServerProtocol(subprotocols=_SUBPROTOCOLS, select_subprotocol=_select, max_size=None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = cast(asyncio.Transport, transport)
        self.transport = t
        t.set_write_buffer_limits(high=self.core.config.write_buffer_high)
        self._start(t.get_extra_info("peername"))

    def send_bytes(self, data: bytes) -> None:
        """The MQTT connection's output (``Link``): one binary frame."""
        ws = self.ws
        if ws.state is State.OPEN:
            ws.send_binary(data)
            self._pump()

    def _pump(self) -> None:
        """Write what the WebSocket machine has to send; close when it says so."""
        t = self.transport
        if t is None or t.is_closing():
            return
        for chunk in self.ws.data_to_send():
            if chunk:
                t.write(chunk)
            else:  # end of stream: the closing handshake is over (or failed)
                t.close()
                return
        if self.ws.close_expected() and self.linger is None:
            self.linger = asyncio.get_running_loop().call_later(LINGER, t.close)

    def shut(self) -> None:
        """The MQTT side closes (``Link``): a WebSocket close frame, then the TCP close."""
        ws = self.ws
        t = self.transport
        if t is None or t.is_closing():
            return
        if ws.state is State.OPEN:
            ws.send_close(CloseCode.NORMAL_CLOSURE)
            self._pump()
        else:
            t.close()

    def data_received(self, data: bytes) -> None:
        if self.proxy_wait is not None:  # a PROXY header comes before the HTTP upgrade
            got = self._proxied(data)
            if not got:
                return
            data = got
        ws = self.ws
        ws.receive_data(data)
        payload: list[bytes] = []  # the MQTT bytes of every frame of this read: one _feed
        for event in ws.events_received():
            if isinstance(event, Frame):
                op = event.opcode
                if op is _BINARY or op is _CONT:
                    payload.append(event.data)  # type: ignore[arg-type]
                elif op is _TEXT:
                    ws.fail(CloseCode.UNSUPPORTED_DATA, "MQTT needs binary frames")
                    payload.clear()
                    break
            elif isinstance(event, Request):
                self._handshake(event)
        if payload:
            self._feed(payload[0] if len(payload) == 1 else b"".join(payload))
        self._pump()

    def _handshake(self, request: Request) -> None:
        ws = self.ws
        if request.path.partition("?")[0] != self.path:
            response = ws.reject(404, f"MQTT is served on {self.path}\n")
        else:
            response = ws.accept(request)
        ws.send_response(response)
        if response.status_code != 101:
            log.info(
                "websocket %s: upgrade refused (%d)",
                self.conn.peer if self.conn else "?",
                response.status_code,
            )

    def eof_received(self) -> bool | None:
        self.ws.receive_eof()
        self._pump()
        return None
