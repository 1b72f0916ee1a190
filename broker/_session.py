"""The sans-IO protocol core: sessions, connections and every state transition between them.

Like h11, nothing here touches a socket or awaits: a :class:`Connection` is fed decoded
packets (``received``) and the time, and answers by appending encoded bytes to its
``outbox`` and by setting ``close_requested``.  :class:`Core` owns the session registry,
the :class:`~broker._router.Router` and the counters; it marks connections that have
output as dirty and ``flush`` hands their bytes to the write callback the transport
registered (one ``write`` per connection per event-loop callback: write coalescing).
Unit tests drive it with plain callables and no event loop.

States of a connection: ``AWAIT_CONNECT -> CONNECTED -> CLOSED``.  States of a session
(MQTT 5 section 4.1): *attached* (``conn`` set), *detached* (kept until its expiry
interval, queuing QoS 1/2 messages), *ended* (removed with its subscriptions).  All
transitions are methods of this module: ``Core.attach`` (new / resumed / clean start /
takeover), ``Connection.lost`` (detach, will scheduling), ``Core.end_session`` and
``Core.tick`` (keep-alive 1.5x, will delay, session expiry, ``$SYS``).  A session holds
only plain data (in-flight messages with their state, queue, QoS 2 receive ids, packet id
counter) so it can be persisted: with a store (``Core.store``, docs/persistence.md; issue 7,
item 1, no seed covers it), every change of a persisted session is written through to the
store's queue (O(1) on the loop), ``Core.restore`` rebuilds the state at start, and
acknowledgements that reveal stored state wait for the store's durable signal
(``Connection.send_ordered`` / ``Core.hold``: one shared wake-up per group commit).

Per-client memory is bounded: at most ``max_inflight`` unacknowledged and
``max_queued_messages`` queued QoS 1/2 messages; QoS 0 messages for a connection whose
transport is paused (slow consumer) are dropped and counted.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import content
import topics
from broker._config import BrokerConfig
from broker._router import Message, Route, Router, SubOptions, split_filter_prefix
from broker._store import (
    EntryRecord,
    LoadedState,
    MessageState,
    OutgoingRecord,
    SessionRecord,
    Store,
    message_record,
    replay_entries,
)
from broker.hooks import (
    Delivery,
    DeliveryEntry,
    Hooks,
    Publication,
    SubscriptionAction,
    SubscriptionChange,
)
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
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
    encode_publish,
)

__all__ = ["Connection", "ConnectionState", "Core", "Outgoing", "Session", "Stats"]

log = logging.getLogger("broker")
#: seconds between two log lines about the same kind of limit refusal
LIMIT_LOG_INTERVAL = 10.0
#: PUBLISHes of one read routed as one content-matching batch at most (flow control can only
#: pause between batches)
_MAX_RUN = 128

_NEVER = 0xFFFFFFFF
_SHARE = "$share/"


class ConnectionState(enum.Enum):
    AWAIT_CONNECT = "await_connect"
    CONNECTED = "connected"
    CLOSED = "closed"


class Outgoing:
    """A QoS 1/2 message on its way to one client (queued or in flight).

    ``state`` 0: PUBLISH sent (or to send), waiting for PUBACK/PUBREC; 1: PUBREL sent,
    waiting for PUBCOMP.
    """

    __slots__ = ("msg", "qos", "retain", "selector", "seq", "state", "sub_ids", "topic_filter")

    def __init__(  # noqa: PLR0917 (hot path: positional arguments)
        self,
        msg: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        topic_filter: str,
        selector: str | None,
    ) -> None:
        self.msg = msg
        self.qos = qos
        self.retain = retain
        self.sub_ids = sub_ids
        self.topic_filter = topic_filter
        self.selector = selector
        self.state = 0
        self.seq = 0  # OutgoingRecord.seq of its stored row (persisted sessions)


Sink = Callable[[Message, Route], None]


class Session:
    """Per-client state that outlives a network connection (MQTT 5 section 4.1).

    ``inflight`` is ordered by send time (dict insertion order); lookups by packet id are
    O(1).  ``queue`` is bounded by ``BrokerConfig.max_queued_messages``.
    """

    __slots__ = (
        "client_id",
        "conn",
        "expires_at",
        "expiry_interval",
        "inflight",
        "next_pid",
        "persisted",
        "qos2_received",
        "queue",
        "selectors",
        "sink",
        "username",
        "version",
        "will",
        "will_due",
    )

    def __init__(self, client_id: str, expiry_interval: int = 0) -> None:
        self.client_id = client_id
        self.expiry_interval = expiry_interval
        self.conn: Connection | None = None
        self.inflight: dict[int, Outgoing] = {}
        self.queue: deque[Outgoing] = deque()
        self.qos2_received: set[int] = set()
        self.next_pid = 1
        self.will: Will | None = None
        self.will_due: float | None = None
        self.expires_at: float | None = None
        self.username: str | None = None
        self.selectors: dict[str, str] = {}  # topic filter -> selector of that subscription
        self.sink: Sink | None = None
        self.persisted = False  # a row exists in Core.store (docs/persistence.md)
        self.version = 4  # protocol level of the latest CONNECT

    def allocate_pid(self) -> int:
        """A packet id not in flight (O(1) amortised; the window is far below 65535)."""
        pid = self.next_pid
        inflight = self.inflight
        while pid in inflight:
            pid = pid % 65535 + 1
        self.next_pid = pid % 65535 + 1
        return pid

    def _check(self) -> None:
        assert len(self.inflight) <= 65535
        assert all(1 <= pid <= 65535 for pid in self.inflight)
        assert self.conn is None or self.conn.session is self
        assert all(o.qos > 0 for o in self.queue)


@dataclass(slots=True)
class Stats:
    """Broker counters (published under ``$SYS/broker/``)."""

    messages_received: int = 0
    messages_sent: int = 0
    publish_dropped: int = 0  # QoS 0 dropped for slow consumers / oversize / expiry
    queue_overflow: int = 0  # QoS 1/2 dropped or clients disconnected for a full queue
    bytes_received: int = 0
    bytes_sent: int = 0
    connections_total: int = 0
    malformed: int = 0
    hook_errors: int = 0
    # listener limits (broker._listeners): connections refused at CONNECT
    refused_max_connections: int = 0
    refused_connection_rate: int = 0
    refused_anonymous: int = 0
    # deliveries an authorize hook refused ("receive": live messages and retained on SUBSCRIBE)
    receive_denied: int = 0
    # session limits (docs/broker.md, "Limits")
    refused_subscription_quota: int = 0  # SUBACK 0x97/0x80: max_subscriptions_per_client
    refused_topic_levels: int = 0  # PUBLISH or SUBSCRIBE beyond max_topic_levels
    refused_selector: int = 0  # content filters refused in SUBACK (syntax or complexity)
    # flow control (docs/broker.md, "Flow control")
    publisher_pauses: int = 0  # times a publishing connection was paused for its subscribers
    publishers_paused: int = 0  # connections paused right now (gauge)
    slow_consumer_events: int = 0  # clients declared slow consumers after the grace time
    slow_consumers: int = 0  # slow consumers right now (gauge)
    slow_disconnected: int = 0  # slow consumers disconnected (policy "disconnect")
    dropped_qos0_slow: int = 0  # QoS 0 dropped because the receiver does not read fast enough
    dropped_queue_full: int = 0  # QoS 1/2 dropped at a full queue (max_queued_messages)


class _Observers:
    """The registered hooks, split by the methods they override (unused ones cost nothing)."""

    def __init__(self, hooks: Iterable[Hooks]) -> None:
        self.all = list(hooks)

        def over(name: str) -> list[Hooks]:
            base = getattr(Hooks, name)
            return [h for h in self.all if getattr(type(h), name) is not base]

        self.connect = over("on_connect")
        self.disconnect = over("on_disconnect")
        self.subscription = over("on_subscription_change")
        self.publication = over("on_publication")
        self.delivery = over("on_delivery")
        self.deliveries = over("on_deliveries")
        self.authenticate = over("authenticate")
        self.authorize = over("authorize")
        self.writes = bool(self.delivery or self.deliveries)  # write_publish reports deliveries
        # The publication whose fan-out is being recorded for on_deliveries, and its entries.
        self.fan_msg: Message | None = None
        self.fan: list[DeliveryEntry] = []

    def deliveries_written(
        self, msg: Message, entries: list[DeliveryEntry], routes: int, stats: Stats
    ) -> None:
        """One ``on_deliveries`` call per hook; the clock is read once for all ``entries``."""
        t = time.time()
        for h in self.deliveries:
            try:
                h.on_deliveries(t, msg, entries, routes)
            except Exception:
                stats.hook_errors += 1
                log.exception("hook %s.on_deliveries failed", type(h).__name__)


def _ok(code: int) -> bool:
    return code < 0x80


def _nothing() -> None:
    """The answer to a QoS 0 PUBLISH refused by the authorize hook: none (dropped)."""


_NOTHING: Callable[[], None] = _nothing


def _call_now(fn: Callable[..., object], *args: object) -> None:
    fn(*args)


_Held = list[tuple["Connection", Packet]]


class Core:
    """Session registry, router, counters and timers of one broker (no I/O)."""

    def __init__(self, config: BrokerConfig | None = None, hooks: Iterable[Hooks] = ()) -> None:
        self.config = cfg = config or BrokerConfig()
        self.router = Router(cfg.partial_unsubscribe, cfg.content_engine, batch_min=cfg.content_batch_min)
        self.sessions: dict[str, Session] = {}
        self.connections: set[Connection] = set()
        self._limit_logged: dict[str, float] = {}  # limit kind -> monotonic time last logged
        self.dirty: set[Connection] = set()
        self.stats = Stats()
        self.obs = _Observers(hooks)
        self.pending_wills: set[Session] = set()
        self.expiring: set[Session] = set()
        self.started = time.monotonic()
        # PUBLISH templates of the message being fanned out ([3.1/3.1.1, 5])
        self.tmpl_msg: Message | None = None
        self.tmpl: list[PublishTemplate | None] = [None, None]
        self._next_sys = self.started + cfg.sys_interval if cfg.sys_interval > 0 else None
        # persistence (docs/persistence.md): Broker.start sets the store and a thread-safe
        # scheduler (loop.call_soon_threadsafe); without a store nothing below is used.
        self.store: Store | None = None
        self.call_threadsafe: Callable[..., object] = _call_now
        self._held: tuple[concurrent.futures.Future[None], _Held] | None = None
        self.store_failed = False
        # flow control (docs/broker.md, "Flow control"): the connection whose PUBLISH is
        # being routed (the one to pause when a receiver is over its high-water mark), the
        # receivers over their mark, and the paused publishers to resume at the next flush
        self.current: Connection | None = None
        self.congested: set[Connection] = set()
        self.resumable: set[Connection] = set()
        self.high_water = cfg.high_water
        self.low_water = cfg.low_water

    # ------------------------------------------------------------ hooks
    def _call(self, hooks: list[Hooks], name: str, *args: object) -> None:
        for h in hooks:
            try:
                getattr(h, name)(*args)
            except Exception:
                self.stats.hook_errors += 1
                log.exception("hook %s.%s failed", type(h).__name__, name)

    def _opinion(self, hooks: list[Hooks], name: str, *args: object) -> bool | None:
        for h in hooks:
            try:
                answer = getattr(h, name)(*args)
            except Exception:
                self.stats.hook_errors += 1
                log.exception("hook %s.%s failed", type(h).__name__, name)
                return False
            if answer is not None:
                return bool(answer)
        return None

    def authorize(self, session: Session, action: str, topic: str) -> bool:
        if not self.obs.authorize:
            return True
        return (
            self._opinion(self.obs.authorize, "authorize", session.client_id, session.username, action, topic)
            is not False
        )

    def may_receive(self, session: Session, topic: str) -> bool:
        """``authorize("receive")`` for a delivery (ACL read rules re-checked per message, so a
        reloaded ACL or a deny rule narrower than the subscribed filter applies); refusals are
        counted in ``$SYS/broker/messages/receive_denied``.  Sessions of in-process
        subscriptions (``sink``) are not checked."""
        if session.sink is not None or self.authorize(session, "receive", topic):
            return True
        self.stats.receive_denied += 1
        return False

    def subscription_changed(
        self,
        client_id: str,
        action: SubscriptionAction,
        topic_filter: str | None,
        selector: str | None,
        qos: int | None,
    ) -> None:
        if self.obs.subscription:
            change = SubscriptionChange(
                time.time(),
                client_id,
                action,
                topic_filter,
                selector,
                qos,
                self.router.index.entry_count(client_id),
            )
            self._call(self.obs.subscription, "on_subscription_change", change)

    # ------------------------------------------------------------ sessions
    def attach(self, conn: Connection, client_id: str, clean_start: bool, expiry: int, now: float) -> bool:
        """Bind ``conn`` to the session of ``client_id``; returns "session present"."""
        old = self.sessions.get(client_id)
        if old is not None and old.conn is not None:
            old.conn.taken_over(now)
            self.subscription_changed(client_id, SubscriptionAction.TAKEOVER, None, None, None)
        if old is not None and (clean_start or (old.expires_at is not None and old.expires_at <= now)):
            self.end_session(old, now)
            old = None
        if old is None:
            session = Session(client_id, expiry)
            self.sessions[client_id] = session
            present = False
        else:
            session = old
            session.expiry_interval = expiry
            present = True
            if session.will_due is not None:  # resumed before the will delay elapsed
                session.will = None
                session.will_due = None
                self.pending_wills.discard(session)
        session.expires_at = None
        self.expiring.discard(session)
        session.conn = conn
        conn.session = session
        return present

    def local_subscribe(  # noqa: PLR0917 (hot path: positional arguments)
        self, client_id: str, topic_filter: str, selector: str | None, qos: int, sink: Sink, now: float
    ) -> Session:
        """An in-process subscriber: a session whose deliveries go to ``sink`` (no QoS flow).

        Raises ``topics.InvalidTopic`` / ``content.FilterSyntaxError`` for bad input.
        """
        topics.validate_filter(topic_filter)
        compiled = None if selector is None else content.compile(selector)
        session = Session(client_id, 0)
        session.sink = sink
        self.sessions[client_id] = session
        router = self.router
        if compiled is not None and selector is not None:
            router.add_selector(selector, compiled)
            session.selectors[topic_filter] = selector
        router.index.subscribe(
            client_id, topic_filter, SubOptions(qos, selector=selector, topic_filter=topic_filter)
        )
        self.subscription_changed(client_id, SubscriptionAction.SUBSCRIBE, topic_filter, selector, qos)
        for msg in router.retained_for(topic_filter, selector, now):
            self.deliver(session, msg, min(qos, msg.qos), True, (), topic_filter, selector, now)
        return session

    def end_session(self, session: Session, now: float) -> None:
        """The session ends: pending will published, subscriptions and queues dropped."""
        if session.will is not None and session.conn is None:
            self._publish_will(session, now)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        self.pending_wills.discard(session)
        self.expiring.discard(session)
        router = self.router
        for selector in session.selectors.values():
            router.release_selector(selector)
        session.selectors.clear()
        had = router.index.entry_count(session.client_id)
        router.index.remove_client(session.client_id)
        session.inflight.clear()
        session.queue.clear()
        session.qos2_received.clear()
        if session.persisted:
            session.persisted = False
            if self.store is not None:
                self.store.delete_session(session.client_id)
        if had:
            self.subscription_changed(session.client_id, SubscriptionAction.SESSION_END, None, None, None)

    def detach(self, session: Session, publish_will: bool, now: float) -> None:
        """The network connection of ``session`` ended (normally or not)."""
        session.conn = None
        if publish_will and session.will is not None:
            delay = session.will.properties.will_delay_interval or 0
            if delay == 0 or session.expiry_interval == 0:
                self._publish_will(session, now)
            else:
                session.will_due = now + min(delay, session.expiry_interval)
                self.pending_wills.add(session)
        else:
            session.will = None
        if session.expiry_interval == 0:
            self.end_session(session, now)
        elif session.expiry_interval != _NEVER:
            session.expires_at = now + session.expiry_interval
            self.expiring.add(session)
        if session.persisted and self.store is not None:
            self.store.put_session(self._session_record(session, now, time.time()))

    def _publish_will(self, session: Session, now: float) -> None:
        will = session.will
        session.will = None
        session.will_due = None
        self.pending_wills.discard(session)
        if will is None:
            return
        if session.persisted and self.store is not None:
            self.store.set_will(session.client_id, None)
        props = will.properties
        if props.will_delay_interval is not None:
            props = dataclasses.replace(props, will_delay_interval=None)
        self.publish(
            Message.create(will.topic, will.payload, will.qos, will.retain, props, session.client_id, now),
            now,
        )

    # ------------------------------------------------------------ publish / deliver
    def publish(self, msg: Message, now: float, routes: list[Route] | None = None) -> int:
        """Store (if retained), route and deliver ``msg``; returns the number of deliveries.

        ``routes``: the router's answer computed beforehand (``Router.route_batch``)."""
        router = self.router
        if msg.retain:
            router.store_retained(msg)
            if self.store is not None and not msg.topic.startswith("$SYS/"):
                self.store.set_retained(message_record(msg, now))
        if routes is None:
            routes = router.route(msg)
        obs = self.obs
        if obs.deliveries:  # record this fan-out's writes (restored after: a sink may publish)
            outer = obs.fan_msg, obs.fan
            obs.fan_msg = msg
            fan: list[DeliveryEntry] = []
            obs.fan = fan
        sessions = self.sessions
        deliver = self.deliver
        may_receive = self.may_receive if obs.authorize else None
        for r in routes:
            s = sessions.get(r.client_id)
            if s is not None and (may_receive is None or may_receive(s, msg.topic)):
                deliver(s, msg, r.qos, r.retain, r.subscription_ids, r.topic_filter, r.selector, now)
        self.stats.messages_received += 1
        if obs.deliveries:
            obs.fan_msg, obs.fan = outer
            obs.deliveries_written(msg, fan, len(routes), self.stats)
        if obs.publication:
            pub = Publication(
                time.time(),
                msg.message_id,
                msg.publisher_id,
                msg.topic,
                len(msg.payload),
                msg.qos,
                msg.retain,
                len(routes),
            )
            self._call(self.obs.publication, "on_publication", pub)
        return len(routes)

    def deliver(  # noqa: PLR0917 (hot path: positional arguments)
        self,
        s: Session,
        msg: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        topic_filter: str,
        selector: str | None,
        now: float,
    ) -> None:
        """Send to, queue for, or drop for session ``s`` (flow control and bounds)."""
        sink = s.sink
        if sink is not None:
            sink(msg, Route(s.client_id, qos, retain, sub_ids, topic_filter, selector))
            return
        conn = s.conn
        if qos == 0:
            if conn is None:
                return
            if conn.paused or conn.slow:
                # QoS 0 to a receiver that does not keep up is dropped, never buffered
                # without bound (latency and memory stay bounded)
                self.stats.publish_dropped += 1
                self.stats.dropped_qos0_slow += 1
                return
            conn.write_publish(msg, 0, retain, False, None, sub_ids, topic_filter, selector, now)
            return
        out = Outgoing(msg, qos, retain, sub_ids, topic_filter, selector)
        queue = s.queue
        if conn is not None and not conn.paused and not queue and len(s.inflight) < conn.window:
            pid = s.allocate_pid()
            s.inflight[pid] = out
            if s.persisted:
                self._store_out(s, out, MessageState.PUBLISH_SENT, pid, now)
            conn.write_publish(msg, qos, retain, False, pid, sub_ids, topic_filter, selector, now)
            return
        if len(queue) >= self.config.max_queued_messages:
            self._queue_full(s, conn)
            return
        queue.append(out)
        if s.persisted:
            self._store_out(s, out, MessageState.QUEUED, None, now)
        if conn is not None and len(queue) >= self.high_water and not conn.slow:
            self._congested(conn, now)

    # ------------------------------------------------------------ flow control
    def _queue_full(self, s: Session, conn: Connection | None) -> None:
        """A QoS 1/2 message finds the queue of ``s`` full: dropped and counted, or (policy
        ``disconnect``) the client is disconnected."""
        self.stats.queue_overflow += 1
        self.stats.dropped_queue_full += 1
        if conn is not None and conn.policy == "disconnect":
            self.log_limit("queue", s.client_id, f"queue full ({len(s.queue)} messages), disconnecting")
            conn.disconnect(ReasonCode.QUOTA_EXCEEDED, "message queue full")
            return
        self.log_limit("queue", s.client_id, f"queue full ({len(s.queue)} messages): message dropped")

    def _congested(self, conn: Connection, now: float) -> None:
        """``conn``'s queue reached the high-water mark: pause the connection whose PUBLISH is
        being routed (O(1)); it resumes when the queue is back at the low-water mark."""
        if conn.congested_since is None:
            conn.congested_since = now
            self.congested.add(conn)
        pub = self.current
        if pub is None or pub is conn or pub in conn.feeders:
            return
        conn.feeders.add(pub)
        pub.blockers += 1
        if pub.blockers == 1:
            self.stats.publisher_pauses += 1
            self.stats.publishers_paused += 1
            self.resumable.discard(pub)
            pub.reader(True)

    def relieve(self, conn: Connection) -> None:
        """``conn`` is no longer congested (drained, slow, or gone): release its publishers."""
        if conn.congested_since is not None:
            conn.congested_since = None
            self.congested.discard(conn)
        if conn.slow:
            conn.slow = False
            self.stats.slow_consumers -= 1
        self._release_feeders(conn)

    def _release_feeders(self, conn: Connection) -> None:
        for pub in conn.feeders:
            pub.blockers -= 1
            if pub.blockers == 0:
                self.stats.publishers_paused -= 1
                self.resumable.add(pub)
        conn.feeders.clear()

    def _check_slow(self, now: float) -> None:
        """Receivers over their mark for longer than the grace time become slow consumers:
        their publishers are released and their policy applies (``pace``: never slow)."""
        grace = self.config.slow_consumer_grace
        for conn in [c for c in self.congested if not c.slow and c.policy != "pace"]:
            since = conn.congested_since
            if since is None or now - since < grace:
                continue
            conn.slow = True
            self.stats.slow_consumers += 1
            self.stats.slow_consumer_events += 1
            self._release_feeders(conn)
            cid = conn.client_id
            if conn.policy == "disconnect":
                self.stats.slow_disconnected += 1
                self.log_limit("slow_consumer", cid, f"slow consumer for {grace:g} s, disconnecting")
                conn.disconnect(ReasonCode.QUOTA_EXCEEDED, "slow consumer")
            else:
                self.log_limit(
                    "slow_consumer", cid, f"slow consumer for {grace:g} s: QoS 0 dropped, QoS 1/2 queued"
                )

    def drain(self, s: Session, now: float) -> None:
        """Move queued messages into the in-flight window while the connection can take them."""
        conn = s.conn
        if conn is None:
            return
        queue = s.queue
        inflight = s.inflight
        window = conn.window
        while queue and len(inflight) < window and not conn.paused and not conn.close_requested:
            out = queue.popleft()
            msg = out.msg
            if msg.expires_at is not None and msg.expires_at <= now:
                self.stats.publish_dropped += 1
                if s.persisted and self.store is not None:
                    self.store.drop_outgoing(s.client_id, out.seq)
                continue
            pid = s.allocate_pid()
            inflight[pid] = out
            if s.persisted and self.store is not None:
                self.store.mark_sent(s.client_id, out.seq, pid)
            conn.write_publish(
                msg, out.qos, out.retain, False, pid, out.sub_ids, out.topic_filter, out.selector, now
            )
        if conn.congested_since is not None and len(queue) <= self.low_water and not conn.paused:
            self.relieve(conn)

    # ------------------------------------------------------------ persistence
    def _session_record(self, s: Session, now: float, wall: float) -> SessionRecord:
        due = None if s.will_due is None else wall + (s.will_due - now)
        disconnected = None if s.conn is not None else wall
        return SessionRecord(
            s.client_id, s.version, s.expiry_interval, disconnected, s.username, s.next_pid, s.will, due
        )

    def _store_out(  # noqa: PLR0917
        self,
        s: Session,
        out: Outgoing,
        state: MessageState,
        pid: int | None,
        now: float,
        wall: float | None = None,
    ) -> None:
        store = self.store
        assert store is not None
        out.seq = seq = store.next_seq()
        store.add_outgoing(
            OutgoingRecord(
                s.client_id,
                seq,
                state,
                pid,
                message_record(out.msg, now, wall),
                out.qos,
                out.retain,
                out.sub_ids,
                out.topic_filter,
                out.selector,
            )
        )

    def session_connected(self, s: Session, now: float) -> None:
        """CONNECT accepted: write the session row (everything, if it becomes persisted now).

        A session is persisted while its expiry interval is > 0 (MQTT 3.1.1: CleanSession=0);
        resuming one with expiry 0 deletes its rows (it ends with this connection anyway).
        """
        store = self.store
        if store is None or s.sink is not None:
            return
        cid = s.client_id
        if s.expiry_interval == 0:
            if s.persisted:
                s.persisted = False
                store.delete_session(cid)
            return
        wall = time.time()
        store.put_session(self._session_record(s, now, wall))
        if s.persisted:
            return
        s.persisted = True  # a session kept in memory only until now (a takeover changed it)
        self.save_entries(s)
        for pid, out in s.inflight.items():
            state = MessageState.PUBLISH_SENT if out.state == 0 else MessageState.PUBREC_RECEIVED
            self._store_out(s, out, state, pid, now, wall)
        for out in s.queue:
            self._store_out(s, out, MessageState.QUEUED, None, now, wall)
        for pid in s.qos2_received:
            store.qos2_received(cid, pid)

    def save_entries(self, s: Session) -> None:
        """The client's entry list changed (SUBSCRIBE / UNSUBSCRIBE): rewrite it."""
        if s.persisted and self.store is not None:
            entries = self.router.index.entries(s.client_id)
            self.store.put_entries(s.client_id, [EntryRecord(e.topic_filter, e.options) for e in entries])

    def hold(self, conn: Connection, packet: Packet) -> None:
        """Send ``packet`` on ``conn`` once everything written to the store so far is durable.

        All packets held between two commits share the store's durable signal and one
        thread-safe wake-up; signals fire in submission order, so a connection's packets
        keep their order (``Connection.held`` makes later ones wait behind held ones).
        """
        store = self.store
        assert store is not None
        fut = store.sync()
        conn.held += 1
        batch = self._held
        if batch is not None and batch[0] is fut:
            batch[1].append((conn, packet))
            return
        held: _Held = [(conn, packet)]
        self._held = (fut, held)
        call = self.call_threadsafe
        release = self._release
        fut.add_done_callback(lambda f: call(release, f, held))

    def _release(self, fut: concurrent.futures.Future[None], held: _Held) -> None:
        """The durable signal fired: send the held packets (or, if the commit failed, refuse)."""
        batch = self._held
        if batch is not None and batch[1] is held:
            self._held = None
        exc = fut.exception()
        if exc is not None and not self.store_failed:
            self.store_failed = True
            log.error(
                "persistent store failed (%s): QoS 1/2 messages that must be stored are no longer "
                "acknowledged; their publishers are disconnected (0x80)",
                exc,
            )
        for conn, packet in held:
            conn.held -= 1
            if conn.state is ConnectionState.CLOSED:
                continue
            if conn.gated and isinstance(packet, Connack):
                conn.open_gate(packet if exc is None else None)
            elif exc is None:
                conn.send(packet)
            else:
                conn.disconnect(ReasonCode.UNSPECIFIED_ERROR, "persistent store failed: not acknowledged")
        self.flush()

    def restore(self, st: LoadedState, now: float, wall: float) -> None:
        """Rebuild the state ``Store.load`` found (broker start, before accepting clients).

        Retained messages, persisted sessions with their entry lists (content filters
        compiled again), queued and in-flight messages (resent with DUP when the client
        resumes), QoS 2 ids awaiting PUBREL, and wills: a delayed will keeps its due time; a
        session that was connected when the process died gets its will as ``detach`` would
        have given it; sessions that expired while the broker was down publish theirs now.
        """
        store = self.store
        assert store is not None
        router = self.router
        for rec in st.retained.values():
            router.store_retained(rec.to_message(now, wall))
        for cid, r in st.sessions.items():
            s = Session(cid, r.expiry_interval)
            s.persisted = True
            s.version = r.protocol_level
            s.next_pid, s.username, s.will = r.next_pid, r.username, r.will
            exp = r.expires_at()
            if exp is not None:
                s.expires_at = now + (exp - wall)
                self.expiring.add(s)
            if r.will_due is not None and r.will is not None:
                s.will_due = now + (r.will_due - wall)
                self.pending_wills.add(s)
            self.sessions[cid] = s
            entries = st.entries.get(cid, [])
            for e in entries:
                opts = e.options
                if opts is not None and opts.selector is not None:
                    router.add_selector(opts.selector, content.compile(opts.selector))
                    s.selectors[e.topic_filter] = opts.selector
            replay_entries(router.index, cid, entries)
            for o in st.outgoing.get(cid, ()):
                out = Outgoing(
                    o.message.to_message(now, wall), o.qos, o.retain, o.sub_ids, o.topic_filter, o.selector
                )
                out.seq = o.seq
                if o.packet_id is None:
                    s.queue.append(out)
                else:
                    out.state = 0 if o.state is MessageState.PUBLISH_SENT else 1
                    s.inflight[o.packet_id] = out
            s.qos2_received = set(st.qos2_in.get(cid, ()))
        for cid in sorted(st.crashed):
            c = self.sessions.get(cid)
            if c is None or c.will is None or c.will_due is not None:
                continue
            delay = c.will.properties.will_delay_interval or 0
            if delay == 0:
                self._publish_will(c, now)
            else:
                c.will_due = now + min(delay, c.expiry_interval)
                self.pending_wills.add(c)
                store.set_will(cid, c.will, wall + (c.will_due - now))
        for r in st.expired:
            if r.will is not None:
                gone = Session(r.client_id)
                gone.will = r.will
                self._publish_will(gone, now)

    # ------------------------------------------------------------ timers
    def tick(self, now: float) -> None:
        """Keep-alive timeouts, will delays, session expiry and ``$SYS`` (call periodically)."""
        for conn in list(self.connections):
            conn.check_keep_alive(now)
        if self.pending_wills:
            for s in [s for s in self.pending_wills if s.will_due is not None and s.will_due <= now]:
                self._publish_will(s, now)
        if self.expiring:
            for s in [s for s in self.expiring if s.expires_at is not None and s.expires_at <= now]:
                self.end_session(s, now)
        if self.congested:
            self._check_slow(now)
        if self._next_sys is not None and now >= self._next_sys:
            self._next_sys = now + self.config.sys_interval
            self.publish_sys(now)

    def sys_values(self, now: float) -> dict[str, str]:
        st = self.stats
        return {
            "$SYS/broker/version": "siftmq",
            "$SYS/broker/uptime": str(int(now - self.started)),
            "$SYS/broker/clients/connected": str(
                sum(1 for c in self.connections if c.state is ConnectionState.CONNECTED)
            ),
            "$SYS/broker/clients/total": str(len(self.sessions)),
            "$SYS/broker/messages/received": str(st.messages_received),
            "$SYS/broker/messages/sent": str(st.messages_sent),
            "$SYS/broker/messages/dropped": str(st.publish_dropped),
            "$SYS/broker/messages/queue_overflow": str(st.queue_overflow),
            "$SYS/broker/bytes/received": str(st.bytes_received),
            "$SYS/broker/bytes/sent": str(st.bytes_sent),
            "$SYS/broker/retained/count": str(len(self.router.retained)),
            "$SYS/broker/malformed": str(st.malformed),
            "$SYS/broker/messages/receive_denied": str(st.receive_denied),
            "$SYS/broker/connections/refused/max_connections": str(st.refused_max_connections),
            "$SYS/broker/connections/refused/connection_rate": str(st.refused_connection_rate),
            "$SYS/broker/connections/refused/anonymous": str(st.refused_anonymous),
            "$SYS/broker/subscriptions/refused/quota": str(st.refused_subscription_quota),
            "$SYS/broker/subscriptions/refused/selector": str(st.refused_selector),
            "$SYS/broker/topic_levels/refused": str(st.refused_topic_levels),
            "$SYS/broker/flow/publishers/paused": str(st.publishers_paused),
            "$SYS/broker/flow/publishers/pauses": str(st.publisher_pauses),
            "$SYS/broker/flow/slow_consumers/current": str(st.slow_consumers),
            "$SYS/broker/flow/slow_consumers/total": str(st.slow_consumer_events),
            "$SYS/broker/flow/slow_consumers/disconnected": str(st.slow_disconnected),
            "$SYS/broker/flow/dropped/qos0": str(st.dropped_qos0_slow),
            "$SYS/broker/flow/dropped/queue_full": str(st.dropped_queue_full),
        }

    def log_limit(self, kind: str, client_id: str | None, what: str, level: int = logging.WARNING) -> None:
        """Log a limit refusal at most once per ``LIMIT_LOG_INTERVAL`` seconds per kind (no log
        flood under abuse); the ``$SYS`` counters count every refusal."""
        now = time.monotonic()
        last = self._limit_logged.get(kind)
        if last is None or now - last >= LIMIT_LOG_INTERVAL:
            self._limit_logged[kind] = now
            log.log(
                level,
                "client %s: %s (further %s refusals not logged for %g s)",
                client_id,
                what,
                kind,
                LIMIT_LOG_INTERVAL,
            )

    def publish_sys(self, now: float) -> None:
        for topic, value in self.sys_values(now).items():
            self.publish(Message.create(topic, value.encode(), 0, True, NO_PROPERTIES, None, now), now)
        st = self.stats
        if st.publish_dropped or st.queue_overflow:
            log.info(
                "counters: %d QoS 0 messages dropped, %d queue overflows",
                st.publish_dropped,
                st.queue_overflow,
            )

    # ------------------------------------------------------------ output
    def flush(self) -> None:
        """Resume the publishers whose receivers drained (their unprocessed packets first),
        then hand every pending output to the transports (one write per connection)."""
        resumable = self.resumable
        while resumable:
            resumable.pop().resume()
        dirty = self.dirty
        while dirty:
            conn = dirty.pop()
            conn.flush()

    def shutdown(self, now: float) -> None:
        """Graceful stop: every connection is closed (v5: DISCONNECT 0x8B) and detached.

        Wills are published (the network connections end without a DISCONNECT from the
        client), and the sessions are left to expire with the process; with a store,
        persisted sessions are kept (their delayed wills stay pending in the store).
        """
        for conn in list(self.connections):
            if conn.state is ConnectionState.CONNECTED:
                conn.disconnect(ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down")
            conn.lost(now)
        for s in list(self.pending_wills):
            if not s.persisted:  # a stored session keeps its will delay across the restart
                self._publish_will(s, now)
        self.flush()

    def _check(self) -> None:
        for cid, s in self.sessions.items():
            assert s.client_id == cid
            s._check()
        for conn in self.connections:
            assert conn.session is None or self.sessions.get(conn.session.client_id) is conn.session
        # flow control: the congested set, the feeder edges and the pause gauge agree
        paused = {c for c in self.connections if c.blockers}
        assert self.stats.publishers_paused == len(paused)
        for conn in self.congested:
            assert conn.congested_since is not None
        edges = sum(len(c.feeders) for c in self.congested)
        assert edges == sum(c.blockers for c in self.connections)
        assert self.stats.slow_consumers == sum(1 for c in self.connections if c.slow)


Writer = Callable[[bytes], None]
Closer = Callable[[], None]
#: the transport's read switch: True = stop reading the socket, False = read again
Reader = Callable[[bool], None]


def _no_reader(pause: bool) -> None:
    """Reader of a connection without a transport (unit tests): nothing to switch."""


class Connection:
    """The protocol machine of one network connection (sans-IO)."""

    def __init__(  # noqa: PLR0917
        self,
        core: Core,
        writer: Writer,
        closer: Closer,
        now: float,
        peer: str = "",
        reader: Reader = _no_reader,
        listener_policy: str | None = None,
    ) -> None:
        self.core = core
        self.writer = writer
        self.closer = closer
        self.reader = reader
        # flow control: as a receiver, since when its queue is over the high-water mark, the
        # publishers paused for it, and whether it is a slow consumer; as a publisher, how
        # many congested receivers it waits for and the packets read but not yet processed
        self.congested_since: float | None = None
        self.feeders: set[Connection] = set()
        self.slow = False
        self.blockers = 0
        self.pending: list[Packet] = []
        self.listener_policy = listener_policy
        self.policy = listener_policy or core.config.slow_consumer_policy
        self.peer = peer
        self.state = ConnectionState.AWAIT_CONNECT
        self.version = 4
        self.session: Session | None = None
        self.outbox: list[bytes] = []
        self.close_requested = False
        self.transport_closed = False
        self.paused = False
        self.keep_alive = 0.0
        self.last_rx = now
        self.clock = now  # the latest time this machine was given
        self.connect_deadline = now + 30.0
        self.window = core.config.max_inflight
        self.client_max_packet = 268_435_455
        self.client_alias_max = 0
        self.alias_out: dict[str, int] = {}
        self.alias_in: dict[int, str] = {}
        self.problem_info = True
        self.will_on_close = True
        self.close_reason = "connection lost"
        self.held = 0  # packets waiting in Core.hold for the store's durable signal
        self.gated = False  # output withheld until the held CONNACK is released (persisted session)
        core.connections.add(self)
        core.stats.connections_total += 1

    @property
    def client_id(self) -> str | None:
        return None if self.session is None else self.session.client_id

    # ------------------------------------------------------------ output helpers
    def send(self, packet: Packet) -> None:
        if self.close_requested:
            return
        self.outbox.append(encode(packet, self.version))
        self.core.dirty.add(self)

    def flush(self) -> None:
        if self.outbox and not self.gated:
            data = b"".join(self.outbox) if len(self.outbox) > 1 else self.outbox[0]
            self.outbox.clear()
            self.core.stats.bytes_sent += len(data)
            self.writer(data)
        if self.close_requested and not self.transport_closed:
            self.transport_closed = True
            self.closer()
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
            self.outbox.clear()
            code = ReasonCode.UNSPECIFIED_ERROR if self.version == 5 else ReasonCode.SERVER_UNAVAILABLE
            self.send(Connack(False, code, self._reason("persistent store failed")))
            self.close("persistent store failed: session not stored")
            return
        self.outbox.insert(0, encode(connack, self.version))
        self.core.dirty.add(self)

    def disconnect(self, code: ReasonCode, reason: str) -> None:
        """Server-initiated end: v5 DISCONNECT with ``code`` then close; 3.1.1: close."""
        if self.version == 5 and self.state is ConnectionState.CONNECTED:
            props = Properties(reason_string=reason) if self.problem_info else NO_PROPERTIES
            self.send(Disconnect(code, props))
        self.close(f"{reason} ({code.name})")

    def send_ordered(self, packet: Packet, wrote: bool) -> None:
        """Send an acknowledgement after the store writes it depends on (``wrote``) are durable.

        It also waits behind this connection's held packets, so acknowledgements keep the
        order of the packets they answer; without a store it is ``send``.
        """
        if wrote or self.held:
            self.core.hold(self, packet)
        else:
            self.send(packet)

    def _reason(self, text: str) -> Properties:
        return Properties(reason_string=text) if self.version == 5 and self.problem_info else NO_PROPERTIES

    def write_publish(  # noqa: PLR0917 (hot path: positional arguments)
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
                if self.session.persisted and core.store is not None:
                    core.store.complete(self.session.client_id, pid)
            return
        self.outbox.append(data)
        core.dirty.add(self)
        core.stats.messages_sent += 1
        obs = core.obs
        if obs.writes and self.session is not None:
            if obs.deliveries:
                entry = (self.session.client_id, topic_filter, selector, qos, retain)
                if obs.fan_msg is msg:
                    obs.fan.append(entry)
                else:  # written after its publication (queued, retained, resumed session)
                    obs.deliveries_written(msg, [entry], -1, core.stats)
            if not obs.delivery:
                return
            t = time.time()
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
    def received(self, packets: Iterable[Packet], now: float) -> None:
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
            self.pending.extend(packets)
            return
        batch = self.state is ConnectionState.CONNECTED and self.core.router.batching()
        run: list[tuple[Publish, Message]] = []
        it = iter(packets)
        for p in it:
            if self.close_requested:
                break
            if self.blockers:  # a receiver of the last PUBLISH is over its mark: stop here
                if run:
                    self._publish_run(run, now)
                    run = []
                self.pending.append(p)
                self.pending.extend(it)
                break
            try:
                if batch and type(p) is Publish and p.qos < 2:
                    accepted = self._accept_publish(p, now)
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
                self._dispatch(p, now)
            except MalformedPacket as exc:
                self.malformed(exc)
            except Exception:
                log.exception("client %s: internal error handling %s", self.client_id, type(p).__name__)
                self.disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "internal error")
        if run:
            try:
                self._publish_run(run, now)
            except Exception:
                log.exception("client %s: internal error routing a batch", self.client_id)
                self.disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "internal error")

    def resume(self) -> None:
        """The receivers this publisher waited for drained: process the packets read before
        the pause (which may pause it again), then read the socket again."""
        if self.blockers or self.state is ConnectionState.CLOSED:
            return
        pending = self.pending
        if pending:
            self.pending = []
            self.received(pending, self.clock)
        if not self.blockers and not self.pending:
            self.reader(False)

    def _publish_run(self, run: list[tuple[Publish, Message]], now: float) -> None:
        """Route the accepted PUBLISHes of one read as one batch, then deliver and ack each."""
        all_routes = self.core.router.route_batch([msg for _, msg in run])
        for (p, msg), routes in zip(run, all_routes, strict=True):
            self._deliver_accepted(p, msg, routes, now)

    def malformed(self, exc: MalformedPacket) -> None:
        """Bad input: v5 DISCONNECT with the codec's reason code then close; 3.1.1: close."""
        self.core.stats.malformed += 1
        self.core.log_limit("malformed", self.client_id, f"({self.peer}) {exc}", logging.INFO)
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
            if not isinstance(p, Connect):
                self.close("first packet is not CONNECT")
                return
            self._on_connect(p, now)
            return
        match p:
            case Publish():
                self._on_publish(p, now)
            case Puback():
                self._on_puback(p, now)
            case Pubrec():
                self._on_pubrec(p, now)
            case Pubrel():
                self._on_pubrel(p)
            case Pubcomp():
                self._on_pubcomp(p, now)
            case Subscribe():
                self._on_subscribe(p, now)
            case Unsubscribe():
                self._on_unsubscribe(p)
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
    def _refuse(self, code: ReasonCode, reason: str) -> None:
        self.send(Connack(False, code, self._reason(reason)))
        self.close(f"CONNECT refused: {reason}")

    def _on_connect(self, p: Connect, now: float) -> None:
        core = self.core
        cfg = core.config
        self.version = v = p.protocol_level
        if p.protocol_name != ("MQIsdp" if v == 3 else "MQTT"):
            self.version = min(v, 4)
            self._refuse(ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, f"protocol name {p.protocol_name!r}")
            return
        props = p.properties
        if v == 5:
            self.problem_info = props.request_problem_information != 0
        client_id = p.client_id
        assigned: str | None = None
        if not client_id:
            if v != 5 and not p.clean_start:
                self._refuse(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "empty client id needs clean session")
                return
            client_id = assigned = "siftmq-" + secrets.token_hex(8)
        if v == 5 and props.authentication_method is not None:
            self._refuse(ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not supported")
            return
        verdict = core._opinion(core.obs.authenticate, "authenticate", client_id, p.username, p.password)
        if verdict is False or (verdict is None and not cfg.allow_anonymous and p.username is None):
            self._refuse(ReasonCode.NOT_AUTHORIZED, "not authorized")
            return
        if p.will is not None and (
            p.will.qos > cfg.maximum_qos or (p.will.retain and not cfg.retain_available)
        ):
            self._refuse(
                ReasonCode.QOS_NOT_SUPPORTED
                if p.will.qos > cfg.maximum_qos
                else ReasonCode.RETAIN_NOT_SUPPORTED,
                "will not supported",
            )
            return
        if p.will is not None:
            try:
                topics.validate_topic(p.will.topic)
            except topics.InvalidTopic as exc:
                self._refuse(ReasonCode.TOPIC_NAME_INVALID, f"will topic: {exc}")
                return
            if (
                core.obs.authorize
                and core._opinion(
                    core.obs.authorize, "authorize", client_id, p.username, "publish", p.will.topic
                )
                is False
            ):
                self._refuse(ReasonCode.NOT_AUTHORIZED, "will topic not authorized")
                return
        expiry = (props.session_expiry_interval or 0) if v == 5 else (0 if p.clean_start else _NEVER)
        capped = min(expiry, cfg.max_session_expiry)
        self.keep_alive = float(p.keep_alive)
        server_ka: int | None = None
        if v == 5:
            cap = cfg.server_keep_alive
            if cap is not None and (p.keep_alive == 0 or p.keep_alive > cap):
                server_ka = cap
                self.keep_alive = float(server_ka)
            self.window = min(cfg.max_inflight, props.receive_maximum or 65535)
            if props.maximum_packet_size is not None:
                self.client_max_packet = props.maximum_packet_size
            self.client_alias_max = props.topic_alias_maximum or 0
        self.state = ConnectionState.CONNECTED
        present = core.attach(self, client_id, p.clean_start, capped, now)
        session = self.session
        assert session is not None
        session.username = p.username
        session.will = p.will
        session.version = v
        if cfg.slow_consumer_rules:
            self.policy = cfg.slow_policy(client_id, self.listener_policy)
        if core.store is not None:
            core.session_connected(session, now)
        ack_props = NO_PROPERTIES
        if v == 5:
            ack_props = Properties(
                assigned_client_identifier=assigned,
                session_expiry_interval=capped if capped != expiry else None,
                server_keep_alive=server_ka,
                receive_maximum=cfg.receive_maximum if cfg.receive_maximum != 65535 else None,
                maximum_qos=cfg.maximum_qos if cfg.maximum_qos < 2 else None,
                retain_available=None if cfg.retain_available else 0,
                maximum_packet_size=cfg.max_packet_size if cfg.max_packet_size < 268_435_455 else None,
                topic_alias_maximum=cfg.topic_alias_maximum or None,
                response_information=(
                    f"$response/{client_id}" if props.request_response_information == 1 else None
                ),
            )
        connack = Connack(present, ReasonCode.SUCCESS, ack_props)
        if session.persisted:
            # the session row must be durable before the client learns its session exists;
            # nothing may precede the CONNACK [MQTT-3.2.0-1], so the connection's output is
            # gated until the commit (Core._release puts the CONNACK first and opens it)
            self.gated = True
            core.hold(self, connack)
        else:
            self.send(connack)
        log.debug("client %s connected (v%d, %s)", client_id, v, self.peer)
        if core.obs.connect:
            core._call(core.obs.connect, "on_connect", client_id, p.username, v)
        if present:
            self._resend(now)

    def _resend(self, now: float) -> None:
        """Resumed session: in-flight messages again (PUBLISH with DUP, or PUBREL), then the queue."""
        s = self.session
        assert s is not None
        for pid, out in list(s.inflight.items()):
            if out.state == 1:
                self.send_ordered(Pubrel(pid), s.persisted)
            else:
                self.write_publish(
                    out.msg, out.qos, out.retain, True, pid, out.sub_ids, out.topic_filter, out.selector, now
                )
        self.core.drain(s, now)

    # ------------------------------------------------------------ PUBLISH from the client
    def _on_publish(self, p: Publish, now: float) -> None:
        accepted = self._accept_publish(p, now)
        if isinstance(accepted, Message):
            self._deliver_accepted(p, accepted, None, now)
        else:
            accepted()

    def _accept_publish(self, p: Publish, now: float) -> Message | Callable[[], None]:
        """Every check of an incoming PUBLISH: the Message to route, or the answer to give
        instead (a refusal, or the PUBREC of a QoS 2 duplicate) as a call, so that a batch can
        deliver and acknowledge the PUBLISHes before it first (``received``)."""
        core = self.core
        cfg = core.config
        s = self.session
        assert s is not None
        qos = p.qos
        if qos > cfg.maximum_qos:
            return partial(self.disconnect, ReasonCode.QOS_NOT_SUPPORTED, f"QoS {qos} not supported")
        if p.retain and not cfg.retain_available:
            return partial(self.disconnect, ReasonCode.RETAIN_NOT_SUPPORTED, "retain not supported")
        topic = p.topic
        props = p.properties
        if self.version == 5 and props.topic_alias is not None:
            alias = props.topic_alias
            if alias == 0 or alias > cfg.topic_alias_maximum:
                return partial(
                    self.disconnect, ReasonCode.TOPIC_ALIAS_INVALID, f"topic alias {alias} out of range"
                )
            if topic:
                self.alias_in[alias] = topic
            else:
                known = self.alias_in.get(alias)
                if known is None:
                    return partial(self.disconnect, ReasonCode.PROTOCOL_ERROR, f"unknown topic alias {alias}")
                topic = known
        try:
            topics.validate_topic(topic)
        except topics.InvalidTopic as exc:
            return partial(self.disconnect, ReasonCode.TOPIC_NAME_INVALID, f"topic name: {exc}")
        if topic.count("/") >= cfg.max_topic_levels:
            core.stats.refused_topic_levels += 1
            core.log_limit("topic_levels", s.client_id, "topic name beyond max_topic_levels")
            return partial(
                self.disconnect,
                ReasonCode.TOPIC_NAME_INVALID,
                f"more than {cfg.max_topic_levels} topic levels",
            )
        pid = p.packet_id
        if qos == 2 and pid in s.qos2_received:
            # duplicate: already routed (method A, MQTT 5 4.3.3)
            return partial(self.send_ordered, Pubrec(pid), False)
        if qos == 2 and len(s.qos2_received) >= cfg.receive_maximum:
            return partial(self.disconnect, ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "receive maximum exceeded")
        if core.obs.authorize and not core.authorize(s, "publish", topic):
            denied = ReasonCode.NOT_AUTHORIZED
            if qos == 1:
                return partial(
                    self.send_ordered, Puback(pid or 0, denied, self._reason("not authorized")), False
                )
            if qos == 2:
                return partial(
                    self.send_ordered, Pubrec(pid or 0, denied, self._reason("not authorized")), False
                )
            return _NOTHING
        if props.topic_alias is not None or props.subscription_identifiers:
            props = dataclasses.replace(props, topic_alias=None, subscription_identifiers=())
        return Message.create(topic, p.payload, qos, p.retain, props, s.client_id, now)

    def _deliver_accepted(self, p: Publish, msg: Message, routes: list[Route] | None, now: float) -> None:
        """Route (unless ``routes`` is given) and deliver an accepted PUBLISH, then acknowledge it."""
        core = self.core
        s = self.session
        assert s is not None
        qos = p.qos
        pid = p.packet_id
        store = core.store
        before = 0 if store is None else store.submitted
        core.current = self  # the connection flow control pauses for a congested receiver
        try:
            n = core.publish(msg, now, routes)
        finally:
            core.current = None
        if store is not None and qos != 0:
            # durability before acknowledgement (docs/persistence.md, "Acknowledgements")
            if qos == 2 and s.persisted:
                store.qos2_received(s.client_id, pid or 0)
            wrote = store.submitted != before
            code = ReasonCode.SUCCESS if n or self.version != 5 else ReasonCode.NO_MATCHING_SUBSCRIBERS
            if qos == 2:
                assert pid is not None
                s.qos2_received.add(pid)
                self.send_ordered(Pubrec(pid, code), wrote)
            else:
                self.send_ordered(Puback(pid or 0, code), wrote)
            return None
        if qos == 1:
            code = ReasonCode.SUCCESS if n or self.version != 5 else ReasonCode.NO_MATCHING_SUBSCRIBERS
            self.send(Puback(pid or 0, code))
        elif qos == 2:
            assert pid is not None
            s.qos2_received.add(pid)
            code = ReasonCode.SUCCESS if n or self.version != 5 else ReasonCode.NO_MATCHING_SUBSCRIBERS
            self.send(Pubrec(pid, code))

    def _on_pubrel(self, p: Pubrel) -> None:
        s = self.session
        assert s is not None
        if p.packet_id in s.qos2_received:
            s.qos2_received.discard(p.packet_id)
            store = self.core.store
            if s.persisted and store is not None:
                # PUBCOMP waits for the delete: a stale id would swallow a later message that
                # reuses the packet id after a crash
                store.qos2_released(s.client_id, p.packet_id)
                self.send_ordered(Pubcomp(p.packet_id), True)
            else:
                self.send_ordered(Pubcomp(p.packet_id), False)
        else:
            self.send_ordered(Pubcomp(p.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND), False)

    # ------------------------------------------------------------ acks from the client
    def _complete(self, s: Session, pid: int, now: float) -> None:
        """An outgoing QoS 1/2 flow ended (PUBACK, PUBCOMP, or a PUBREC refusal): free the
        packet id, delete its stored row, and refill the in-flight window."""
        del s.inflight[pid]
        store = self.core.store
        if s.persisted and store is not None:
            store.complete(s.client_id, pid)
        self.core.drain(s, now)

    def _on_puback(self, p: Puback, now: float) -> None:
        s = self.session
        assert s is not None
        out = s.inflight.get(p.packet_id)
        if out is not None and out.qos == 1:
            self._complete(s, p.packet_id, now)

    def _on_pubrec(self, p: Pubrec, now: float) -> None:
        s = self.session
        assert s is not None
        out = s.inflight.get(p.packet_id)
        if out is None or out.qos != 2:
            self.send(Pubrel(p.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
            return
        if not _ok(p.reason_code):
            self._complete(s, p.packet_id, now)
            return
        out.state = 1
        store = self.core.store if s.persisted else None
        if store is not None:
            # PUBREL (a Paho receiver hands the message over on it) waits until the message
            # and its state are durable: a crash cannot then duplicate a QoS 2 delivery
            store.mark_pubrec(s.client_id, p.packet_id)
        self.send_ordered(Pubrel(p.packet_id), store is not None)

    def _on_pubcomp(self, p: Pubcomp, now: float) -> None:
        s = self.session
        assert s is not None
        out = s.inflight.get(p.packet_id)
        if out is not None and out.state == 1:
            self._complete(s, p.packet_id, now)

    # ------------------------------------------------------------ SUBSCRIBE / UNSUBSCRIBE
    def _on_subscribe(self, p: Subscribe, now: float) -> None:
        core = self.core
        cfg = core.config
        router = core.router
        s = self.session
        assert s is not None
        v5 = self.version == 5
        props = p.properties
        sub_id = props.subscription_identifiers[0] if props.subscription_identifiers else None
        packet_selector = None
        for key, value in props.user_properties:
            if key == "filter":
                packet_selector = value
        codes: list[ReasonCode] = []
        reasons: list[str] = []
        retained: list[tuple[Message, int, bool, str, str | None]] = []
        for req in p.subscriptions:
            try:
                selector, full_filter = split_filter_prefix(req.topic_filter)
            except ValueError as exc:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                reasons.append(str(exc))
                continue
            if selector is None:
                selector = packet_selector
            shared = full_filter.startswith(_SHARE)
            plain = full_filter
            if shared:
                parts = full_filter.split("/", 2)
                if len(parts) < 3 or not parts[1] or "+" in parts[1] or "#" in parts[1]:
                    codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                    reasons.append(f"{full_filter!r}: $share/<group>/<filter> expected")
                    continue
                plain = parts[2]
                if req.no_local and v5:
                    self.disconnect(ReasonCode.PROTOCOL_ERROR, "no-local on a shared subscription")
                    return
            try:
                topics.validate_filter(plain)
            except topics.InvalidTopic as exc:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                reasons.append(f"{plain!r}: {exc}")
                continue
            if plain.count("/") >= cfg.max_topic_levels:
                core.stats.refused_topic_levels += 1
                core.log_limit("topic_levels", s.client_id, "topic filter beyond max_topic_levels")
                codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                reasons.append(f"{plain!r}: more than {cfg.max_topic_levels} topic levels")
                continue
            compiled: content.Filter | None = None
            if selector is not None:
                try:
                    compiled = content.compile(selector)
                except content.FilterSyntaxError as exc:
                    core.stats.refused_selector += 1
                    core.log_limit("selector", s.client_id, f"content filter refused: {exc}")
                    codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                    reasons.append(f"content filter {selector!r}: {exc} at position {exc.position}")
                    continue
            if full_filter in cfg.refused_filters:
                codes.append(ReasonCode.UNSPECIFIED_ERROR)
                reasons.append(f"{full_filter!r}: refused by configuration")
                continue
            if core.obs.authorize and not core.authorize(s, "subscribe", full_filter):
                codes.append(ReasonCode.NOT_AUTHORIZED)
                reasons.append(f"{full_filter!r}: not authorized")
                continue
            if router.index.entry_count(s.client_id) >= cfg.max_subscriptions_per_client and not any(
                e.topic_filter == full_filter for e in router.index.entries(s.client_id)
            ):
                core.stats.refused_subscription_quota += 1
                core.log_limit("subscriptions", s.client_id, "max_subscriptions_per_client reached")
                codes.append(ReasonCode.QUOTA_EXCEEDED)  # 3.1.1: 0x80 (codec)
                reasons.append(f"{full_filter!r}: more than {cfg.max_subscriptions_per_client} subscriptions")
                continue
            qos = min(req.qos, cfg.maximum_qos)
            options = SubOptions(
                qos,
                req.no_local,
                req.retain_as_published,
                req.retain_handling,
                sub_id,
                selector,
                plain,
            )
            old_selector = s.selectors.pop(full_filter, None)
            if compiled is not None and selector is not None:
                router.add_selector(selector, compiled)
                s.selectors[full_filter] = selector
            if old_selector is not None:
                router.release_selector(old_selector)
            outcome = router.index.subscribe(s.client_id, full_filter, options)
            codes.append(ReasonCode(qos))
            core.subscription_changed(s.client_id, SubscriptionAction.SUBSCRIBE, full_filter, selector, qos)
            rh = req.retain_handling
            if not shared and (rh == 0 or (rh == 1 and not outcome.replaced)):
                retained.extend(
                    (msg, min(qos, msg.qos), True, plain, selector)
                    for msg in router.retained_for(plain, selector, now)
                    if not core.obs.authorize or core.may_receive(s, msg.topic)
                )
        ack_props = NO_PROPERTIES
        if v5 and reasons and self.problem_info:
            ack_props = Properties(reason_string="; ".join(reasons))
        if s.persisted:
            core.save_entries(s)
        # a persisted subscription is acknowledged once it is durable (retained messages may
        # go first: MQTT 5 section 3.8.4 lets PUBLISHes precede the SUBACK)
        self.send_ordered(Suback(p.packet_id, tuple(codes), ack_props), s.persisted)
        sub_ids = () if sub_id is None else (sub_id,)
        for msg, qos, retain, plain, selector in retained:
            core.deliver(s, msg, qos, retain, sub_ids, plain, selector, now)

    def _on_unsubscribe(self, p: Unsubscribe) -> None:
        core = self.core
        router = core.router
        s = self.session
        assert s is not None
        codes: list[ReasonCode] = []
        for raw in p.topic_filters:
            try:
                _, full_filter = split_filter_prefix(raw)
                plain = full_filter.split("/", 2)[2] if full_filter.startswith(_SHARE) else full_filter
                topics.validate_filter(plain)
            except (ValueError, IndexError):
                codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                continue
            result = router.index.unsubscribe(s.client_id, full_filter)
            if result is topics.Unsubscribed.REMOVED:
                selector = s.selectors.pop(full_filter, None)
                if selector is not None:
                    router.release_selector(selector)
                codes.append(ReasonCode.SUCCESS)
                core.subscription_changed(
                    s.client_id, SubscriptionAction.UNSUBSCRIBE, full_filter, selector, None
                )
            elif result is topics.Unsubscribed.PARTIAL:
                codes.append(ReasonCode.SUCCESS)
                core.subscription_changed(
                    s.client_id, SubscriptionAction.PARTIAL_UNSUBSCRIBE, full_filter, None, None
                )
            else:
                codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
        if s.persisted:
            core.save_entries(s)
        self.send_ordered(Unsuback(p.packet_id, tuple(codes)), s.persisted)

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
        self.close("client disconnected")

    def taken_over(self, now: float) -> None:
        """Another connection CONNECTed with our client id (MQTT 5 section 3.1.4)."""
        self.disconnect(ReasonCode.SESSION_TAKEN_OVER, "session taken over")
        self.lost(now, keep_session=True)

    def check_keep_alive(self, now: float) -> None:
        self.clock = now
        if self.state is ConnectionState.AWAIT_CONNECT:
            if now > self.connect_deadline:
                self.close("no CONNECT")
            return
        ka = self.keep_alive
        if (
            ka
            and not self.paused
            and not self.blockers
            and not self.pending
            and not self.close_requested
            and now - self.last_rx > 1.5 * ka
        ):
            self.disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep alive timeout")
            self.lost(now)

    def lost(self, now: float, keep_session: bool = False) -> None:
        """The network connection is gone (or is being closed by us): detach the session."""
        if self.state is ConnectionState.CLOSED:
            return
        was_connected = self.state is ConnectionState.CONNECTED
        self.state = ConnectionState.CLOSED
        core = self.core
        core.connections.discard(self)
        core.relieve(self)  # its publishers must not wait for a receiver that is gone
        if self.blockers:  # a paused publisher: forget it at the receivers it waits for
            for receiver in core.congested:
                receiver.feeders.discard(self)
            self.blockers = 0
            core.stats.publishers_paused -= 1
        self.pending.clear()
        s = self.session
        if s is not None and was_connected and s.conn is self:
            if keep_session:
                # takeover: the will follows its delay; the new connection decides the session
                s.conn = None
                if self.will_on_close and s.will is not None:
                    delay = s.will.properties.will_delay_interval or 0
                    if delay == 0:
                        core._publish_will(s, now)
                    else:
                        s.will_due = now + delay
                        core.pending_wills.add(s)
            else:
                core.detach(s, self.will_on_close, now)
        if was_connected and core.obs.disconnect and s is not None:
            core._call(core.obs.disconnect, "on_disconnect", s.client_id, self.close_reason)
        if self.outbox or self.close_requested:
            core.dirty.add(self)
