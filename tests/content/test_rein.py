"""REIN and HCEM (seed 004): exactness against brute force, bucket maintenance, batch scans.

The shared model test (test_engines_model.py) drives both engines with the whole selector
language on tiny subscription sets.  Here a second state machine uses numeric-heavy filters
over a few attributes with bulk adds and removes, so that lists are rebucketed (quantile
boundaries recomputed), compacted after deletes, unit ids are reused, and batches exceed one
64-event word; values sit at float64's limits (2**53 neighbours, huge ints, NaN, inf).
"""

from __future__ import annotations

import math
import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from content import HCEM, REIN, BruteForce, Filter, Op, Predicate
from content._predicate import Scalar

ATTRS = ("x", "y", "z")
BIG = 2**53
NUMS: tuple[int | float, ...] = (
    -2,
    -1,
    0,
    1,
    2,
    -0.5,
    0.5,
    1.5,
    BIG - 1,
    BIG,
    BIG + 1,
    float(BIG),
    float(BIG + 2),
    10**400,
    -(10**400),
    1e308,
)
EVENT_EXTRA: tuple[Scalar | float, ...] = (math.nan, math.inf, -math.inf, "1", True)
NUM_OPS = (Op.EQ, Op.LT, Op.LE, Op.GT, Op.GE)

num_preds = st.builds(Predicate.of, st.sampled_from(ATTRS), st.sampled_from(NUM_OPS), st.sampled_from(NUMS))
other_preds = st.one_of(
    st.builds(Predicate.of, st.sampled_from(ATTRS), st.just(Op.NE), st.sampled_from(NUMS)),
    st.builds(Predicate.of, st.sampled_from(ATTRS), st.just(Op.EQ), st.sampled_from(("1", "a", True))),
    st.builds(
        Predicate.of,
        st.sampled_from(ATTRS),
        st.sampled_from((Op.IN, Op.NOT_IN)),
        st.frozensets(st.sampled_from((0, 1, BIG + 1, "a")), min_size=1, max_size=3),
    ),
)
clauses = st.lists(st.one_of(num_preds, num_preds, num_preds, other_preds), max_size=4).map(tuple)
filters = st.lists(clauses, min_size=0, max_size=3).map(lambda cs: Filter("generated", tuple(cs)))
values = st.sampled_from(NUMS + EVENT_EXTRA)
events = st.dictionaries(st.sampled_from(ATTRS), values)


class NumericIndexVsBruteForce(RuleBasedStateMachine):
    """REIN and HCEM (with few buckets, so boundaries matter) against the oracle."""

    def __init__(self) -> None:
        super().__init__()
        self.rein = REIN(buckets=3)
        self.hcem = HCEM(buckets=5)
        self.oracle = BruteForce()
        self.next_id = 0

    def _add(self, sid: object, f: Filter) -> None:
        for e in (self.rein, self.hcem, self.oracle):
            e.add(sid, f)

    @rule(fs=st.lists(filters, min_size=1, max_size=40))
    def add_many(self, fs: list[Filter]) -> None:
        for f in fs:
            self._add(self.next_id, f)
            self.next_id += 1

    @rule(f=filters, data=st.data())
    def replace(self, f: Filter, data: st.DataObject) -> None:
        if len(self.oracle):
            self._add(data.draw(st.sampled_from(sorted(self.oracle, key=repr))), f)

    @rule(seed=st.integers(0, 2**32), share=st.floats(0.1, 1.0))
    def remove_many(self, seed: int, share: float) -> None:
        ids = sorted(self.oracle, key=repr)
        for sid in random.Random(seed).sample(ids, int(len(ids) * share)):
            for e in (self.rein, self.hcem, self.oracle):
                e.remove(sid)

    @rule(event=events)
    def match(self, event: dict[str, Scalar]) -> None:
        want = self.oracle.match(event)
        assert self.rein.match(event) == want
        assert self.hcem.match(event) == want

    @rule(batch=st.lists(events, min_size=1, max_size=70))
    def match_batch(self, batch: list[dict[str, Scalar]]) -> None:
        want = [self.oracle.match(e) for e in batch]
        assert self.hcem.match_batch(batch) == want
        assert self.rein.match_batch(batch) == want

    @invariant()
    def consistent(self) -> None:
        assert len(self.rein) == len(self.hcem) == len(self.oracle)
        self.rein._check()
        self.hcem._check()


