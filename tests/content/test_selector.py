"""The selector language: every operator, precedence, normalisation, errors with positions."""

from __future__ import annotations

import pytest

from content import Filter, FilterSyntaxError, Kind, Op, Predicate, compile
from content._selector import MAX_CLAUSES, MAX_DEPTH, format_filter


def P(attr: str, op: Op, value: object) -> Predicate:
    return Predicate.of(attr, op, value)  # type: ignore[arg-type]


def clauses(s: str) -> set[frozenset[Predicate]]:
    return {frozenset(c) for c in compile(s).clauses}


@pytest.mark.parametrize(
    ("text", "op", "value"),
    [
        ("a = 5", Op.EQ, 5),
        ("a <> 5", Op.NE, 5),
        ("a != 5", Op.NE, 5),
        ("a < 5", Op.LT, 5),
        ("a <= 5", Op.LE, 5),
        ("a > 5", Op.GT, 5),
        ("a >= 5", Op.GE, 5),
        ("a = -2.5e3", Op.EQ, -2500.0),
        ("a = .5", Op.EQ, 0.5),
        ("a = +7", Op.EQ, 7),
        ("a = 'it''s'", Op.EQ, "it's"),
        ("a = TRUE", Op.EQ, True),
        ("a <> false", Op.NE, False),
        ("a LIKE 'ab%'", Op.PREFIX, "ab"),
        ("a LIKE '%ab'", Op.SUFFIX, "ab"),
        ("a LIKE '%ab%'", Op.CONTAINS, "ab"),
        ("a LIKE 'a_b%'", Op.LIKE, "a_b%"),
        ("a LIKE 'a%b'", Op.LIKE, "a%b"),
        ("a LIKE 'ab'", Op.EQ, "ab"),
        ("a LIKE '%'", Op.PREFIX, ""),
        ("a LIKE 'ab%%'", Op.PREFIX, "ab"),
        ("a NOT LIKE 'ab%'", Op.NOT_PREFIX, "ab"),
        ("a NOT LIKE '%ab'", Op.NOT_SUFFIX, "ab"),
        ("a NOT LIKE '%ab%'", Op.NOT_CONTAINS, "ab"),
        ("a NOT LIKE '_'", Op.NOT_LIKE, "_"),
        ("a LIKE 'a!%%' ESCAPE '!'", Op.PREFIX, "a%"),
        ("a IN (1, 2, 2.0)", Op.IN, frozenset({1, 2})),
        ("a NOT IN ('x', 'y')", Op.NOT_IN, frozenset({"x", "y"})),
        ("a IN ('x')", Op.EQ, "x"),
        ("a NOT IN (3)", Op.NE, 3),
        ("3 < a", Op.GT, 3),
        ("'m' >= a", Op.LE, "m"),
    ],
)
def test_single_operators(text: str, op: Op, value: object) -> None:
    f = compile(text)
    assert f.clauses == ((P("a", op, value),),)
    assert isinstance(f, Filter)
    assert f.selector == text


def test_keywords_are_case_insensitive_and_identifiers_dotted() -> None:
    assert (
        compile("sensor.temp between 1 and 2 Or NOT s like 'x%'").clauses
        == compile("sensor.temp BETWEEN 1 AND 2 OR NOT s LIKE 'x%'").clauses
    )
    assert compile('"and" = 1').clauses == ((P("and", Op.EQ, 1),),)
    assert compile('"we""ird" = 1').clauses == ((P('we"ird', Op.EQ, 1),),)


def test_between_and_not_between() -> None:
    assert clauses("a BETWEEN 1 AND 3") == {frozenset({P("a", Op.GE, 1), P("a", Op.LE, 3)})}
    assert clauses("a NOT BETWEEN 1 AND 3") == {frozenset({P("a", Op.LT, 1)}), frozenset({P("a", Op.GT, 3)})}
    assert clauses("a BETWEEN 'a' AND 'c'") == {frozenset({P("a", Op.GE, "a"), P("a", Op.LE, "c")})}


def test_precedence_not_and_or() -> None:
    a, b, c = P("a", Op.EQ, 1), P("b", Op.EQ, 2), P("c", Op.EQ, 3)
    assert clauses("a = 1 OR b = 2 AND c = 3") == {frozenset({a}), frozenset({b, c})}
    assert clauses("(a = 1 OR b = 2) AND c = 3") == {frozenset({a, c}), frozenset({b, c})}
    assert clauses("NOT a = 1 AND b = 2") == {frozenset({a.negate(), b})}
    assert clauses("NOT (a = 1 AND b = 2)") == {frozenset({a.negate()}), frozenset({b.negate()})}
    assert clauses("NOT NOT a = 1") == {frozenset({a})}


