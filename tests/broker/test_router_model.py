"""Model test of the router's plan cache and engine-first join against per-message routing.

The reference is brute force for plain subscriptions: the machine keeps every client's
ordered entries (subscriptions and negative entries, docs/reference.md "Negative entries inside the
MQTT broker") itself, walks them newest first with ``topics.matches`` and evaluates every
selector with ``content.compile(...)`` directly on the JSON attributes; ``$share`` groups come
from ``SubscriptionIndex.match`` (only the member choice is the router's).  The state
machine interleaves subscriptions (plain, wildcard, ``$share``, with and without selectors
and no-local), partial unsubscriptions, client removals and publishes, and compares the
deliveries.  A twin router with a batch engine (``hcem``, ``rabased``; ``batch_min=1``) gets
the same operations, and its ``route_batch`` over random batches must equal the per-message
``route`` of the first router exactly (shared round robin included: both see every message).
A third router, the first's own kind, routes every message with ``route_head`` (a big
fan-out's routing streamed into its delivery, ``Core.publish``) at random sizes: its first
routes followed by its parts must be the first router's ``route``, in the same order.
"""

from __future__ import annotations

import orjson
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import content
import topics
from broker.core._router import Router
from broker.values import Message, Route, SubOptions

CLIENTS = ["c0", "c1", "c2", "c3"]
FILTERS = ["a/b", "a/+", "a/#", "+/b", "#", "a/c", "$share/g/a/b", "$share/g/a/+"]
TOPICS = ["a/b", "a/c", "b/b", "a"]
SELECTORS = [None, "x > 1", "x < 3", "y = 'k'"]


# per client: entries oldest first, (filter, options) or (filter, None) for a negative entry
Entries = dict[str, list[tuple[str, SubOptions | None]]]


def model_subscribe(entries: Entries, cid: str, f: str, opts: SubOptions) -> None:
    lst = [(g, o) for g, o in entries.get(cid, []) if g != f and not (o is None and topics.includes(f, g))]
    entries[cid] = [*lst, (f, opts)]


def model_unsubscribe(entries: Entries, cid: str, f: str) -> None:
    old = entries.get(cid, [])
    exact = any(g == f and o is not None for g, o in old)
    lst = [
        (g, o) for g, o in old if not (g == f and o is not None) and not (o is None and topics.includes(f, g))
    ]
    if not exact and any(o is not None and topics.overlaps(f, g) for g, o in lst):
        lst.append((f, None))
    entries[cid] = lst


def reference(router: Router, entries: Entries, msg: Message) -> list[tuple[object, ...]]:
    result = router.index.match(msg.topic)
    attrs = content.attributes(msg.payload)
    out: list[tuple[object, ...]] = []
    for cid, lst in entries.items():
        collected: list[SubOptions] = []
        for g, opts in reversed(lst):
            if topics.matches(g, msg.topic):
                if opts is None:
                    break
                collected.append(opts)
        best: SubOptions | None = None
        ids: list[int] = []
        rap = False
        for o in collected:
            if o.no_local and cid == msg.publisher_id:
                continue
            if o.selector is not None and not content.compile(o.selector).matches(attrs):
                continue
            if best is None or o.qos > best.qos:
                best = o
            if o.subscription_id is not None:
                ids.append(o.subscription_id)
            rap = rap or o.retain_as_published
        if best is not None:
            qos = min(msg.qos, best.qos)
            out.append((cid, qos, msg.retain and rap, tuple(ids), best.topic_filter, best.selector))
    for key, members in result.shared.items():
        ok = sorted(c for c, o in members if o.selector is None or content.compile(o.selector).matches(attrs))
        if ok:
            out.append(("$share", key, tuple(ok)))
    return sorted(out, key=repr)


def _unordered(routes: list[Route]) -> list[Route]:
    return sorted(routes, key=repr)


