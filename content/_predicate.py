"""Atomic predicates and the normal form every engine indexes.

A selector (docs/reference.md, "content") is compiled to a :class:`Filter`: a disjunction of
conjunctions (DNF) of atomic :class:`Predicate` objects, with every ``NOT`` already pushed
into the operators.  This is the representation all engines share; seed 000 (section 2)
calls the atoms *constraints* (type, name, operator, value) and stores identical ones once
(its Theorem 2): predicates are frozen, hashable values so that an engine can intern them.

Semantics (SQL's three-valued logic, collapsed exactly):

* an atom is *true* only when the event carries the attribute with a comparable type and
  the comparison holds; a missing attribute or a type mismatch makes the atom false;
* the negated operators (``NE``, ``NOT_PREFIX``, ``NOT_IN`` ...) are true only when the value
  is comparable and the positive comparison is false, so ``NOT`` of an unknown stays false;
* after ``NOT`` is pushed down (De Morgan holds in Kleene logic) the formula is monotone in
  its atoms, so evaluating it with unknown = false gives exactly SQL's ``WHERE`` answer.

Comparability: numbers (int and float, never bool) with numbers, strings with strings
(ordered by code point), booleans with booleans and only under ``EQ``/``NE``.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Kind", "Op", "Predicate", "Scalar", "Value", "kind_of"]

Scalar = int | float | str | bool
Value = Scalar | frozenset[Scalar]


class Kind(enum.Enum):
    """The type family of a predicate's literal (seed 000: Integer/Float merge into NUM)."""

    NUM = "num"
    STR = "str"
    BOOL = "bool"
    SET = "set"  # IN / NOT IN lists (members may mix kinds)


class Op(enum.Enum):
    """Operators after normalisation.  ``negated`` maps each to its complement."""

    EQ = "="
    NE = "<>"
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    PREFIX = "prefix"  # LIKE 'abc%'
    SUFFIX = "suffix"  # LIKE '%abc'
    CONTAINS = "contains"  # LIKE '%abc%'
    LIKE = "like"  # any other LIKE pattern; value is the SQL pattern
    IN = "in"
    NOT_PREFIX = "not prefix"
    NOT_SUFFIX = "not suffix"
    NOT_CONTAINS = "not contains"
    NOT_LIKE = "not like"
    NOT_IN = "not in"

    @property
    def negated(self) -> Op:
        return _NEGATION[self]


_NEGATION = {
    Op.EQ: Op.NE,
    Op.NE: Op.EQ,
    Op.LT: Op.GE,
    Op.GE: Op.LT,
    Op.GT: Op.LE,
    Op.LE: Op.GT,
    Op.PREFIX: Op.NOT_PREFIX,
    Op.NOT_PREFIX: Op.PREFIX,
    Op.SUFFIX: Op.NOT_SUFFIX,
    Op.NOT_SUFFIX: Op.SUFFIX,
    Op.CONTAINS: Op.NOT_CONTAINS,
    Op.NOT_CONTAINS: Op.CONTAINS,
    Op.LIKE: Op.NOT_LIKE,
    Op.NOT_LIKE: Op.LIKE,
    Op.IN: Op.NOT_IN,
    Op.NOT_IN: Op.IN,
}

ORDER_OPS = frozenset({Op.LT, Op.LE, Op.GT, Op.GE})
STRING_OPS = frozenset(
    {
        Op.PREFIX,
        Op.SUFFIX,
        Op.CONTAINS,
        Op.LIKE,
        Op.NOT_PREFIX,
        Op.NOT_SUFFIX,
        Op.NOT_CONTAINS,
        Op.NOT_LIKE,
    }
)


def kind_of(value: object) -> Kind | None:
    """The comparability family of an event value, or None for unsupported values."""
    if isinstance(value, bool):
        return Kind.BOOL
    if isinstance(value, int | float):
        return Kind.NUM
    if isinstance(value, str):
        return Kind.STR
    return None


def _like_regex(pattern: str) -> re.Pattern[str]:
    out = []
    for ch in pattern:
        if ch == "%":
            out.append(".*")
        elif ch == "_":
            out.append(".")
        else:
            out.append(re.escape(ch))
    return re.compile("".join(out), re.DOTALL)