def test_in_lists_split_by_kind() -> None:
    assert clauses("a IN (1, 'x', TRUE, 2)") == {
        frozenset({P("a", Op.IN, frozenset({1, 2}))}),
        frozenset({P("a", Op.EQ, "x")}),
        frozenset({P("a", Op.EQ, True)}),
    }
    # a mixed NOT IN is unknown (false) for every value: no clause survives
    assert compile("a NOT IN (1, 'x')").clauses == ()
    assert compile("a NOT IN (1, 'x') OR b = 1").clauses == ((P("b", Op.EQ, 1),),)


def test_dedup_absorption_and_contradictions() -> None:
    a = P("a", Op.EQ, 1)
    assert compile("a = 1 AND a = 1").clauses == ((a,),)
    assert compile("a = 1 OR a = 1.0").clauses == ((a,),)
    assert compile("a = 1 OR (a = 1 AND b = 2)").clauses == ((a,),)
    assert compile("a = 1 AND a = 'x'").clauses == ()
    assert compile("a = TRUE").clauses[0][0].kind is Kind.BOOL


def test_compile_is_cached() -> None:
    assert compile("cache.me = 1") is compile("cache.me = 1")


@pytest.mark.parametrize(
    ("text", "position", "fragment"),
    [
        ("a >", 3, "expected a value after '>'"),
        ("a.b > ", 6, "expected a value after '>'"),
        ("a > b", 4, "two attributes"),
        ("1 = 2", 4, "attribute name"),
        ("a < TRUE", 2, "booleans"),
        ("(a = 1", 6, "expected ')'"),
        ("a = 1)", 5, "unbalanced"),
        ("", 0, "empty"),
        ("   ", 3, "empty"),
        ("a NOT 5", 6, "BETWEEN, IN or LIKE"),
        ("a = 'abc", 4, "unterminated string"),
        ("a IN ()", 6, "expected a value"),
        ("a IN (1 2)", 8, "expected ',' or ')'"),
        ("a BETWEEN 1 OR 2", 12, "expected AND"),
        ("a BETWEEN 1 AND 'x'", 16, "both be numbers"),
        ("a BETWEEN TRUE AND FALSE", 10, "booleans"),
        ("a LIKE 5", 7, "pattern"),
        ("a LIKE 'x' ESCAPE 'ab'", 18, "one-character"),
        ("a LIKE 'x!' ESCAPE '!'", 7, "escape character"),
        ("a LIKE '_!%' ESCAPE '!'", 7, "escaped"),
        ("a = 1 b = 2", 6, "expected AND, OR"),
        ("a # 1", 2, "unexpected character"),
        ("a = 12x", 4, "malformed number"),
        ("a ! 1", 2, "unexpected character"),
        ("a = 1 AND", 9, "expected a condition"),
        ("()", 1, "inside '('"),
        ('"" = 1', 0, "empty quoted name"),
        ("a", 1, "comparison operator"),
    ],
)
def test_errors_carry_positions(text: str, position: int, fragment: str) -> None:
    with pytest.raises(FilterSyntaxError) as info:
        compile(text)
    assert info.value.position == position
    assert fragment in str(info.value)
    assert str(info.value).endswith(f"at {position}")
    assert isinstance(info.value, ValueError)


def test_size_limits() -> None:
    # (a1 OR b1) AND (a2 OR b2) AND ... doubles the DNF at each factor
    factors = [f"(a{i} = 1 OR b{i} = 1)" for i in range(9)]
    assert len(compile(" AND ".join(factors[:8])).clauses) == 256 == MAX_CLAUSES
    with pytest.raises(FilterSyntaxError, match="too complex"):
        compile(" AND ".join(factors))
    deep = "(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1)
    with pytest.raises(FilterSyntaxError, match="nested"):
        compile(deep)
    assert compile("(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH).clauses == ((P("a", Op.EQ, 1),),)
    with pytest.raises(FilterSyntaxError, match="longer"):
        compile("a = '" + "x" * 70000 + "'")


@pytest.mark.parametrize(
    "text",
    [
        "a = 1 OR NOT (b LIKE 'x\\_%' AND c IN (1, 2.5, 'q', FALSE))",
        "s LIKE '%50!%%' ESCAPE '!' AND t NOT LIKE 'a_c'",
        "x BETWEEN -1e300 AND 1e999 OR \"odd name\" <> 'it''s'",
        "a NOT IN ('a', 'b') AND b.c.d >= -0.0",
    ],
)
def test_format_round_trip(text: str) -> None:
    f = compile(text)
    assert compile(format_filter(f)).clauses == f.clauses


def test_format_empty_filter() -> None:
    never = compile("a NOT IN (1, 'x')")
    assert compile(format_filter(never)).clauses == ()


def test_error_pickles_with_its_position() -> None:
    import pickle

    with pytest.raises(FilterSyntaxError) as info:
        compile("a >")
    again = pickle.loads(pickle.dumps(info.value))
    assert (str(again), again.position) == (str(info.value), 3)
