"""The predicate model's three-valued semantics (docs/reference.md, content)."""

from __future__ import annotations

import pytest

from content import BruteForce, Filter, Kind, Op, Predicate


def test_bool_is_not_a_number() -> None:
    assert Predicate.of("a", Op.EQ, True) != Predicate.of("a", Op.EQ, 1)
    assert not Predicate.of("a", Op.EQ, 1).test(True)
    assert not Predicate.of("a", Op.EQ, True).test(1)
    assert Predicate.of("a", Op.EQ, True).test(True)


def test_numbers_compare_across_int_and_float() -> None:
    assert Predicate.of("a", Op.EQ, 1).test(1.0)
    assert Predicate.of("a", Op.LT, 1.5).test(1)


def test_mismatch_and_missing_are_false_both_ways() -> None:
    p = Predicate.of("a", Op.LT, 5)
    for v in ("x", True, None):
        assert not p.test(v)
        assert not p.negate().test(v)


def test_in_and_not_in_follow_sql() -> None:
    members = frozenset({"a", 1})
    assert Predicate.of("x", Op.IN, members).test("a")
    assert Predicate.of("x", Op.IN, members).test(1.0)
    assert not Predicate.of("x", Op.IN, frozenset({1})).test(True)
    # NOT IN with an incomparable member is unknown -> false
    assert not Predicate.of("x", Op.NOT_IN, members).test("b")
    assert Predicate.of("x", Op.NOT_IN, frozenset({"a", "c"})).test("b")


def test_like_patterns() -> None:
    assert Predicate.of("s", Op.LIKE, "a_c%").test("abcdef")
    assert not Predicate.of("s", Op.LIKE, "a_c%").test("ac")
    assert Predicate.of("s", Op.NOT_LIKE, "a_c%").test("ac")
    assert Predicate.of("s", Op.CONTAINS, "b").test("abc")


def test_kind_is_checked() -> None:
    with pytest.raises(ValueError, match="booleans"):
        Predicate("a", Op.LT, True, Kind.BOOL)
    with pytest.raises(ValueError):
        Predicate("a", Op.EQ, 1, Kind.STR)


def test_brute_force_engine() -> None:
    e = BruteForce()
    e.add(1, Filter("a > 1", ((Predicate.of("a", Op.GT, 1),),)))
    e.add(2, Filter("a < 1 OR b = 'x'", ((Predicate.of("a", Op.LT, 1),), (Predicate.of("b", Op.EQ, "x"),))))
    assert e.match({"a": 2}) == {1}
    assert e.match({"a": 0}) == {2}
    assert e.match({"a": 2, "b": "x"}) == {1, 2}
    e.remove(1)
    assert len(e) == 1 and e.match({"a": 2}) == set()
    with pytest.raises(KeyError):
        e.remove(1)
