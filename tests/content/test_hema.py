"""HEMA (seed 003): structure invariants and a model-based comparison with brute force."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from content import ENGINES, BruteForce, Filter, Op, Predicate
from content._filter import Clause
from content._hema import HEMA
from content._predicate import Scalar
from tests.budget import examples

ATTRS = ("a", "b", "c", "d")
ORDER = (Op.LT, Op.LE, Op.GT, Op.GE)


def f(*clauses: Clause, text: str = "") -> Filter:
    return Filter(text or " OR ".join(" AND ".join(map(str, c)) for c in clauses), tuple(clauses))


def p(attr: str, op: Op, value: object) -> Predicate:
    return Predicate.of(attr, op, value)  # type: ignore[arg-type]


# ---------------------------------------------------------------- strategies

numbers = st.one_of(st.integers(-4, 4), st.sampled_from([-1.5, -0.5, 0.0, 0.5, 1.0, 2.5]))
strings = st.sampled_from(["", "a", "ab", "abc", "b", "ba", "x%y", "A"])
scalars: st.SearchStrategy[Scalar] = st.one_of(numbers, strings, st.booleans())


@st.composite
def predicates(draw: st.DrawFn) -> Predicate:
    attr = draw(st.sampled_from(ATTRS))
    kind = draw(st.sampled_from(["num", "num", "str", "bool", "set", "like"]))
    if kind == "num":
        return p(attr, draw(st.sampled_from([*ORDER, *ORDER, Op.EQ, Op.NE])), draw(numbers))
    if kind == "str":
        return p(attr, draw(st.sampled_from([*ORDER, Op.EQ, Op.NE])), draw(strings))
    if kind == "bool":
        return p(attr, draw(st.sampled_from([Op.EQ, Op.NE])), draw(st.booleans()))
    if kind == "set":
        members = frozenset(draw(st.lists(scalars, min_size=1, max_size=3)))
        return p(attr, draw(st.sampled_from([Op.IN, Op.NOT_IN])), members)
    op = draw(st.sampled_from([Op.PREFIX, Op.SUFFIX, Op.CONTAINS, Op.LIKE, Op.NOT_PREFIX, Op.NOT_LIKE]))
    return p(attr, op, draw(st.sampled_from(["a", "b", "a%", "_b", "%"])))


@st.composite
def order_clauses(draw: st.DrawFn) -> Clause:
    """Pure numeric order conjunctions on few families: these form Plist chains."""
    families = draw(st.sets(st.sampled_from([("a", 0), ("a", 1), ("b", 0), ("c", 1)]), min_size=1))
    out = []
    for attr, family in sorted(families):
        op = draw(st.sampled_from([Op.LT, Op.LE] if family == 0 else [Op.GT, Op.GE]))
        out.append(p(attr, op, draw(numbers)))
    return tuple(out)


clauses = st.one_of(
    order_clauses(),
    order_clauses(),
    st.lists(predicates(), max_size=4, unique=True).map(tuple),
)
filters = st.lists(clauses, min_size=0, max_size=3).map(lambda cs: f(*cs, text="generated"))
events = st.one_of(
    st.dictionaries(
        st.sampled_from(ATTRS),
        st.one_of(scalars, st.just(math.nan), st.none(), st.just([1])),
        max_size=4,
    ),
    # numeric events over every attribute: these reach the Plist chains' boundaries
    st.fixed_dictionaries(dict.fromkeys(ATTRS, numbers)),
)


# ---------------------------------------------------------------- model-based test


class HemaVersusBruteForce(RuleBasedStateMachine):
    """Random add/remove/replace sequences; every match must equal brute force."""

    max_chains = 8
    min_chain = 4

    def __init__(self) -> None:
        super().__init__()
        self.hema = HEMA(max_chains=self.max_chains, min_chain=self.min_chain)
        self.oracle = BruteForce()
        self.next_id = 0

    ids = Bundle("ids")

    def new_id(self) -> object:
        self.next_id += 1
        return self.next_id - 1

    @rule(target=ids, flt=filters)
    def add(self, flt: Filter) -> object:
        sid = self.new_id()
        self.hema.add(sid, flt)
        self.oracle.add(sid, flt)
        return sid

    @rule(sid=ids, flt=filters)
    def replace(self, sid: object, flt: Filter) -> None:
        if sid in self.oracle:
            self.hema.add(sid, flt)
            self.oracle.add(sid, flt)

    @rule(sid=consumes(ids))
    def remove(self, sid: object) -> None:
        if sid in self.oracle:
            self.hema.remove(sid)
            self.oracle.remove(sid)

    @rule(event=events)
    def match(self, event: dict[str, object]) -> None:
        assert self.hema.match(event) == self.oracle.match(event)

    @rule(batch=st.lists(events, max_size=3))
    def match_batch(self, batch: list[dict[str, object]]) -> None:
        assert self.hema.match_batch(batch) == self.oracle.match_batch(batch)

    @invariant()
    def consistent(self) -> None:
        self.hema._check()
        assert len(self.hema) == len(self.oracle)


class HemaSmallChains(HemaVersusBruteForce):
    """K = 2 chains per signature, promotion at 2 members: exercises Plist <-> Mlist moves."""

    max_chains = 2
    min_chain = 2


class HemaMixedIds(HemaSmallChains):
    """Ids of several types: chains and boxes switch between their int64 copies of the ids
    and the plain id lists as non-int ids come and go."""

    def new_id(self) -> object:
        n = self.next_id
        self.next_id += 1
        match n % 4:
            case 0:
                return f"s{n}"
            case 1:
                return 2**64 + n  # beyond int64
            case _:
                return n


HemaVersusBruteForce.TestCase.settings = settings(max_examples=examples(40), stateful_step_count=40)
HemaSmallChains.TestCase.settings = settings(max_examples=examples(40), stateful_step_count=40)
HemaMixedIds.TestCase.settings = settings(max_examples=examples(25), stateful_step_count=40)
TestHemaVersusBruteForce = HemaVersusBruteForce.TestCase
TestHemaSmallChains = HemaSmallChains.TestCase
TestHemaMixedIds = HemaMixedIds.TestCase


@settings(max_examples=100)
@given(st.lists(filters, max_size=12), st.lists(events, min_size=1, max_size=5))
def test_static_workloads_agree(flts: list[Filter], evs: list[dict[str, object]]) -> None:
    hema, oracle = HEMA(min_chain=1), BruteForce()
    for i, flt in enumerate(flts):
        hema.add(i, flt)
        oracle.add(i, flt)
    hema._check()
    for ev in evs:
        assert hema.match(ev) == oracle.match(ev)


# ---------------------------------------------------------------- structures


def chain_filter(x: float, y: float) -> Filter:
    return f((p("x", Op.LT, x), p("y", Op.GE, y)))


def test_registered() -> None:
    assert ENGINES["hema"] is HEMA


def test_nested_subscriptions_form_one_active_chain() -> None:
    h = HEMA(min_chain=3)
    for i in range(5):  # x < 10+i AND y >= -i: each looser than the one before
        h.add(i, chain_filter(10 + i, -i))
    h._check()
    assert h.stats["active_chains"] == 1
    assert h.stats["plist_units"] == 5 and h.stats["mlist_units"] == 0
    assert h.match({"x": 11.5, "y": -2}) == {2, 3, 4}
    assert h.match({"x": 11.5, "y": -2.5}) == {3, 4}
    assert h.match({"x": 9.5, "y": 0}) == {0, 1, 2, 3, 4}
    assert h.match({"x": 14, "y": 0}) == set()
    assert h.match({"x": 12}) == set()
    assert h.match({"x": 12, "y": "0"}) == set()
    assert h.match({"x": True, "y": 0}) == set()
    assert h.match({"x": math.nan, "y": 0}) == set()


def test_strict_and_inclusive_bounds_in_chain_and_mlist() -> None:
    h = HEMA(min_chain=1)
    h.add("lt", f((p("x", Op.LT, 5),)))
    h.add("le", f((p("x", Op.LE, 5),)))
    h.add("gt", f((p("x", Op.GT, 5), p("s", Op.EQ, "k"))))
    h.add("ge", f((p("x", Op.GE, 5), p("s", Op.EQ, "k"))))
    h.add("sge", f((p("s", Op.GE, "k"), p("s", Op.NE, "z"))))
    h._check()
    assert h.match({"x": 5, "s": "k"}) == {"le", "ge", "sge"}
    assert h.match({"x": 5.0, "s": "z"}) == {"le"}
    assert h.match({"x": 4.999, "s": "k"}) == {"lt", "le", "sge"}
    assert h.match({"x": 6, "s": "k"}) == {"gt", "ge", "sge"}


def test_crossing_subscription_goes_to_a_second_chain_then_mlist() -> None:
    h = HEMA(max_chains=2, min_chain=1)
    h.add(0, chain_filter(10, 0))
    h.add(1, chain_filter(20, -10))  # covers 0: same chain
    h.add(2, chain_filter(15, 5))  # crosses 1 (x looser than 0, y tighter): new chain
    h.add(3, chain_filter(30, 20))  # crosses both chains, K = 2 reached: Mlist
    h._check()
    assert h.stats == {
        "units": 4,
        "plist_units": 3,
        "mlist_units": 1,
        "residual_units": 0,
        "active_chains": 2,
        "chains": 2,
    }
    assert h.match({"x": 12, "y": 25}) == {1, 2, 3}
    for sid in (1, 0, 2, 3):
        h.remove(sid)
        h._check()
    assert h.stats["units"] == 0 and h.stats["chains"] == 0


def test_promotion_and_demotion_between_mlist_and_plist() -> None:
    h = HEMA(min_chain=4)
    for i in range(3):
        h.add(i, chain_filter(10 + i, -i))
    h._check()
    assert h.stats["active_chains"] == 0 and h.stats["mlist_units"] == 3
    h.add(3, chain_filter(13, -3))
    h._check()
    assert h.stats["active_chains"] == 1 and h.stats["plist_units"] == 4
    h.remove(0)
    h.remove(1)
    h._check()
    assert h.stats["active_chains"] == 1  # hysteresis: stays until below min_chain // 2
    h.remove(2)
    h._check()
    assert h.stats["active_chains"] == 0 and h.stats["mlist_units"] == 1
    assert h.match({"x": 0, "y": 0}) == {3}


def test_or_branches_are_units_of_one_subscription() -> None:
    h = HEMA()
    h.add("s", f((p("a", Op.EQ, 1),), (p("b", Op.LIKE, "a_c"),), ()))
    h.add("never", Filter("nothing", ()))
    h._check()
    assert h.match({}) == {"s"}  # the empty conjunction is always true
    h.add("s", f((p("a", Op.EQ, 1),), (p("b", Op.LIKE, "a_c"),)))
    assert h.match({"a": 1.0}) == {"s"}
    assert h.match({"a": True}) == set()
    assert h.match({"b": "abc"}) == {"s"}
    assert h.match({"b": "abcd"}) == set()
    assert h.stats["units"] == 2
    h.remove("s")
    h.remove("never")
    h._check()
    assert h.stats["units"] == 0


def test_in_and_not_in_and_booleans() -> None:
    h = HEMA()
    h.add("in", f((p("a", Op.IN, frozenset({1, "x"})),)))
    h.add("notin", f((p("a", Op.NOT_IN, frozenset({1, 2})),)))
    h.add("true", f((p("a", Op.EQ, True),)))
    h._check()
    assert h.match({"a": 1}) == {"in"}
    assert h.match({"a": "x"}) == {"in"}
    assert h.match({"a": 3}) == {"notin"}
    assert h.match({"a": True}) == {"true"}
    assert h.match({"a": "y"}) == set()  # NOT IN with numbers vs a string: unknown


def test_remove_unknown_raises_and_bad_parameters() -> None:
    h = HEMA()
    with pytest.raises(KeyError):
        h.remove("nope")
    with pytest.raises(ValueError, match="positive"):
        HEMA(min_chain=0)


def test_boxed_candidates_are_exact_at_float_limits() -> None:
    big = 2**53 + 1  # not exactly representable as a float
    h, oracle = HEMA(), BruteForce()
    flts = {
        "lt": f((p("a", Op.LT, 2**53), p("b", Op.GT, -1))),
        "le-big": f((p("a", Op.LE, big), p("b", Op.GE, 0))),  # not boxable: walked
        "eq": f((p("a", Op.GT, 0.5), p("a", Op.LT, 1.5), p("b", Op.EQ, 1))),
        "inf": f((p("a", Op.LT, math.inf), p("b", Op.LE, 0.0))),
        "strict": f((p("a", Op.GT, 0.1), p("b", Op.LT, 0.3))),
    }
    for sid, flt in flts.items():
        h.add(sid, flt)
        oracle.add(sid, flt)
    h._check()
    assert h._boxes.boxes, "numeric start nodes use the vectorised boundary test"
    values: list[object] = [
        big,
        2**53,
        -big,
        0,
        0.1,
        0.30000000000000004,
        0.3,
        1,
        1.0,
        math.inf,
        -math.inf,
        math.nan,
    ]
    values += [True, "1", None]
    for a in values:
        for b in values:
            ev = {"a": a, "b": b}
            assert h.match(ev) == oracle.match(ev), ev
    assert h.match({"b": 0}) == set()


def test_ids_come_back_unchanged_from_chains_and_boxes() -> None:
    """A bool or str id in a chain or a boxed Mlist unit is returned as itself (the int64
    fast path is off while such an id is stored, and back on once it is gone)."""
    h = HEMA(min_chain=2)
    for i in range(2, 6):
        h.add(i, chain_filter(10 + i, -i))  # one active chain
    h.add(100, f((p("x", Op.GT, 0), p("z", Op.LT, 5))))  # boxed Mlist unit
    ev = {"x": 11.5, "y": 0, "z": 1}
    assert h.match(ev) == {2, 3, 4, 5, 100}
    for odd in (True, "t"):
        h.add(odd, chain_filter(30, -30))
        h.add((odd,), f((p("x", Op.GT, 0), p("z", Op.LT, 5))))
        got = h.match(ev)
        assert got == {2, 3, 4, 5, 100, odd, (odd,)}
        assert any(g is True for g in got) is (odd is True)
        h._check()
        h.remove(odd)
        h.remove((odd,))
        assert h.match(ev) == {2, 3, 4, 5, 100}
    h._check()


def test_chain_bounds_are_exact_near_two_to_the_53() -> None:
    """Chains compare events with float bounds (x <= t becomes e < nextafter(t)): exact for
    int and float events around thresholds just below 2**53; thresholds from 2**53 on (and
    infinities) stay in the Mlist."""
    big = 2**53
    h, oracle = HEMA(min_chain=2), BruteForce()
    thresholds: list[float] = [big - 3, big - 2, big - 1, 2**52, -(big - 1)]
    sid = 0
    for t in thresholds:
        for lo, hi in ((Op.GE, Op.LE), (Op.GT, Op.LT)):
            flt = f((p("x", hi, t), p("y", lo, -t)))  # nested in t and strictness
            h.add(sid, flt)
            oracle.add(sid, flt)
            sid += 1
    for t in (big, big + 1, math.inf, -math.inf, -big):
        flt = f((p("x", Op.LE, t), p("y", Op.GT, -t)))
        h.add(sid, flt)
        oracle.add(sid, flt)
        sid += 1
    h._check()
    assert h.stats["plist_units"] == 2 * len(thresholds)  # all nested: one chain
    values: list[object] = [big - 3, big - 2, big - 1, big, big + 1, big + 2, 2**52, 2**52 + 1]
    values += [float(big - 1), float(big), 2.0**52 + 0.5, math.inf, -math.inf, 3**40, -(big - 1), -big]
    for x in values:
        for y in (-(big - 1), -big, 0, -(2**52), -(big + 1)):
            ev = {"x": x, "y": y}
            assert h.match(ev) == oracle.match(ev), ev