class RouterMachine(RuleBasedStateMachine):
    twin_engine = "hcem"

    def __init__(self) -> None:
        super().__init__()
        self.router = Router(cache_size=3)
        self.twin = Router(cache_size=3, engine=self.twin_engine, batch_min=1)
        self.streamer = Router(cache_size=3)
        self.selectors: dict[tuple[str, str], str] = {}
        self.entries: Entries = {}
        self.next_id = 1

    @property
    def routers(self) -> tuple[Router, Router, Router]:
        return (self.router, self.twin, self.streamer)

    def streamed(self, msg: Message, at_least: int, chunk: int) -> list[Route]:
        """``route_head`` then every part, each part ``chunk`` routes or more (the last
        excepted), the first list ``at_least`` or all."""
        head, rest = self.streamer.route_head(msg, at_least, chunk)
        out = list(head)
        if rest is None:
            return out
        event("streamed")  # the case this checks (--hypothesis-show-statistics)
        assert len(head) >= at_least
        parts = list(rest)
        assert all(len(part) >= chunk for part in parts[:-1])
        for part in parts:
            out += part
        return out

    @rule(
        cid=st.sampled_from(CLIENTS),
        f=st.sampled_from(FILTERS),
        sel=st.sampled_from(SELECTORS),
        qos=st.integers(0, 2),
        no_local=st.booleans(),
        rap=st.booleans(),
        with_id=st.booleans(),
    )
    def subscribe(
        self, cid: str, f: str, sel: str | None, qos: int, no_local: bool, rap: bool, with_id: bool
    ) -> None:
        shared = f.startswith("$share/")
        plain = f.split("/", 2)[2] if shared else f
        sub_id = self.next_id if with_id else None
        self.next_id += 1
        old = self.selectors.pop((cid, f), None)
        opts = SubOptions(qos, no_local and not shared, rap, 0, sub_id, sel, plain)
        for router in self.routers:
            if sel is not None:
                router.add_selector(sel, content.compile(sel))
            if old is not None:
                router.release_selector(old)
            router.index.subscribe(cid, f, opts)
        if sel is not None:
            self.selectors[cid, f] = sel
        if not shared:
            model_subscribe(self.entries, cid, f, opts)

    @rule(cid=st.sampled_from(CLIENTS), f=st.sampled_from(FILTERS))
    def unsubscribe(self, cid: str, f: str) -> None:
        old = self.selectors.pop((cid, f), None)
        for router in self.routers:
            router.index.unsubscribe(cid, f)  # partial unsubscribe may leave a negative entry
            if old is not None:
                router.release_selector(old)
        if not f.startswith("$share/"):
            model_unsubscribe(self.entries, cid, f)

    @rule(cid=st.sampled_from(CLIENTS))
    def remove_client(self, cid: str) -> None:
        self.entries.pop(cid, None)
        for router in self.routers:
            router.index.remove_client(cid)
        for key in [k for k in self.selectors if k[0] == cid]:
            sel = self.selectors.pop(key)
            for router in self.routers:
                router.release_selector(sel)

    @rule(
        topic=st.sampled_from(TOPICS),
        x=st.integers(0, 4),
        y=st.sampled_from(["k", "z"]),
        qos=st.integers(0, 2),
        retain=st.booleans(),
        pub=st.sampled_from([*CLIENTS, None]),
        at_least=st.integers(1, 4),
        chunk=st.integers(1, 3),
    )
    def publish(
        self,
        topic: str,
        x: int,
        y: str,
        qos: int,
        retain: bool,
        pub: str | None,
        at_least: int,
        chunk: int,
    ) -> None:
        payload = orjson.dumps({"x": x, "y": y})
        msg = Message(topic, payload, qos, retain, publisher_id=pub)
        expected = reference(self.router, self.entries, msg)
        routes = self.router.route(msg)
        # streamed: the same routes in the same order (the same engine, the same round robin)
        assert self.streamed(msg, at_least, chunk) == routes
        # the same routes, in any order: engines list matches in their own order (hcem by its
        # clusters, which a removal and a resubscription reshuffle), and MQTT orders messages
        # per subscriber, not deliveries across subscribers (4.6)
        assert _unordered(self.twin.route(msg)) == _unordered(routes)
        shared: dict[object, tuple[str, ...]] = {e[1]: e[2] for e in expected if e[0] == "$share"}  # type: ignore[misc]
        plain = [e for e in expected if e[0] != "$share"]
        # a shared delivery goes to one eligible member; plain deliveries match exactly
        got = [(r.client_id, r.qos, r.retain, r.subscription_ids, r.topic_filter, r.selector) for r in routes]
        assert len(routes) == len(plain) + len(shared)
        for e in plain:
            assert e in got
        members = {m for ms in shared.values() for m in ms}
        for r in routes:
            t = (r.client_id, r.qos, r.retain, r.subscription_ids, r.topic_filter, r.selector)
            assert t in plain or r.client_id in members

    @rule(
        batch=st.lists(
            st.tuples(
                st.sampled_from(TOPICS),
                st.integers(0, 4),
                st.integers(0, 1),
                st.sampled_from([*CLIENTS, None]),
            ),
            min_size=2,
            max_size=8,
        )
    )
    def publish_batch(self, batch: list[tuple[str, int, int, str | None]]) -> None:
        msgs = [
            Message(topic, orjson.dumps({"x": x, "y": "k"}), qos, False, publisher_id=pub)
            for topic, x, qos, pub in batch
        ]
        assert self.twin.batching == bool(self.selectors)
        twin = self.twin.route_batch(msgs)
        routes = [self.router.route(m) for m in msgs]
        assert [_unordered(r) for r in twin] == [_unordered(r) for r in routes]
        assert [self.streamed(m, 2, 1) for m in msgs] == routes

    @invariant()
    def consistent(self) -> None:
        for router in self.routers:
            router._check()


class RabasedTwinMachine(RouterMachine):
    twin_engine = "rabased"


TestRouterModel = RouterMachine.TestCase
TestRouterModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestRouterModelRabasedTwin = RabasedTwinMachine.TestCase
TestRouterModelRabasedTwin.settings = settings(max_examples=30, stateful_step_count=40, deadline=None)
