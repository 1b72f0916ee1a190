"""ICCounting's index leaves on workloads that force each code path (the model test's small
pools mostly take the scanning paths): many substring patterns (substring enumeration),
prefix/suffix length sets, ordered leaves with ties between int and float bounds."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from content import ENGINES, BruteForce, Engine, ICCounting, Kind, Op
from content._ic_index import REBUILD_FRACTION, REBUILD_MIN, _Ordered

PATTERNS = ["".join(t) for n in (1, 2, 3) for t in itertools.product("abc", repeat=n)]


def _loaded(name: str) -> tuple[Engine, BruteForce]:
    engine, oracle = ENGINES[name](), BruteForce()
    sid = 0
    for p in PATTERNS:
        for sel in (
            f"s LIKE '%{p}%'",
            f"s NOT LIKE '%{p}%'",
            f"s LIKE '{p}%'",
            f"s NOT LIKE '%{p}'",
            f"s LIKE '%{p}' AND s <> '{p}'",
        ):
            engine.add(sid, sel)
            oracle.add(sid, sel)
            sid += 1
    return engine, oracle


ENGINES_UNDER_TEST = {name: _loaded(name) for name in ("counting", "iccounting", "rabased")}


@given(st.text(alphabet="abc", max_size=9))
def test_string_leaves_agree_with_brute_force(s: str) -> None:
    for engine, oracle in ENGINES_UNDER_TEST.values():
        assert engine.match({"s": s}) == oracle.match({"s": s})


def test_substring_enumeration_path_is_taken() -> None:
    engine, _ = ENGINES_UNDER_TEST["iccounting"]
    assert isinstance(engine, ICCounting)
    engine._check()
    assert engine._index.by_kind[Kind.NUM] == {}
    ni = engine._index.by_kind[Kind.STR]["s"]
    hits = ni.affix[Op.CONTAINS].substring_hits("abcab")
    assert isinstance(hits, set)  # 39 patterns > 6 positions x 3 lengths: enumeration
    assert hits == {p for p in PATTERNS if p in "abcab"}


@given(
    st.lists(st.sampled_from([0, 0.0, 1, 1.0, 1.5, -2, 2]), min_size=1, max_size=6),
    st.sampled_from([0, 1, 1.5, 2, -3]),
)
def test_ordered_leaves_with_int_float_ties(bounds: list[float], v: float) -> None:
    for name in ("counting", "iccounting", "rabased"):
        engine, oracle = ENGINES[name](), BruteForce()
        for i, b in enumerate(bounds):
            for j, op in enumerate(("<", "<=", ">", ">=", "=", "<>")):
                engine.add((i, j), f"x {op} {b!r}")
                oracle.add((i, j), f"x {op} {b!r}")
        engine._check()
        # the first query flattens the ordered leaves; later ones use the arrays
        for probe in (v, v, v, v, v, -v, 1, 1.5, v):
            assert engine.match({"x": probe}) == oracle.match({"x": probe})
            assert engine.match_batch([{"x": probe}, {"x": v}]) == [
                oracle.match({"x": probe}),
                oracle.match({"x": v}),
            ]
        engine._check()
        # a clause joining / leaving an existing constraint changes its CSList in place
        engine.add("late", f"x > {bounds[0]!r}")
        oracle.add("late", f"x > {bounds[0]!r}")
        engine._check()
        assert engine.match({"x": 3}) == oracle.match({"x": 3})
        engine.remove("late")
        oracle.remove("late")
        for i in range(len(bounds)):
            for j in range(6):
                engine.remove((i, j))
        engine._check()
        assert len(engine) == 0
        assert engine.match({"x": v}) == set()


def test_hand_built_filters_always_never_and_duplicates() -> None:
    from content import Filter, Predicate

    p = Predicate.of("x", Op.GT, 1)
    always = Filter("always", ((),))
    never = Filter("never", ())
    dup = Filter("dup", ((p, p), (p,)))
    for name in ("counting", "iccounting", "rabased"):
        engine, oracle = ENGINES[name](), BruteForce()
        for sid, f in (("always", always), ("never", never), ("dup", dup)):
            engine.add(sid, f)
            oracle.add(sid, f)
        engine._check()
        for ev in ({}, {"x": 2}, {"x": 0}, {"x": "s"}):
            assert engine.match(ev) == oracle.match(ev)
        assert engine.match({"x": 2}) == {"always", "dup"}
        engine.remove("always")
        engine.remove("dup")
        engine._check()
        assert engine.match_batch([{"x": 2}, {}]) == [set(), set()]


# --- ordered leaves under churn (snapshot + delta + SINK, rebuilt past the threshold) ----

_OPS = ("<", "<=", ">", ">=")


def _pending(engine: ICCounting) -> list[int]:
    """Pending changes (delta entries + SINKs) of every ordered leaf."""
    return [len(o.dc) + o.dead for o in _leaves(engine)]


def _selector(rng: random.Random, values: list[float]) -> str:
    def atom() -> str:
        attr = rng.choice("xy")
        if rng.random() < 0.1:
            return f"{attr} = {rng.choice(values)!r}"
        return f"{attr} {rng.choice(_OPS)} {rng.choice(values)!r}"

    conj = " AND ".join(atom() for _ in range(rng.randint(1, 3)))
    return conj if rng.random() < 0.8 else f"{conj} OR {atom()}"


@pytest.mark.parametrize("name", ["iccounting", "rabased"])
@pytest.mark.parametrize("seed", range(4))
def test_churn_across_rebuild_threshold(name: str, seed: int) -> None:
    """Random add / replace / remove sequences over few values (ties, clause ids recycled
    into constraints they left) with enough changes per leaf to pass REBUILD_MIN several
    times; every few steps the engine answers like brute force and its invariants hold."""
    rng = random.Random(seed)
    values: list[float] = [-2, -1, -0.5, 0, 0.0, 0.5, 1, 1.5, 2, 3]
    engine, oracle = ENGINES[name](), BruteForce()
    assert isinstance(engine, ICCounting)
    events: list[dict[str, object]] = [{"x": v, "y": w} for v in (*values, -9, 9) for w in (0, 1.5)]
    events += [{"x": 1}, {"y": 2}, {}, {"x": "s", "y": 0.5}, {"x": True}]
    ids: list[int] = []
    next_id = 0
    rebuilds = sinks = delta_drops = 0
    for step in range(1500):
        r = rng.random()
        before = _pending(engine)
        if r < 0.45 or len(ids) < 20:
            sel = _selector(rng, values)
            engine.add(next_id, sel)
            oracle.add(next_id, sel)
            ids.append(next_id)
            next_id += 1
        elif r < 0.8:
            sid = rng.choice(ids)
            sel = _selector(rng, values)
            engine.add(sid, sel)  # replace: delete + insert
            oracle.add(sid, sel)
        else:
            sid = ids.pop(rng.randrange(len(ids)))
            engine.remove(sid)
            oracle.remove(sid)
        after = _pending(engine)
        if len(after) == len(before) and sum(after) < sum(before):
            delta_drops += 1  # a change cancelled an entry still in a delta
        sinks = max(sinks, max((o.dead for o in _leaves(engine)), default=0))
        if step % 5 == 0:
            ev = rng.choice(events)
            queried = [o for a in ev if type(ev[a]) in (int, float) for o in _leaves(engine, a)]
            rebuilds += sum(1 for o in queried if len(o.dc) + o.dead > o.limit)
            assert engine.match(ev) == oracle.match(ev)
            assert engine.match_batch([ev, events[0]]) == [oracle.match(ev), oracle.match(events[0])]
            assert all(len(o.dc) + o.dead <= o.limit for o in queried), "a queried leaf is over its limit"
        if step % 100 == 0:
            engine._check()
    engine._check()
    for ev in events:
        assert engine.match(ev) == oracle.match(ev)
    assert rebuilds > 0, "the churn never crossed the rebuild threshold"
    assert sinks > 0, "no snapshot entry was deleted in place"
    assert delta_drops > 0, "no delta entry was dropped"


def _leaves(engine: ICCounting, attr: str | None = None) -> list[_Ordered]:
    """The numeric ordered leaves (of one attribute, or all)."""
    names = engine._index.by_kind[Kind.NUM]
    nis = names.values() if attr is None else [names[attr]] if attr in names else []
    return [o for ni in nis for o in (ni.gt, ni.ge, ni.lt, ni.le)]


def test_large_leaf_uses_the_fractional_limit() -> None:
    """A leaf with more than REBUILD_MIN x REBUILD_FRACTION entries tolerates entries/32
    pending changes; churn on it stays exact and rebuilds keep the pending part bounded."""
    rng = random.Random(7)
    engine, oracle = ICCounting(), BruteForce()
    n = REBUILD_MIN * REBUILD_FRACTION + 500
    for i in range(n):
        sel = f"x > {rng.randrange(200)} AND x < {rng.randrange(200)}"
        engine.add(i, sel)
        oracle.add(i, sel)
    assert engine.match({"x": 100}) == oracle.match({"x": 100})  # first query: rebuild
    leaf = engine._index.by_kind[Kind.NUM]["x"].gt
    assert leaf.limit == len(leaf.flat) // REBUILD_FRACTION > REBUILD_MIN
    assert len(leaf.dc) == leaf.dead == 0
    peak = 0
    for k in range(3 * leaf.limit):
        sid = rng.randrange(n)
        sel = f"x > {rng.randrange(200)} AND x < {rng.randrange(200)}"
        engine.add(sid, sel)
        oracle.add(sid, sel)
        peak = max(peak, len(leaf.dc) + leaf.dead)
        if k % 25 == 0:
            v = rng.randrange(-5, 205)
            assert engine.match({"x": v}) == oracle.match({"x": v})
            leaf = engine._index.by_kind[Kind.NUM]["x"].gt
            assert len(leaf.dc) + leaf.dead <= leaf.limit
    assert peak > REBUILD_MIN  # more pending than the fixed minimum was tolerated
    engine._check()


@pytest.mark.parametrize("name", ["iccounting", "rabased", "counting"])
def test_owner_ids_of_any_type_come_back_unchanged(name: str) -> None:
    """Matches are gathered from an int64 copy of the owners while every live id is a plain
    int; ids of other types (bool, str, tuple, ints beyond int64) switch to the object path
    and back once they are gone, and the ids returned are the very values given."""
    engine, oracle = ENGINES[name](), BruteForce()
    sels = ["x > 1", "x > 1 AND x < 50", "x >= 0 OR x = 7"]
    int_ids: list[object] = [0, 5, -(2**63), 2**63 - 1]
    odd_ids: list[object] = [True, "s", ("a", 1), 2**63, -(2**63) - 1]
    ev = {"x": 7}

    def agree() -> None:
        got = engine.match(ev)
        assert got == oracle.match(ev)
        assert sorted(map(repr, got)) == sorted(map(repr, oracle.match(ev)))  # True is not 1
        engine._check()

    for k, sid in enumerate(int_ids):
        engine.add(sid, sels[k % 3])
        oracle.add(sid, sels[k % 3])
    agree()
    for k, sid in enumerate(odd_ids):
        engine.add(sid, sels[k % 3])
        oracle.add(sid, sels[k % 3])
        agree()
    table = engine._table  # type: ignore[attr-defined]
    assert table.n_obj == sum(len(engine.filter_of(s).clauses) for s in odd_ids)  # per clause
    for sid in odd_ids:
        engine.remove(sid)
        oracle.remove(sid)
        agree()
    assert table.n_obj == 0


# --- removal cost (issue 42 item 2: a fleet of 100,000 selectors disconnecting) ------------


def test_a_clause_leaves_a_long_cslist_by_swap_remove_at_its_kept_position() -> None:
    """A predicate shared by thousands of clauses (``class = 'pump'``) has a CSList as long;
    removing a clause must not scan it (``list.remove`` cost ~20 us there): the table keeps
    each clause's position in each of its CSLists and the last id takes the freed slot."""
    engine, oracle = ICCounting(), BruteForce()
    n = 3000
    for i in range(n):
        sel = f"class = 'pump' AND t > {i}"
        engine.add(i, sel)
        oracle.add(i, sel)
    table = engine._table
    (shared,) = (cl for p, cl in table.csl.items() if p.op is Op.EQ)
    first, last = shared[0], shared[-1]
    engine.remove(0)
    oracle.remove(0)
    assert first not in shared and len(shared) == n - 1
    assert shared[0] == last, "the last id did not take the removed one's slot"
    assert table.cpos[last][table.ccsl[last].index(shared)] == 0
    rng = random.Random(3)
    for i in rng.sample(range(1, n), 1500):
        engine.remove(i)
        oracle.remove(i)
    engine._check()
    for t in (-1, 10, 1500, 2999, 5000):
        ev = {"class": "pump", "t": t}
        assert engine.match(ev) == oracle.match(ev)


