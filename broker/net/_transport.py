"""The asyncio transport: a thin ``asyncio.Protocol`` adapter around the sans-IO core.

Bytes go into the streaming :class:`~broker.packets.Decoder`; decoded packets go into the
:class:`~broker.core._connection.Connection` machine; after each ``data_received`` the core's dirty
connections are flushed with one ``transport.write`` each (write coalescing across the
whole fan-out of the packets just read).  ``pause_writing``/``resume_writing`` (the
transport's high-water mark) mark a slow consumer: QoS 0 traffic to it is dropped and
counted, QoS 1/2 traffic queues in its session up to the configured bound.

Protocols rather than streams: no per-read task switches and no intermediate buffers.
Between packets an idle connection holds no decoder of its own: after a read that ended on
a packet boundary it holds the shared decoder of its protocol level (a decoder then holds
nothing of its stream; ``Decoder.settle``), and a read that leaves a packet incomplete gets
its own again (issue 27, item 2).
The protocol object is the connection's :class:`~broker.core._connection.Link` (``send_bytes``,
``shut``, ``throttle``): the machine holds this one object, not three bound-method callbacks,
and the peer address is asked from the transport when it is shown (issue 27, item 2).
TLS sits below this class (``broker.net._listeners``), so this class never sees it;
MQTT over WebSocket (``broker.net._websocket``) subclasses it and only changes how bytes are
framed (``_feed`` is the entry for MQTT bytes, ``_start`` creates the machine).

Listener admission (issue 7, item 3; ``broker.net._listeners``): when a protocol has a
:class:`~broker.net._admission.ListenerPolicy`, the connection is counted at accept, and its
first packet is screened: a CONNECT over the connection limit, over the source's
connection rate, or without a user name on a listener closed to anonymous clients gets a
refusing CONNACK here, before the core sees it; every later packet costs one boolean test.

PROXY protocol (issue 39 item 6; ``Listener.proxy_protocol``): on such a listener the first
bytes go to a :class:`~broker.protocol._proxy.ProxyParser` (``proxy_wait``) until the header is
complete; its client address becomes the connection's peer (``Connection.fixed_peer``: logs,
dashboard, admin API, everything that asks ``Connection.peer``) and the admission check runs
with it (the connection rate is per real client, not per balancer).  A missing, malformed or
late header (``proxy_header_timeout``) closes the connection, counted in
``$SYS/broker/connections/refused/proxy_header`` and logged at most once per interval
(``Core.log_limit``).  After the header every read costs one ``is None`` test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import logging
import socket
import struct
import termios
from typing import Any, cast

from broker._logging import address
from broker.core import PEER_PREFIX, Connection, Core, address_of
from broker.net._admission import ListenerPolicy, Refusal
from broker.packets import (
    NO_PROPERTIES,
    Connack,
    Connect,
    Decoder,
    MalformedPacket,
    Packet,
    Properties,
    ReasonCode,
)
from broker.protocol import ProxyError, ProxyParser

__all__ = ["LINGER", "MQTTProtocol", "common_name"]


#: reads at least this large probe the kernel backlog behind them (ingress load shedding)
PROBE_BYTES = 16 * 1024
#: seconds after its last shedding read during which a connection found behind again sheds
#: at once (no new grace): an overload that lasts must not buy a grace period per cycle
SHED_MEMORY = 1.0
#: while shedding, a read's newest ``ingress_shed_bytes // SHED_KEEP_FRACTION`` bytes are routed
SHED_KEEP_FRACTION = 8
log = logging.getLogger("broker")


#: seconds a closing connection waits for the peer to close its side
LINGER = 2.0


def common_name(peercert: Any) -> str | None:
    """The subject commonName of a verified peer certificate (``SSLObject.getpeercert()``)."""
    if not isinstance(peercert, dict):
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class MQTTProtocol(asyncio.Protocol):
    """One TCP (or TLS) connection of the broker.

    ``registry`` (optional) holds the open protocols of a broker; ``closed()`` resolves when
    the connection is lost (``Broker.stop`` waits for it).
    """

    __slots__ = (
        "behind_since",
        "conn",
        "core",
        "decoder",
        "done",
        "fd",
        "hot_until",
        "linger",
        "policy",
        "proxy_wait",
        "refusal",
        "registry",
        "screening",
        "stopping",
        "throttled",
        "transport",
        "write_paused",
    )

    def __init__(
        self,
        core: Core,
        policy: ListenerPolicy | None = None,
        registry: set[MQTTProtocol] | None = None,
    ) -> None:
        self.core = core
        # its own decoder until the CONNECT is read and whenever a packet is incomplete (or
        # the stream is shedding), the shared one of its protocol level between packets
        # (``Decoder.settle`` after every feed)
        self.decoder = Decoder(None, max_packet_size=core.config.max_packet_size, server=True)
        self.transport: asyncio.Transport | None = None
        self.conn: Connection | None = None
        self.linger: asyncio.TimerHandle | None = None
        self.policy = policy
        self.refusal: Refusal | None = None
        self.screening = False
        self.registry = registry
        self.fd = -1  # the socket, for the ingress backlog probe (-1: none, e.g. WebSocket)
        self.behind_since: float | None = None  # the kernel backlog above the mark since
        self.hot_until = 0.0  # shedding without a new grace until then (SHED_MEMORY)
        self.throttled = False  # flow control paused this publisher (``throttle``)
        self.stopping = False  # the broker stops: nothing more is read (``stop_reading``)
        self.write_paused = False  # the peer does not read what we write
        self.done: asyncio.Future[None] | None = None  # created on demand: ``closed``
        #: the PROXY header being read (proxy listeners only; None once it is read)
        self.proxy_wait: _ProxyWait | None = None

    def closed(self) -> asyncio.Future[None]:
        """Resolves when the connection is lost (``Broker.stop`` waits for it); created on
        demand, so an idle connection does not hold a future (issue 27, item 2)."""
        if self.done is None:
            self.done = asyncio.get_running_loop().create_future()
        return self.done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = cast(asyncio.Transport, transport)
        self.transport = t
        t.set_write_buffer_limits(high=self.core.config.write_buffer_high)
        sock = t.get_extra_info("socket")
        if sock is not None:
            self.fd = sock.fileno()
            self._tune(sock)
        self._start(t.get_extra_info("peername"))

    def _tune(self, sock: Any) -> None:
        """The configured kernel send buffer (``socket_send_buffer``) on the socket."""
        sndbuf = self.core.config.socket_send_buffer
        if sndbuf:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
            except OSError as exc:  # not a stream socket we can tune: keep the kernel's
                log.debug("SO_SNDBUF %d not set: %s", sndbuf, exc)

    def _fileno(self) -> int:
        """The socket's descriptor, for the ingress backlog probe (-1: none, e.g. WebSocket)."""
        return self.fd

    def _start(self, peer: Any) -> None:
        """Create the protocol machine (and pass the listener's admission check).

        The protocol joins ``registry`` here, not when it is built: a TLS connection whose
        handshake fails never reaches ``connection_made`` nor ``connection_lost``.
        """
        if self.registry is not None:
            self.registry.add(self)
        now = self.core.clock.monotonic()
        policy = self.policy
        self.conn = Connection(self.core, self, now, None, None if policy is None else policy.slow_consumer)
        self.conn.io = self.transport  # its write buffer: hung-consumer detection (Core.tick)
        if policy is not None:
            if policy.proxy:  # admitted once the header names the client (``_proxied``)
                timeout = self.core.config.proxy_header_timeout
                timer = asyncio.get_running_loop().call_later(timeout, self._proxy_late, timeout)
                self.proxy_wait = _ProxyWait(timer)
                return
            self._admit(policy, peer, now)

    def _proxied(self, data: bytes) -> bytes | None:
        """The bytes after the PROXY header once it is complete (None: not yet, or it was
        refused and the connection is closing). O(header), once per connection."""
        wait = self.proxy_wait
        conn = self.conn
        policy = self.policy
        if wait is None or wait.parser is None or conn is None or policy is None:
            return data if wait is None else None
        try:
            got = wait.parser.feed(data)
        except ProxyError as exc:
            self._proxy_refused(str(exc))
            return None
        if got is None:
            return None
        header, rest = got
        wait.timer.cancel()
        self.proxy_wait = None
        if header.source is not None:
            conn.fixed_peer = header.source  # THE peer address of this connection from here on
        self._admit(policy, conn.peer, self.core.clock.monotonic())
        return rest

    def _admit(self, policy: ListenerPolicy, peer: object, now: float) -> None:
        """The listener's admission of the client at ``peer`` (its first packet is screened)."""
        self.refusal = policy.admit(address_of(peer), now)
        self.screening = True

    def _proxy_late(self, timeout: float) -> None:
        self._proxy_refused(f"no PROXY header within {timeout:g} s")

    def _proxy_refused(self, why: str) -> None:
        """Close a proxy-listener connection whose header is missing, malformed or late."""
        wait = self.proxy_wait
        if wait is None or wait.parser is None:
            return
        wait.parser = None  # nothing more is parsed; still not admitted (no release)
        wait.timer.cancel()
        core = self.core
        core.stats.refused_proxy_header += 1
        peer = None if self.conn is None else self.conn.peer
        core.log_limit(
            "proxy_header",
            None,
            f"connection from {address(peer)} closed: {why}",
            logging.INFO,
            address=address(peer),
            reason="proxy_header",
        )
        if self.transport is not None:
            self.transport.abort()

    def send_bytes(self, data: bytes) -> None:
        """The connection's output (``Link``): to the transport's buffer."""
        t = self.transport
        if t is not None:
            t.write(data)

    def peername(self) -> object:
        """The peer's address (``Link``), asked from the transport (None once it is closed)."""
        t = self.transport
        return None if t is None else t.get_extra_info("peername")

    def shut(self) -> None:
        """Lingering close (``Link``): flush, half-close, discard what the peer still sends, then close.

        Closing a socket with unread input makes the kernel send RST, which can destroy the
        DISCONNECT (and its reason code) before the client read it; so the write side is
        shut first and the connection closes when the peer does (at most LINGER seconds).

        A client that ended with DISCONNECT (``Connection.said_disconnect``) is owed nothing
        and sends nothing more [MQTT-3.14.4-1]: with nothing left to write, the connection
        closes at once (the FIN goes with the close), without the half-close, the linger
        timer and a second read for its end of stream: a fleet leaving at once costs the
        loop one read per client instead of two (issue 42 item 2).
        """
        t = self.transport
        if t is None or t.is_closing():
            return
        conn = self.conn
        if conn is not None and conn.said_disconnect and not t.get_write_buffer_size():
            t.close()
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
        if self.proxy_wait is not None:
            got = self._proxied(data)
            if not got:
                return
            data = got
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        """MQTT bytes from the peer (any split: the decoder streams)."""
        conn = self.conn
        if conn is None or conn.close_requested:
            return
        core = self.core
        decoder = self.decoder
        try:
            core.stats.bytes_received += len(data)
            if len(data) >= PROBE_BYTES and core.config.ingress_shed_bytes and (fd := self._fileno()) >= 0:
                self._probe(conn, len(data), fd)
            elif self.behind_since is not None or decoder.shed_keep >= 0:
                self.behind_since = None
                decoder.shed_keep = -1
            try:
                packets = decoder.feed(data)
                if decoder.shed_count:
                    core.stats.dropped_qos0_ingress += decoder.shed_count
                    core.stats.publish_dropped += decoder.shed_count
                    decoder.shed_count = 0
            except MalformedPacket as exc:
                self.decoder = decoder.settle()
                conn.version = decoder.version or conn.version
                conn.malformed(exc)
            else:
                held = decoder.settle()  # the shared decoder while idle, its own while not
                if held is not decoder:
                    self.decoder = held
                if self.screening and packets and self._screen(conn, packets):
                    core.flush()
                    return
                conn.received(packets, self.core.clock.monotonic())
            core.flush()
        except Exception:  # never into the event loop
            self.decoder = self.decoder.settle()  # a shared decoder is left as it was found
            log.exception("connection %s: unexpected error", conn.peer)
            if self.transport is not None:
                self.transport.abort()

    def _probe(self, conn: Connection, read: int, fd: int) -> None:
        """A large read: is the peer more than ``ingress_shed_bytes`` ahead of the broker?

        *Behind*: that much is still waiting in the kernel after the read (a burst the read
        took whole is not a backlog). Behind for ``ingress_shed_grace`` seconds in a row, the
        connection is *overloaded* until SHED_MEMORY seconds after it was last found behind
        or had to shed; while overloaded, a read that with what waits behind it exceeds the mark has the QoS 0
        of all but its newest ``ingress_shed_bytes`` shed (the oldest data goes, the broker
        keeps routing at its own pace). docs/broker.md, "Flow control".
        One ioctl per read of at least PROBE_BYTES, none for small reads."""
        try:
            behind = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        except OSError:
            return
        core = self.core
        cfg = core.config
        mark = cfg.ingress_shed_bytes
        decoder = self.decoder  # the shared one too: ``settle`` after the feed makes it its own
        now = core.clock.monotonic()
        if behind > mark:
            since = self.behind_since
            if since is None:
                self.behind_since = since = now
            if now - since >= cfg.ingress_shed_grace or now < self.hot_until:
                self.hot_until = now + SHED_MEMORY
        else:
            self.behind_since = None
        shed = now < self.hot_until and read + behind > mark
        if shed:  # still more than the mark per read: the overload lasts
            self.hot_until = now + SHED_MEMORY
        if shed and decoder.shed_keep < 0:
            core.log_limit(
                "ingress",
                conn.client_id,
                f"publisher {read + behind} bytes ahead of the broker: its QoS 0 shed while above {mark}",
            )
        # route the read's newest ``mark // SHED_KEEP_FRACTION`` bytes, shed the QoS 0 before them
        decoder.shed_keep = max(mark // SHED_KEEP_FRACTION, 1) if shed else -1

    def _screen(self, conn: Connection, packets: list[Packet]) -> bool:
        """The listener's admission decision on the first packet; True if it refused it.

        With ``use_identity_as_username`` the CONNECT in ``packets`` is replaced by one whose
        user name is the client certificate's CN.
        """
        self.screening = False
        policy = self.policy
        first = packets[0]
        if policy is None or not isinstance(first, Connect):
            return False  # not a CONNECT: the core answers with a protocol error
        refusal = self.refusal
        if policy.identity:
            cn = None if self.transport is None else common_name(self.transport.get_extra_info("peercert"))
            if cn is not None:
                packets[0] = first = dataclasses.replace(first, username=cn, identity=True)
            elif refusal is None:  # never fall back to the user name the client claims
                refusal = policy.refuse_anonymous(Refusal.NO_IDENTITY)
        if refusal is None and policy.peers_only and not first.client_id.startswith(PEER_PREFIX):
            refusal = Refusal.NOT_PEER  # logged below with the other refusals (rate-limited)
            self.core.stats.refused_non_peer += 1
        if refusal is None and first.username is None and not policy.anonymous:
            refusal = policy.refuse_anonymous(Refusal.ANONYMOUS)
        if refusal is None:
            return False
        v = first.protocol_level if first.protocol_level in (3, 4, 5) else 4
        conn.version = v
        code = refusal.reason_code if v == 5 else ReasonCode.SERVER_UNAVAILABLE
        if refusal.reason_code is ReasonCode.NOT_AUTHORIZED:
            code = ReasonCode.NOT_AUTHORIZED
        props = Properties(reason_string=refusal.text) if v == 5 else NO_PROPERTIES
        conn.send(Connack(False, code, props))
        conn.close(f"CONNECT refused: {refusal.text}")
        self.core.log_limit(  # rate-limited, as the core's refusals (one line per 10 s)
            "connect_refused",
            first.client_id,
            f"({conn.peer}) CONNECT refused: {refusal.text} ({code.name})",
            logging.INFO,
            "client.refused",
            address(conn.peer),
            refusal.text,
        )
        return True

    def _reading(self) -> None:
        """Read the socket unless flow control paused this publisher or the peer does not
        read what we write (so its requests cannot pile up answers)."""
        t = self.transport
        if t is None or t.is_closing():
            return
        if self.throttled or self.write_paused or self.stopping:
            if t.is_reading():
                t.pause_reading()
        elif not t.is_reading():
            t.resume_reading()

    def throttle(self, pause: bool) -> None:
        """Flow control pauses (True) or resumes (False) this publisher (``Link``)."""
        self.throttled = pause
        self._reading()

    def stop_reading(self, stop: bool = True) -> None:
        """Graceful stop: read nothing more while ``Broker.stop`` sends what is owed (``False``:
        read again, once the connections are shut, to see the clients close)."""
        self.stopping = stop
        self._reading()

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.paused = True
        self.write_paused = True
        self._reading()

    def resume_writing(self) -> None:
        conn = self.conn
        self.write_paused = False
        self._reading()
        if conn is not None:
            conn.paused = False
            if conn.session is not None:
                self.core.drain(conn.session, self.core.clock.monotonic())
                self.core.flush()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        linger = self.linger
        if linger is not None:
            self.linger = None
            linger.cancel()
        wait = self.proxy_wait
        if wait is not None:  # never admitted: nothing to release
            wait.timer.cancel()
        elif self.policy is not None and self.conn is not None:
            self.policy.release()
        if self.registry is not None:
            self.registry.discard(self)
        if self.done is not None and not self.done.done():
            self.done.set_result(None)
        conn = self.conn
        if conn is None:
            self.transport = None
            return
        try:
            conn.transport_closed = True
            conn.lost(self.core.clock.monotonic())
            self.core.flush()
        except Exception:
            log.exception("connection %s: error while closing", conn.peer)
        finally:
            self._unlink(conn)

    def _unlink(self, conn: Connection) -> None:
        """Break the references between the finished connection's objects: the machine's
        link to this protocol and its write buffer, this protocol's transport (a lean one is
        its own), so that reference counting frees them when the last outside reference
        goes: no reference cycle left for the collector (issue 42 item 2; with the heap
        frozen, ``Broker._tick``, a cycle would stay for good). Later writes to the machine
        (an acknowledgement the store releases after the end) go nowhere, as they went to a
        closed transport before. O(1)."""
        conn.link = GONE
        conn.io = None
        self.transport = None


class _Gone:
    """The link of a connection whose transport is gone (``MQTTProtocol._unlink``): writes,
    closes and read switches do nothing, the peer is unknown (as a closed transport's)."""

    __slots__ = ()

    def send_bytes(self, data: bytes) -> None:
        """Nothing: the transport is closed."""

    def shut(self) -> None:
        """Nothing: the transport is closed."""

    def throttle(self, pause: bool) -> None:
        """Nothing: the transport is closed."""

    def peername(self) -> object:
        return None


#: the one link of every finished connection (``MQTTProtocol._unlink``)
GONE = _Gone()


class _ProxyWait:
    """A proxy-listener connection before its PROXY header: the parser (None once refused)
    and the header's deadline."""

    __slots__ = ("parser", "timer")

    def __init__(self, timer: asyncio.TimerHandle) -> None:
        self.parser: ProxyParser | None = ProxyParser()
        self.timer = timer
