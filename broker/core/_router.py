"""The routing core: subscriptions, retained messages and content filters, with no I/O.

The router answers one question per PUBLISH: which clients receive it, at which QoS and
with which subscription identifiers.  It never re-implements topic matching: the
subscription lists, negative entries and partial unsubscribe (docs/reference.md, "Negative
entries inside the MQTT broker"; seed 002, the IBM patent, Fig. 4-7) live in
:class:`topics.SubscriptionIndex`, retained messages in :class:`topics.RetainedTree`.

Content filters (seed 000 / 003 engines behind ``content.ENGINES``) are kept in one
engine keyed by selector text, with a reference count, so identical selectors are indexed
once; a selector's last release only queues its removal from the engine, done in slices by
``Core.tick`` (:meth:`Router.settle_selectors`), so a fleet disconnecting does not stall the
loop with its selectors' removals (issue 42 item 2).  Routing goes through a per-topic
plan (an LRU cache of ``cache_size`` topic names, issue 8 item 2): plain subscribers get
prebuilt routes, selector-only subscribers are indexed by selector (a client with several
different selectors under each of them, routed once per message however many of them match:
issue 42 item 2) so one ``engine.match`` per message is joined with the plan in O(matched
entries) instead of testing every topic candidate, and the JSON payload is parsed only when
a subscription on the topic carries a selector.  Plans are dropped by the index subclass on
every subscription change that can affect them (one topic for an exact filter, all otherwise);
a topic gets a plan on its second miss, so scans wider than the cache route directly.

Shared subscriptions (``$share/<group>/<filter>``) are delivered to one member of the
group among the members whose options accept the message, picked by the group's strategy
(:mod:`broker.core._shared`: round robin, random, sticky, hash of the publisher or the topic,
local members first) in O(1): each group's members with their lookup tables are built once per
change of the group (:class:`broker.core._shared.Groups`, dropped by the index subclass with the
plans), for a topic with a plan, a topic without one and a message a peer forwarded alike.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import islice
from time import perf_counter
from typing import Any

import content
import topics
from broker._logging import shown
from broker.core._shared import Groups, Members, SharedPolicy, reachable
from broker.packets import ReasonCode, SubscriptionRequest
from broker.values import (
    PEER_PREFIX,
    SHARE_PREFIX,
    Message,
    Route,
    SubOptions,
    split_filter_prefix,
    split_share,
)

__all__ = ["RELEASE_SLICE", "SETTLE_BUDGET", "Router", "SubscribeLimits", "Subscribed", "at_position"]


def at_position(exc: ValueError, position: int, limit: int = 200) -> str:
    """The message of a syntax error cut to ``limit`` characters, ending with its position
    once: the content and composite parsers' messages end with ``at <position>`` already
    (appending it again gave "... at 14 at 14"), and the cut must not lose it."""
    message, tail = str(exc), f" at {position}"
    message = message.removesuffix(tail)
    return message[:limit] + tail


@dataclass(frozen=True, slots=True)
class SubscribeLimits:
    """What a SUBSCRIBE may ask for (from ``BrokerConfig``)."""

    max_topic_levels: int = 201
    max_subscriptions: int = 10_000
    maximum_qos: int = 2
    refused_filters: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Subscribed:
    """The answer to one subscription request (:meth:`Router.subscribe`).

    ``code`` is the SUBACK reason code (the granted QoS on success); ``reason`` explains a
    refusal; ``limit`` names the limit that refused it (``topic_levels``, ``selector``,
    ``subscriptions``: counted and logged by the caller); ``retained`` is True when the
    retained messages matching the filter are due (retain handling).
    """

    code: ReasonCode
    reason: str | None = None
    limit: str | None = None
    full_filter: str = ""
    plain: str = ""
    selector: str | None = None
    retained: bool = False

    @property
    def ok(self) -> bool:
        return self.code < 0x80


#: released selectors removed from the engine per ``Core.tick`` (Router.settle_selectors)
RELEASE_SLICE = 2048
#: seconds a slice of :meth:`Router.settle_selectors` may spend, when the caller gives it a
#: budget (the broker does: ``Broker._tick``). An engine's removal costs 7-15 us on average
#: and up to 2.7 ms of CPU once in a while (an iccounting leaf rebuilt), differently by engine
#: (iccounting, hema, hcem: ``bench_content_fleet.py --probe-removals``), so a slice counted in
#: removals took 15-28 ms of one loop turn in a 100,000-selector fleet's teardown (issue 42
#: item 2); a slice bounded by time stops within one removal of its budget, whatever the
#: engine, and the rest waits for the next slice. The clock is read after each removal
#: (~60 ns, under 1 % of the cheapest engine's mean removal)
SETTLE_BUDGET = 0.004
#: a table of the router's (``_selector_refs``) is copied into a fresh one when its entries
#: fall below a quarter of the most it held since (from this many): a Python dict keeps its
#: table when keys are deleted, 1.9 MB for a fleet's 100,000 selectors after it left
_SHRINK_FROM = 1024

_QOS_RETAIN_KEYS = 6  # (message QoS 0..2) x (RETAIN flag): key = 2 * qos + retain


class _Plan:
    """The routing of one topic name, derived from one ``SubscriptionIndex.match`` result.

    ``fixed``: the clients whose delivery depends only on the message's QoS and RETAIN flag
    (no selector, no no-local), as ``(client id, best QoS, ids, retain-as-published, filter)``;
    ``routes[2 * qos + retain]`` caches their :class:`Route` lists.  ``by_selector``: selector
    -> the clients whose every subscription carries that one selector (reached only through
    the engine's result: the inverted join).  ``by_selectors``: the same for the clients whose
    every subscription carries a selector, with several different selectors and no no-local
    (issue 42 item 2, 100k subscriptions): each such client is listed under each of its
    selectors, and a message reaching it through several matched selectors routes it once
    (:meth:`Router._route_plan` deduplicates; :func:`_client_route` computes the one Route
    from all its subscriptions, as before).  ``general``: clients evaluated per message
    (no-local with a selector, or a selector next to a plain subscription).  ``shared``: the
    shared subscription members of each group (:class:`Members`: one picked per message by
    the group's strategy).  ``reach``: the clients and groups it lists (the most routes a
    message on the topic can have).  Space O(matched entries).
    """

    __slots__ = ("by_selector", "by_selectors", "fixed", "general", "reach", "routes", "selective", "shared")

    def __init__(self, result: topics.MatchResult[SubOptions], groups: Groups) -> None:
        fixed: list[tuple[str, int, tuple[int, ...], bool, str]] = []
        general: list[tuple[str, list[topics.Subscription[SubOptions]]]] = []
        by_selector: dict[object, list[tuple[str, list[topics.Subscription[SubOptions]]]]] = {}
        by_selectors: dict[object, list[tuple[str, list[topics.Subscription[SubOptions]]]]] = {}
        selective = False
        for client_id, subs in result.clients.items():
            selectors = {sub.options.selector for sub in subs}
            no_local = any(sub.options.no_local for sub in subs)
            if selectors == {None} and not no_local:
                best: SubOptions | None = None
                ids: list[int] = []
                rap = False
                for sub in subs:
                    o = sub.options
                    if best is None or o.qos > best.qos:
                        best = o
                    if o.subscription_id is not None:
                        ids.append(o.subscription_id)
                    rap = rap or o.retain_as_published
                assert best is not None
                fixed.append((client_id, best.qos, tuple(ids), rap, best.topic_filter))
                continue
            if None not in selectors:
                selective = True
                if len(selectors) == 1:
                    (only,) = selectors
                    assert only is not None
                    by_selector.setdefault(only, []).append((client_id, subs))
                    continue
                if not no_local:
                    entry = (client_id, subs)
                    for one in selectors:
                        by_selectors.setdefault(one, []).append(entry)
                    continue
            elif len(selectors) > 1:
                selective = True
            general.append((client_id, subs))
        shared = {key: groups.of(key, members) for key, members in result.shared.items()}
        if any(g.selective for g in shared.values()):
            selective = True
        self.fixed = fixed
        self.routes: list[list[Route] | None] = [None] * _QOS_RETAIN_KEYS
        self.general = general
        self.by_selector = by_selector
        self.by_selectors = by_selectors
        self.shared = shared
        self.selective = selective  # some subscription here carries a selector
        #: the most routes a message on the topic can have (a client gets one, a group one):
        #: below ``at_least`` :meth:`Router.route_head` routes it whole
        self.reach = len(result.clients) + len(shared)

    def fixed_routes(self, key: int) -> list[Route]:
        """The :class:`Route` list of the ``fixed`` clients for ``key = 2 * qos + retain``."""
        mqos, mretain = key >> 1, bool(key & 1)
        routes = [
            Route(cid, mqos if mqos < qos else qos, mretain and rap, ids, tf, None)
            for cid, qos, ids, rap, tf in self.fixed
        ]
        self.routes[key] = routes
        return routes


def _client_route(  # noqa: PLR0917 (hot path: positional arguments)
    client_id: str,
    subs: list[topics.Subscription[SubOptions]],
    publisher: str | None,
    mqos: int,
    mretain: bool,
    sel_ok: AbstractSet[object],
) -> Route | None:
    """The delivery to ``client_id`` given its applicable ``subs`` (MQTT 5 section 4.5)."""
    best: SubOptions | None = None
    ids: list[int] = []
    rap = False
    for sub in subs:
        o = sub.options
        if o.no_local and client_id == publisher:
            continue
        if o.selector is not None and o.selector not in sel_ok:
            continue
        if best is None or o.qos > best.qos:
            best = o
        if o.subscription_id is not None:
            ids.append(o.subscription_id)
        rap = rap or o.retain_as_published
    if best is None:
        return None
    return Route(
        client_id,
        mqos if mqos < best.qos else best.qos,
        mretain and rap,
        tuple(ids),
        best.topic_filter,
        best.selector,
    )


_EMPTY: frozenset[object] = frozenset()

#: a plan's clients reached through one selector: (client id, its subscriptions on the topic)
_Clients = list[tuple[str, list[topics.Subscription[SubOptions]]]]


def _matched(by: dict[object, _Clients], sel_ok: AbstractSet[object]) -> list[_Clients]:
    """The client lists of ``by`` (a plan's ``by_selector`` or ``by_selectors``) under the
    matched selectors ``sel_ok``, in the order :meth:`Router._route_plan` visits them (the
    smaller of the two is iterated). O(min(len(by), len(sel_ok)))."""
    if len(sel_ok) <= len(by):
        get = by.get
        return [clients for clients in map(get, sel_ok) if clients is not None]
    return [clients for selector, clients in by.items() if selector in sel_ok]


class _CachingIndex(topics.SubscriptionIndex[SubOptions]):
    """A :class:`topics.SubscriptionIndex` that invalidates the router's per-topic plans.

    Every mutation goes through ``subscribe`` / ``unsubscribe`` / ``remove_client``.  A
    filter without wildcards (after any ``$share/<group>/``) applies to one topic name only,
    so only that topic's plan is dropped (O(1)); a wildcard filter or a removed client clears
    the whole cache (O(cached topics), and the generation counter moves on).  A change of a
    shared group also drops its members kept in ``groups`` (O(1); a removed client's groups:
    O(its entries)).
    """

    def __init__(self, partial_unsubscribe: bool, cache: OrderedDict[str, _Plan], groups: Groups) -> None:
        super().__init__(partial_unsubscribe=partial_unsubscribe)
        self._cache = cache
        self._groups = groups
        self.generation = 0  # bumped whenever the whole cache is dropped
        #: clients that subscribed to a shared group (``$share/...``) since their entries were
        #: last removed: their departure is never deferred (:meth:`Router.depart`), a group
        #: must not pick a member that is gone. A superset (an unsubscribed one stays). O(1)
        self.shared_clients: set[str] = set()

    def _invalidate(self, topic_filter: str) -> None:
        if topic_filter.startswith(SHARE_PREFIX):
            parts = topic_filter.split("/", 2)
            topic_filter = parts[2] if len(parts) == 3 else "#"
            if len(parts) == 3:
                self._groups.drop((parts[1], parts[2]))
        if "+" in topic_filter or "#" in topic_filter:
            self._cache.clear()
            self.generation += 1
        else:
            self._cache.pop(topic_filter, None)

    def subscribe(self, client_id: str, topic_filter: str, options: SubOptions) -> topics.SubscribeOutcome:
        outcome = super().subscribe(client_id, topic_filter, options)
        if topic_filter.startswith(SHARE_PREFIX):
            self.shared_clients.add(client_id)
        self._invalidate(topic_filter)
        return outcome

    def unsubscribe(self, client_id: str, topic_filter: str) -> topics.UnsubscribeOutcome:
        outcome = super().unsubscribe(client_id, topic_filter)
        self._invalidate(topic_filter)
        return outcome

    def replay(self, client_id: str, entries: Iterable[Any]) -> int:
        """A saved list (a store's restore, before clients connect: the cache is empty
        then); whatever was cached is dropped once, O(1) when nothing was."""
        self.shared_clients.add(client_id)  # restored: its entries are not looked at here
        try:
            return super().replay(client_id, entries)
        finally:
            if self._cache:
                self._cache.clear()
                self.generation += 1

    def remove_client(self, client_id: str) -> int:
        for entry in self.entries(client_id) if self._groups.kept() else ():
            if entry.topic_filter.startswith(SHARE_PREFIX):
                group, _, inner = entry.topic_filter[len(SHARE_PREFIX) :].partition("/")
                self._groups.drop((group, inner))
        removed = super().remove_client(client_id)
        self.shared_clients.discard(client_id)
        if removed:
            self._cache.clear()
            self.generation += 1
        return removed


class Router:
    """Subscriptions + retained messages + content filters for one broker.

    ``route`` looks the topic name up in an LRU cache of routing plans (``cache_size``
    topics; a miss costs one ``SubscriptionIndex.match`` and O(matched entries) to build the
    plan).  Per message it then costs O(clients without selectors) -- prebuilt routes, one
    list copy -- plus, when a subscription on the topic carries a selector, one JSON parse
    and one ``engine.match`` and O(matched selectors + their clients) to join the engine's
    result with the plan (not O(topic candidates)); a client with several selectors is
    deduplicated through a set, O(1) per listing.
    """

    def __init__(
        self,
        partial_unsubscribe: bool = True,
        engine: str = "brute-force",
        cache_size: int = 4096,
        batch_min: int = 64,
        limits: SubscribeLimits | None = None,
        *,
        shared: SharedPolicy | None = None,
    ) -> None:
        self.limits = limits or SubscribeLimits()
        self._cache: OrderedDict[str, _Plan] = OrderedDict()
        self.cache_size = cache_size
        self.batch_min = batch_min  # selectors from which route_batch uses match_batch
        self.batched = 0  # messages content-matched through match_batch
        self.cache_misses = 0
        self._seen: set[str] = set()  # topics that missed once (admission filter)
        self.routed = 0
        #: each shared group's members, kept from one change of the group to the next
        self.groups = Groups()
        self.index: topics.SubscriptionIndex[SubOptions] = _CachingIndex(
            partial_unsubscribe, self._cache, self.groups
        )
        self.retained: topics.RetainedTree[Message] = topics.RetainedTree()
        self.retained_bytes = 0  # payload bytes of the retained messages (max_retained_bytes)
        if engine not in content.ENGINES:  # an unknown name fails here, at start, as before
            raise KeyError(engine)
        #: the content engine's name; the engine is made at its first use (:attr:`engine`)
        self.engine_name = engine
        self._engine: content.Engine | None = None
        self._selector_refs: dict[str, int] = {}
        #: the most selectors ``_selector_refs`` held since it was last copied (``_shrink``)
        self._refs_peak = 0
        #: selectors no subscription references any more, still in the engine until
        #: :meth:`settle_selectors` removes them (insertion-ordered: oldest first)
        self._releasing: dict[str, None] = {}
        #: clients whose session ended at their departure (:meth:`depart`) and whose entries
        #: and selectors still wait for :meth:`settle_selectors` (client id -> its filter ->
        #: selector map; insertion-ordered: oldest first). No session of that id exists
        #: meanwhile (``Core`` routes nothing to them), and a new one of the same id settles
        #: its predecessor's first (:meth:`settle_client`)
        self._departed: dict[str, dict[str, str]] = {}
        #: :meth:`_batching`, kept up to date by add_selector / release_selector
        self.batching = False
        #: the shared groups' strategies and their state (broker.core._shared)
        self.shared = shared or SharedPolicy()
        self._unavailable: frozenset[str] = frozenset()

    @property
    def unavailable(self) -> frozenset[str]:
        """Sessions a shared group's round robin skips while another member is left: the
        links of cluster nodes this node cannot reach (set by the cluster; issue 30).  A
        frozen set: assigning a new one is what tells the kept groups
        (:class:`broker.core._shared.Groups`) to filter their members again."""
        return self._unavailable

    @unavailable.setter
    def unavailable(self, sessions: AbstractSet[str]) -> None:
        self._unavailable = frozenset(sessions)

    # ------------------------------------------------------------ content filters
    @property
    def engine(self) -> content.Engine:
        """The content engine, holding exactly the selectors of live subscriptions: the
        released ones and the departed clients' still waiting (:meth:`settle_selectors`) are
        removed first, O(waiting). Routing uses :meth:`_live` instead (never waits on
        removals)."""
        if self._releasing or self._departed:
            self.settle_selectors(0)
        return self._live()

    def _live(self) -> content.Engine:
        """The content engine as it is (released selectors may still be in it: they match
        but reach no client), made (its module imported) at the first content filter: most
        engines import numpy, which a broker without content filters does without (issue 42,
        the idle footprint). O(1)."""
        e = self._engine
        if e is None:
            e = self._engine = content.ENGINES[self.engine_name]()
        return e

    def add_selector(self, selector: str, compiled: content.Filter) -> None:
        """One more reference to ``selector`` (indexed at its first; a released one still
        waiting for its removal is taken back as it is). O(1) plus the engine's add."""
        refs = self._selector_refs.get(selector, 0)
        if refs == 0:
            if selector in self._releasing:
                del self._releasing[selector]  # same text, same compiled filter: still indexed
            else:
                self._live().add(selector, compiled)
            if len(self._selector_refs) >= self._refs_peak:
                self._refs_peak = len(self._selector_refs) + 1
        self._selector_refs[selector] = refs + 1
        self.batching = self._batching()

    def release_selector(self, selector: str) -> None:
        """One reference less; at the last, the selector waits for its removal from the
        engine (:meth:`settle_selectors`, from ``Core.tick``): a fleet disconnecting
        released its selectors one by one in the loop turn that read the DISCONNECTs,
        ~15-25 us each, a 100,000-selector fleet stalling the loop for seconds (issue 42
        item 2). O(1)."""
        refs = self._selector_refs[selector] - 1
        if refs == 0:
            del self._selector_refs[selector]
            self._releasing[selector] = None
        else:
            self._selector_refs[selector] = refs
        self.batching = self._batching()

    @property
    def releasing(self) -> int:
        """Removals still waiting for :meth:`settle_selectors`: released selectors still in
        the engine, and departed clients whose entries are still in the index."""
        return len(self._releasing) + len(self._departed)

    @property
    def departed(self) -> int:
        """Departed clients whose entries and selectors wait for :meth:`settle_selectors`."""
        return len(self._departed)

    def is_departing(self, client_id: str) -> bool:
        """Whether ``client_id``'s departed entries still wait for their removal. O(1)."""
        return client_id in self._departed

    def depart(self, client_id: str, selectors: dict[str, str]) -> bool:
        """A session of ``client_id`` ended at its client's departure (its filter ->
        selector map ``selectors``, handed over): its entries leave the index and its
        selectors are released later, in slices (:meth:`settle_selectors`), instead of in
        the read of its DISCONNECT (~30 % of a departure's read path, the index's
        ``remove_client`` and the releases: issue 42 item 2, a live client's ping waited
        behind 10,000 of them). The caller has removed the session: routes to the client
        reach no one meanwhile (``Core.publish`` skips a client without session). Not for a
        member of a shared group (a group must not pick a member that is gone): then, and
        when the index holds nothing of it, done at once; returns True when deferred. O(1)
        (O(entries) when done at once)."""
        index = self.index
        if client_id in self._departed:
            self.settle_client(client_id)  # an earlier departure of the id: finished first
        if not isinstance(index, _CachingIndex) or client_id in index.shared_clients:
            self._end_client(client_id, selectors)
            return False
        if not selectors and not index.entry_count(client_id):
            return False
        self._departed[client_id] = selectors
        return True

    def settle_client(self, client_id: str) -> bool:
        """Finish the departure of ``client_id`` now, if it waits (a session of that id is
        about to be made: its predecessor's subscriptions must not reach it); True if it
        did. O(1) when none waits, else O(its entries)."""
        selectors = self._departed.pop(client_id, None)
        if selectors is None:
            return False
        self._end_client(client_id, selectors)
        return True

    def _end_client(self, client_id: str, selectors: dict[str, str]) -> None:
        """Remove the entries of ``client_id`` and release its selectors. O(its entries)."""
        for selector in selectors.values():
            self.release_selector(selector)
        self.index.remove_client(client_id)

    def settle_selectors(
        self, limit: int = RELEASE_SLICE, budget: float = 0.0, clock: Callable[[], float] = perf_counter
    ) -> int:
        """Remove up to ``limit`` released selectors from the engine, oldest first (0: all;
        a 64th of what waits when that is more, so a backlog of more than 64 slices still
        drains geometrically); return how many still wait. ``Core.tick`` calls it, so a loop
        turn spends at most a slice's removals. O(removed) engine removals.

        ``budget`` (seconds, > 0; ``clock``: the time source, ``time.perf_counter``): the
        slice also stops once it has spent that long, looked at after every removal, so it
        ends within one removal of its budget whatever the engine (:data:`SETTLE_BUDGET`;
        counted in removals alone, 512 of them took 15-28 ms: issue 42 item 2); the rest
        waits for the next slice. 0: bounded by the count alone.

        Departed clients (:meth:`depart`) go first, ``limit // 4`` of them (a 128th of a
        larger backlog; their entries out of the index, their selectors join the released
        ones), each taking two selector removals off the slice (about their cost), so a
        slice stays within one selector slice's time; 0: all. Returns the removals still
        waiting (:attr:`releasing`). The tables a backlog grew are given back once it is
        settled (:meth:`_shrink`)."""
        departed = self._departed
        timed = budget > 0.0
        deadline = clock() + budget if timed else 0.0
        spent = 0
        if departed:
            k = len(departed) if limit <= 0 else min(len(departed), max(limit // 4, len(departed) // 128))
            for client_id in list(islice(departed, k)):  # one list: departed shrinks meanwhile
                self._end_client(client_id, departed.pop(client_id))
                spent += 2
                if timed and clock() >= deadline:
                    return self._settled()
        pending = self._releasing
        if not pending:
            return self._settled()
        n = len(pending) if limit <= 0 else min(len(pending), max(limit, len(pending) // 64) - spent)
        if n <= 0:
            return len(pending) + len(departed)
        engine = self._live()
        for selector in list(islice(pending, n)):
            del pending[selector]
            engine.remove(selector)
            if timed and clock() >= deadline:
                break
        return self._settled()

    def _settled(self) -> int:
        """The removals still waiting; once none does, the tables the backlog grew are
        shrunk (:meth:`_shrink`). O(1), O(selectors) when a table is copied."""
        left = len(self._releasing) + len(self._departed)
        if not left:
            self._shrink()
        return left

    def _shrink(self) -> None:
        """Give back the tables a departed fleet grew: a Python dict keeps its table when its
        keys are deleted (1.9 MB for 100,000 selectors once every one was released, 1 MB for
        the released ones' queue, 0.2 MB for 10,000 departed clients; measured with
        ``bench_content_fleet.py --probe-teardown``, ``held_bytes``). The empty queues are
        made anew, and ``_selector_refs`` is copied into a table of its size when it holds
        less than a quarter of its peak. O(1), O(selectors left) when copied; amortized O(1)
        per release (at least three quarters of the peak were released since)."""
        self._releasing = {}
        self._departed = {}
        refs = self._selector_refs
        if self._refs_peak >= _SHRINK_FROM and 4 * len(refs) < self._refs_peak:
            self._selector_refs = dict(refs)
            self._refs_peak = len(refs)

    def _matching_selectors(self, payload: bytes) -> set[object]:
        return self._live().match(content.attributes(payload))

    # ------------------------------------------------------------ routing
    def _plan(self, topic: str) -> _Plan | None:
        """The cached plan of ``topic``; None on a first miss (admission: a topic gets a plan
        when it misses twice within ``cache_size`` distinct missed topics, so a cyclic scan
        over more topics than the cache holds routes directly instead of thrashing)."""
        cache = self._cache
        plan = cache.get(topic)
        if plan is not None:
            cache.move_to_end(topic)
            return plan
        self.cache_misses += 1
        seen = self._seen
        if topic not in seen:
            if len(seen) >= self.cache_size:
                seen.clear()
            seen.add(topic)
            return None
        seen.discard(topic)
        plan = _Plan(self.index.match(topic), self.groups)
        cache[topic] = plan
        if len(cache) > self.cache_size:
            cache.popitem(last=False)
        return plan

    def _route_direct(self, msg: Message) -> list[Route]:
        """Route without a plan: one index match, the engine only if a selector is met."""
        result = self.index.match(msg.topic)
        routes: list[Route] = []
        append = routes.append
        publisher = msg.publisher_id
        mqos = msg.qos
        mretain = msg.retain
        sel_ok: AbstractSet[object] | None = None
        for client_id, subs in result.clients.items():
            ok: AbstractSet[object] = _EMPTY
            for sub in subs:
                if sub.options.selector is not None:
                    if sel_ok is None:
                        sel_ok = self._matching_selectors(msg.payload)
                    ok = sel_ok
                    break
            r = _client_route(client_id, subs, publisher, mqos, mretain, ok)
            if r is not None:
                append(r)
        if result.shared:
            of = self.groups.of
            groups = {key: of(key, members) for key, members in result.shared.items()}
            if sel_ok is None and any(g.selective for g in groups.values()):
                sel_ok = self._matching_selectors(msg.payload)
            self._route_shared(groups, _EMPTY if sel_ok is None else sel_ok, msg, append, False)
        return routes

    def _route_shared(
        self,
        shared: dict[tuple[str, str], Members],
        sel_ok: AbstractSet[object],
        msg: Message,
        append: Callable[[Route], None],
        local: bool,
    ) -> None:
        """One delivery per shared group, to the member its strategy picks among the members
        the message passes (among the reachable ones, :attr:`unavailable`, when there are
        any).  ``local``: ``shared`` holds the groups' local members (:meth:`route_peer`).
        O(1) amortized per group (the reachable members are kept in :attr:`groups` while the
        group and the unreachable nodes are unchanged), O(members) for a group whose members
        carry content filters (the candidates are filtered first, then picked once: picking
        among all and again among the reachable advanced a round robin twice and sent the
        member after an unreachable one more than its share)."""
        unavailable = self._unavailable
        pick = self.shared.pick
        mqos = msg.qos
        publisher = msg.publisher_id
        topic = msg.topic
        for key, members in shared.items():
            group = members
            if group.selective:
                group = Members.of(
                    [m for m in members.members if m[1].selector is None or m[1].selector in sel_ok]
                )
                if unavailable:
                    group = reachable(group, unavailable)
            elif unavailable:
                group = self.groups.reachable(key, group, unavailable, local)
            if not group.members:
                continue
            client_id, o = group.members[pick(key, group, publisher, topic)]
            ids_t = () if o.subscription_id is None else (o.subscription_id,)
            append(
                Route(client_id, mqos if mqos < o.qos else o.qos, False, ids_t, o.topic_filter, o.selector)
            )

    def route_peer(
        self, msg: Message, plain: bool, groups: AbstractSet[tuple[str, str]], replay: bool = False
    ) -> list[Route]:
        """The deliveries of a message another broker of a cluster forwarded (docs/cluster.md).

        Only local sessions receive it: a session whose client id starts with
        :data:`PEER_PREFIX` (another broker's link) never does, so a message crosses at most
        one link.  ``plain``: the peer forwarded it for this broker's ordinary subscriptions
        (all matching local non-shared subscribers get it); ``groups``: the ``(group, filter)``
        shared subscriptions it was forwarded for (one local member of each gets it, by the
        group's strategy).  ``replay``: a peer's retained message sent because this broker subscribed anew
        (delivered with the RETAIN flag, as a retained message on SUBSCRIBE is).  O(index
        match) without the plan cache (peer traffic is one copy per node).
        """
        self.routed += 1
        if plain and not groups:  # the common case: through the plan cache
            plan = self._plan(msg.topic)
            if plan is not None and not plan.shared:
                routes = self._route_plan(msg, plan, None)
                if replay or any(r.client_id.startswith(PEER_PREFIX) for r in routes):
                    routes = [
                        r
                        if not replay or r.retain
                        else Route(r.client_id, r.qos, True, r.subscription_ids, r.topic_filter, r.selector)
                        for r in routes
                        if not r.client_id.startswith(PEER_PREFIX)
                    ]
                return routes
        result = self.index.match(msg.topic)
        routes = []
        append = routes.append
        sel_ok: AbstractSet[object] | None = None
        if plain:
            for client_id, subs in result.clients.items():
                if client_id.startswith(PEER_PREFIX):
                    continue
                ok: AbstractSet[object] = _EMPTY
                if any(sub.options.selector is not None for sub in subs):
                    if sel_ok is None:
                        sel_ok = self._matching_selectors(msg.payload)
                    ok = sel_ok
                r = _client_route(client_id, subs, msg.publisher_id, msg.qos, msg.retain, ok)
                if r is not None:
                    if replay and not r.retain:
                        r = Route(r.client_id, r.qos, True, r.subscription_ids, r.topic_filter, r.selector)
                    append(r)
        if groups and result.shared:
            of_local = self.groups.local
            local = {key: of_local(key, members) for key, members in result.shared.items() if key in groups}
            if sel_ok is None and any(g.selective for g in local.values()):
                sel_ok = self._matching_selectors(msg.payload)
            self._route_shared(local, _EMPTY if sel_ok is None else sel_ok, msg, append, True)
        return routes

    def route(self, msg: Message) -> list[Route]:
        """Decide every delivery of ``msg`` (MQTT 5 section 4.5 and docs/reference.md rules)."""
        self.routed += 1
        plan = self._plan(msg.topic)
        if plan is None:
            return self._route_direct(msg)
        return self._route_plan(msg, plan, None)

    def route_head(
        self, msg: Message, at_least: int, chunk: int
    ) -> tuple[list[Route], Iterator[list[Route]] | None]:
        """:meth:`route` begun: the first ``at_least`` routes of ``msg`` or more (all of them
        when it has fewer), and an iterator of the rest, in parts of ``chunk`` routes or more
        computed as they are read (None: the first list holds every route).  The first list
        followed by the parts is exactly ``route(msg)``: the same routes in the same order,
        the same plan-cache, counter and shared-group effects (the groups' picks in the last
        part, as they come last in ``route``).  A big fan-out's deliveries start after
        ``at_least`` routes instead of all of them (``Core.publish``, ``EARLY_MIN``; issue 42
        item 2: at 100k filtered subscriptions the heaviest message's 5,188 routes took
        17-22 ms before its first copy could leave).  Streamed only when the topic has a plan
        whose join has per-client work (selectors, no-local) and that lists ``at_least``
        clients and groups (``_Plan.reach``); any other message is routed whole, as by
        :meth:`route` (no generator made). O(the first routes) now, O(chunk) per part."""
        self.routed += 1
        plan = self._plan(msg.topic)
        if plan is None:
            return self._route_direct(msg), None
        if plan.reach < at_least or not (plan.general or plan.by_selector or plan.by_selectors):
            return self._route_plan(msg, plan, None), None
        parts = self._stream_plan(msg, plan, chunk)
        head: list[Route] = []
        for part in parts:
            head += part
            if len(head) >= at_least:
                return head, parts
        return head, None

    def _stream_plan(  # noqa: C901 (the join of _route_plan in one frame)
        self, msg: Message, plan: _Plan, chunk: int
    ) -> Iterator[list[Route]]:
        """:meth:`_route_plan` in parts of ``chunk`` routes or more, each computed when it is
        asked for: the plan's prebuilt routes first (no per-client work), then the join's
        (``general``, the clients of the matched selectors in ``by_selector``, then those of
        ``by_selectors`` once each), the shared groups' picks in the last part -- the order of
        :meth:`_route_plan`, which the two must keep (the router's model test compares them).
        The engine's match is made before the first part of the join. O(chunk) per part."""
        mqos = msg.qos
        mretain = msg.retain
        key = 2 * mqos + mretain
        fixed = plan.routes[key]
        if fixed is None:
            fixed = plan.fixed_routes(key)
        part = fixed.copy()
        if len(part) >= chunk:
            yield part
            part = []
        publisher = msg.publisher_id
        sel_ok: AbstractSet[object] = self._matching_selectors(msg.payload) if plan.selective else _EMPTY
        lists = [plan.general]
        if plan.by_selector and sel_ok:
            lists += _matched(plan.by_selector, sel_ok)
        for clients in lists:
            for client_id, subs in clients:
                r = _client_route(client_id, subs, publisher, mqos, mretain, sel_ok)
                if r is not None:
                    part.append(r)
                    if len(part) >= chunk:
                        yield part
                        part = []
        if plan.by_selectors and sel_ok:
            seen: set[str] = set()  # a client listed under several matched selectors: once
            for clients in _matched(plan.by_selectors, sel_ok):
                for client_id, subs in clients:
                    if client_id in seen:
                        continue
                    seen.add(client_id)
                    r = _client_route(client_id, subs, publisher, mqos, mretain, sel_ok)
                    if r is not None:
                        part.append(r)
                        if len(part) >= chunk:
                            yield part
                            part = []
        if plan.shared:
            self._route_shared(plan.shared, sel_ok, msg, part.append, False)
        if part:
            yield part

    def _batching(self) -> bool:
        """Whether :meth:`route_batch` matches content as one batch (a batch engine holding at
        least ``batch_min`` selectors); otherwise it is a loop over :meth:`route`. Kept in
        ``batching`` (updated when selectors come and go): read once per packet read."""
        return bool(self._live().batch_native) and len(self._selector_refs) >= self.batch_min

    def route_batch(self, msgs: Sequence[Message]) -> list[list[Route]]:
        """``[self.route(m) for m in msgs]``, with one ``engine.match_batch`` for the messages
        whose plan needs the engine (issue 8: the PUBLISHes of one read matched as a batch).

        Same result, same plan-cache and round-robin effects as the loop: plans are looked up
        in message order, and routing changes no subscription state.
        """
        if len(msgs) < 2 or not self.batching:
            return [self.route(m) for m in msgs]
        plans = [self._plan(m.topic) for m in msgs]
        need = [i for i, plan in enumerate(plans) if plan is not None and plan.selective]
        matched: dict[int, AbstractSet[object]] = {}
        engine = self._live()
        if len(need) >= engine.batch_min_events:
            results = engine.match_batch([content.attributes(msgs[i].payload) for i in need])
            matched = dict(zip(need, results, strict=True))
            self.batched += len(need)
        out: list[list[Route]] = []
        for i, msg in enumerate(msgs):
            self.routed += 1
            plan = plans[i]
            out.append(
                self._route_direct(msg) if plan is None else self._route_plan(msg, plan, matched.get(i))
            )
        return out

    def _route_plan(  # noqa: C901, PLR0912 (hot path: one frame per routed message)
        self, msg: Message, plan: _Plan, sel_ok: AbstractSet[object] | None
    ) -> list[Route]:
        """Join ``plan`` with the message (``sel_ok``: the matching selectors if known)."""
        mqos = msg.qos
        mretain = msg.retain
        key = 2 * mqos + mretain
        fixed = plan.routes[key]
        if fixed is None:
            fixed = plan.fixed_routes(key)
        routes = fixed.copy()
        if not (plan.general or plan.by_selector or plan.by_selectors or plan.shared):
            return routes
        append = routes.append
        publisher = msg.publisher_id
        if sel_ok is None:
            sel_ok = self._matching_selectors(msg.payload) if plan.selective else _EMPTY
        for client_id, subs in plan.general:
            r = _client_route(client_id, subs, publisher, mqos, mretain, sel_ok)
            if r is not None:
                append(r)
        by_selector = plan.by_selector
        if by_selector and sel_ok:
            if len(sel_ok) <= len(by_selector):
                get = by_selector.get
                for selector in sel_ok:
                    clients = get(selector)
                    if clients is not None:
                        for client_id, subs in clients:
                            r = _client_route(client_id, subs, publisher, mqos, mretain, sel_ok)
                            if r is not None:
                                append(r)
            else:
                for selector, clients in by_selector.items():
                    if selector in sel_ok:
                        for client_id, subs in clients:
                            r = _client_route(client_id, subs, publisher, mqos, mretain, sel_ok)
                            if r is not None:
                                append(r)
        by_selectors = plan.by_selectors
        if by_selectors and sel_ok:
            # a client listed under several matched selectors is routed once: the first of
            # them computes its Route from all its subscriptions (O(matched entries))
            seen: set[str] = set()
            add = seen.add
            for selector in sel_ok if len(sel_ok) <= len(by_selectors) else by_selectors:
                clients = by_selectors.get(selector)
                if clients is None or selector not in sel_ok:
                    continue
                for client_id, subs in clients:
                    if client_id in seen:
                        continue
                    add(client_id)
                    r = _client_route(client_id, subs, publisher, mqos, mretain, sel_ok)
                    if r is not None:
                        append(r)
        if plan.shared:
            self._route_shared(plan.shared, sel_ok, msg, append, False)
        return routes

    def _check(self) -> None:
        """Assert the cache bound and that every cached plan equals a fresh one (O(cache)),
        and that the engine holds the referenced and the waiting selectors, nothing else."""
        assert len(self._cache) <= self.cache_size
        assert not self._releasing.keys() & self._selector_refs.keys()
        for waiting in self._departed.values():  # still referenced until settled
            assert all(sel in self._selector_refs for sel in waiting.values())
        if self._engine is not None:
            assert set(self._engine) == self._selector_refs.keys() | self._releasing.keys()
        for topic, plan in self._cache.items():
            result = self.index.match(topic)
            self.groups.check(result.shared)
            fresh = _Plan(result, Groups())
            assert plan.fixed == fresh.fixed, topic
            assert plan.general == fresh.general, topic
            assert plan.by_selector == fresh.by_selector, topic
            assert plan.by_selectors == fresh.by_selectors, topic
            for clients in plan.by_selectors.values():  # listed once per selector
                assert len({cid for cid, _ in clients}) == len(clients), topic
            for selector, clients in plan.by_selectors.items():
                for _, subs in clients:
                    selectors = {sub.options.selector for sub in subs}
                    assert selector in selectors and None not in selectors and len(selectors) > 1, topic
                    assert not any(sub.options.no_local for sub in subs), topic
            assert plan.shared == fresh.shared, topic
            assert plan.selective == fresh.selective, topic
            assert plan.reach == fresh.reach, topic
            for key, routes in enumerate(plan.routes):
                assert routes is None or routes == fresh.fixed_routes(key), topic

    # ------------------------------------------------------------ retained
    # ------------------------------------------------------------ subscriptions
    def subscribe(  # noqa: PLR0917
        self,
        client_id: str,
        selectors: dict[str, str],
        req: SubscriptionRequest,
        packet_selector: str | None,
        sub_id: int | None,
        authorize: Callable[[str], bool] | None = None,
    ) -> Subscribed:
        """One request of a SUBSCRIBE: prefixes parsed (``$filter/``, ``$share/``), filter and
        selector checked against the limits, the selector compiled and reference-counted
        (``selectors``: the client's filter -> selector map), the entry stored in the index.

        O(levels + selector) plus the index's subscribe; a refusal changes nothing.
        """
        limits = self.limits
        try:
            selector, full_filter = split_filter_prefix(req.topic_filter)
            share = split_share(full_filter)
        except ValueError as exc:
            return Subscribed(ReasonCode.TOPIC_FILTER_INVALID, str(exc)[:200])
        if selector is None:
            selector = packet_selector
        plain = full_filter if share is None else share[1]
        try:
            topics.validate_filter(plain)
        except topics.InvalidTopic as exc:
            # the message names the filter (cut to 60 characters) and the position
            return Subscribed(ReasonCode.TOPIC_FILTER_INVALID, str(exc)[:300])
        if plain.count("/") >= limits.max_topic_levels:
            return Subscribed(
                ReasonCode.TOPIC_FILTER_INVALID,
                f"{shown(plain)}: more than {limits.max_topic_levels} topic levels",
                "topic_levels",
            )
        compiled: content.Filter | None = None
        if selector is not None:
            try:
                compiled = content.compile(selector)
            except content.FilterSyntaxError as exc:
                return Subscribed(
                    ReasonCode.TOPIC_FILTER_INVALID,
                    f"content filter {shown(selector)}: {at_position(exc, exc.position)}",
                    "selector",
                )
        if full_filter in limits.refused_filters:
            return Subscribed(ReasonCode.UNSPECIFIED_ERROR, f"{shown(full_filter)}: refused by configuration")
        if authorize is not None and not authorize(full_filter):
            return Subscribed(ReasonCode.NOT_AUTHORIZED, f"{shown(full_filter)}: not authorized")
        index = self.index
        if index.entry_count(client_id) >= limits.max_subscriptions and not any(
            e.topic_filter == full_filter for e in index.entries(client_id)
        ):
            return Subscribed(
                ReasonCode.QUOTA_EXCEEDED,  # 3.1.1: 0x80 (codec)
                f"{shown(full_filter)}: more than {limits.max_subscriptions} subscriptions",
                "subscriptions",
            )
        qos = min(req.qos, limits.maximum_qos)
        options = SubOptions(
            qos, req.no_local, req.retain_as_published, req.retain_handling, sub_id, selector, plain
        )
        old_selector = selectors.pop(full_filter, None)
        if compiled is not None and selector is not None:
            self.add_selector(selector, compiled)
            selectors[full_filter] = selector
        if old_selector is not None:
            self.release_selector(old_selector)
        outcome = index.subscribe(client_id, full_filter, options)
        rh = req.retain_handling
        due = share is None and (rh == 0 or (rh == 1 and not outcome.replaced))
        return Subscribed(ReasonCode(qos), None, None, full_filter, plain, selector, due)

    def unsubscribe(self, client_id: str, selectors: dict[str, str], raw: str) -> Subscribed:
        """One filter of an UNSUBSCRIBE (partial unsubscribe: docs/reference.md); ``code`` is the
        UNSUBACK reason code, ``limit`` the change: ``removed``, ``partial`` or None."""
        try:
            _, full_filter = split_filter_prefix(raw)
            share = split_share(full_filter)
            plain = full_filter if share is None else share[1]
            topics.validate_filter(plain)
        except ValueError:
            return Subscribed(ReasonCode.TOPIC_FILTER_INVALID)
        result = self.index.unsubscribe(client_id, full_filter)
        if result is topics.UnsubscribeOutcome.REMOVED:
            selector = selectors.pop(full_filter, None)
            if selector is not None:
                self.release_selector(selector)
            return Subscribed(ReasonCode.SUCCESS, None, "removed", full_filter, plain, selector)
        if result is topics.UnsubscribeOutcome.PARTIAL:
            return Subscribed(ReasonCode.SUCCESS, None, "partial", full_filter, plain)
        return Subscribed(ReasonCode.NO_SUBSCRIPTION_EXISTED)

    def store_retained(self, msg: Message) -> None:
        """Store ``msg`` as the retained message of its topic (empty payload clears it);
        ``retained_bytes`` follows. O(topic levels)."""
        old = self.retained.get(msg.topic)
        if old is not None:
            self.retained_bytes -= len(old.payload)
        if msg.payload:
            self.retained.set(msg.topic, msg)
            self.retained_bytes += len(msg.payload)
        else:
            self.retained.delete(msg.topic)

    def retained_fits(self, topic: str, size: int, max_count: int, max_bytes: int) -> bool:
        """Whether a retained message of ``size`` bytes on ``topic`` stays within ``max_count``
        messages and ``max_bytes`` payload bytes (0: no cap) when it replaces the topic's
        current one. O(topic levels)."""
        old = self.retained.get(topic)
        count = len(self.retained) + (old is None)
        total = self.retained_bytes + size - (0 if old is None else len(old.payload))
        return (not max_count or count <= max_count) and (not max_bytes or total <= max_bytes)

    def retained_for(self, topic_filter: str, selector: str | None, now: float) -> Iterator[Message]:
        """Retained messages a new subscription receives (expired ones are dropped)."""
        expired: list[str] = []
        for topic, msg in self.retained.match(topic_filter):
            if msg.expires_at is not None and msg.expires_at <= now:
                expired.append(topic)
                continue
            if selector is not None and selector not in self._matching_selectors(msg.payload):
                continue
            yield msg
        for topic in expired:
            old = self.retained.get(topic)
            if old is not None:
                self.retained_bytes -= len(old.payload)
            self.retained.delete(topic)