@dataclass(frozen=True, slots=True)
class Predicate:
    """One atomic constraint ``attr op value``.

    ``kind`` is part of equality so that ``a = TRUE`` and ``a = 1`` stay distinct (Python's
    ``True == 1``).  For ``IN``/``NOT_IN`` the value is a frozenset; members are compared
    with the same kind rules as ``=``, and ``members`` (the members' kind, set by the
    constructor) is part of equality too: ``frozenset({True, False}) == frozenset({1, 0})``,
    yet ``b IN (TRUE, FALSE)`` and ``b IN (1, 0)`` are different predicates.
    For ``LIKE``/``NOT_LIKE`` the value is the SQL pattern; for
    prefix/suffix/contains it is the literal part without ``%``.
    """

    attr: str
    op: Op
    value: Value
    kind: Kind = field(default=Kind.NUM)
    members: Kind | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        expected = Kind.SET if self.op in (Op.IN, Op.NOT_IN) else kind_of(self.value)
        if expected is not self.kind or expected is None:
            raise ValueError(f"predicate {self.attr} {self.op.value} {self.value!r}: kind {self.kind}")
        if expected is Kind.SET:
            assert isinstance(self.value, frozenset)
            kinds = {kind_of(m) for m in self.value}
            if len(kinds) == 1:
                object.__setattr__(self, "members", kinds.pop())
        if self.kind is Kind.BOOL and self.op not in (Op.EQ, Op.NE):
            raise ValueError("booleans compare only with = and <>")
        if self.op in STRING_OPS and self.kind is not Kind.STR:
            raise ValueError(f"{self.op.value} needs a string pattern")

    @staticmethod
    def of(attr: str, op: Op, value: Value) -> Predicate:
        """Build a predicate, inferring ``kind`` from the value."""
        if isinstance(value, frozenset):
            return Predicate(attr, op, value, Kind.SET)
        kind = kind_of(value)
        if kind is None:
            raise ValueError(f"unsupported literal {value!r}")
        return Predicate(attr, op, value, kind)

    def negate(self) -> Predicate:
        """The predicate true exactly when this one is comparable and false."""
        return Predicate(self.attr, self.op.negated, self.value, self.kind)

    def test(self, value: object) -> bool:
        """Evaluate against one event value (``None``/missing -> False)."""
        return _test(self, value)

    def __call__(self, event: Mapping[str, object]) -> bool:
        return _test(self, event.get(self.attr))

    def __str__(self) -> str:
        return f"{self.attr} {self.op.value} {self.value!r}"


@functools.lru_cache(maxsize=4096)
def like_regex(pattern: str) -> re.Pattern[str]:
    """The anchored regex for an SQL LIKE pattern (``%`` any run, ``_`` one character)."""
    return _like_regex(pattern)


def _member(value: Scalar, members: frozenset[Scalar]) -> tuple[bool, bool]:
    """(found, all members comparable) for ``value IN members`` under the kind rules."""
    vk = kind_of(value)
    found = False
    comparable = True
    for m in members:
        if kind_of(m) is vk:
            if m == value:
                found = True
        else:
            comparable = False
    return found, comparable


def _test(p: Predicate, v: object) -> bool:  # noqa: C901, PLR0912 (one case per operator)
    vk = kind_of(v)
    if vk is None:
        return False
    op = p.op
    if p.kind is Kind.SET:
        assert isinstance(p.value, frozenset)
        found, comparable = _member(v, p.value)  # type: ignore[arg-type]
        if op is Op.IN:
            return found
        return comparable and not found
    if vk is not p.kind:
        return False
    x = p.value
    if op is Op.EQ:
        return v == x
    if op is Op.NE:
        return v != x
    if op is Op.LT:
        return v < x  # type: ignore[operator]
    if op is Op.LE:
        return v <= x  # type: ignore[operator]
    if op is Op.GT:
        return v > x  # type: ignore[operator]
    if op is Op.GE:
        return v >= x  # type: ignore[operator]
    assert isinstance(v, str) and isinstance(x, str)
    if op is Op.PREFIX:
        return v.startswith(x)
    if op is Op.SUFFIX:
        return v.endswith(x)
    if op is Op.CONTAINS:
        return x in v
    if op is Op.LIKE:
        return like_regex(x).fullmatch(v) is not None
    if op is Op.NOT_PREFIX:
        return not v.startswith(x)
    if op is Op.NOT_SUFFIX:
        return not v.endswith(x)
    if op is Op.NOT_CONTAINS:
        return x not in v
    if op is Op.NOT_LIKE:
        return like_regex(x).fullmatch(v) is None
    raise AssertionError(op)