def test_ordered_entries_of_a_removed_clause_stay_until_the_rebuild_and_hold_its_id() -> None:
    """Removing a clause leaves its entries in an ordered leaf's flattened snapshot (no
    search of the value's run): they never fire, and the clause id is held -- not given to
    a new clause -- until the rebuild squeezes them out and releases it."""
    engine, oracle = ICCounting(), BruteForce()
    for i in range(400):
        engine.add(i, f"x > {i}")
        oracle.add(i, f"x > {i}")
    assert engine.match({"x": 1000}) == oracle.match({"x": 1000})  # snapshot built
    table = engine._table
    leaf = engine._index.by_kind[Kind.NUM]["x"].gt
    flat = leaf.flat.copy()
    (cid,) = table.sub_cids[7]
    engine.remove(7)
    oracle.remove(7)
    assert (leaf.flat == flat).all(), "the snapshot was searched and written"
    assert cid in table.held and cid not in table.free and leaf.stale == [cid]
    engine.add("new", "x > 3.5")
    oracle.add("new", "x > 3.5")
    assert table.sub_cids["new"] != [cid], "a held clause id was given to a new clause"
    for ev in ({"x": 1000}, {"x": 8}, {"x": 7.5}, {"x": 3}):
        assert engine.match(ev) == oracle.match(ev)
    engine._check()
    for i in range(8, 8 + leaf.limit + 1):  # past the limit: the next query rebuilds
        engine.remove(i)
        oracle.remove(i)
    assert engine.match({"x": 1000}) == oracle.match({"x": 1000})
    assert not leaf.stale and leaf.dead == 0 and cid not in table.held and cid in table.free
    assert cid not in leaf.flat.tolist()
    engine._check()
