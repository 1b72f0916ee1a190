"""Model-based test: the engine's composite events, buffers and counters equal the brute-force
reference of the documented semantics (tests/composite/reference.py).

Random expressions over a small atom pool (so elements are shared across subscriptions),
subscribe / re-subscribe / unsubscribe (of shared elements too), offers to one atom or to
several (a publication matching several atoms), time advancing past windows (integer times:
arrivals exactly on the window's edge happen), tick, snapshot + restore.  The engine's batch
sizes are shrunk so that log trimming and prefix-count rebasing happen within a few steps.
``_check()`` runs after every step.

Persistence by journal (composite/_journal.py): some keys are *durable* (all of them, or
keys 0-3 in partition 1 while the others are in partition 0, drawn per example); after every
call concerning a durable key (its subscribe and unsubscribe, an offer to an atom a durable
key uses) the test records what a broker would journal, and now and then a checkpoint takes
``snapshot(keep=durable)`` and empties the journal.  ``recover`` rebuilds an engine from the
last checkpoint plus ``replay`` of the journal, as a broker does after ``kill -9``: each durable
key's subscription, counters and buffers must equal the live engine's; when every key is
durable the recovered engine replaces the live one and the run continues against the
reference.  The engine's ``drain_losses`` (what the broker turns into
hook records) must report every dropped and expired instance exactly once: the running totals
of what it returned equal the engine's counters after every step, and ``occupancy(event)`` gives the firing
subscription's buffer occupancy after the offer, equal to the reference's.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from composite import (
    Call,
    Component,
    CompositeEngine,
    CompositeEvent,
    Unsubscribed,
    offered,
    parse,
    replay,
    subscribed,
)
from tests.budget import examples
from tests.composite.reference import EventKey, Reference

POOL = ["a", "b", "c", "d", "e/+"]
KEYS = st.integers(0, 6)
WINDOW, CAP = 5.0, 3


@st.composite
def expressions(draw: st.DrawFn, depth: int = 3) -> str:
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        return draw(st.sampled_from(POOL))
    op = draw(st.sampled_from(["&", "|"]))
    n = draw(st.integers(2, 3))
    parts = [draw(expressions(depth - 1)) for _ in range(n)]
    return "(" + f" {op} ".join(parts) + ")"


def event_key(ev: CompositeEvent) -> EventKey:
    return (
        ev.expression,
        tuple(sorted((repr(k), q) for k, q in ev.deliveries)),
        tuple(
            (p.element, p.component.topic, p.component.payload, p.component.qos, p.arrival)
            for p in ev.components
        ),
        ev.begin,
        ev.end,
    )


def tune(engine: CompositeEngine) -> CompositeEngine:
    engine._trim_slack = 0
    engine._dcum_slack = 1
    engine._dcum_factor = 0
    return engine


class EngineVsReference(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engine = self.observed(CompositeEngine(window=WINDOW, max_buffer=CAP))
        self.ref = Reference(WINDOW, CAP)
        self.now = 0.0
        self.serial = 0
        self.lost = [0, 0]  # dropped, expired reported through drain_losses
        self.durable: set[int] = set()
        self.saved = self.engine.snapshot()  # the last checkpoint ...
        self.journal: list[Call] = []  # ... and the calls since

    @initialize(full=st.booleans())
    def durability(self, full: bool) -> None:
        self.durable = set(range(7)) if full else {0, 1, 2, 3}

    def partition(self, key: int) -> int:
        return 1 if key in self.durable and len(self.durable) < 7 else 0

    def durable_atoms(self) -> set[str]:
        out: set[str] = set()
        for key in self.durable:
            sub = self.engine.subscription_of(key)
            if sub is not None:
                out.update(a.text for a in parse(sub[0]).atoms())
        return out

    def observed(self, engine: CompositeEngine) -> CompositeEngine:
        engine.track_losses(True)
        return tune(engine)

    def drain(self) -> None:
        """What the broker's loss hook gets: every loss once, per subscription and atom."""
        for expression, window, cap, element, expired, dropped in self.engine.drain_losses():
            assert expired >= 0 and dropped >= 0 and expired + dropped > 0
            subs = [self.ref.subs.get((expression, window, cap, p)) for p in (0, 1)]
            assert any(sub is None or element in {a.text for a in sub.expr.atoms()} for sub in subs)
            self.lost[0] += dropped
            self.lost[1] += expired

    def occupancy(self, events: list[CompositeEvent]) -> None:
        """``occupancy`` of each event: its subscription's buffered instances now, as the
        reference (and as ``subscription()`` says, which settles on its own)."""
        for ev in events:
            got = self.engine.occupancy(ev)
            assert got is not None
            window, cap, buffered = got
            ref = self.ref.by_key[ev.deliveries[0][0]]
            assert (ref.expr.text, ref.window, ref.cap) == (ev.expression, window, cap)
            assert buffered == sum(len(b) for b in ref.buffers.values())
            key = next(iter(ref.subscribers))
            s = self.engine.subscription(key)
            assert s is not None and s.buffered == buffered

    def ids(self) -> dict[str, int]:
        return {a.element: a.id for a in self.engine.atoms()}

    @rule(
        key=KEYS,
        text=expressions(),
        qos=st.integers(0, 2),
        window=st.sampled_from([None, None, 2.0, 3.0]),
        cap=st.sampled_from([None, None, 1, 2]),
    )
    def subscribe(self, key: int, text: str, qos: int, window: float | None, cap: int | None) -> None:
        before = set(self.ids())
        part = self.partition(key)
        change = self.engine.subscribe(key, text, qos=qos, window=window, max_buffer=cap, partition=part)
        self.ref.subscribe(key, text, qos, window, cap, part)
        if key in self.durable:
            rec = subscribed(self.engine, key)
            assert rec is not None
            self.journal.append(rec)
        after = set(self.ids())
        assert {a.element for a in change.added} == after - before
        assert {a.element for a in change.removed} == before - after

    @precondition(lambda self: self.ref.by_key)
    @rule(key=KEYS, other=KEYS, qos=st.integers(0, 2))
    def subscribe_same(self, key: int, other: int, qos: int) -> None:
        """``key`` joins the composite subscription ``other`` is subscribed to (same
        expression, window and cap: shared buffers, within a partition)."""
        sub = self.ref.by_key.get(other)
        if sub is not None:
            self.subscribe(key, sub.expr.text, qos, sub.window, sub.cap)

    @rule(key=KEYS, dt=st.sampled_from([0, 0, 6]))
    def unsubscribe(self, key: int, dt: int) -> None:
        # the broker first moves the clock to the wall clock (what expired by then is counted
        # as expired, not discarded with the subscription)
        self.now += dt
        self.engine.advance(self.now)
        self.ref.advance(self.now)
        before = set(self.ids())
        change = self.engine.unsubscribe(key)
        had = self.ref.unsubscribe(key)
        if key in self.durable and had:
            self.journal.append(Unsubscribed(self.engine.clock, key))
        assert (change is not None) == had
        if change is not None:
            assert not change.added
            assert {a.element for a in change.removed} == before - set(self.ids())

    def payload(self) -> bytes:
        self.serial += 1
        return b"p%d" % self.serial

    @rule(atom=st.sampled_from([*POOL, "zz"]), qos=st.integers(0, 2), dt=st.sampled_from([0, 0, 1, 2, 3, 6]))
    def offer(self, atom: str, qos: int, dt: int) -> None:
        self.now += dt
        comp = Component(atom + "/t", self.payload(), qos)
        ids = self.ids()
        got = self.engine.offer(ids.get(atom, 10_000), comp, self.now)
        if atom in self.durable_atoms():
            self.journal.append(offered(self.engine, [ids[atom]], comp))
        want = self.ref.offer(atom, comp, self.now)
        assert sorted(map(event_key, got)) == sorted(want)
        self.occupancy(got)

    @rule(
        atoms=st.sets(st.sampled_from(POOL), min_size=1), qos=st.integers(0, 2), dt=st.sampled_from([0, 1, 4])
    )
    def offer_many(self, atoms: set[str], qos: int, dt: int) -> None:
        self.now += dt
        comp = Component("multi", self.payload(), qos)
        ids = self.ids()
        known = sorted((ids[a], a) for a in atoms if a in ids)
        got = self.engine.offer_many([i for i, _ in known], comp, self.now)
        if self.durable_atoms() & {a for _, a in known}:
            self.journal.append(offered(self.engine, [i for i, _ in known], comp))
        want: list[EventKey] = []
        for _, a in known:
            want.extend(self.ref.offer(a, comp, self.now))
        if not known:
            self.ref.advance(self.now)
            self.engine.tick(self.now)
        assert sorted(map(event_key, got)) == sorted(want)
        self.occupancy(got)

    @rule(dt=st.sampled_from([0, 1, 5, 7]), back=st.booleans())
    def tick(self, dt: int, back: bool) -> None:
        # a clock going backwards is ignored (the engine's time never decreases)
        self.now += dt
        t = self.now - 10 if back else self.now
        self.engine.tick(t)
        self.ref.advance(t)

    @rule(dt=st.sampled_from([0, 1, 6]), budget=st.integers(1, 3))
    def settle_some(self, dt: int, budget: int) -> None:
        # the broker's sweep: counts (and reports) what expired in idle subscriptions
        self.now += dt
        n = self.engine.settle_some(self.now, budget)
        assert 0 <= n <= min(budget, len(self.ref.subs))
        self.ref.advance(self.now)

    @precondition(lambda self: self.ref.by_key)
    @rule()
    def snapshot_restore(self) -> None:
        before = self.engine.stats()
        data = self.engine.snapshot()
        self.drain()
        self.engine = self.observed(CompositeEngine.restore(data))
        self.lost = [before.dropped, before.expired]  # the restored counters, all reported
        after = self.engine.stats()
        assert (after.events, after.dropped, after.expired, after.buffered) == (
            before.events,
            before.dropped,
            before.expired,
            before.buffered,
        )

    @rule()
    def checkpoint(self) -> None:
        """Compaction: a snapshot of the durable keys; the journal starts again."""
        self.saved = self.engine.snapshot(keep=self.durable.__contains__)
        self.journal = []

    @rule()
    def recover(self) -> None:
        """kill -9: the last checkpoint plus the journal equal the live engine's durable keys."""
        eng = self.observed(CompositeEngine.restore(self.saved))
        replay(eng, self.journal)
        eng.advance(self.engine.clock)  # the time after the restart (the wall clock in a broker)
        eng._check()
        for key in range(7):
            got = eng.subscription(key)
            live = self.engine.subscription(key)
            if key not in self.durable:
                assert got is None
                continue
            assert (got is None) == (live is None)
            if got is None or live is None:
                continue
            assert (got.expression, got.window, got.max_buffer) == (
                live.expression,
                live.window,
                live.max_buffer,
            )
            assert (got.events, got.dropped, got.expired, got.buffered) == (
                live.events,
                live.dropped,
                live.expired,
                live.buffered,
            )
            assert eng.buffers(key) == self.engine.buffers(key)
            assert eng.subscription_of(key) == self.engine.subscription_of(key)
        if len(self.durable) == 7:  # the recovered engine carries on
            before = self.engine.stats()
            self.drain()
            eng.drain_losses()  # what the replay counted was counted (and drained) live
            self.engine = eng
            self.lost = [before.dropped, before.expired]
            after = eng.stats()
            assert (after.events, after.dropped, after.expired, after.buffered) == (
                before.events,
                before.dropped,
                before.expired,
                before.buffered,
            )

    @invariant()
    def consistent(self) -> None:
        self.engine._check()
        ref = self.ref
        for key in range(7):
            s = self.engine.subscription(key)
            r = ref.by_key.get(key)
            assert (s is None) == (r is None)
            if s is None or r is None:
                continue
            assert (s.expression, s.window, s.max_buffer) == (r.expr.text, r.window, r.cap)
            assert (s.events, s.dropped, s.expired) == (r.events, r.dropped, r.expired)
            assert s.subscribers == len(r.subscribers)
            bufs = self.engine.buffers(key)
            assert bufs is not None
            assert {a: [(p.arrival, p.component) for p in parts] for a, parts in bufs.items()} == {
                a: list(b) for a, b in r.buffers.items()
            }
        st_ = self.engine.stats()
        assert st_.events == ref.events
        assert st_.dropped == ref.gone_dropped + sum(s.dropped for s in ref.subs.values())
        assert st_.expired == ref.gone_expired + sum(s.expired for s in ref.subs.values())
        self.drain()
        assert (st_.dropped, st_.expired) == tuple(self.lost)  # each loss reported once
        assert st_.subscriptions == len(ref.subs)
        assert st_.subscribers == len(ref.by_key)


TestEngineVsReference = EngineVsReference.TestCase
TestEngineVsReference.settings = settings(
    max_examples=examples(150),
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
