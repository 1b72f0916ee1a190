"""The embedding API: :class:`Broker` runs the core on the current asyncio loop.

``async with Broker(port=0) as b`` starts the listeners (``broker.net._listeners``: TCP, TLS,
WebSocket; ``b.port`` tells the first one's bound port, ``b.ports`` all of them),
``await b.publish(...)`` injects messages from code, and ``b.subscribe(...)``
gives an in-process subscription (topic filter plus optional content selector) that
yields :class:`Message` records from a bounded queue (messages that do not fit are
dropped and counted in ``dropped``); ``b.subscribe_composite(expression)`` is the same for a
composite subscription (issue 16, docs/composite.md): it yields one :class:`Message` per
composite event, on the topic ``$composite/<name>`` with the event's JSON payload.  The
timers of the core (keep-alive, will delay, session expiry, ``$SYS``) run from one
``call_later`` chain.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING

import topics
from broker._config import BrokerConfig, Listener
from broker._logging import fields
from broker._reload import ReloadCounters, ReloadResult, reload_broker
from broker.core import SETTLE_BUDGET, Clock, Core, Message, Route, Session
from broker.hooks import Hooks
from broker.net import (
    ConnectionLimits,
    MQTTProtocol,
    OpenListener,
    close_listeners,
    connection_capacity,
    descriptor_limit,
    open_listener,
    open_listeners,
    wait_closed,
)
from broker.packets import NO_PROPERTIES, Properties

if TYPE_CHECKING:
    from broker._composite_saver import CompositeSaver
    from broker._dashboard import Dashboard, DashboardProvider
    from broker.durability import Store
    from broker.net import HttpServer

__all__ = ["Broker", "LocalCompositeSubscription", "LocalSubscription", "Message"]

log = logging.getLogger("broker")

_local_ids = itertools.count(1)

#: seconds ``Broker.stop`` waits for disconnected clients to close their connections
STOP_GRACE = 1.0
#: seconds between flow-control checks while a receiver is over its high-water mark
FLOW_CHECK = 0.05
#: seconds between two slices of released content selectors leaving the engine while some
#: wait (``Router.settle_selectors``), and the slice's count at most: a slice stops after
#: ``SETTLE_BUDGET`` seconds of removals (4 ms, ``broker.core._router``) whatever the
#: engine's cost per removal, and the next one runs ``SETTLE_EVERY`` later (2 ms; the loop
#: reads and writes in between), so the backlog drains at about two thirds of the loop while
#: no loop turn holds more than a slice (issue 42 item 2: 512 removals a slice every 20 ms
#: took 15-28 ms of one turn in a 100,000-selector fleet's teardown, which took 3.8-3.9 s)
SETTLE_EVERY = 0.002
SETTLE_SLICE = 2048

#: restored sessions from which the restore freezes the heap (``gc.freeze``, ``_open_store``);
#: also the growth of the sessions since the last freeze from which the survivors of a full
#: collection are frozen (``Broker._tick``, issue 42 item 2): a full collection walks every
#: long-lived object, ~0.3 s with 10,000 sessions holding content selectors and ~1 s with
#: 100,000 selectors (measured in-process, load 10), a stall the next one repeats unless
#: what survived is moved out of the collector's generations
FREEZE_SESSIONS = 1000
#: the growth of the sessions since the last freeze from which an idle tick collects and
#: freezes the heap itself (``Broker._idle_freeze``; with at least :data:`FREEZE_SESSIONS`
#: sessions): what a fleet made after the collector's last full collection is otherwise walked
#: by the next one, which the allocations of a big fan-out trigger (issue 42 item 2,
#: docs/performance-content.md "The collector's pause before a fleet's first fan-out")
IDLE_FREEZE_SESSIONS = 100
#: objects not frozen from which an idle tick collects and freezes the heap too (what a
#: fleet's first messages build: the content engine's leaves, ~160,000 objects at 100,000
#: selectors); a full collection walks ~150 ns per object, so this is ~3 ms of walk
IDLE_FREEZE_OBJECTS = 20_000
#: bytes read between two ticks under which the loop counts as idle for that collection (no
#: PUBLISH and no new connection either): keep-alive pings of a 100,000-client fleet at 10 s
#: are ~5 KiB per tick of 0.25 s, a fleet connecting or a stream far more
IDLE_BYTES = 64 * 1024
#: seconds between sweeps of expired sessions and retained messages in the store; also the
#: grace period of a sweep (docs/persistence.md, "How the broker uses the store")
SWEEP_INTERVAL = 60.0


def _log_capacity(max_connections: int) -> None:
    """Say how many connections the descriptor limit leaves room for; warn when
    ``max_connections`` promises more (docs/operations-fleet.md)."""
    room = connection_capacity()
    limit = descriptor_limit()
    if max_connections > room:
        log.warning(
            "max_connections %d is above what the descriptor limit %d leaves room for (about %d "
            "connections): connections beyond that are closed unanswered and counted in "
            "$SYS/broker/connections/refused/descriptors; raise the hard limit (ulimit -Hn, "
            "systemd LimitNOFILE=) or lower max_connections",
            max_connections,
            limit,
            room,
        )
    else:
        log.info("descriptor limit %d: room for about %d connections", limit, room)


class LocalSubscription:
    """An in-process subscription: ``async with`` registers it, ``async for`` yields messages.

    The queue holds at most ``maxsize`` messages; further ones are dropped and counted in
    :attr:`dropped` (the broker never blocks on a slow in-process consumer).
    """

    def __init__(
        self, broker: Broker, topic_filter: str, selector: str | None, qos: int, maxsize: int
    ) -> None:
        self.broker = broker
        self.topic_filter = topic_filter
        self.selector = selector
        self.qos = qos
        self.queue: asyncio.Queue[Message] = asyncio.Queue(maxsize)
        self.dropped = 0
        self.client_id = f"$local/{next(_local_ids)}"
        self._session: Session | None = None

    def _sink(self, msg: Message, route: Route) -> None:
        try:
            self.queue.put_nowait(msg)
        except asyncio.QueueFull:
            self.dropped += 1

    async def __aenter__(self) -> LocalSubscription:
        self._session = self.broker._subscribe_local(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            self.broker.core.end_session(self._session, self.broker.core.clock.monotonic())
            self._session = None

    def __aiter__(self) -> LocalSubscription:
        return self

    async def __anext__(self) -> Message:
        return await self.queue.get()

    async def get(self, timeout: float | None = None) -> Message:  # noqa: ASYNC109 (queue.get with a deadline, the public API)
        """The next message (``asyncio.TimeoutError`` after ``timeout`` seconds)."""
        return await asyncio.wait_for(self.queue.get(), timeout)


class LocalCompositeSubscription(LocalSubscription):
    """An in-process composite subscription (``Broker.subscribe_composite``): ``async with``
    registers it (``CompositeSyntaxError`` for a bad expression), ``async for`` yields one
    :class:`Message` per composite event (topic ``$composite/<name>``, JSON payload as in
    docs/composite.md, QoS the minimum of ``qos`` and the components')."""

    def __init__(  # noqa: PLR0917
        self,
        broker: Broker,
        expression: str,
        name: str,
        qos: int,
        maxsize: int,
        window: float | None,
        max_buffer: int | None,
    ) -> None:
        super().__init__(broker, "$composite/" + name, None, qos, maxsize)
        self.expression = expression
        self.name = name
        self.window = window
        self.max_buffer = max_buffer
        #: the canonical expression (after ``async with``)
        self.canonical: str | None = None

    async def __aenter__(self) -> LocalCompositeSubscription:
        core = self.broker.core
        session = Session(self.client_id, 0)
        session.sink = self._sink
        self.canonical = core.composite.add(
            self.client_id, self.name, self.expression, self.qos, self.window, self.max_buffer
        )
        core.sessions[self.client_id] = session
        self._session = session
        return self


def _full_collections() -> int:
    """The collector's own count of full (generation 2) collections so far (the tick compares
    it with the last one seen: no callback runs on each collection). O(1)."""
    return int(gc.get_stats()[2]["collections"])


class Broker:
    """An MQTT 3.1.1/5.0 broker on the running event loop.

    ``Broker(host, port, hooks=[...], config=BrokerConfig(...), **options)``: keyword
    options override fields of the config (``partial_unsubscribe=False``,
    ``content_engine="counting"``, ``max_queued_messages=...``; see docs/broker.md).
    """

    def __init__(
        self,
        host: str | None = None,
        port: int | None = None,
        *,
        hooks: Iterable[Hooks] = (),
        config: BrokerConfig | None = None,
        clock: Clock | None = None,
        **options: object,
    ) -> None:
        cfg = config or BrokerConfig()
        if host is not None:
            options["host"] = host
        if port is not None:
            options["port"] = port
        if options:
            cfg = cfg.replace(**options)
        self.config = cfg
        self.hooks: list[Hooks] = list(hooks)
        self.core = Core(cfg, self.hooks, clock)
        self._listeners: list[OpenListener] | None = None
        self._extra: list[OpenListener] = []  # opened by Broker.listen (plugins)
        self._timer: asyncio.TimerHandle | None = None
        self._next_tick = 0.0  # when the next Core.tick is due (the timer may fire sooner)
        self._full_seen = 0  # the collector's count of full collections at the last tick's look
        self._frozen_sessions = 0  # sessions when the heap was last frozen
        self._seen_io = (0, 0, 0)  # bytes, PUBLISHes, connections received at the last tick
        #: collections the idle ticks ran themselves (``_idle_freeze``) and the last one's
        #: pause of the loop in seconds
        self.idle_collections = 0
        self.idle_collection_s = 0.0
        self._sweeper: asyncio.Task[None] | None = None
        self._http: HttpServer | None = None
        self.dashboard: Dashboard | None = None
        #: sections of the dashboard added by packages above the broker (the cluster's
        #: ``"cluster"``): name -> a callable returning JSON-ready data (docs/dashboard.md)
        self.dashboard_providers: dict[str, DashboardProvider] = {}
        #: snapshots of the durable composite subscriptions (with a store on disk)
        self.composite_saver: CompositeSaver | None = None
        #: QoS 2 ids the store held under client ids without a session (an extension's own:
        #: the cluster keeps its peers' received ids so), by client id, as found at start
        self.restored_qos2_in: dict[str, set[int]] = {}
        #: the open TLS and WebSocket connections (plain-TCP ones are in their listener's poller)
        self._open: set[MQTTProtocol] = set()
        #: authenticate hooks' awaitables being awaited (core/_connect.py: the CONNECT is held)
        self._checks: set[asyncio.Task[None]] = set()
        self.core.await_check = self._await_check
        #: reloads done / failed (``Broker.reload``; ``$SYS/broker/reloads/``)
        self.reload_counters = ReloadCounters()
        self._reloading = asyncio.Lock()
        self.core.sys_sources.append(self.reload_counters.sys_values)
        self.core.metric_sources.append(self.reload_counters.metric_values)
        for h in self.hooks:
            h.attach(self)

    def _await_check(self, check: Awaitable[bool | None], done: Callable[[object], None]) -> None:
        """Await an authenticate hook's awaitable in a task of its own (the core holds the
        CONNECT; nothing else waits) and feed its outcome back: ``done(result or exception)``
        on the loop, then a flush, as for any other event of the core."""

        async def run() -> None:
            try:
                outcome: object = await check
            except BaseException as exc:  # the core decides: hook error, busy; cancelled at stop
                outcome = exc
            try:
                done(outcome)
                self.core.flush()
            except Exception:
                log.exception("authentication outcome failed")
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome

        task = asyncio.get_running_loop().create_task(run())
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    def _protocols(self) -> list[MQTTProtocol]:
        """Every open network connection: the TLS/WebSocket set and the plain-TCP listeners'
        pollers (``broker.net._lean``). O(connections + highest descriptor)."""
        found: list[MQTTProtocol] = list(self._open)
        for o in (self._listeners or []) + self._extra:
            for a in o.acceptors:
                if a.poller is not None:
                    found += a.poller.protocols()
        return found

    @property
    def port(self) -> int:
        """The bound port of the first listener (after start)."""
        return self.ports[0]

    @property
    def ports(self) -> list[int]:
        """The bound port of every listener, in ``config.effective_listeners()`` order."""
        if self._listeners is None:
            raise RuntimeError("broker not started")
        return [o.port for o in self._listeners]

    @property
    def host(self) -> str:
        return self.config.host

    async def start(self) -> None:
        for h in self.hooks:
            await h.start()
        if self.config.store_path is not None:
            await self._open_store(self.config.store_path)
        if self.config.store_path is not None or self.config.bans_file is not None:
            from broker._bans_file import load_bans

            await load_bans(self)  # the admin API's bans (docs/admin.md)
        try:
            self._listeners = await open_listeners(self.core, self._open, self.config)
        except BaseException:  # e.g. the port is taken: do not leave the store's thread behind
            await self._close_store()
            raise
        if self.config.metrics_listen is not None:
            try:
                await self._start_http(self.config.metrics_listen)
            except BaseException as exc:
                await self.stop()
                if isinstance(exc, OSError):  # say which listener: not the MQTT one
                    where = f"metrics listener {self.config.metrics_listen}"
                    raise OSError(exc.errno, exc.strerror or str(exc), where) from exc
                raise
        _log_capacity(self.config.max_connections)
        self._next_tick = self.core.clock.monotonic() + self.config.tick_interval
        self._full_seen = _full_collections()
        self._schedule()
        for h in self.hooks:
            await h.ready()

    async def listen(self, listener: Listener) -> int:
        """Open one more listener on the serving broker (a plugin's: the cluster's link
        listener); returns its bound port. It closes with the broker."""
        if self._listeners is None:
            raise RuntimeError("broker not started")
        opened = await open_listener(
            self.core, self._open, listener, ConnectionLimits(self.config, self.core.stats)
        )
        self._extra.append(opened)
        return opened.port

    async def add_hook(self, hook: Hooks, *, before: Hooks | None = None) -> None:
        """Register ``hook`` in a broker that runs already, as if it had been in ``hooks``:
        asked before ``before`` (its place among the hooks' opinions: the first opinion
        decides; None: after all), attached, and, once the broker serves, started and told it
        is ready; stopped with the broker.  A plugin adds so a hook that a reload made
        necessary (uplink: the first ``[[bridges]]`` table of a broker started without one).
        Raises what its ``start`` or ``ready`` raises (it stays registered: stopped with the
        broker).  O(hooks); the core's split of the hooks is made again (``Core.observe``)."""
        hooks = self.hooks
        hooks.insert(len(hooks) if before is None else hooks.index(before), hook)
        self.core.observe(hooks)
        hook.attach(self)
        if self._listeners is not None:  # serving (else start() starts it with the others)
            await hook.start()
            await hook.ready()

    async def reload(self, config: BrokerConfig | None = None) -> ReloadResult:
        """Re-read the password and ACL files (``FileAuth`` hooks) and the TLS files of the
        listeners, and apply the live fields of ``config`` (``broker._reload.LIVE_FIELDS``;
        other changed fields are reported as needing a restart), all or nothing: a file that
        does not parse keeps every old setting and is named in the result and in one error
        line. Open connections stay. One reload at a time (docs/operations.md, "Reload")."""
        async with self._reloading:
            return await reload_broker(self, config)

    async def _start_http(self, listen: str) -> None:
        """The HTTP listener of ``/metrics`` and the dashboard (broker.net._http, on this loop)."""
        from broker._dashboard import Dashboard
        from broker.net import HttpLimits, parse_listen, serve_http

        host, port = parse_listen(listen)
        cfg = self.config
        limits = HttpLimits(
            max_connections=cfg.http_max_connections,
            max_unauthenticated=cfg.http_max_unauthenticated,
            max_streams=cfg.http_max_streams,
            request_timeout=cfg.http_request_timeout,
            idle_timeout=cfg.http_idle_timeout,
        )
        dashboard = Dashboard(self, host)
        self._http = await serve_http(host, port, dashboard.handle, limits)
        dashboard.http = self._http
        self.dashboard = dashboard
        dashboard.start()
        log.info("metrics on http://%s:%d/metrics", host, self._http.port)
        if self.config.dashboard:
            log.info(
                "dashboard on http://%s:%d/ (%s)",
                host,
                self._http.port,
                "login required" if dashboard.auth_required else "loopback, no login",
            )

    @property
    def metrics_port(self) -> int | None:
        """The bound port of the metrics endpoint and dashboard (None when it is off)."""
        return None if self._http is None else self._http.port

    async def _open_store(self, path: str) -> None:
        """Open the store and restore its state into the core (before any client connects)."""
        from broker.durability import Store  # with a store only (issue 42 item 1)

        cfg = self.config
        store = await asyncio.to_thread(
            Store, path, max_backlog=cfg.store_max_backlog, commit_delay=cfg.store_commit_delay
        )
        # The restore makes a few objects per stored session and frees none: the cyclic
        # collector would traverse the growing heap again and again (27 s instead of 10 s
        # for 100,000 sessions, docs/performance-connections.md "Restart storm"). Off
        # meanwhile; then what was restored moves to the permanent generation (gc.freeze),
        # so later collections do not walk 100,000 idle sessions either.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            try:
                wall = self.core.clock.wall()
                state = await asyncio.to_thread(store.load, wall)
            except BaseException:
                await asyncio.to_thread(store.close)
                raise
            core = self.core
            journal = core.journal
            journal.store = store
            core.hold_qos2 = True  # QoS 2 deliveries after the commit (issue 30)
            journal.call_threadsafe = asyncio.get_running_loop().call_soon_threadsafe
            journal.restore(state, self.core.clock.monotonic(), wall)
            self.restored_qos2_in = {
                c: set(ids) for c, ids in state.qos2_in.items() if c not in state.sessions
            }
            core.flush()
            log.info(
                "store %s: %d sessions, %d retained messages restored",
                path,
                len(state.sessions),
                len(state.retained),
            )
            del state
            if len(core.sessions) >= FREEZE_SESSIONS:
                gc.freeze()
                self._frozen_sessions = len(core.sessions)
        finally:
            if was_enabled:
                gc.enable()
        self._sweeper = asyncio.create_task(self._sweep(store))
        core.sys_sources.append(
            lambda: {
                "$SYS/broker/store/failed": str(int(store.failed)),
                "$SYS/broker/store/failures": str(store.failures),
                "$SYS/broker/store/failed_commits": str(store.failed_commits),
                "$SYS/broker/store/recoveries": str(store.recoveries),
            }
        )
        if path != ":memory:":
            from broker._composite_saver import CompositeSaver  # with a store only (issue 42 item 1)

            self.composite_saver = CompositeSaver(core.composite, store, path + ".composite")
            await self.composite_saver.load(self._persisted)

    def _persisted(self, client_id: str) -> bool:
        s = self.core.sessions.get(client_id)
        return s is not None and s.persisted

    async def _sweep(self, store: Store) -> None:
        """Every SWEEP_INTERVAL: delete what expired in the store while nothing ended it."""
        core = self.core
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            try:
                gone = await asyncio.to_thread(store.sweep, core.clock.wall() - SWEEP_INTERVAL)
            except Exception:
                if not store.failed:  # a failed store has logged its cause and retries
                    log.exception("store sweep failed", extra=fields("store.sweep_failed"))
                continue
            now = self.core.clock.monotonic()
            for rec in gone:
                if rec.client_id not in core.sessions and rec.will is not None:
                    orphan = Session(rec.client_id)
                    orphan.will = rec.will
                    core.publish_will(orphan, now)
            core.flush()

    async def _close_store(self) -> None:
        store = self.core.journal.store
        if store is None:
            return
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self.composite_saver is not None:
            await self.composite_saver.close()
            self.composite_saver = None
        self.core.journal.store = None
        self.core.hold_qos2 = False
        for s in self.core.sessions.values():
            s.persisted = False
        await asyncio.to_thread(store.close)

    def _schedule(self) -> None:
        """The next timer: the tick, or sooner (FLOW_CHECK) while receivers are over their
        high-water mark, so that a hung one is found about ``hung_consumer_time`` after it
        congested, not up to a tick later (docs/broker.md, "Flow control")."""
        loop = asyncio.get_running_loop()
        delay = self._next_tick - self.core.clock.monotonic()
        if self.core.congested and self.config.hung_consumer_time > 0:
            delay = min(delay, FLOW_CHECK)
        if self.core.router.releasing:
            delay = min(delay, SETTLE_EVERY)
        self._timer = loop.call_later(max(delay, 0.0), self._tick)

    def _freeze_survivors(self) -> None:
        """After a full collection, with :data:`FREEZE_SESSIONS` sessions more than at the last
        freeze, move the heap to the permanent generation (``gc.freeze``): later full
        collections walk only what was made since (the restore does the same for a store's
        sessions). Objects frozen are still freed by their reference counts, and neither a
        finished connection nor an ended session leaves a reference cycle
        (``MQTTProtocol._unlink``; tests/broker/test_broker_gc_freeze.py: a fleet that leaves
        every way, a fleet that reconnects, restored sessions discarded), so nothing frozen
        waits for the collector and the heap is never unfrozen. Until issue 42 item 2 a closed
        connection was a cycle of 12 objects (connection, protocol, session, transport, linger
        timer), and the tick unfroze the heap after 1,000 closed connections or 1,000 sessions
        fewer: a full walk of the heap each time, ~0.3-1 s with a fleet's selectors, in the
        middle of the fleet's departure. O(1) (the freeze only links the generations' lists)."""
        n = len(self.core.sessions)
        if n < self._frozen_sessions:
            self._frozen_sessions = n  # a fleet that left, and may come back
        elif n - self._frozen_sessions >= FREEZE_SESSIONS:
            gc.freeze()
            self._frozen_sessions = n

    def _idle_freeze(self) -> None:
        """At an idle tick, with :data:`FREEZE_SESSIONS` sessions or more, run the full
        collection now and freeze its survivors when the sessions grew by
        :data:`IDLE_FREEZE_SESSIONS` since the last freeze, or when :data:`IDLE_FREEZE_OBJECTS`
        objects or more are not frozen: so that a fleet's big fan-outs do not walk the fleet,
        nor what its first messages built.

        Why: CPython (3.11) collects generation 2 when generation 1 was collected more than 10
        times since the last full collection and the objects it promoted meanwhile exceed a
        quarter of those the last one left (``long_lived_pending > long_lived_total / 4``);
        a full collection walks every object not frozen. :meth:`_freeze_survivors` freezes
        only after such a collection, so the part of a fleet that connected after the last one
        (70-840 of 10,000 sessions in the runs measured) stays in the collector's generations,
        and the fleet's first messages build more that stays (the content engine's ordered
        leaves, rebuilt by the first query that reaches each: ~100,000 tuples and ~58,000
        lists at 100,000 selectors); the next full collection walks it all (22-25 ms at 100k,
        in the 14th-23rd message of the runs measured; 57.6 ms in the first message in one run
        of session 18) and it comes when allocations are many, i.e. inside a big fan-out.
        Idle means: since the previous tick no PUBLISH and no new connection were received
        and fewer than :data:`IDLE_BYTES` were read, so the collection's pause (it still stops
        the loop: it walks what is not frozen yet, measured in docs/performance-content.md,
        "The collector's pause before a fleet's first fan-out") falls between messages, not
        in one; a message arriving during it waits for it. Not with the collector disabled
        (the embedding program's choice, or a restore's). O(1) on a busy tick; on an idle one
        O(objects not frozen) to count them (``gc.get_objects``, at most about
        :data:`IDLE_FREEZE_OBJECTS` between two collections, ~0.1 ms) and, when it collects,
        one walk of them."""
        st = self.core.stats
        io = (st.bytes_received, st.messages_received, st.connections_total)
        seen, self._seen_io = self._seen_io, io
        n = len(self.core.sessions)
        self._frozen_sessions = min(self._frozen_sessions, n)  # a fleet that left may come back
        if (
            n < FREEZE_SESSIONS
            or io[1] != seen[1]
            or io[2] != seen[2]
            or io[0] - seen[0] >= IDLE_BYTES
            or not gc.isenabled()
        ):
            return
        if n - self._frozen_sessions < IDLE_FREEZE_SESSIONS and len(gc.get_objects()) < IDLE_FREEZE_OBJECTS:
            return
        t = time.perf_counter()
        gc.collect()
        gc.freeze()
        took = time.perf_counter() - t
        self._frozen_sessions = n
        self._full_seen = _full_collections()
        self.idle_collections += 1
        self.idle_collection_s = took
        log.debug(
            "idle collection: %.1f ms, %d sessions, %d objects frozen",
            took * 1e3,
            n,
            gc.get_freeze_count(),
            extra=fields("broker.idle_collection"),
        )

    def _tick(self) -> None:
        try:
            full = _full_collections()
            if full != self._full_seen:  # a full collection ran since the last tick
                self._full_seen = full
                self._freeze_survivors()
            self._idle_freeze()
            now = self.core.clock.monotonic()
            core = self.core
            if now >= self._next_tick - FLOW_CHECK / 2:
                self._next_tick = now + self.config.tick_interval
                core.tick(now, SETTLE_SLICE, SETTLE_BUDGET)
            else:
                core.check_flow(now)
                if core.router.releasing:
                    core.router.settle_selectors(SETTLE_SLICE, SETTLE_BUDGET)
            core.flush()
        except Exception:
            log.exception("timer failed")
        self._schedule()

    async def stop(self) -> None:
        """Graceful stop: listener closed, clients disconnected (wills published), hooks stopped."""
        if self._listeners is None:
            return
        for h in self.hooks:
            try:
                await h.stopping()
            except Exception:
                log.exception("hook %s.stopping failed", type(h).__name__)
        await close_listeners(self._listeners + self._extra)
        if self.dashboard is not None:
            await self.dashboard.stop()
            self.dashboard = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._timer is not None:
            self._timer.cancel()
        await self._send_owed()
        for task in list(self._checks):  # held CONNECTs: their connections close below
            task.cancel()
        self.core.shutdown(self.core.clock.monotonic())
        # clients get STOP_GRACE seconds to close their side, then are aborted
        if protocols := self._protocols():
            await asyncio.wait([p.closed() for p in protocols], timeout=STOP_GRACE)
        for p in self._protocols():
            if p.transport is not None:
                p.transport.abort()
        await wait_closed(self._listeners + self._extra)
        self._listeners = None
        self._extra = []
        await self._close_store()
        if self.core.composite_if_made is not None:  # composite losses counted since the last tick
            self.core.composite_if_made.flush_losses()
        for h in self.hooks:
            try:
                await h.stop()
            except Exception:
                log.exception("hook %s.stop failed", type(h).__name__)
        log.info("stopped", extra=fields("broker.stopped"))

    async def _send_owed(self) -> None:
        """Graceful stop, before the connections close: nothing more is read from them, and
        what the store's commit still holds back (PUBACK, PUBREC, PUBCOMP, QoS 2 deliveries:
        ``Journal.hold``) is sent once durable, at most ``STOP_GRACE`` later.

        Closing first dropped them while the store's close committed what they answer: a
        PUBCOMP lost that way leaves the publisher with a PUBREL to resend for an id the
        restarted broker no longer knows, and paho-mqtt 2.2, whose failed reconnects reset the
        message to PUBLISH, sent the message again, routed as a new one (the nemesis's QoS 2
        duplicates after a ``leave``, issue 30; docs/fault.md).
        """
        journal = self.core.journal
        store = journal.store
        if store is None or not journal.holding:
            return
        from broker.durability import StoreError  # imported with the store

        protocols = self._protocols()  # plain TCP (the listeners' pollers), TLS and WebSocket
        for p in protocols:
            p.stop_reading()
        try:
            await asyncio.wait_for(store.durable(), STOP_GRACE)
            await asyncio.sleep(0)  # the release is scheduled on the loop with the durable signal
        except (TimeoutError, StoreError):
            pass  # a failed commit refuses them (Journal._release); a slow one: not waited for
        finally:
            # reading again, so that the clients' EOF after the DISCONNECT (core.shutdown, at
            # once, no await between) is seen: a connection not read waited out STOP_GRACE
            for p in protocols:
                p.stop_reading(False)

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def publish(
        self,
        topic: str,
        payload: bytes | str = b"",
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> int:
        """Publish from code (no publisher client id); returns the number of deliveries."""
        topics.validate_topic(topic)
        if isinstance(payload, str):
            payload = payload.encode()
        now = self.core.clock.monotonic()
        msg = Message.create(topic, payload, qos, retain, properties or NO_PROPERTIES, None, now)
        n = self.core.publish(msg, now)
        self.core.flush()
        return n

    def subscribe(
        self, topic_filter: str, selector: str | None = None, qos: int = 2, maxsize: int | None = None
    ) -> LocalSubscription:
        """An in-process subscription (use with ``async with``)."""
        return LocalSubscription(
            self, topic_filter, selector, qos, maxsize or self.config.inprocess_queue_size
        )

    def subscribe_composite(  # noqa: PLR0917
        self,
        expression: str,
        qos: int = 2,
        name: str = "local",
        window: float | None = None,
        max_buffer: int | None = None,
        maxsize: int | None = None,
    ) -> LocalCompositeSubscription:
        """An in-process composite subscription to ``expression`` (use with ``async with``);
        ``window`` (seconds) and ``max_buffer`` default to the engine's (60 s, 64)."""
        return LocalCompositeSubscription(
            self, expression, name, qos, maxsize or self.config.inprocess_queue_size, window, max_buffer
        )

    def _subscribe_local(self, sub: LocalSubscription) -> Session:
        return self.core.local_subscribe(
            sub.client_id, sub.topic_filter, sub.selector, sub.qos, sub._sink, self.core.clock.monotonic()
        )
