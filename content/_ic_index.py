"""ICCounting's constraint multi-level index, CIndex (seed 000, section 3.1, Fig. 6).

Level 1 is the type (our :class:`~content._predicate.Kind`: NUM merges the paper's Integer
and Float because numbers compare across int/float; STR; BOOL), level 2 the attribute name,
level 3 the operator; each leaf is a constraint list CL whose entries are the CSLists of
:class:`~content._ic_clauses.ClauseTable` (identical constraints are one entry, Theorem 2).

Leaves, per operator (``v`` is the event value, ``x`` a constraint's value, n the number of
distinct constraints in the leaf, k the number that the event satisfies):

* ``< <= > >=`` -- a list sorted by the covering relation of Table 1 (Theorem 1): for ``>``
  the constraint ``> x1`` is covered by ``> x2`` when x1 >= x2, so with the values in
  ascending order the satisfied constraints ``x < v`` are exactly a prefix, found with one
  binary search (``bisect``); likewise ``>=`` (prefix, ``x <= v``), ``<`` (suffix, ``x > v``)
  and ``<=`` (suffix, ``x >= v``).  O(log n + k); insert/delete O(n) ``list.insert`` memmove.
* ``=`` -- a hash table value -> CSList, O(1).  ``IN`` -- a hash table member -> CSLists of
  the lists containing it (each IN list is single-kinded after compile), O(1 + k).
* prefix / suffix -- a hash table pattern -> CSList plus the sorted set of pattern lengths;
  the event string's prefixes (suffixes) of those lengths are looked up: O(#lengths).
* substring -- a hash table pattern -> CSList; either every substring of the event string
  whose length is a pattern length is looked up (O(len(v) x #lengths)) or every pattern is
  tested with ``in`` (O(n x len(v)) in C), whichever the sizes make cheaper.
* Extensions for the rest of the language (the paper has no negation): the negated
  operators ``<>``, ``NOT IN``, ``NOT LIKE 'abc%'`` ... are true exactly when the value has
  the leaf's type and the positive test is false, so their leaf yields *all* its constraints
  except the ones the positive test hits -- work proportional to the output.  General
  ``LIKE`` / ``NOT LIKE`` patterns cannot be indexed by these structures and are verified
  one by one with their compiled regex (O(n) for that leaf only).

Missing attributes and type mismatches need nothing: an event value only reaches the leaves
of its own type and name, so every constraint it cannot satisfy is never touched.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable
from itertools import chain, islice, pairwise
from re import Pattern

from content._predicate import Kind, Op, Predicate, Scalar, kind_of, like_regex

__all__ = ["CIndex", "NameIndex"]

CSList = list[int]


def _remove_identity(lst: list[CSList], cl: CSList) -> None:
    for i, c in enumerate(lst):
        if c is cl:
            del lst[i]
            return
    raise AssertionError("CSList not found")


class _Lengths:
    """Multiset of pattern lengths, with the distinct ones kept sorted."""

    __slots__ = ("count", "sorted")

    def __init__(self) -> None:
        self.count: dict[int, int] = {}
        self.sorted: list[int] = []

    def add(self, n: int) -> None:
        c = self.count.get(n, 0)
        if c == 0:
            insort(self.sorted, n)
        self.count[n] = c + 1

    def discard(self, n: int) -> None:
        c = self.count[n] - 1
        if c:
            self.count[n] = c
        else:
            del self.count[n]
            self.sorted.remove(n)


class _Affix:
    """Patterns -> CSList for one of prefix / suffix / substring (positive or negated)."""

    __slots__ = ("lens", "table")

    def __init__(self) -> None:
        self.table: dict[str, CSList] = {}
        self.lens = _Lengths()

    def add(self, pattern: str, cl: CSList) -> None:
        self.table[pattern] = cl
        self.lens.add(len(pattern))

    def remove(self, pattern: str) -> None:
        del self.table[pattern]
        self.lens.discard(len(pattern))

    def prefix_hits(self, s: str) -> list[str]:
        table = self.table
        n = len(s)
        out = []
        for k in self.lens.sorted:
            if k > n:
                break
            if s[:k] in table:
                out.append(s[:k])
        return out

    def suffix_hits(self, s: str) -> list[str]:
        table = self.table
        n = len(s)
        out = []
        for k in self.lens.sorted:
            if k > n:
                break
            t = s[n - k :]
            if t in table:
                out.append(t)
        return out

    def substring_hits(self, s: str) -> list[str] | set[str]:
        table = self.table
        n = len(s)
        lens = self.lens.sorted
        if len(table) <= (n + 1) * len(lens):
            return [p for p in table if p in s]
        found: set[str] = set()
        for k in lens:
            if k > n:
                break
            for i in range(n - k + 1):
                t = s[i : i + k]
                if t in table:
                    found.add(t)
        return found


_HITS: dict[Op, Callable[[_Affix, str], list[str] | set[str]]] = {
    Op.PREFIX: _Affix.prefix_hits,
    Op.SUFFIX: _Affix.suffix_hits,
    Op.CONTAINS: _Affix.substring_hits,
}
_POSITIVE = {Op.NOT_PREFIX: Op.PREFIX, Op.NOT_SUFFIX: Op.SUFFIX, Op.NOT_CONTAINS: Op.CONTAINS}


class NameIndex:
    """Level 3 of CIndex: the operator leaves of one (type, name)."""

    __slots__ = (
        "affix",
        "eq",
        "ge_c",
        "ge_x",
        "gt_c",
        "gt_x",
        "in_",
        "le_c",
        "le_x",
        "like",
        "lt_c",
        "lt_x",
        "ne",
        "not_in",
        "not_like",
        "size",
    )

    def __init__(self) -> None:
        self.eq: dict[Scalar, CSList] = {}
        self.ne: dict[Scalar, CSList] = {}
        self.in_: dict[Scalar, list[CSList]] = {}
        self.not_in: dict[frozenset[Scalar], CSList] = {}
        # ordered leaves: ascending values x and their CSLists (parallel lists)
        self.gt_x: list[Scalar] = []
        self.gt_c: list[CSList] = []
        self.ge_x: list[Scalar] = []
        self.ge_c: list[CSList] = []
        self.lt_x: list[Scalar] = []
        self.lt_c: list[CSList] = []
        self.le_x: list[Scalar] = []
        self.le_c: list[CSList] = []
        self.affix: dict[Op, _Affix] = {}  # PREFIX/SUFFIX/CONTAINS and their NOT_ forms
        self.like: dict[str, tuple[Pattern[str], CSList]] = {}
        self.not_like: dict[str, tuple[Pattern[str], CSList]] = {}
        self.size = 0  # distinct constraints held

    def _ordered(self, op: Op) -> tuple[list[Scalar], list[CSList]]:
        match op:
            case Op.GT:
                return self.gt_x, self.gt_c
            case Op.GE:
                return self.ge_x, self.ge_c
            case Op.LT:
                return self.lt_x, self.lt_c
            case Op.LE:
                return self.le_x, self.le_c
        raise AssertionError(op)

    def insert(self, p: Predicate, cl: CSList) -> None:
        """Add distinct constraint ``p`` whose CSList is ``cl``."""
        v = p.value
        self.size += 1
        match p.op:
            case Op.EQ:
                self.eq[v] = cl  # type: ignore[index]
            case Op.NE:
                self.ne[v] = cl  # type: ignore[index]
            case Op.GT | Op.GE | Op.LT | Op.LE:
                xs, cs = self._ordered(p.op)
                i = bisect_left(xs, v)
                xs.insert(i, v)  # type: ignore[arg-type]
                cs.insert(i, cl)
            case Op.IN:
                assert isinstance(v, frozenset)
                for m in v:
                    self.in_.setdefault(m, []).append(cl)
            case Op.NOT_IN:
                assert isinstance(v, frozenset)
                self.not_in[v] = cl
            case Op.PREFIX | Op.SUFFIX | Op.CONTAINS | Op.NOT_PREFIX | Op.NOT_SUFFIX | Op.NOT_CONTAINS:
                assert isinstance(v, str)
                self.affix.setdefault(p.op, _Affix()).add(v, cl)
            case Op.LIKE:
                assert isinstance(v, str)
                self.like[v] = (like_regex(v), cl)
            case Op.NOT_LIKE:
                assert isinstance(v, str)
                self.not_like[v] = (like_regex(v), cl)

    def delete(self, p: Predicate, cl: CSList) -> None:
        """Remove distinct constraint ``p`` (its CSList ``cl`` is empty by now)."""
        v = p.value
        self.size -= 1
        match p.op:
            case Op.EQ:
                del self.eq[v]  # type: ignore[arg-type]
            case Op.NE:
                del self.ne[v]  # type: ignore[arg-type]
            case Op.GT | Op.GE | Op.LT | Op.LE:
                xs, cs = self._ordered(p.op)
                i = bisect_left(xs, v)
                assert cs[i] is cl
                del xs[i]
                del cs[i]
            case Op.IN:
                assert isinstance(v, frozenset)
                for m in v:
                    lst = self.in_[m]
                    _remove_identity(lst, cl)
                    if not lst:
                        del self.in_[m]
            case Op.NOT_IN:
                del self.not_in[v]  # type: ignore[arg-type]
            case Op.PREFIX | Op.SUFFIX | Op.CONTAINS | Op.NOT_PREFIX | Op.NOT_SUFFIX | Op.NOT_CONTAINS:
                assert isinstance(v, str)
                a = self.affix[p.op]
                a.remove(v)
                if not a.table:
                    del self.affix[p.op]
            case Op.LIKE:
                del self.like[v]  # type: ignore[arg-type]
            case Op.NOT_LIKE:
                del self.not_like[v]  # type: ignore[arg-type]

    def collect(self, v: Scalar, acc: list[int]) -> None:
        """Extend ``acc`` with the CSLists of every constraint ``v`` satisfies (each once)."""
        ext = acc.extend
        if self.eq:
            cl = self.eq.get(v)
            if cl is not None:
                ext(cl)
        if self.ne:
            ne = self.ne
            hit = ne.get(v)
            if hit is None:
                ext(chain.from_iterable(ne.values()))
            else:
                ext(chain.from_iterable(c for c in ne.values() if c is not hit))
        if self.gt_x:
            ext(chain.from_iterable(islice(self.gt_c, bisect_left(self.gt_x, v))))
        if self.ge_x:
            ext(chain.from_iterable(islice(self.ge_c, bisect_right(self.ge_x, v))))
        if self.lt_x:
            ext(chain.from_iterable(islice(self.lt_c, bisect_right(self.lt_x, v), None)))
        if self.le_x:
            ext(chain.from_iterable(islice(self.le_c, bisect_left(self.le_x, v), None)))
        if self.in_:
            lst = self.in_.get(v)
            if lst is not None:
                ext(chain.from_iterable(lst))
        if self.not_in:
            ext(chain.from_iterable(c for fs, c in self.not_in.items() if v not in fs))
        if self.affix or self.like or self.not_like:
            assert isinstance(v, str)
            self._collect_str(v, ext)

    def _collect_str(self, s: str, ext: Callable[[list[int]], None]) -> None:
        for op, a in self.affix.items():
            pos = _POSITIVE.get(op)
            if pos is None:
                table = a.table
                for t in _HITS[op](a, s):
                    ext(table[t])
            else:
                hits = _HITS[pos](a, s)
                table = a.table
                if not hits:
                    for c in table.values():
                        ext(c)
                else:
                    skip = set(hits)
                    for t, c in table.items():
                        if t not in skip:
                            ext(c)
        for rx, c in self.like.values():
            if rx.fullmatch(s) is not None:
                ext(c)
        for rx, c in self.not_like.values():
            if rx.fullmatch(s) is None:
                ext(c)

    def _check(self) -> None:
        for xs in (self.gt_x, self.ge_x, self.lt_x, self.le_x):
            assert all(a < b for a, b in pairwise(xs)), "ordered leaf not strictly sorted"  # type: ignore[operator]
        for xs, cs in (
            (self.gt_x, self.gt_c),
            (self.ge_x, self.ge_c),
            (self.lt_x, self.lt_c),
            (self.le_x, self.le_c),
        ):
            assert len(xs) == len(cs)
        for a in self.affix.values():
            assert a.table
            assert sorted({len(t) for t in a.table}) == a.lens.sorted
        count = (
            len(self.eq)
            + len(self.ne)
            + len(self.not_in)
            + len({id(c) for lst in self.in_.values() for c in lst})
            + sum(len(xs) for xs in (self.gt_x, self.ge_x, self.lt_x, self.le_x))
            + sum(len(a.table) for a in self.affix.values())
            + len(self.like)
            + len(self.not_like)
        )
        assert count == self.size, (count, self.size)


_KIND_OF_TYPE: dict[type, Kind] = {bool: Kind.BOOL, int: Kind.NUM, float: Kind.NUM, str: Kind.STR}


def _leaf_kind(p: Predicate) -> Kind:
    if p.kind is Kind.SET:
        assert isinstance(p.value, frozenset)
        k = kind_of(next(iter(p.value)))
        assert k is not None
        assert all(kind_of(m) is k for m in p.value), "IN list with mixed kinds (not from compile)"
        return k
    return p.kind


class CIndex:
    """The whole multi-level index: type -> name -> :class:`NameIndex`.

    ``lookup(name, value)`` returns the NameIndex an event attribute reaches (None when no
    constraint has that type and name): two hash lookups.
    """

    __slots__ = ("by_kind", "by_type")

    def __init__(self) -> None:
        self.by_kind: dict[Kind, dict[str, NameIndex]] = {k: {} for k in (Kind.NUM, Kind.STR, Kind.BOOL)}
        self.by_type: dict[type, dict[str, NameIndex]] = {
            t: self.by_kind[k] for t, k in _KIND_OF_TYPE.items()
        }

    def insert(self, p: Predicate, cl: CSList) -> None:
        names = self.by_kind[_leaf_kind(p)]
        ni = names.get(p.attr)
        if ni is None:
            ni = names[p.attr] = NameIndex()
        ni.insert(p, cl)

    def delete(self, p: Predicate, cl: CSList) -> None:
        names = self.by_kind[_leaf_kind(p)]
        ni = names[p.attr]
        ni.delete(p, cl)
        if ni.size == 0:
            del names[p.attr]

    def names_for(self, value: object) -> dict[str, NameIndex] | None:
        """The level-2 table for an event value's type (None for unsupported values)."""
        t = self.by_type.get(type(value))
        if t is not None:
            return t
        k = kind_of(value)
        return None if k is None else self.by_kind[k]

    def _check(self) -> None:
        for names in self.by_kind.values():
            for ni in names.values():
                assert ni.size > 0
                ni._check()
