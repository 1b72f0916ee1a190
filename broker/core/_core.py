"""The broker core: sessions, routing, delivery, flow control and timers, with no I/O.

Like h11, nothing here touches a socket or awaits.  :class:`Core` owns the session registry
and every session state transition (MQTT 5 section 4.1): *attached* (``conn`` set),
*detached* (kept until its expiry interval, queuing QoS 1/2 messages), *ended* (removed with
its subscriptions) — ``attach`` (new / resumed / clean start / takeover), ``detach`` (will
scheduling), ``end_session`` and ``tick`` (keep-alive 1.5x, will delay, session expiry,
slow consumers, ``$SYS``).  ``publish`` routes a message (:class:`~broker.core._router.Router`)
and ``deliver`` sends, queues or drops it per receiver, with flow control (docs/broker.md,
"Flow control"; issue 14): a receiver over its queue's high-water mark pauses the publishing
:class:`~broker.core._connection.Connection`.  Durability goes through the journal
(:mod:`broker.core._journal`), hooks through :mod:`broker.core._observers`.  The core marks
connections that have output as dirty and ``flush`` hands their bytes to the transport (one
``write`` per connection per event-loop callback: write coalescing).

Per-client memory is bounded: at most ``max_inflight`` unacknowledged and
``max_queued_messages`` queued QoS 1/2 messages; QoS 0 messages for a connection that does
not read are dropped and counted.  Unit tests drive the core with plain callables and no
event loop (tests/broker/test_broker_session_machine.py).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Final

import content
import topics
from broker._logging import LogLimiter, bounded, cut, fields
from broker.core._backoff import LoginBackoff
from broker.core._bans import BanList
from broker.core._clock import Clock
from broker.core._connection import NO_ALIASES_IN, NO_ALIASES_OUT, NO_FEEDERS
from broker.core._conntimers import ConnectionTimers
from broker.core._deadlines import Deadlines
from broker.core._hooks import CoreHooks, Publication, SubscriptionAction, SubscriptionChange
from broker.core._journal import Journal
from broker.core._observers import Observers
from broker.core._options import CoreConfig
from broker.core._qbound import QueueBound, size_of
from broker.core._quota import Quotas
from broker.core._router import RELEASE_SLICE, Router, SubscribeLimits
from broker.core._session import NEVER, ConnectionState, Outgoing, Session, Sink, Stats
from broker.core._shared import SharedPolicy, Strategy, group_strategies
from broker.packets import NO_PROPERTIES, PublishTemplate, Pubrel, ReasonCode
from broker.values import (
    ATOM_CLIENT,
    PEER_PREFIX,
    PUBLISH_SENT,
    PUBREL_SENT,
    QUEUED,
    Message,
    Route,
    SubOptions,
)

if TYPE_CHECKING:
    from broker.core._composite import Composites
    from broker.core._connection import Connection

__all__ = ["LIMIT_LOG_INTERVAL", "Core"]

log = logging.getLogger("broker")
#: seconds between two log lines about the same kind of limit refusal
LIMIT_LOG_INTERVAL = 10.0
#: the ``extra`` of a failed hook's log line (``--log-format json``: broker._logging)
_HOOK_FAILED = fields("hook.failed")
#: the ``$SYS/broker/composite/...`` counters of a broker whose composite subscriptions were
#: never made (:attr:`Core.composite`): ``Composites.sys_values`` of a new one
NO_COMPOSITES_SYS = dict.fromkeys(
    (
        "$SYS/broker/composite/subscribers",
        "$SYS/broker/composite/offers",
        "$SYS/broker/composite/events",
        "$SYS/broker/composite/refused",
        "$SYS/broker/composite/duplicate_atoms",
        "$SYS/broker/composite/duplicate_events",
    ),
    "0",
)
#: tolerance of the hung-consumer time against the tick timer (which may fire a hair early)
TICK_SLACK = 0.001
#: a fan-out of at least this many deliveries, of a PUBLISH read alone (``Core.lone``) while
#: no other output waits, starts writing before it is fully encoded: every ``EARLY_CHUNK``
#: deliveries the connections it made dirty are flushed (each holds this one message, so
#: nothing is lost to write coalescing); the first receiver's copy leaves after EARLY_CHUNK
#: encodings instead of all of them (issue 42 item 2: a fleet's heaviest message). Its
#: routing is streamed too (``Router.route_head``): once EARLY_MIN routes are known the
#: fan-out is big, and the rest are computed in parts of EARLY_CHUNK between the deliveries,
#: so the first copy leaves after EARLY_MIN routes instead of all of them. ``Final``:
#: the compiled core inlines them; a plain module global was a dictionary lookup in every
#: ``publish`` (``due = EARLY_CHUNK``), ~130 instructions of ~16,400 per QoS 0 delivery
#: (``bench_broker_smoke.py --core-qos0`` under callgrind, docs/performance-broker.md)
EARLY_MIN: Final = 128
EARLY_CHUNK: Final = 64


def _taken(conn: Connection) -> int:
    """The bytes ``conn``'s socket has taken so far (written, less what its transport holds)."""
    io = conn.io
    return conn.sent - (0 if io is None else io.get_write_buffer_size())


def _will_due(s: Session) -> float | None:
    return s.will_due


def _expires_at(s: Session) -> float | None:
    return s.expires_at


