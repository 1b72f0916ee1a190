"""The protocol machine of one network connection (sans-IO).

Like h11, nothing here touches a socket or awaits: a :class:`Connection` is fed decoded
packets (``received``) and the time, and answers by appending encoded bytes to its
``outbox`` and by setting ``close_requested``; the transport (:mod:`broker.net`) owns the
socket.  States: ``AWAIT_CONNECT -> CONNECTED -> CLOSED``.  The packet handlers (CONNECT
(in :mod:`broker.core._connect`), PUBLISH and its acknowledgements in both directions (in
:mod:`broker.core._publish`), SUBSCRIBE and UNSUBSCRIBE (in :mod:`broker.core._subscribe`),
DISCONNECT) check the packet and call the core
(:mod:`broker.core._core`) for everything that concerns sessions, routing and delivery.  For
flow control (issue 14) a connection is also a publisher that can be paused: the packets read
after the pause wait in ``pending``, in order, and the transport stops reading
(``Link.throttle``).

Lean (issue 27, item 2): an idle connection costs the machine's native object and nothing
else.  The transport is one :class:`Link` object (the ``MQTTProtocol`` itself: no bound-method
callbacks stored per connection), the peer address is asked from the transport when it is
logged or shown (``peer``: not stored per connection), and the output list, the pending
packets, the flow-control set and the topic-alias maps are shared empty containers until first
written (``_check``); the output list goes back to the shared empty one after every flush.
Eighteen fields that almost every idle device leaves at their defaults (flow control, topic
aliases, held acknowledgements, the gate, flags, the close reason) live in a side object
created the first time one of them is set (:mod:`broker.core._connrare`, ``RareFields``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, Protocol

from broker._logging import bounded
from broker.core._ahead import held_for
from broker.core._connect import hold_connack, log_client, log_refusal, negotiate, on_connect
from broker.core._connrare import NO_ALIASES_IN, NO_ALIASES_OUT, NO_FEEDERS, NO_PACKETS, RareFields
from broker.core._hooks import Delivery
from broker.core._publish import accept_publish, acknowledged, deliver_accepted, on_publish, on_pubrel, resend
from broker.core._quota import over_quota
from broker.core._session import (
    NEVER,
    PUBACK,
    PUBCOMP,
    PUBREC,
    AckWaiter,
    ConnectionState,
    Session,
    WriteBuffer,
)
from broker.core._subscribe import on_subscribe, on_unsubscribe
from broker.packets import (
    NO_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    MalformedPacket,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    PublishTemplate,
    Pubrec,
    Pubrel,
    ReasonCode,
    Subscribe,
    Unsubscribe,
    encode,
    encode_publish,
)
from broker.protocol import Record
from broker.values import Message

if TYPE_CHECKING:
    from broker.core._core import Core

__all__ = [
    "CLIENT_DISCONNECTED",
    "NO_ALIASES_IN",
    "NO_ALIASES_OUT",
    "NO_FEEDERS",
    "Callbacks",
    "Closer",
    "Connection",
    "Link",
    "Reader",
    "Writer",
]

log = logging.getLogger("broker")

#: PUBLISHes of one read routed as one content-matching batch at most (flow control can only
#: pause between batches)
_MAX_RUN: Final = 128


Writer = Callable[[bytes], None]
Closer = Callable[[], None]
#: the transport's read switch: True = stop reading the socket, False = read again
Reader = Callable[[bool], None]


class Link(Protocol):
    """The transport of one connection as the machine drives it (``MQTTProtocol``)."""

    def send_bytes(self, data: bytes) -> None:
        """Write ``data`` (encoded packets) to the peer."""

    def shut(self) -> None:
        """Close after what was written (the lingering close)."""

    def throttle(self, pause: bool) -> None:
        """Stop (True) or resume (False) reading the socket: flow control of this publisher."""

    def peername(self) -> object:
        """The peer's address (the socket's ``peername``; None once it is closed)."""


def _no_reader(pause: bool) -> None:
    """Reader of a connection without a transport (unit tests): nothing to switch."""


class Callbacks:
    """A :class:`Link` made of three functions (unit tests, benchmarks, embedders)."""

    def __init__(self, writer: Writer, closer: Closer, reader: Reader = _no_reader) -> None:
        self.writer = writer
        self.closer = closer
        self.reader = reader

    def send_bytes(self, data: bytes) -> None:
        self.writer(data)

    def shut(self) -> None:
        self.closer()

    def throttle(self, pause: bool) -> None:
        self.reader(pause)

    def peername(self) -> object:
        return ""


#: the close reason of a connection its client ended with DISCONNECT (``said_disconnect``)
CLIENT_DISCONNECTED: Final = "client disconnected"

#: the shared empty output list (issue 27, item 2: an idle connection holds no empty list,
#: set or dict; the others are in ``broker.core._connrare``): written to never (``_check``)
_NO_OUTPUT: Final[list[bytes]] = []


class Connection(RareFields):
    """The protocol machine of one network connection (sans-IO)."""

    def __init__(
        self,
        core: Core,
        link: Link,
        now: float,
        peer: object = None,
        listener_policy: str | None = None,
    ) -> None:
        """``link``: the transport; ``peer``: a fixed peer address to show (unit tests), or
        None to ask the transport when needed (``Link.peername``)."""
        super().__init__()  # the rarely used fields (``RareFields``): defaults until set
        self.core = core
        self.link = link
        # rare (``broker.core._connrare``): flow control: as a receiver, since when its queue
        # is over the high-water mark (``congested_since``), the publishers paused for it
        # (``feeders``, its own set once one is paused for it), and whether it is a slow
        # consumer (``slow``); as a publisher, how many congested receivers it waits for
        # (``blockers``), paused until the store's writer catches up (``store_wait``,
        # Journal.bound) and the packets read but not yet processed (``pending``, its own list
        # once a paused read leaves packets); ``bridge``: a mosquitto bridge (CONNECT level
        # 0x83/0x84: no echo, retain as published); the listener's slow-consumer policy; a
        # fixed peer address; topic aliases (``client_alias_max``, ``alias_out``: its own dict
        # from a v5 CONNECT that allows them, ``negotiate``; ``alias_in``: its own dict at the
        # client's first alias); ``problem_info``;
        # ``will_on_close``; ``close_reason``; ``held``/``held_writes``: packets held for the
        # store's durable signal, deliveries among them; ``gated``: output withheld until the
        # held CONNACK is released (persisted session)
        self.sent = 0  # bytes written; less the transport's (``io``) buffer: what the socket took
        self.io: WriteBuffer | None = None
        self.clean_start = True  # the CONNECT's Clean Start (Clean Session) flag
        self.listener_policy = listener_policy
        self.policy = listener_policy or core.config.slow_consumer_policy
        self.fixed_peer = peer
        self.state = ConnectionState.AWAIT_CONNECT
        self.version = 4
        self.session: Session | None = None
        self.outbox: list[bytes] = _NO_OUTPUT  # its own list while output waits for a flush
        self.close_requested = False
        self.transport_closed = False
        self.paused = False
        self.keep_alive = 0.0
        self.last_rx = now
        self.clock = now  # the latest time this machine was given
        self.connect_deadline = now + core.config.connect_timeout
        self.timer_key = -1  # its bucket in core.conn_timers (-1: none; core/_conntimers.py)
        self.window = core.config.max_inflight
        self.client_max_packet = 268_435_455
        core.connections.add(self)
        core.conn_timers.file(self, self.connect_deadline)
        core.stats.connections_total += 1

    @property
    def client_id(self) -> str | None:
        return None if self.session is None else self.session.client_id

    @property
    def peer(self) -> object:
        """The peer's address, for log lines and the dashboard (asked, not stored)."""
        return self.fixed_peer if self.fixed_peer is not None else self.link.peername()

    @property
    def said_disconnect(self) -> bool:
        """The client ended the connection with a DISCONNECT (nothing more to read from
        it, nothing owed to it but what is written already: the transport may close at once
        instead of lingering for its end of stream, ``MQTTProtocol.shut``). O(1)."""
        return self.close_reason == CLIENT_DISCONNECTED

    def _check(self) -> None:
        shared = (NO_FEEDERS, NO_ALIASES_OUT, NO_ALIASES_IN, _NO_OUTPUT, NO_PACKETS)
        assert not any(shared), "a shared empty container was written"

    # ------------------------------------------------------------ output helpers
    def send(self, packet: Packet) -> None:
        if self.close_requested:
            return
        data = encode(packet, self.version)
        if len(data) > self.client_max_packet:
            fitted = self._fit(packet)
            if fitted is None:
                return
            data = fitted
        self._out().append(data)
        self.core.dirty.add(self)

    def _fit(self, packet: Packet) -> bytes | None:
        """``packet`` exceeds the client's Maximum Packet Size [MQTT-3.1.2-24]: without its Reason
        String and User Properties (MQTT 5 lets the server omit them), else the connection closes."""
        props = getattr(packet, "properties", None)
        if isinstance(props, Properties) and (props.reason_string or props.user_properties):
            bare = dataclasses.replace(props, reason_string=None, user_properties=())
            loose: Any = packet  # every packet that has properties is a record or a dataclass
            smaller = (
                loose.replace(properties=bare)
                if isinstance(packet, Record)
                else dataclasses.replace(loose, properties=bare)
            )
            data = encode(smaller, self.version)
            if len(data) <= self.client_max_packet:
                return data
        self.core.log_limit(
            "client_packet_size", self.client_id, "packet above the client's Maximum Packet Size"
        )
        self.close(f"{type(packet).__name__} above the client's Maximum Packet Size")
        return None

    def _out(self) -> list[bytes]:
        """The output list, its own (something is about to be appended). O(1)."""
        out = self.outbox
        if out is _NO_OUTPUT:
            out = self.outbox = []
        return out

    def flush(self) -> None:
        out = self.outbox
        if out and not self.gated:
            data = b"".join(out) if len(out) > 1 else out[0]
            self.outbox = _NO_OUTPUT  # an idle connection keeps no list
            self.core.stats.bytes_sent += len(data)
            self.sent += len(data)
            self.link.send_bytes(data)
        if self.close_requested and not self.transport_closed:
            self.transport_closed = True
            self.link.shut()
            # the session is detached now, not when the peer finally closes its side
            self.lost(self.clock)

    def close(self, reason: str) -> None:
        """Ask the transport to close after the pending output."""
        if not self.close_requested:
            self.close_reason = reason
            self.close_requested = True
            self.core.dirty.add(self)

    def open_gate(self, connack: Connack | None) -> None:
        """The held CONNACK's commit ended: send it ahead of what queued behind it, or (None:
        the commit failed) refuse the connection instead and drop that output."""
        self.gated = False
        if self.close_requested:
            return
        if connack is None:
            self.outbox = _NO_OUTPUT
            code = ReasonCode.UNSPECIFIED_ERROR if self.version == 5 else ReasonCode.SERVER_UNAVAILABLE
            self.send(Connack(False, code, self._reason("persistent store failed")))
            self.close("persistent store failed: session not stored")
            return
        self._out().insert(0, encode(connack, self.version))
        self.core.dirty.add(self)

    def disconnect(self, code: ReasonCode, reason: str) -> None:
        """Server-initiated end: v5 DISCONNECT with ``code`` then close; 3.1.1: close."""
        if self.version == 5 and self.state is ConnectionState.CONNECTED:
            props = Properties(reason_string=reason) if self.problem_info else NO_PROPERTIES
            self.send(Disconnect(code, props))
        self.close(f"{reason} ({code.name})")

    def send_ordered(self, packet: Packet, wrote: bool, waiter: AckWaiter | None = None) -> None:
        """Send an acknowledgement after the store writes it depends on (``wrote``) are durable
        (or ``waiter``'s deliveries are acknowledged, see ``Journal.hold``).

        It also waits behind this connection's held packets, so acknowledgements keep the
        order of the packets they answer; without a store it is ``send``.
        """
        if wrote or self.held:
            self.core.journal.hold(self, packet, waiter if wrote else None)
        else:
            self.send(packet)

    def _reason(self, text: str) -> Properties:
        return Properties(reason_string=text) if self.version == 5 and self.problem_info else NO_PROPERTIES

    def write_publish(  # noqa: C901, PLR0917, PLR0912 (hot path: positional arguments, one frame per delivery)
        self,
        msg: Message,
        qos: int,
        retain: bool,
        dup: bool,
        pid: int | None,
        sub_ids: tuple[int, ...],
        topic_filter: str,
        selector: str | None,
        now: float,
    ) -> None:
        if self.close_requested:
            return
        topic = msg.topic
        version = self.version
        alias: int | None = None
        send_topic = True
        if version == 5 and self.client_alias_max:
            alias = self.alias_out.get(topic)
            if alias is not None:
                send_topic = False
            elif len(self.alias_out) < self.client_alias_max:
                alias = len(self.alias_out) + 1
                self.alias_out[topic] = alias
        core = self.core
        if msg.expires_at is None:
            # fan-out fast path: the message is encoded once per protocol family
            if core.tmpl_msg is not msg:
                core.tmpl_msg = msg
                core.tmpl = [None, None]
            slot = 1 if version == 5 else 0
            tmpl = core.tmpl[slot]
            if tmpl is None:
                tmpl = core.tmpl[slot] = PublishTemplate(topic, msg.payload, msg.properties, 5 if slot else 4)
            data = tmpl.render(
                qos,
                pid,
                dup=dup,
                retain=retain,
                subscription_identifiers=sub_ids,
                topic_alias=alias,
                send_topic=send_topic,
            )
        else:
            props = msg.properties
            if version == 5:
                props = dataclasses.replace(
                    props,
                    subscription_identifiers=sub_ids,
                    message_expiry_interval=max(0, int(msg.expires_at - now + 0.999)),
                    topic_alias=alias,
                )
            data = encode_publish(
                topic if send_topic else "", msg.payload, qos, retain, dup, pid, props, version
            )
        if len(data) > self.client_max_packet:
            # MQTT 5 section 3.1.2.11.4: discard as if sent.
            self.core.stats.publish_dropped += 1
            if self.session is not None and pid is not None:
                self.session.inflight.pop(pid, None)
                core.journal.completed(self.session, pid)
            return
        deferred = core.deferred
        if deferred is not None:  # a QoS 2 message is routed: set aside until its id is submitted
            deferred.append((self, data))
        elif self.held_writes or (msg.qos == 2 and core.hold_qos2):
            core.journal.hold_write(self, data)  # QoS 2 (or behind one): after the next commit
        else:
            self._out().append(data)
            core.dirty.add(self)
        core.stats.messages_sent += 1
        obs = core.obs
        if obs.writes and self.session is not None:
            if obs.recording:
                obs.written(
                    msg, self.session.client_id, topic_filter, selector, qos, retain, core.clock, core.stats
                )
            if not obs.delivery:
                return
            t = core.clock.wall()
            core._call(
                core.obs.delivery,
                "on_delivery",
                Delivery(
                    t,
                    msg.message_id,
                    msg.publisher_id,
                    self.session.client_id,
                    msg.topic,
                    topic_filter,
                    selector,
                    qos,
                    retain,
                    len(msg.payload),
                    max(0.0, t - msg.received),
                ),
            )

    # ------------------------------------------------------------ input
    def received(self, packets: Iterable[Packet], now: float) -> None:  # noqa: C901, PLR0912, PLR0915 (hot path: one frame per read)
        """Process decoded packets in order (stops at the first one that closes).

        Micro-batching (issue 8): when the router matches content in batches
        (``Router.batching``: a batch engine with enough selectors), a run of consecutive
        QoS 0/1 PUBLISH packets of one read is accepted packet by packet (every check and refusal as
        usual), routed with one ``Router.route_batch`` (one ``engine.match_batch``), then
        delivered and acknowledged in packet order.  Any other packet ends the run, which is
        routed first, so a PUBLISH before an UNSUBSCRIBE in the same read keeps its meaning.
        A batch is one read of one connection: every read is handled synchronously, and
        waiting for the other reads of the loop turn would cost a loop iteration of latency
        and reorder acknowledgements against the connection's other packets.
        """
        self.last_rx = self.clock = now
        if self.blockers or self.pending:  # paused: keep the order, process on resume
            if self.pending is NO_PACKETS:
                self.pending = []
            self.pending.extend(packets)
            return
        # a PUBLISH read alone: its fan-out may write as it goes (Core.publish, EARLY_MIN). The
        # packets are a list (the decoder's, or ``pending``): compiled, a test against (list,
        # tuple) was generic (a tuple built, a boxed index, PyObject_GetItem), ~0.5 % of a lone
        # QoS 0 delivery; another iterable is never lone (no early writes, nothing else)
        self.core.lone = isinstance(packets, list) and len(packets) == 1 and type(packets[0]) is Publish
        connected = self.state is ConnectionState.CONNECTED
        batch = connected and self.core.router.batching
        quota = self.quota  # publish quota (issue 39, core/_quota.py): None for most clients
        ahead = self.core.obs.ahead  # authorization fetched first (core/_ahead.py): [] mostly
        run: list[tuple[Publish, Message]] = []
        it = iter(packets)
        for p in it:
            if self.close_requested:
                break
            if self.blockers:  # a receiver of the last PUBLISH is over its mark: stop here
                if run:
                    self._publish_run(run, now)
                    run = []
                self.pending = [p, *it]
                break
            if ahead and held_for(self, p):  # held until a hook knows (connected: a session)
                if run:
                    self._publish_run(run, now)
                    run = []
                self.pending = [p, *it]
                break
            if quota is not None and connected and type(p) is Publish and over_quota(self, p, now):
                break  # disconnected by its quota (action "disconnect")
            try:
                if batch and type(p) is Publish and p.qos < 2:
                    accepted = accept_publish(self, p, now)
                    if isinstance(accepted, Message):
                        run.append((p, accepted))
                        if len(run) >= _MAX_RUN:  # bounds what one pause can let through
                            self._publish_run(run, now)
                            run = []
                        continue
                    if run:
                        self._publish_run(run, now)
                        run = []
                    accepted()  # the refusal, after the PUBLISHes before it
                    continue
                if run:
                    self._publish_run(run, now)
                    run = []
                if connected and type(p) is Publish:  # the hot path, without the dispatch
                    accepted = accept_publish(self, p, now)
                    if isinstance(accepted, Message):
                        deliver_accepted(self, p, accepted, None, now)
                    else:
                        accepted()
                    continue
                self._dispatch(p, now)
            except MalformedPacket as exc:
                self.malformed(exc)
            except Exception:
                log.exception(
                    "client %s: internal error handling %s", bounded(self.client_id), type(p).__name__
                )
                self.disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "internal error")
        if run:
            try:
                self._publish_run(run, now)
            except Exception:
                log.exception("client %s: internal error routing a batch", bounded(self.client_id))
                self.disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "internal error")

    def resume(self) -> None:
        """The receivers this publisher waited for drained: process the packets read before
        the pause (which may pause it again), then read the socket again."""
        if self.blockers or self.state is ConnectionState.CLOSED:
            return
        pending = self.pending
        if pending:
            self.pending = NO_PACKETS
            self.received(pending, self.clock)
        if not self.blockers and not self.pending:
            self.link.throttle(False)

    def _publish_run(self, run: list[tuple[Publish, Message]], now: float) -> None:
        """Route the accepted PUBLISHes of one read as one batch, then deliver and ack each.
        A run of one is routed by ``Core.publish`` (``route_batch`` of one message is
        ``route``), which streams a lone PUBLISH's big fan-out (``EARLY_MIN``)."""
        if len(run) == 1:
            p, msg = run[0]
            deliver_accepted(self, p, msg, None, now)
            return
        all_routes = self.core.router.route_batch([msg for _, msg in run])
        for (p, msg), routes in zip(run, all_routes, strict=True):
            deliver_accepted(self, p, msg, routes, now)

    def malformed(self, exc: MalformedPacket) -> None:
        """Bad input: v5 DISCONNECT with the codec's reason code then close; 3.1.1: close."""
        self.core.stats.malformed += 1
        log_refusal(self, "malformed", "client.malformed", self.client_id, str(exc), str(exc))
        if (
            self.state is ConnectionState.AWAIT_CONNECT
            and exc.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
        ):
            self.version = 4  # answer in a form old clients read
            self.send(Connack(False, ReasonCode.UNSUPPORTED_PROTOCOL_VERSION))
            self.close(str(exc))
            return
        self.disconnect(exc.reason_code, str(exc))

    def _dispatch(self, p: Packet, now: float) -> None:
        if self.state is ConnectionState.AWAIT_CONNECT:
            on_connect(self, p, now)  # or kept behind a CONNECT being authenticated
            return
        match p:
            case Publish():
                on_publish(self, p, now)
            case Puback():
                acknowledged(self, PUBACK, p.packet_id, True, now)
            case Pubrec():
                acknowledged(self, PUBREC, p.packet_id, p.reason_code < 0x80, now)
            case Pubrel():
                on_pubrel(self, p)
            case Pubcomp():
                acknowledged(self, PUBCOMP, p.packet_id, True, now)
            case Subscribe():
                on_subscribe(self, p, now)
            case Unsubscribe():
                on_unsubscribe(self, p)
            case Pingreq():
                self.send_ordered(Pingresp(), False)
            case Disconnect():
                self._on_disconnect(p)
            case Auth():
                self.disconnect(ReasonCode.PROTOCOL_ERROR, "AUTH without an authentication method")
            case Connect():
                self.disconnect(ReasonCode.PROTOCOL_ERROR, "second CONNECT")
            case _:
                self.disconnect(ReasonCode.PROTOCOL_ERROR, f"unexpected {type(p).__name__}")

    # ------------------------------------------------------------ CONNECT
    def _refuse(self, code: ReasonCode, reason: str, client_id: str | None = None) -> None:
        self.send(Connack(False, code, self._reason(reason)))
        self.close(f"CONNECT refused: {reason}")
        what = f"CONNECT refused: {reason} ({code.name})"  # one line per 10 s (bad passwords)
        log_refusal(self, "connect_refused", "client.refused", client_id, what, reason)

    def accept(self, p: Connect, client_id: str, authenticated: bool, now: float) -> None:
        """An authenticated CONNECT: the session attached, the limits of both sides
        negotiated, and the CONNACK sent (after the commit of a persisted session).  The
        session records whether its user name was ``authenticated`` (a hook said True): the
        authorize hooks see the name only then."""
        core = self.core
        cfg = core.config
        v = p.protocol_level
        self.bridge = p.bridge
        self.clean_start = p.clean_start
        expiry = (p.properties.session_expiry_interval or 0) if v == 5 else (0 if p.clean_start else NEVER)
        capped = min(expiry, cfg.max_session_expiry)
        server_ka = negotiate(self, p)
        self.state = ConnectionState.CONNECTED
        core.connected += 1
        present = core.attach(self, client_id, p.clean_start, capped, now)
        session = self.session
        assert session is not None
        session.username = p.username
        session.authenticated = authenticated
        session.will = p.will
        session.version = v
        if core.quotas is not None:
            core.quotas.attach(self, client_id, p.username if authenticated else None, now)
        if cfg.slow_consumer_rules:
            self.policy = cfg.slow_policy(client_id, self.listener_policy)
        durable_first = core.journal.connected(session, now)
        ack_props = NO_PROPERTIES
        if v == 5:
            ack_props = Properties(
                assigned_client_identifier=None if p.client_id else client_id,
                session_expiry_interval=capped if capped != expiry else None,
                server_keep_alive=server_ka,
                receive_maximum=cfg.receive_maximum if cfg.receive_maximum != 65535 else None,
                maximum_qos=cfg.maximum_qos if cfg.maximum_qos < 2 else None,
                retain_available=None if cfg.retain_available else 0,
                maximum_packet_size=cfg.max_packet_size if cfg.max_packet_size < 268_435_455 else None,
                topic_alias_maximum=cfg.topic_alias_maximum or None,
                response_information=(
                    f"$response/{client_id}" if p.properties.request_response_information == 1 else None
                ),
            )
        # MQTT 3.1's CONNACK has no Session Present flag (the byte is reserved, 0)
        connack = Connack(present and v != 3, ReasonCode.SUCCESS, ack_props)
        if core.obs.hold_connack and hold_connack(self, client_id, p.clean_start, connack):
            pass  # a hook fetches the session first (the cluster); gated until it releases
        elif durable_first:
            # the session row must be durable before the client learns its session exists;
            # nothing may precede the CONNACK [MQTT-3.2.0-1], so the connection's output is
            # gated until the commit (Journal._release puts the CONNACK first and opens it)
            self.gated = True
            core.journal.hold(self, connack)
        else:
            self.send(connack)
        log_client(self, "client.connected", client_id, f"connected (v{v})", None)
        if core.obs.connect:
            core._call(core.obs.connect, "on_connect", client_id, p.username, v)
        if present:
            resend(self, now)

    # ------------------------------------------------------------ end of connection
    def _on_disconnect(self, p: Disconnect) -> None:
        s = self.session
        assert s is not None
        if self.version == 5:
            new_expiry = p.properties.session_expiry_interval
            if new_expiry is not None:
                if s.expiry_interval == 0 and new_expiry != 0:
                    self.disconnect(ReasonCode.PROTOCOL_ERROR, "session expiry changed from 0")
                    return
                s.expiry_interval = min(new_expiry, self.core.config.max_session_expiry)
        self.will_on_close = self.version == 5 and p.reason_code == ReasonCode.DISCONNECT_WITH_WILL_MESSAGE
        self.close(CLIENT_DISCONNECTED)

    def taken_over(self, now: float) -> None:
        """Another connection CONNECTed with our client id (MQTT 5 section 3.1.4)."""
        self.disconnect(ReasonCode.SESSION_TAKEN_OVER, "session taken over")
        self.lost(now, keep_session=True)

    def lost(self, now: float, keep_session: bool = False) -> None:
        """The network connection is gone (or is being closed by us): detach the session."""
        if self.state is ConnectionState.CLOSED:
            return
        was_connected = self.state is ConnectionState.CONNECTED
        self.state = ConnectionState.CLOSED
        core = self.core
        if was_connected:
            core.connected -= 1
        core.connections.discard(self)
        core.conn_timers.discard(self)
        core.relieve(self)  # its publishers must not wait for a receiver that is gone
        if self.blockers:  # a paused publisher: forget it at the receivers it waits for
            for receiver in core.congested:
                receiver.feeders.discard(self)
            self.blockers = 0
            core.stats.publishers_paused -= 1
        if core.quotas is not None:
            core.quotas.paused.pop(self, None)  # its pause ended with its blockers above
        self.pending = NO_PACKETS
        s = self.session
        if s is not None and was_connected and s.conn is self:
            if keep_session:
                # takeover: the will follows its delay; the new connection decides the session
                s.conn = None
                if self.will_on_close and s.will is not None:
                    delay = s.will.properties.will_delay_interval or 0
                    if delay == 0:
                        core.publish_will(s, now)
                    else:
                        s.will_due = now + delay
                        core.pending_wills.add(s)
            else:
                core.detach(s, self.will_on_close, now)
        if was_connected and s is not None:
            log_client(self, "client.disconnected", s.client_id, "disconnected", self.close_reason)
        if was_connected and core.obs.disconnect and s is not None:
            core._call(core.obs.disconnect, "on_disconnect", s.client_id, self.close_reason)
        if self.outbox or self.close_requested:
            core.dirty.add(self)
