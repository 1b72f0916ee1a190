"""ICCounting's index leaves on workloads that force each code path (the model test's small
pools mostly take the scanning paths): many substring patterns (substring enumeration),
prefix/suffix length sets, ordered leaves with ties between int and float bounds."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from content import ENGINES, BruteForce, Engine, ICCounting, Kind, Op

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
        # repeated queries switch the ordered leaves to their flattened arrays (REBUILD_AFTER)
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