class Core:
    """Session registry, router, counters and timers of one broker (no I/O)."""

    def __init__(
        self, config: CoreConfig, hooks: Iterable[CoreHooks] = (), clock: Clock | None = None
    ) -> None:
        self.config = cfg = config
        self.clock = clock or Clock()
        limits = SubscribeLimits(
            cfg.max_topic_levels, cfg.max_subscriptions_per_client, cfg.maximum_qos, cfg.refused_filters
        )
        shared = SharedPolicy(
            Strategy(cfg.shared_subscription_strategy),
            group_strategies(cfg.shared_subscription_group_strategy),
            cfg.shared_subscription_seed,
        )
        self.router = Router(
            cfg.partial_unsubscribe,
            cfg.content_engine,
            batch_min=cfg.content_batch_min,
            limits=limits,
            shared=shared,
        )
        self.sessions: dict[str, Session] = {}
        self.connections: set[Connection] = set()
        self.connected = 0  # connections in state CONNECTED ($SYS clients/connected, O(1))
        self.conn_timers = ConnectionTimers(cfg.tick_interval)
        self._limits = LogLimiter(LIMIT_LOG_INTERVAL)  # log_limit's lines, per kind
        self.dirty: set[Connection] = set()
        #: the PUBLISH being handled was its read's only packet (``Connection.received`` sets
        #: it, :meth:`publish` takes it): its fan-out may write early (``EARLY_MIN``)
        self.lone = False
        self.stats = Stats()
        self.obs = Observers(hooks)
        #: publish quotas (issue 39; core/_quota.py): None without ``quotas`` rules
        self.quotas: Quotas | None = Quotas(self, cfg.quotas) if cfg.quotas else None
        # sessions waiting for their will delay / their expiry, due ones found in O(k log n)
        self.pending_wills = Deadlines(_will_due)
        self.expiring = Deadlines(_expires_at)
        self.started = self.clock.monotonic()
        # PUBLISH templates of the message being fanned out ([3.1/3.1.1, 5])
        self.tmpl_msg: Message | None = None
        self.tmpl: list[PublishTemplate | None] = [None, None]
        self._next_sys = self.started + cfg.sys_interval if cfg.sys_interval > 0 else None
        # durability (docs/persistence.md): Broker.start gives the journal its store
        self.journal = Journal(self)
        #: bans checked at CONNECT (broker/core/_bans.py; edited by the admin API)
        self.bans = BanList()
        #: this broker's node id in a cluster (set by the cluster; the bridge records it)
        self.node: str | None = None
        #: more ``$SYS`` values (topic -> text), from the packages above (the cluster)
        self.sys_sources: list[Callable[[], dict[str, str]]] = []
        #: more ``/metrics`` counters (broker._metrics): name -> {reason -> count}, exported as
        #: ``siftmq_<name>_total{reason="..."}`` (the cluster's refused datagrams and tokens)
        self.metric_sources: list[Callable[[], dict[str, dict[str, int]]]] = []
        #: composite subscriptions (issue 16; atoms live in the router's index): None until
        #: the first use of :attr:`composite` (a composite subscription, a store's saver, the
        #: cluster), so that a broker without them never imports their modules (issue 42 item 1)
        self.composite_if_made: Composites | None = None
        # flow control (docs/broker.md, "Flow control"): the connection whose PUBLISH is
        # being routed (the one to pause when a receiver is over its high-water mark), the
        # receivers over their mark, and the paused publishers to resume at the next flush
        self.current: Connection | None = None
        #: while an inbound QoS 2 message of a persisted publisher (or a peer's) is routed:
        #: its encoded deliveries (``Connection.write_publish`` sets them aside), sent only once
        #: its packet id is durable with them (:meth:`defer_qos2`, ``Journal.hold_writes``;
        #: docs/persistence.md, "Exactly once, end to end")
        self.deferred: list[tuple[Connection, bytes]] | None = None
        #: QoS 2 deliveries wait for the store's next durable signal (``Broker.start`` sets it
        #: with a store; docs/persistence.md).  benchmarks/bench_qos2_commit.py clears it for
        #: its baseline: deliveries before the commit, as before issue 30 (a duplicate after a
        #: crash)
        self.hold_qos2 = False
        self.congested: set[Connection] = set()
        self.resumable: set[Connection] = set()
        self.high_water = cfg.high_water
        self.low_water = cfg.low_water
        # hung-consumer detection: congested receivers -> (bytes their socket had taken, when
        # that count last moved), read at the ticks; the receivers found hung
        self.progress: dict[Connection, tuple[int, float]] = {}
        self.hung: set[Connection] = set()
        self.last_check = self.started
        #: a cluster's link sessions (client id ``$cluster/...``, set by the cluster; issue 30):
        #: QoS 1/2 messages one may queue (its bound is mostly time: the peer expiry), and
        #: seconds a congested link may pace its publishers before it counts as slow (its
        #: publishers released, its QoS 1/2 still queued): an unreachable node must not stall
        #: the others' publishers beyond the failure timeout; None = ``pace`` without end
        self.peer_queue_limit = cfg.max_queued_messages
        self.peer_pace_limit: float | None = None
        #: sessions bounded by a queue bound of their own instead of ``max_queued_messages``
        #: (client id -> bound; the outbound bridges', core/_qbound.py)
        self.queue_bounds: dict[str, QueueBound] = {}
        #: asked before a published retained message is stored (False: not stored, still
        #: routed): a cluster keeps one converging register per topic (docs/cluster.md)
        self.retain_hook: Callable[[Message], bool] | None = None
        #: set by a cluster: ``(message, routes)`` -> the message its links get (origin id)
        self.stamp_hook: Callable[[Message, list[Route]], Message] | None = None
        #: set by a cluster: ``(client id, password)`` -> None when the CONNECT of a client id
        #: ``$cluster/...`` carries a valid token of the cluster's secret, else why not (and it
        #: logs that, rate-limited; ``broker.core._internal.internal_refusal``); None: no
        #: cluster, every such client id refused
        self.peer_auth: Callable[[str, bytes | None], str | None] | None = None
        #: failed logins per source address and their back-off (core/_backoff.py)
        self.login_backoff = LoginBackoff(
            cfg.auth_failures, cfg.auth_failure_window, cfg.auth_backoff, cfg.auth_backoff_max
        )
        #: set by the transport adapter (``Broker``): ``await_check(awaitable, done)`` awaits an
        #: authenticate hook's awaitable off this sans-IO core and calls ``done(outcome)`` on
        #: the loop with its result or its exception, then flushes (core/_connect.py); None:
        #: no adapter, an awaitable verdict refuses the CONNECT
        self.await_check: Callable[[Awaitable[bool | None], Callable[[object], None]], None] | None = None

    @property
    def composite(self) -> Composites:
        """The composite subscriptions (core/_composite.py), made and their module imported at
        the first use: a None check at a composite SUBSCRIBE or UNSUBSCRIBE, never on PUBLISH
        (a publication reaches them only through an atom's route, which exists only once they
        were made). O(1)."""
        comp = self.composite_if_made
        if comp is None:
            from broker.core._composite import Composites

            comp = self.composite_if_made = Composites(self)
        return comp

    # ------------------------------------------------------------ hooks
    def observe(self, hooks: Iterable[CoreHooks]) -> None:
        """The registered hooks changed (``Broker.add_hook``): split them again.  Called from
        the adapter between events (never inside a fan-out); a CONNECT waiting for a hook's
        verdict goes on with the hooks after that one (core/_connect.py). O(hooks)."""
        self.obs = Observers(hooks)
        if self.composite_if_made is not None:
            self.composite_if_made._observe()

    def _call(self, hooks: list[CoreHooks], name: str, *args: object) -> None:
        for h in hooks:
            try:
                getattr(h, name)(*args)
            except Exception:
                self.stats.hook_errors += 1
                log.exception("hook %s.%s failed", type(h).__name__, name, extra=_HOOK_FAILED)

    def _opinion(self, hooks: list[CoreHooks], name: str, *args: object) -> bool | None:
        for h in hooks:
            try:
                answer = getattr(h, name)(*args)
            except Exception:
                self.stats.hook_errors += 1
                log.exception("hook %s.%s failed", type(h).__name__, name, extra=_HOOK_FAILED)
                return False
            if answer is not None:
                return bool(answer)
        return None

    def authorize(self, session: Session, action: str, topic: str) -> bool:
        """The authorize hooks' decision, asked with the session's user name only if it was
        authenticated (``Session.authenticated``; docs/security.md, "Who is a user")."""
        if not self.obs.authorize:
            return True
        user = session.verified_username
        return (
            self._opinion(self.obs.authorize, "authorize", session.client_id, user, action, topic)
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

    def subscription_changed(  # noqa: PLR0917 (the change's fields, positional as before)
        self,
        client_id: str,
        action: SubscriptionAction,
        topic_filter: str | None,
        selector: str | None,
        qos: int | None,
        entries: int | None = None,
    ) -> None:
        """Tell the subscription observers; ``entries``: the client's entries after the
        change (None: the index's count; a departure's are still there, ``end_session``)."""
        if self.obs.subscription:
            change = SubscriptionChange(
                self.clock.wall(),
                client_id,
                action,
                topic_filter,
                selector,
                qos,
                self.router.index.entry_count(client_id) if entries is None else entries,
            )
            self._call(self.obs.subscription, "on_subscription_change", change)

    # ------------------------------------------------------------ sessions
    def attach(self, conn: Connection, client_id: str, clean_start: bool, expiry: int, now: float) -> bool:
        """Bind ``conn`` to the session of ``client_id``; returns "session present"."""
        old = self.sessions.get(client_id)
        if old is None and self.router.departed:
            self.router.settle_client(client_id)  # a departed predecessor's entries: gone first
        will_cleared = False  # a will change to store: the CONNACK then waits for its commit
        if old is not None and old.conn is not None:
            if old.conn.version != 5 and old.will and not (clean_start or old.expiry_interval == 0):
                # 3.1 / 3.1.1: the will is dropped when the new connection continues the
                # session, as mosquitto (docs/broker.md, "A will on takeover"); v5: its delay
                old.will = None
                self.journal.will_cleared(old)
                will_cleared = True
            old.conn.taken_over(now)
            self.subscription_changed(client_id, SubscriptionAction.TAKEOVER, None, None, None)
        if old is not None and old.will_due is not None:
            # a new network connection before the will delay elapsed: no will [MQTT-3.1.2-8]
            old.will = None
            old.will_due = None
            self.pending_wills.discard(old)
            self.journal.will_cleared(old)
            will_cleared = True
        if old is not None and (
            clean_start
            or old.expiry_interval == 0  # a clean session is never reused [MQTT-3.1.2-6]
            or (old.expires_at is not None and old.expires_at <= now)
        ):
            self.end_session(old, now)
            old = None
        if old is None:
            session = Session(client_id, expiry, True)  # lean: containers on first use
            self.sessions[client_id] = session
            present = False
        else:
            session = old
            # its CONNACK may skip the commit if the stored row still tells the truth (Journal.connected)
            self.journal.resumed_as_stored = not will_cleared and old.expiry_interval == expiry
            session.expiry_interval = expiry
            present = True
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
        if self.router.departed:
            self.router.settle_client(client_id)
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

    def end_session(self, session: Session, now: float, depart: bool = False) -> None:
        """The session ends: pending will published, subscriptions and queues dropped.

        ``depart`` (its client left, ``detach``): the session leaves the registry at once,
        so nothing is routed to it any more, but its entries and selectors leave the router
        later, in slices between loop turns (``Router.depart``; a client connecting again
        with its id finishes that first, ``attach``): a fleet's departure costs each read
        of a DISCONNECT O(1) here instead of O(its subscriptions) (issue 42 item 2)."""
        if session.will is not None and session.conn is None:
            self.publish_will(session, now)
        cid = session.client_id
        sessions = self.sessions
        if sessions.get(cid) is session:
            del sessions[cid]
        if session.will_due is not None:
            self.pending_wills.discard(session)
        if self.expiring:  # (discarding from an empty set is a no-op, whatever expires_at says)
            self.expiring.discard(session)
        router = self.router
        had = router.index.entry_count(cid)
        if depart and session.sink is None and cid not in sessions and not cid.startswith(PEER_PREFIX):
            router.depart(cid, session.take_selectors())
        else:
            for selector in session.selectors.values():
                router.release_selector(selector)
            session.selectors.clear()
            router.index.remove_client(cid)
        session.inflight.clear()
        session.queue.clear()
        if self.queue_bounds and session.client_id in self.queue_bounds:
            self.queue_bounds[session.client_id].queued_bytes = 0
            self.queue_bounds[session.client_id].release(self)  # its paced publishers
        session.qos2_received.clear()
        self.journal.ended(session)
        comp = self.composite_if_made
        if comp is not None:
            expired = session.expires_at is not None and session.expires_at <= now
            had += comp.drop_client(cid, expired)
        if had:
            self.subscription_changed(cid, SubscriptionAction.SESSION_END, None, None, None, 0)

    def detach(self, session: Session, publish_will: bool, now: float) -> None:
        """The network connection of ``session`` ended (normally or not)."""
        session.conn = None
        if publish_will and session.will is not None:
            delay = session.will.properties.will_delay_interval or 0
            if delay == 0 or session.expiry_interval == 0:
                self.publish_will(session, now)
            else:
                session.will_due = now + min(delay, session.expiry_interval)
                self.pending_wills.add(session)
        else:
            session.will = None
        if session.expiry_interval == 0:
            self.end_session(session, now, True)
        elif session.expiry_interval != NEVER:
            session.expires_at = now + session.expiry_interval
            self.expiring.add(session)
        self.journal.detached(session, now)

    def publish_will(self, session: Session, now: float) -> None:
        will = session.will
        session.will = None
        session.will_due = None
        self.pending_wills.discard(session)
        if will is None:
            return
        self.journal.will_cleared(session)
        props = will.properties
        if props.will_delay_interval is not None:
            props = dataclasses.replace(props, will_delay_interval=None)
        self.publish(
            Message.create(will.topic, will.payload, will.qos, will.retain, props, session.client_id, now),
            now,
        )

    # ------------------------------------------------------------ publish / deliver
    def publish(  # noqa: C901, PLR0912, PLR0915 (hot path: one frame per routed message)
        self, msg: Message, now: float, routes: list[Route] | None = None, internal: bool = False
    ) -> int:
        """Store (if retained), route and deliver ``msg``; returns the number of deliveries.

        ``routes``: the router's answer computed beforehand (``Router.route_batch``); without
        it, a lone PUBLISH's big fan-out is routed in parts between its deliveries
        (``Router.route_head``, ``EARLY_MIN``), any other whole first (``Router.route``).
        ``internal``: the broker's own publication (``$SYS``, a cluster's control messages),
        counted in ``Stats.messages_internal``, not in ``messages_received`` (the clients'
        traffic, issue 38).  O(routes)."""
        router = self.router
        if msg.retain and (self.retain_hook is None or self.retain_hook(msg)):
            self.journal.retain(msg, now)
        stamp = self.stamp_hook
        rest: Iterator[list[Route]] | None = None  # the routes still to compute (streamed)
        if routes is None:
            # (len: the set's size read in compiled code, where its truth value is a call)
            if self.lone and not len(self.dirty) and self.deferred is None and (stamp is None or not msg.qos):
                # the fan-out may write early: its routes computed as it is delivered
                routes, rest = router.route_head(msg, EARLY_MIN, EARLY_CHUNK)
            else:
                routes = router.route(msg)
        # a cluster stamps a QoS 1/2 publication that crosses a link with its origin id
        # (broker.core._atom_ids); the stamped copy goes to the links (and to composite atoms)
        stamped = msg
        if stamp is not None and msg.qos:
            stamped = stamp(msg, routes)
        obs = self.obs
        outer_msg = obs.fan_msg  # an outer fan-out's, restored after this one: a sink may publish
        outer_fan = obs.fan
        outer_call = obs.begin(msg) if obs.recording else -1  # record this fan-out's writes
        sessions = self.sessions
        deliver = self.deliver
        may_receive = self.may_receive if obs.authorize else None
        atoms: list[int] | None = None  # composite atoms matched (routes without a session)
        gone = 0  # routes to departed clients whose entries still wait (Router.depart)
        # a big fan-out of a lone PUBLISH with no other output waiting writes as it goes
        total = len(routes)
        early = self.lone and total >= EARLY_MIN and not self.dirty and self.deferred is None
        self.lone = False
        due = EARLY_CHUNK
        part = routes
        while True:  # the routes, then each part of the rest as the router computes it
            for r in part:
                s = sessions.get(r.client_id)
                if s is not None:
                    if may_receive is None or may_receive(s, msg.topic):
                        m = stamped if stamped is not msg and r.client_id.startswith(PEER_PREFIX) else msg
                        deliver(s, m, r.qos, r.retain, r.subscription_ids, r.topic_filter, r.selector, now)
                elif r.client_id.startswith(ATOM_CLIENT):
                    if atoms is None:
                        atoms = []
                    atoms.extend(r.subscription_ids)
                else:
                    gone += 1
                if early:
                    due -= 1
                    if due == 0:
                        due = EARLY_CHUNK
                        self.flush_written()
            if rest is None:
                break
            more = next(rest, None)
            if more is None:
                break
            part = more
            total += len(part)
        if internal:
            self.stats.messages_internal += 1
        else:
            self.stats.messages_received += 1
        n = (total if atoms is None else total - len(atoms)) - gone
        if obs.recording:
            obs.end(self.clock.wall(), msg, n, outer_msg, outer_fan, outer_call, self.stats)
        if atoms is not None:
            self.composite.offer(stamped, atoms, now)
        if obs.publication:
            pub = Publication(
                self.clock.wall(),
                msg.message_id,
                msg.publisher_id,
                msg.topic,
                len(msg.payload),
                msg.qos,
                msg.retain,
                n,
            )
            self._call(self.obs.publication, "on_publication", pub)
        return n

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
            s.own_inflight()[pid] = out  # a lean session shares an empty window until now
            if s.persisted:
                self.journal.outgoing(s, out, PUBLISH_SENT, pid, now)
            conn.write_publish(msg, qos, retain, False, pid, sub_ids, topic_filter, selector, now)
            return
        bounds = self.queue_bounds
        bound = bounds.get(s.client_id) if bounds else None
        if bound is not None:
            if not bound.admit(self, s, out):
                return
            queue = s.queue
        elif (
            len(queue) >= self.config.max_queued_messages
            and (not s.client_id.startswith(PEER_PREFIX) or len(queue) >= self.peer_queue_limit)
            and self._queue_full(s, conn)
        ):
            return
        if not queue:  # a lean session shares an empty queue until now
            queue = s.own_queue()
        queue.append(out)
        if s.persisted:
            self.journal.outgoing(s, out, QUEUED, None, now)
        if conn is not None and len(queue) >= self.high_water and not conn.slow:
            self._congested(conn, now)

    # ------------------------------------------------------------ QoS 2 deferral
    def defer_qos2(self, persisted: bool) -> bool:
        """A QoS 2 message is about to be routed (a persisted publisher's, or a peer's:
        ``persisted``): with a store, its deliveries are encoded and set aside
        (:attr:`deferred`) until its packet id is submitted, then held until the commit
        (``Journal.hold_writes``).  Exactly once across a crash: a delivery that left before
        the id was durable is delivered again after the publisher's resend (issue 30).  True
        if deferring (end with :meth:`take_deferred`). O(1)."""
        if self.journal.store is None or not persisted or not self.hold_qos2 or self.deferred is not None:
            return False
        self.deferred = []
        return True

    def take_deferred(self) -> list[tuple[Connection, bytes]]:
        """The deliveries set aside since :meth:`defer_qos2` (deferring ends). O(1)."""
        out = self.deferred or []
        self.deferred = None
        return out

    # ------------------------------------------------------------ a session moved in from another node
    def deliver_duplicate(self, s: Session, msg: Message, route: Route, now: float) -> None:
        """Deliver ``msg`` to ``s`` as a possible duplicate (a copy another node may have
        delivered: a session moving between cluster nodes): with DUP if it is sent at once (the
        same steps as :meth:`deliver`'s direct path), the usual way otherwise. O(1)."""
        conn = s.conn
        qos = route.qos
        if (
            qos == 0
            or s.sink is not None
            or conn is None
            or conn.paused
            or s.queue
            or len(s.inflight) >= conn.window
        ):
            self.deliver(
                s, msg, qos, route.retain, route.subscription_ids, route.topic_filter, route.selector, now
            )
            return
        out = Outgoing(msg, qos, route.retain, route.subscription_ids, route.topic_filter, route.selector)
        pid = s.allocate_pid()
        s.own_inflight()[pid] = out  # a lean session shares an empty window until used
        if s.persisted:
            self.journal.outgoing(s, out, PUBLISH_SENT, pid, now)
        conn.write_publish(
            msg, qos, route.retain, True, pid, route.subscription_ids, route.topic_filter, route.selector, now
        )

    def resume_inflight(  # noqa: PLR0917
        self, s: Session, pid: int, msg: Message, route: Route, state: int, now: float
    ) -> bool:
        """A message that was in flight to the client on another node, under packet id
        ``pid`` in flow ``state`` (``broker.values``: PUBREL_SENT, else PUBLISH_SENT), goes on
        here as a reconnecting client's would (``OUTGOING_FLOW``): PUBREL again, or PUBLISH
        with DUP; written through to the store for a persisted session.  False, and nothing
        done, when ``pid`` is in flight already or ``s`` is an in-process one. O(1)."""
        if pid in s.inflight or s.sink is not None:
            return False
        out = Outgoing(
            msg, route.qos, route.retain, route.subscription_ids, route.topic_filter, route.selector
        )
        out.state = PUBREL_SENT if state == PUBREL_SENT else PUBLISH_SENT
        s.own_inflight()[pid] = out
        if s.persisted:
            self.journal.outgoing(s, out, out.state, pid, now)
        conn = s.conn
        if conn is not None:
            if out.state == PUBREL_SENT:
                conn.send(Pubrel(pid))
            else:
                conn.write_publish(
                    msg, out.qos, out.retain, True, pid, out.sub_ids, out.topic_filter, out.selector, now
                )
        return True

    def keep_qos2_id(self, s: Session, pid: int) -> None:
        """An incoming QoS 2 packet id of the client that the other node received and did not
        release yet: its PUBLISH sent again with DUP is not routed twice. O(1)."""
        if pid not in s.qos2_received:
            s.own_ids().add(pid)
            self.journal.qos2_received(s, pid)

    # ------------------------------------------------------------ flow control
    def _queue_full(self, s: Session, conn: Connection | None) -> bool:
        """A QoS 1/2 message finds the queue of ``s`` full: dropped and counted, or (policy
        ``disconnect``, or a hung consumer) the client is disconnected; True. A hung consumer
        whose socket takes bytes again is paced again instead (False: queue the message,
        past the bound by what is being routed before its publishers pause)."""
        if conn is not None and conn in self.hung and self._recovered(conn):
            return False
        self.stats.queue_overflow += 1
        self.stats.dropped_queue_full += 1
        if s.client_id.startswith(PEER_PREFIX):
            self.stats.dropped_peer_queue_full += 1
        if conn is not None and (conn.policy == "disconnect" or conn in self.hung):
            # a hung consumer is disconnected rather than lose acknowledged messages while
            # connected (a persistent session keeps its queue)
            self.log_limit("queue", s.client_id, f"queue full ({len(s.queue)} messages), disconnecting")
            conn.disconnect(ReasonCode.QUOTA_EXCEEDED, "message queue full")
            return True
        self.log_limit("queue", s.client_id, f"queue full ({len(s.queue)} messages): message dropped")
        return True

    def _recovered(self, conn: Connection) -> bool:
        """A hung consumer's socket took bytes since it was found hung (a client that was only
        starved of CPU, or paused by a GC): an ordinary congested receiver again, paced; the
        grace still counts from when it first went over its mark."""
        mark = self.progress.get(conn)
        if mark is None or _taken(conn) == mark[0]:
            return False
        self.hung.discard(conn)
        self.progress.pop(conn, None)
        since = conn.congested_since
        if since is not None and self.last_check - since >= self.config.slow_consumer_grace:
            return False  # past the grace: an ordinary slow consumer from now on
        conn.slow = False
        self.stats.slow_consumers -= 1
        return True

    def _congested(self, conn: Connection, now: float) -> None:
        """``conn``'s queue reached the high-water mark: pause the connection whose PUBLISH is
        being routed (O(1)); it resumes when the queue is back at the low-water mark."""
        if conn.congested_since is None:
            conn.congested_since = now
            self.congested.add(conn)
            self.progress[conn] = (_taken(conn), now)  # hung if that does not move
        pub = self.current
        if pub is None or pub is conn or pub in conn.feeders:
            return
        if conn.feeders is NO_FEEDERS:  # the shared empty set of a connection never congested
            conn.feeders = set()
        conn.feeders.add(pub)
        self.block(pub)

    def block(self, pub: Connection) -> None:
        """One more reason not to read ``pub`` (a congested receiver, the store's backlog, its
        publish quota): its first one pauses it (counted, socket throttled). O(1)."""
        pub.blockers += 1
        if pub.blockers == 1:
            self.stats.publisher_pauses += 1
            self.stats.publishers_paused += 1
            self.resumable.discard(pub)
            pub.link.throttle(True)

    def unblock(self, pub: Connection) -> bool:
        """One reason not to read ``pub`` gone: True when it was the last (``pub`` is
        resumable at the next flush). O(1)."""
        pub.blockers -= 1
        if pub.blockers == 0:
            self.stats.publishers_paused -= 1
            self.resumable.add(pub)
            return True
        return False

    def relieve(self, conn: Connection) -> None:
        """``conn`` is no longer congested (drained, slow, or gone): release its publishers."""
        if conn.congested_since is not None:
            conn.congested_since = None
            self.congested.discard(conn)
            self.progress.pop(conn, None)
        if conn.slow:
            conn.slow = False
            self.stats.slow_consumers -= 1
            self.hung.discard(conn)
        self._release_feeders(conn)

    def _release_feeders(self, conn: Connection) -> None:
        for pub in conn.feeders:
            self.unblock(pub)
        if conn.feeders:
            conn.feeders = NO_FEEDERS  # its own set released (it reads again)

    def check_flow(self, now: float) -> None:
        """Slow and hung consumers (``tick``, and between ticks while receivers are congested)."""
        # a check far later than the tick interval: the loop itself stalled, so a receiver's
        # socket taking nothing since the last check says nothing about the receiver
        stalled = now - self.last_check > 1.5 * self.config.tick_interval
        self.last_check = now
        if self.congested:
            self._check_slow(now, stalled)

    def _check_slow(self, now: float, stalled: bool) -> None:
        """Receivers over their mark for longer than the grace time, or whose socket took
        nothing for ``hung_consumer_time`` (hung), become slow consumers: their publishers are
        released and their policy applies (``pace``: never slow). O(congested receivers): one
        write-buffer size read per receiver over its mark per tick, nothing per message."""
        grace = self.config.slow_consumer_grace
        hung_after = self.config.hung_consumer_time
        # a cluster's link sessions are ``pace`` but slow after ``peer_pace_limit`` (issue 30)
        peer_limit = self.peer_pace_limit
        progress = self.progress
        for conn in [
            c
            for c in self.congested
            if not c.slow
            and (
                c.policy != "pace" or (peer_limit is not None and (c.client_id or "").startswith(PEER_PREFIX))
            )
        ]:
            since = conn.congested_since
            if since is None:
                continue
            limit = grace if conn.policy != "pace" else peer_limit or 0.0
            if now - since >= limit:
                self._slow(conn, f"slow consumer for {limit:g} s")
                continue
            if hung_after <= 0 or conn.policy == "pace":
                continue
            taken = _taken(conn)
            mark = progress.get(conn)
            if mark is None or mark[0] != taken or stalled:
                progress[conn] = (taken, now)
            elif now - mark[1] >= hung_after - TICK_SLACK:
                self.stats.hung_consumer_events += 1
                self._slow(conn, f"hung consumer (its socket took nothing for {now - mark[1]:.2f} s)")
                if not conn.close_requested:
                    self.hung.add(conn)
                    progress[conn] = mark  # kept: it recovers if its socket takes bytes again
        for conn in list(self.hung):
            self._recovered(conn)

    def _slow(self, conn: Connection, why: str) -> None:
        conn.slow = True
        self.progress.pop(conn, None)
        self.stats.slow_consumers += 1
        self.stats.slow_consumer_events += 1
        self._release_feeders(conn)
        cid = conn.client_id
        if conn.policy == "disconnect":
            self.stats.slow_disconnected += 1
            self.log_limit("slow_consumer", cid, f"{why}, disconnecting")
            conn.disconnect(ReasonCode.QUOTA_EXCEEDED, "slow consumer")
        else:
            self.log_limit("slow_consumer", cid, f"{why}: QoS 0 dropped, QoS 1/2 queued")

    def drain(self, s: Session, now: float) -> None:
        """Move queued messages into the in-flight window while the connection can take them."""
        conn = s.conn
        if conn is None:
            return
        queue = s.queue
        # something to send: the window is its own from here (a lean session shares an empty one)
        inflight = s.own_inflight() if queue else s.inflight
        window = conn.window
        bounds = self.queue_bounds
        bound = bounds.get(s.client_id) if bounds else None
        while queue and len(inflight) < window and not conn.paused and not conn.close_requested:
            out = queue.popleft()
            if bound is not None:
                bound.queued_bytes -= size_of(out)
            msg = out.msg
            if msg.expires_at is not None and msg.expires_at <= now:
                self.stats.publish_dropped += 1
                self.journal.dropped(s, out)
                continue
            pid = s.allocate_pid()
            inflight[pid] = out
            self.journal.sent(s, out, pid)
            conn.write_publish(
                msg, out.qos, out.retain, False, pid, out.sub_ids, out.topic_filter, out.selector, now
            )
        if conn.congested_since is not None and len(queue) <= self.low_water and not conn.paused:
            self.relieve(conn)
        if bound is not None and bound.paced and bound.drained(len(queue)):
            bound.release(self)  # queue_policy "pace" (core/_qbound.py)

    # ------------------------------------------------------------ timers
    def tick(self, now: float, settle: int = RELEASE_SLICE, budget: float = 0.0) -> None:
        """Keep-alive timeouts, will delays, session expiry, released content selectors
        (a slice of ``settle`` per tick at least, and of ``budget`` seconds at most when
        given: ``Router.settle_selectors``; the broker settles slices between its ticks too)
        and ``$SYS`` (call periodically)."""
        self.conn_timers.expire(now)  # CONNECT and keep-alive deadlines due (core/_conntimers.py)
        if self.pending_wills:
            for s in self.pending_wills.due(now):
                self.publish_will(s, now)
        if self.expiring:
            for s in self.expiring.due(now):
                self.end_session(s, now)
        self.check_flow(now)
        if self.quotas is not None:
            self.quotas.tick(now)  # publishers whose quota refilled read again
        if self.composite_if_made is not None:
            self.composite_if_made.tick()  # composite losses in idle subscriptions, when observed
        if self.router.releasing:
            self.router.settle_selectors(settle, budget)  # released selectors leave the engine in slices
        if self._next_sys is not None and now >= self._next_sys:
            self._next_sys = now + self.config.sys_interval
            self.publish_sys(now)

    def sys_values(self, now: float) -> dict[str, str]:
        st = self.stats
        comp = self.composite_if_made
        composites = NO_COMPOSITES_SYS if comp is None else comp.sys_values()
        return {
            "$SYS/broker/version": "siftmq",
            "$SYS/broker/uptime": str(int(now - self.started)),
            "$SYS/broker/clients/connected": str(self.connected),
            "$SYS/broker/clients/total": str(len(self.sessions)),
            "$SYS/broker/messages/received": str(st.messages_received),
            "$SYS/broker/messages/internal": str(st.messages_internal),
            "$SYS/broker/messages/sent": str(st.messages_sent),
            "$SYS/broker/messages/dropped": str(st.publish_dropped),
            "$SYS/broker/messages/queue_overflow": str(st.queue_overflow),
            "$SYS/broker/messages/queue_overflow/cluster_links": str(st.dropped_peer_queue_full),
            "$SYS/broker/bytes/received": str(st.bytes_received),
            "$SYS/broker/bytes/sent": str(st.bytes_sent),
            "$SYS/broker/retained/count": str(len(self.router.retained)),
            "$SYS/broker/malformed": str(st.malformed),
            "$SYS/broker/messages/receive_denied": str(st.receive_denied),
            "$SYS/broker/connections/refused/max_connections": str(st.refused_max_connections),
            "$SYS/broker/connections/refused/connection_rate": str(st.refused_connection_rate),
            "$SYS/broker/connections/refused/anonymous": str(st.refused_anonymous),
            "$SYS/broker/connections/refused/proxy_header": str(st.refused_proxy_header),
            "$SYS/broker/connections/refused/descriptors": str(st.refused_descriptors),
            "$SYS/broker/connections/refused/auth_backoff": str(st.refused_auth_backoff),
            "$SYS/broker/connections/refused/auth_busy": str(st.refused_auth_busy),
            "$SYS/broker/connections/auth_failures": str(st.auth_failures),
            "$SYS/broker/connections/auth_pending": str(st.auth_pending),
            "$SYS/broker/connections/accept_pauses": str(st.accept_pauses),
            "$SYS/broker/connections/connect_timeouts": str(st.connect_timeouts),
            "$SYS/broker/connections/keepalive_timeouts": str(st.keepalive_timeouts),
            "$SYS/broker/subscriptions/refused/quota": str(st.refused_subscription_quota),
            "$SYS/broker/subscriptions/refused/selector": str(st.refused_selector),
            "$SYS/broker/topic_levels/refused": str(st.refused_topic_levels),
            "$SYS/broker/flow/publishers/paused": str(st.publishers_paused),
            "$SYS/broker/flow/publishers/pauses": str(st.publisher_pauses),
            "$SYS/broker/flow/slow_consumers/current": str(st.slow_consumers),
            "$SYS/broker/flow/slow_consumers/total": str(st.slow_consumer_events),
            "$SYS/broker/flow/slow_consumers/disconnected": str(st.slow_disconnected),
            "$SYS/broker/flow/slow_consumers/hung": str(st.hung_consumer_events),
            "$SYS/broker/flow/dropped/qos0": str(st.dropped_qos0_slow),
            "$SYS/broker/flow/dropped/qos0_ingress": str(st.dropped_qos0_ingress),
            "$SYS/broker/flow/dropped/queue_full": str(st.dropped_queue_full),
            "$SYS/broker/flow/store_waits": str(st.store_waits),
            "$SYS/broker/publish/refused/reserved": str(st.refused_reserved_publish),
            "$SYS/broker/hooks/errors": str(st.hook_errors),
            "$SYS/broker/hooks/dropped": str(st.hook_dropped),
            "$SYS/broker/hooks/rewrite_refused": str(st.hook_rewrite_refused),
            "$SYS/broker/hooks/derived": str(st.hook_derived),
            "$SYS/broker/quotas/pauses": str(st.quota_pauses),
            "$SYS/broker/quotas/disconnects": str(st.quota_disconnects),
            "$SYS/broker/retained/refused/quota": str(st.refused_retained_quota),
            "$SYS/broker/subscriptions/refused/reserved": str(st.refused_reserved_subscribe),
            "$SYS/broker/connections/refused/not_peer": str(st.refused_non_peer),
            "$SYS/broker/connections/refused/reserved_client_id": str(st.refused_reserved_client_id),
            **composites,
            **{k: v for source in self.sys_sources for k, v in source().items()},
        }

    def refused(self, limit: str, client_id: str) -> None:
        """A subscription refused by a limit (``Router.subscribe``): counted and logged."""
        st = self.stats
        if limit == "topic_levels":
            st.refused_topic_levels += 1
            self.log_limit(limit, client_id, "topic filter beyond max_topic_levels")
        elif limit == "selector":
            st.refused_selector += 1
            self.log_limit(limit, client_id, "content filter refused")
        elif limit == "subscriptions":
            st.refused_subscription_quota += 1
            self.log_limit(limit, client_id, "max_subscriptions_per_client reached")

    def log_limit(  # noqa: PLR0917 (a log site's fields)
        self,
        kind: str,
        client_id: str | None,
        what: str | Callable[[], str],
        level: int = logging.WARNING,
        event: str | None = None,
        address: str | None = None,
        reason: str | None = None,
    ) -> None:
        """Log a limit refusal at most once per ``LIMIT_LOG_INTERVAL`` seconds per kind (no log
        flood under abuse; :class:`~broker._logging.LogLimiter`); the ``$SYS`` counters count
        every refusal.  The record's ``event`` (``--log-format json``, :mod:`broker._logging`)
        is ``event`` or ``limit.<kind>``.  The client id (the client's own string) is
        :func:`~broker._logging.bounded` and ``what`` cut (it may quote the client's input):
        one line stays short whatever the client sent.  A site that refuses often and builds
        its text from numbers (a queue bound's drop) passes ``what`` as a callable: it is
        called only when the line is logged (the other refusals cost no formatting). O(1)."""
        if self._limits.due(kind, self.clock.monotonic()):
            log.log(
                level,
                "client %s: %s (further %s refusals not logged for %g s)",
                bounded(client_id),
                cut(what if isinstance(what, str) else what()),
                kind,
                LIMIT_LOG_INTERVAL,
                extra=fields(event or "limit." + kind, client_id, address, reason or kind),
            )

    def publish_sys(self, now: float) -> None:
        for topic, value in self.sys_values(now).items():
            msg = Message.create(topic, value.encode(), 0, True, NO_PROPERTIES, None, now)
            self.publish(msg, now, None, True)
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
        dirty = self.dirty
        while resumable or dirty:  # a closing connection may release paused publishers
            while resumable:
                resumable.pop().resume()
            # a batch and clear(), not pop() one by one: a set keeps the table of its largest
            # size, and popping its few members off a table once sized for hundreds of dirty
            # connections cost 1.6 us per flush (measured: benchmarks/bench_composite.py --broker)
            batch = list(dirty)
            dirty.clear()
            for i, conn in enumerate(batch):
                try:
                    conn.flush()
                except BaseException:
                    dirty.update(batch[i + 1 :])  # as before: the rest stay dirty
                    raise

    def flush_written(self) -> None:
        """Hand the pending output of the dirty connections to their transports now, in the
        middle of a fan-out (:data:`EARLY_MIN`): neither the paused publishers' packets (they
        wait for :meth:`flush`, after the packet being handled) nor a close (a connection
        closing stays dirty for :meth:`flush`). O(dirty connections)."""
        dirty = self.dirty
        batch = list(dirty)
        dirty.clear()
        for i, conn in enumerate(batch):
            if conn.close_requested:
                dirty.add(conn)
                continue
            try:
                conn.flush()
            except BaseException:
                dirty.update(batch[i + 1 :])  # as in flush: the rest stay dirty
                raise

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
                self.publish_will(s, now)
        self.flush()

    def _check(self) -> None:
        for cid, s in self.sessions.items():
            assert s.client_id == cid
            assert not self.router.is_departing(cid)  # a departed predecessor is settled first
            s._check()
        for conn in self.connections:
            conn._check()
            assert conn.session is None or self.sessions.get(conn.session.client_id) is conn.session
        self.conn_timers._check(self.connections)
        self.login_backoff._check()
        assert all(c.state is ConnectionState.AWAIT_CONNECT for c in self.connections if c.authenticating)
        assert self.connected == sum(1 for c in self.connections if c.state is ConnectionState.CONNECTED)
        assert not (NO_FEEDERS or NO_ALIASES_IN or NO_ALIASES_OUT), "a shared empty container was written"
        # flow control: the congested set, the feeder edges and the pause gauge agree
        paused = {c for c in self.connections if c.blockers}
        assert self.stats.publishers_paused == len(paused)
        for conn in self.congested:
            assert conn.congested_since is not None
        edges = sum(len(c.feeders) for c in self.congested)
        # publishers paused at a queue bound (core/_qbound.py, "pace"); a lost one is reset
        edges += sum(1 for b in self.queue_bounds.values() for c in b.paced if c in self.connections)
        quota_paused = self.quotas.paused if self.quotas is not None else {}
        assert edges == sum(c.blockers - c.store_wait - (c in quota_paused) for c in self.connections)
        assert self.stats.slow_consumers == sum(1 for c in self.connections if c.slow)
        assert all(c.slow and c in self.progress for c in self.hung)
        assert all(c in self.congested for c in self.progress)