def test_numeric_index_agrees_with_brute_force() -> None:
    run_state_machine_as_test(
        NumericIndexVsBruteForce,
        settings=settings(
            max_examples=20,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )


def _random_filter(rng: random.Random, attrs: int, k: int) -> Filter:
    clause = []
    for a in rng.sample(range(attrs), k):
        lo = rng.random() * 0.5
        clause.append(Predicate.of(f"a{a}", Op.GE, lo))
        clause.append(Predicate.of(f"a{a}", Op.LE, lo + 0.5))
    return Filter("generated", (tuple(clause),))


def test_bulk_churn_rebuckets_compacts_and_reuses_units() -> None:
    rng = random.Random(4)
    rein, hcem, oracle = REIN(buckets=16), HCEM(buckets=16), BruteForce()
    for sid in range(1200):
        f = _random_filter(rng, 6, 3)
        for e in (rein, hcem, oracle):
            e.add(sid, f)
    high_water = rein._table.n
    for sid in (s for s in range(1200) if s % 3):
        for e in (rein, hcem, oracle):
            e.remove(sid)
    assert rein._table.free, "compaction freed unit ids"
    for sid in range(1200, 1500):
        f = _random_filter(rng, 6, 3)
        for e in (rein, hcem, oracle):
            e.add(sid, f)
    assert rein._table.n <= high_water, "new units reuse freed ids"
    low, _high = rein._lists["a0"]
    assert 1 < len(low.count) <= 16, "bucket count follows the data, capped at b"
    batch = [{f"a{a}": rng.random() for a in range(6)} for _ in range(100)]
    batch[7] = {"a1": 0.5}
    want = [oracle.match(e) for e in batch]
    assert sum(map(len, want)) > 0
    assert hcem.match_batch(batch) == want
    assert [rein.match(e) for e in batch] == want
    big = batch * 6  # 600 events: ten 64-event chunks, the last one partial
    assert hcem.match_batch(big) == [rein.match(e) for e in big]
    rein._check()
    hcem._check()


def test_delete_never_rebuilds_other_lists() -> None:
    rein = REIN()
    for sid in range(200):
        rein.add(sid, f"a BETWEEN {sid} AND {sid + 10} AND b > {sid}")
    b_low, b_high = rein._lists["b"]
    arrays = (b_low.vals, b_low.units, b_high.vals, b_high.units)
    rein.add(999, "c = 1")
    rein.remove(999)
    rein.remove(5)
    assert (b_low.vals, b_low.units, b_high.vals, b_high.units) == arrays
    assert rein.match({"a": 7, "b": 6.5}) == {0, 1, 2, 3, 4, 6}
    rein._check()


def test_strict_bounds_and_float_limits_are_exact() -> None:
    for engine in (REIN(), HCEM()):
        engine.add("gt", "x > 9007199254740992")  # 2**53: strict bound kept as a residual
        engine.add("ge", "x >= 9007199254740992.0")
        engine.add("lt", "x < 0.5")
        engine.add("eq", "x = 1")
        engine.add("str", "x = '1' OR y LIKE 'a%'")
        assert engine.match({"x": BIG + 1}) == {"gt", "ge"}
        assert engine.match({"x": BIG}) == {"ge"}
        assert engine.match({"x": BIG - 1}) == set()
        assert engine.match({"x": math.nextafter(0.5, 0)}) == {"lt"}
        assert engine.match({"x": 0.5}) == set()
        assert engine.match({"x": 1.0}) == {"eq"}
        assert engine.match({"x": True}) == set()
        assert engine.match({"x": math.nan}) == set()
        assert engine.match({"x": 10**400}) == {"gt", "ge"}
        assert engine.match({"x": -(10**400)}) == {"lt"}
        assert engine.match({"x": "1"}) == {"str"}
        assert engine.match({"y": "ab"}) == {"str"}
        assert engine.match_batch([{"x": 0}, {"x": BIG + 1}, {}, {"x": 1}]) == [
            {"lt"},
            {"gt", "ge"},
            set(),
            {"eq"},
        ]


def test_fig2_events_enter_in_value_order() -> None:
    """Seed 004, Fig. 2: events e1(a1=57), e2(a1=15), e3(a1=32) over ranges in [0, 70]."""
    ranges = [(8, 24), (10, 40), (12, 18), (20, 60), (30, 35), (33, 70), (50, 58), (0, 15), (56, 57)]
    hcem, rein = HCEM(buckets=7), REIN(buckets=7)
    for sid, (lo, hi) in enumerate(ranges, start=1):
        hcem.add(f"S{sid}", f"a1 BETWEEN {lo} AND {hi}")
        rein.add(f"S{sid}", f"a1 BETWEEN {lo} AND {hi}")
    batch = [{"a1": 57}, {"a1": 15}, {"a1": 32}]
    want = [{"S4", "S6", "S7", "S9"}, {"S1", "S2", "S3", "S8"}, {"S2", "S4", "S5"}]
    assert hcem.match_batch(batch) == want
    assert rein.match_batch(batch) == want
    assert [hcem.match(e) for e in batch] == want


def test_hcem_bucket_index_follows_inserts_deletes_and_sparse_lists() -> None:
    """HCEM's per-unit bucket index (dense lists) and slot scatter (sparse lists) stay exact."""
    rng = random.Random(40)
    hcem, oracle = HCEM(buckets=8), BruteForce()
    sid = 0

    def add(f: Filter) -> None:
        nonlocal sid
        hcem.add(sid, f)
        oracle.add(sid, f)
        sid += 1

    for _ in range(400):
        add(_random_filter(rng, 3, 2))  # a0..a2: dense lists
    for v in range(20):
        add(Filter("sparse", ((Predicate.of("s", Op.GE, v / 20),),)))  # s: a sparse list
    batch = [
        {"a0": rng.random(), "a1": rng.random(), "a2": rng.random(), "s": rng.random()} for _ in range(70)
    ]
    batch[3] = {"a0": 0.5}  # missing attributes fail every unit with an entry there
    assert hcem.match_batch(batch) == [oracle.match(e) for e in batch]
    low, _ = hcem._lists["a0"]
    s_low, _ = hcem._lists["s"]
    assert low.bkt is not None and s_low.bkt is None, "index built for dense lists only"
    for _ in range(60):  # inserts after the index exists are written through flush
        add(_random_filter(rng, 3, 2))
    for victim in range(0, sid, 7):
        hcem.remove(victim)
        oracle.remove(victim)
    hcem._check()
    assert hcem.match_batch(batch) == [oracle.match(e) for e in batch]
    hcem._check()
