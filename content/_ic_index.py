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
  A leaf left unchanged for :data:`REBUILD_AFTER` queries also keeps its CSLists flattened
  into one numpy array, so the satisfied run is credited as one slice (see :class:`_Ordered`).
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
from itertools import accumulate, chain, islice, pairwise
from re import Pattern
from typing import Any

import numpy as np

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


REBUILD_AFTER = 4
"""An ordered leaf unchanged for this many queries gets its flattened CSList array built."""


class _Ordered:
    """One ``< <= > >=`` leaf: values ascending, their CSLists in the same order.

    The satisfied constraints are a prefix or a suffix (covering order, Table 1).  Their
    clause ids are credited either by chaining the CSLists (always valid) or, once the leaf
    has been queried :data:`REBUILD_AFTER` times without a change, as one slice of ``flat``
    -- all CSLists concatenated into a numpy array, ``offs`` the prefix sums of their
    lengths -- so that a run of k constraints costs O(1) Python work instead of O(k).  Any
    change (a constraint added or removed, or a CSList growing or shrinking: see
    :meth:`CIndex.touch`) drops the array; under heavy churn a leaf simply stays on the
    chaining path.  Query O(log n) + output; insert/delete O(n) (list memmove); rebuild O(n
    + entries), paid at most once per change and only after REBUILD_AFTER queries.
    """

    __slots__ = ("cs", "flat", "offs", "queries", "xs")

    def __init__(self) -> None:
        self.xs: list[Scalar] = []
        self.cs: list[CSList] = []
        self.flat: np.ndarray[Any, np.dtype[np.intp]] | None = None
        self.offs: list[int] = []
        self.queries = 0

    def insert(self, x: Scalar, cl: CSList) -> None:
        i = bisect_left(self.xs, x)
        self.xs.insert(i, x)
        self.cs.insert(i, cl)
        self.dirty()

    def delete(self, x: Scalar, cl: CSList) -> None:
        i = bisect_left(self.xs, x)
        assert self.cs[i] is cl
        del self.xs[i]
        del self.cs[i]
        self.dirty()

    def dirty(self) -> None:
        self.flat = None
        self.queries = 0

    def _ready(self) -> bool:
        if self.flat is not None:
            return True
        self.queries += 1
        if self.queries < REBUILD_AFTER:
            return False
        offs = [0]
        offs.extend(accumulate(len(c) for c in self.cs))
        self.offs = offs
        self.flat = np.fromiter(chain.from_iterable(self.cs), dtype=np.intp, count=offs[-1])
        return True

    def head(self, i: int, acc: list[int], parts: list[np.ndarray[Any, np.dtype[np.intp]]]) -> None:
        """Credit the constraints [0, i)."""
        if i:
            if self._ready():
                assert self.flat is not None
                parts.append(self.flat[: self.offs[i]])
            else:
                acc.extend(chain.from_iterable(islice(self.cs, i)))

    def tail(self, i: int, acc: list[int], parts: list[np.ndarray[Any, np.dtype[np.intp]]]) -> None:
        """Credit the constraints [i, n)."""
        if i < len(self.xs):
            if self._ready():
                assert self.flat is not None
                parts.append(self.flat[self.offs[i] :])
            else:
                acc.extend(chain.from_iterable(islice(self.cs, i, None)))

    def _check(self) -> None:
        assert len(self.xs) == len(self.cs)
        assert all(a < b for a, b in pairwise(self.xs)), "ordered leaf not strictly sorted"  # type: ignore[operator]
        if self.flat is not None:
            assert self.flat.tolist() == [c for cl in self.cs for c in cl], "stale flattened leaf"


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
        "ge",
        "gt",
        "in_",
        "le",
        "like",
        "lt",
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
        self.gt = _Ordered()
        self.ge = _Ordered()
        self.lt = _Ordered()
        self.le = _Ordered()
        self.affix: dict[Op, _Affix] = {}  # PREFIX/SUFFIX/CONTAINS and their NOT_ forms
        self.like: dict[str, tuple[Pattern[str], CSList]] = {}
        self.not_like: dict[str, tuple[Pattern[str], CSList]] = {}
        self.size = 0  # distinct constraints held

    def ordered(self, op: Op) -> _Ordered:
        match op:
            case Op.GT:
                return self.gt
            case Op.GE:
                return self.ge
            case Op.LT:
                return self.lt
            case Op.LE:
                return self.le
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
                assert not isinstance(v, frozenset)
                self.ordered(p.op).insert(v, cl)
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
                assert not isinstance(v, frozenset)
                self.ordered(p.op).delete(v, cl)
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

    def collect(self, v: Scalar, acc: list[int], parts: list[np.ndarray[Any, np.dtype[np.intp]]]) -> None:
        """Credit every constraint ``v`` satisfies (each once): CSLists are appended to
        ``acc``, flattened runs of ordered leaves to ``parts``."""
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
        o = self.gt
        if o.xs:
            o.head(bisect_left(o.xs, v), acc, parts)
        o = self.ge
        if o.xs:
            o.head(bisect_right(o.xs, v), acc, parts)
        o = self.lt
        if o.xs:
            o.tail(bisect_right(o.xs, v), acc, parts)
        o = self.le
        if o.xs:
            o.tail(bisect_left(o.xs, v), acc, parts)
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
        for o in (self.gt, self.ge, self.lt, self.le):
            o._check()
        for a in self.affix.values():
            assert a.table
            assert sorted({len(t) for t in a.table}) == a.lens.sorted
        count = (
            len(self.eq)
            + len(self.ne)
            + len(self.not_in)
            + len({id(c) for lst in self.in_.values() for c in lst})
            + sum(len(o.xs) for o in (self.gt, self.ge, self.lt, self.le))
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

    def touch(self, p: Predicate) -> None:
        """``p``'s CSList changed in place (a clause joined or left an existing constraint):
        drop the flattened copy its ordered leaf may hold."""
        if p.op in (Op.GT, Op.GE, Op.LT, Op.LE):
            ni = self.by_kind[_leaf_kind(p)].get(p.attr)
            if ni is not None:  # None: a later clause of the same removal dropped it
                ni.ordered(p.op).dirty()

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
