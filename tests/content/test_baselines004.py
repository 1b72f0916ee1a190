"""TAMA and H-Tree (seed 004's baselines): exactness against brute force, rebuilds, compaction.

The shared model test (test_engines_model.py) drives both engines with the whole selector
language on tiny subscription sets.  Here a state machine uses numeric-heavy filters over a
few attributes with bulk adds and removes, on small tables (TAMA with 3 levels, H-Tree with
3-4 cells, 2 levels and a tight copy budget) rebuilt after every change, so that cells are
recomputed, bounds fall on cell boundaries, units are replicated and moved to the catch-all
cell, and compaction renumbers units; values sit at float64's limits.
"""

from __future__ import annotations

import math
import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from content import TAMA, BruteForce, Engine, Filter, HTree, Op, Predicate
from content._predicate import Scalar
from content._units import SLOTS

ATTRS = ("x", "y", "z")
BIG = 2**53
NUMS: tuple[int | float, ...] = (
    -2,
    -1,
    0,
    1,
    2,
    3,
    0.5,
    1.5,
    BIG - 1,
    BIG,
    BIG + 1,
    float(BIG + 2),
    10**400,
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
events = st.dictionaries(st.sampled_from(ATTRS), st.sampled_from(NUMS + EVENT_EXTRA))


def engines() -> list[Engine]:
    return [
        TAMA(levels=3, rebuild_min=0),
        TAMA(levels=1, rebuild_min=5),
        HTree(cells=3, levels=2, max_copies=2, rebuild_min=0),
        HTree(cells=4, levels=2, rebuild_min=3),
    ]


class BaselinesVsBruteForce(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engines = engines()
        self.oracle = BruteForce()
        self.next_id = 0

    def _each(self) -> list[Engine]:
        return [*self.engines, self.oracle]

    @rule(fs=st.lists(filters, min_size=1, max_size=40))
    def add_many(self, fs: list[Filter]) -> None:
        for f in fs:
            for e in self._each():
                e.add(self.next_id, f)
            self.next_id += 1

    @rule(f=filters, data=st.data())
    def replace(self, f: Filter, data: st.DataObject) -> None:
        if len(self.oracle):
            sid = data.draw(st.sampled_from(sorted(self.oracle, key=repr)))
            for e in self._each():
                e.add(sid, f)

    @rule(seed=st.integers(0, 2**32), share=st.floats(0.1, 1.0))
    def remove_many(self, seed: int, share: float) -> None:
        ids = sorted(self.oracle, key=repr)
        for sid in random.Random(seed).sample(ids, int(len(ids) * share)):
            for e in self._each():
                e.remove(sid)

    @rule(event=events)
    def match(self, event: dict[str, Scalar]) -> None:
        want = self.oracle.match(event)
        for e in self.engines:
            assert e.match(event) == want, e

    @rule(batch=st.lists(events, min_size=1, max_size=5))
    def match_batch(self, batch: list[dict[str, Scalar]]) -> None:
        want = [self.oracle.match(e) for e in batch]
        for e in self.engines:
            assert e.match_batch(batch) == want, e

    @invariant()
    def consistent(self) -> None:
        for e in self.engines:
            assert len(e) == len(self.oracle)
            e._check()


def test_baselines_agree_with_brute_force() -> None:
    run_state_machine_as_test(
        BaselinesVsBruteForce,
        settings=settings(
            max_examples=20,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )


def _range_filter(rng: random.Random, attrs: int, k: int, width: float) -> Filter:
    clause = []
    for a in rng.sample(range(attrs), k):
        lo = round(rng.random() * (1 - width), 3)
        clause.append(Predicate.of(f"a{a}", Op.GE, lo))
        clause.append(Predicate.of(f"a{a}", Op.LE, round(lo + width, 3)))
    return Filter("generated", (tuple(clause),))


def test_bulk_load_churn_and_compaction() -> None:
    """Thousands of ranges: the index is built once, new units are verified until the next
    rebuild, deletes compact and renumber, and answers stay exact throughout."""
    rng = random.Random(4)
    tama, htree, oracle = TAMA(levels=6), HTree(cells=5, levels=3), BruteForce()
    every = (tama, htree, oracle)
    for sid in range(3000):
        f = _range_filter(rng, 6, 3, 0.5)
        for e in every:
            e.add(sid, f)
    batch = [{f"a{a}": round(rng.random(), 3) for a in range(6)} for _ in range(30)]
    batch[3] = {"a1": 0.5}
    want = [oracle.match(e) for e in batch]
    assert sum(map(len, want)) > 100
    assert tama.match_batch(batch) == want and htree.match_batch(batch) == want
    assert tama._built == htree._built == 3000
    assert tama.stats()["entries"] > 3 * 3000, "ranges are split over cells"
    assert htree.stats()["entries"] > 3000, "wide ranges are replicated"
    for sid in range(3000, 3100):  # below a sixteenth: verified directly, no rebuild
        f = _range_filter(rng, 6, 3, 0.5)
        for e in every:
            e.add(sid, f)
    assert [tama.match(e) for e in batch] == [oracle.match(e) for e in batch]
    assert [htree.match(e) for e in batch] == [oracle.match(e) for e in batch]
    assert tama._built == htree._built == 3000
    for sid in range(0, 3100, 3):
        for e in every:
            e.remove(sid)
    assert tama._store.n == 3100 and tama._store.dead > 0
    for sid in [s for s in range(3100) if s % 3]:
        for e in every:
            e.remove(sid)
    for store in (tama._store, htree._store):
        assert store.n < 3100 and store.n == store.dead <= 64, "compaction renumbered"
    for sid in range(5000, 5300):
        f = _range_filter(rng, 6, 3, 0.3)
        for e in every:
            e.add(sid, f)
    want = [oracle.match(e) for e in batch]
    assert tama.match_batch(batch) == want and htree.match_batch(batch) == want
    tama._check()
    htree._check()


def test_tama_counts_canonical_cells_and_checks_partial_leaves() -> None:
    """Seed 004's TAMA walk: one cell per level; whole cells counted, partial leaves compared."""
    tama = TAMA(levels=4, rebuild_min=0)  # 8 leaves
    for v in range(16):
        tama.add(f"eq{v}", f"a = {v}")
    tama.add("wide", "a BETWEEN 2 AND 13")
    tama.add("two", "a >= 3 AND b <= 2.5")
    tama.add("open", "a > 6.5")
    assert tama.match({"a": 7, "b": 1}) == {"eq7", "wide", "two", "open"}
    assert tama.match({"a": 13}) == {"eq13", "wide", "open"}
    assert tama.match({"a": 13.5}) == {"open"}
    assert tama.match({"a": 2.5, "b": 1}) == {"wide"}
    assert tama.match({"a": 6.5}) == {"wide"}, "two needs b, open is strict"
    table = tama._tables[tama._store.attr_ids["a"]]
    assert len(table.cuts) == 7
    wide = tama._store.units_of["wide"]
    full = set(table.full_units.tolist())
    assert wide in full, "the middle of the wide range sits in whole cells"
    assert wide in set(table.part_units.tolist()), "its ends cut leaves and are compared"
    tama._check()


def test_htree_visits_three_cells_per_level_and_replicates_wide_ranges() -> None:
    htree = HTree(cells=6, levels=2, rebuild_min=0)
    rng = random.Random(6)
    for sid in range(600):
        lo = rng.randrange(0, 600)
        htree.add(sid, f"x BETWEEN {lo} AND {lo + 50} AND y BETWEEN {lo} AND {lo + 400}")
    htree.add("free", "z = 1")
    htree.match({})
    assert len(htree._attrs) == 2, "x and y are indexed, z is not"
    keys = htree._keys(htree._store.event({"x": 300, "y": 300}))
    assert len(keys) == 9, "two value cells and the catch-all cell on each of two levels"
    assert len(htree._keys(htree._store.event({"x": 300}))) == 3, "no y: only y's catch-all cell"
    stats = htree.stats()
    assert 601 < stats["entries"] <= 601 * 9, "the wide y ranges are replicated"
    want = {sid for sid in range(600) if htree.filter_of(sid).matches({"x": 300, "y": 300, "z": 1})}
    assert htree.match({"x": 300, "y": 300, "z": 1}) == want | {"free"}
    htree._check()


def test_wide_ranges_respect_the_copy_budget() -> None:
    htree = HTree(cells=6, levels=3, max_copies=4, rebuild_min=0)
    for sid in range(300):
        htree.add(sid, f"a BETWEEN {sid % 10} AND {sid % 10 + 60} AND b BETWEEN 0 AND {sid % 50 + 30}")
        htree.add(("c", sid), f"c BETWEEN {sid} AND {sid + 100}")
    htree.match({"a": 1})
    counts: dict[int, int] = {}
    for u in htree._units.tolist():
        counts[u] = counts.get(u, 0) + 1
    assert max(counts.values()) <= 4
    event = {"a": 30, "b": 10, "c": 50}
    assert htree.match(event) == {sid for sid in htree if htree.filter_of(sid).matches(event)}
    htree._check()


def test_strict_bounds_and_float_limits_are_exact() -> None:
    for engine in (TAMA(rebuild_min=0), HTree(rebuild_min=0)):
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
        engine._check()


def test_more_numeric_attributes_than_slots_become_residuals() -> None:
    names = [f"a{i}" for i in range(SLOTS + 3)]
    selector = " AND ".join(f"{a} BETWEEN 0 AND 10" for a in names)
    for engine in (TAMA(rebuild_min=0), HTree(rebuild_min=0)):
        engine.add("many", selector)
        event: dict[str, object] = dict.fromkeys(names, 5)
        assert engine.match(event) == {"many"}
        for a in (names[0], names[-1]):
            assert engine.match({**event, a: 11}) == set()
        engine._check()
