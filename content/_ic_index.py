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
  The leaf also keeps its CSLists flattened into one numpy array, exact under churn (a
  sorted delta of added entries; a removed clause's entries left in place, where they never
  fire, its id held from reuse until the rebuild squeezes them out; rebuilt after
  max(REBUILD_MIN, entries / REBUILD_FRACTION) changes), so the satisfied run is credited as
  one or two slices and a removal costs no search of the flattened array (see
  :class:`_Ordered`).
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
from collections import Counter
from collections.abc import Callable
from itertools import accumulate, chain, pairwise
from re import Pattern
from typing import Any

import numpy as np

from content._ic_clauses import SINK, ClauseTable
from content._predicate import Kind, Op, Predicate, Scalar, kind_of, like_regex

__all__ = ["ORDERED", "CIndex", "NameIndex"]

ORDERED = frozenset((Op.GT, Op.GE, Op.LT, Op.LE))
"""The operators whose leaves are covering-sorted (:class:`_Ordered`)."""

CSList = list[int]


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


REBUILD_MIN = 64
"""An ordered leaf is re-flattened once its pending changes exceed this many entries ..."""
REBUILD_FRACTION = 32
"""... or 1/REBUILD_FRACTION of its flattened entries, whichever is larger."""

Run = np.ndarray[Any, np.dtype[np.intp]]
_EMPTY: Run = np.zeros(0, dtype=np.intp)
_EMPTY.flags.writeable = False


class _Ordered:
    """One ``< <= > >=`` leaf: the constraints' values ascending, their CSLists in the same
    order, and a flattened copy of those CSLists kept exact under churn.

    The satisfied constraints are a prefix or a suffix (covering order, Table 1), found with
    one ``bisect``.  Their clause ids are credited as numpy slices of three parts:

    * the *snapshot*: every (constraint, clause) entry at the last rebuild, the CSLists
      concatenated in covering order into ``flat`` with ``offs`` the prefix sums of their
      lengths over the snapshot's values ``fx`` -- one slice per query, O(1) Python work
      however many constraints the run holds;
    * the *delta*: entries added since, as a list sorted by value (``dx`` values, ``dc``
      clause ids, ``dn`` the same ids in an int64 buffer with spare capacity, kept in step
      by an in-place shift, a C memmove, on every change: no conversion at query time),
      so its satisfied part is one more ``bisect`` and one slice;
    * *deletions* of snapshot entries are lazy: the entry stays in ``flat`` and its clause
      id goes to ``stale``; a removed clause's id never fires (its need is -1 in the
      :class:`~content._ic_clauses.ClauseTable`) and is *held* there (not reused) until the
      rebuild squeezes it out and releases it, so an entry of ``flat`` whose clause is
      gone is dead whatever the id's position (an entry added since is simply dropped from
      the delta).  A removal thus costs O(1) here, not a search of the value's run in
      ``flat`` (issue 42 item 2: a fleet of 100,000 selectors disconnecting).

    So the live entries are always ``flat`` minus the dead ids plus the delta, and no update
    invalidates the snapshot.  When the pending changes (delta entries plus dead ones,
    ``dead``) pass max(:data:`REBUILD_MIN`, entries / :data:`REBUILD_FRACTION`) the next
    query rebuilds the snapshot.

    Complexity (n distinct values, m entries, d pending): query O(log n + log d) Python
    work plus the slices; entry add O(log d) (+ list memmove); entry drop O(1) in the
    snapshot or O(log d + ties) in the delta; constraint insert/delete O(log n) (+ memmove);
    rebuild O(m) in numpy (a merge of the delta into the snapshot, a mask of the dead ids)
    plus O(dead) to release their ids, amortised O(REBUILD_FRACTION) per change.
    """

    __slots__ = ("cs", "dc", "dead", "dn", "dx", "flat", "fx", "limit", "offs", "stale", "table", "xs")

    def __init__(self, table: ClauseTable) -> None:
        self.table = table  # the clause ids' needs (dead: -1) and their holds
        self.xs: list[Scalar] = []  # the constraints' values, strictly ascending
        self.cs: list[CSList] = []  # their CSLists (shared with ClauseTable)
        self.fx: list[Scalar] = []  # the snapshot's values
        self.offs: list[int] = [0]  # flat[offs[i]:offs[i + 1]] is fx[i]'s CSList then
        self.flat: Run = _EMPTY
        self.dx: list[Scalar] = []  # delta: values ascending ...
        self.dc: list[int] = []  # ... and their clause ids
        self.dn: Run = np.zeros(REBUILD_MIN, dtype=np.intp)  # dn[: len(dc)] == dc
        self.dead = 0  # dead entries in flat (len(stale))
        self.stale: list[int] = []  # their clause ids (held in the table until the rebuild)
        self.limit = REBUILD_MIN

    def insert(self, x: Scalar, cl: CSList) -> None:
        """A new constraint with value ``x`` (its entries arrive through :meth:`add`)."""
        i = bisect_left(self.xs, x)
        self.xs.insert(i, x)
        self.cs.insert(i, cl)

    def delete(self, x: Scalar, cl: CSList) -> None:
        """Constraint ``x`` is gone (its entries left through :meth:`drop`)."""
        i = bisect_left(self.xs, x)
        assert self.cs[i] is cl
        del self.xs[i]
        del self.cs[i]
        if not self.xs:  # empty: a query never reaches it again, so nothing stays pending
            assert not self.dc, "a delta entry outlived its constraint"
            self.offs = [0]
            self.flat = _EMPTY
            self.fx = []
            self._released()

    def add(self, x: Scalar, cid: int) -> None:
        """Clause ``cid`` joined constraint ``x``'s CSList."""
        dc = self.dc
        i = bisect_right(self.dx, x)
        n = len(dc)
        self.dx.insert(i, x)
        dc.insert(i, cid)
        dn = self.dn
        if n == len(dn):
            dn = self.dn = np.concatenate((dn, np.zeros(n, dtype=np.intp)))
        dn[i + 1 : n + 1] = dn[i:n]  # numpy handles the overlap
        dn[i] = cid

    def drop(self, x: Scalar, cid: int) -> bool:
        """Clause ``cid`` (being removed) leaves constraint ``x``'s CSList: dropped from the
        delta (False), or left dead in the snapshot (True: the caller holds ``cid`` in the
        table, released at the next rebuild)."""
        dx = self.dx
        if dx:
            dc = self.dc
            for k in range(bisect_left(dx, x), bisect_right(dx, x)):
                if dc[k] == cid:
                    n = len(dc)
                    del dx[k]
                    del dc[k]
                    dn = self.dn
                    dn[k : n - 1] = dn[k + 1 : n]
                    return False
        self.stale.append(cid)
        self.dead += 1
        return True

    def _rebuild(self) -> None:
        """Merge the delta into the snapshot and squeeze out the dead entries, in numpy: each
        delta entry goes to the end of its value's group (one ``bisect`` per entry), then one
        ``np.insert`` and one boolean mask (a gather of the ids' needs: a removed clause's
        is -1, as SINK's); O(m) in C plus O(n + d log n) Python steps, then the dead ids'
        holds are released.  (Re-flattening the CSLists instead visits every entry's
        scattered list: ~10x more.)"""
        cs = self.cs
        offs = [0]
        offs.extend(accumulate(map(len, cs)))
        flat = self.flat
        dx = self.dx
        if dx:
            fx = self.fx
            old = self.offs
            flat = np.insert(flat, [old[bisect_right(fx, x)] for x in dx], self.dn[: len(dx)])
        if self.dead:
            flat = flat[self.table.need_np[flat] > 0]
        assert len(flat) == offs[-1]
        self.offs = offs
        self.flat = flat
        self.fx = self.xs.copy()
        self.dx = []
        self.dc = []
        self._released()
        self.limit = max(REBUILD_MIN, offs[-1] // REBUILD_FRACTION)

    def _released(self) -> None:
        """The snapshot holds no dead entry any more: their clause ids' holds end."""
        self.dead = 0
        stale = self.stale
        if stale:
            self.stale = []
            self.table.release(stale)

    def settle(self) -> None:
        """Rebuild now if half the snapshot is dead (after removals: a leaf no event
        queries must not hold removed clause ids without bound; a queried one rebuilds
        sooner, at :data:`REBUILD_FRACTION`). Amortised O(1) per removal: a fleet's
        teardown rebuilds a leaf O(log entries) times."""
        if self.xs and self.dead > max(self.limit, len(self.flat) >> 1):
            self._rebuild()

    def _pending(self) -> int:
        """The delta's length (rebuilding first when too much is pending)."""
        n = len(self.dc)
        if self.dead + n > self.limit:
            self._rebuild()
            return 0
        return n

    def head(self, v: Scalar, bis: Callable[[list[Scalar], Scalar], int], parts: list[Run]) -> None:
        """Credit the constraints before ``bis(values, v)`` (``>``: bisect_left, ``>=``:
        bisect_right)."""
        n = self._pending()
        i = bis(self.fx, v)
        if i:
            parts.append(self.flat[: self.offs[i]])
        if n:
            i = bis(self.dx, v)
            if i:
                parts.append(self.dn[:i])

    def tail(self, v: Scalar, bis: Callable[[list[Scalar], Scalar], int], parts: list[Run]) -> None:
        """Credit the constraints from ``bis(values, v)`` on (``<``: bisect_right, ``<=``:
        bisect_left)."""
        n = self._pending()
        i = bis(self.fx, v)
        offs = self.offs
        if i < len(offs) - 1:
            parts.append(self.flat[offs[i] :])
        if n:
            i = bis(self.dx, v)
            if i < n:
                parts.append(self.dn[i:n])

    def _check(self) -> None:
        assert len(self.xs) == len(self.cs)
        assert all(a < b for a, b in pairwise(self.xs)), "ordered leaf not strictly sorted"  # type: ignore[operator]
        assert all(a < b for a, b in pairwise(self.fx)), "snapshot not strictly sorted"  # type: ignore[operator]
        assert all(a <= b for a, b in pairwise(self.dx)), "delta not sorted"  # type: ignore[operator]
        assert len(self.dx) == len(self.dc)
        assert self.dn[: len(self.dc)].tolist() == self.dc
        assert len(self.offs) == len(self.fx) + 1 and self.offs[-1] == len(self.flat)
        flat = self.flat.tolist()
        assert SINK not in flat
        # the dead entries are exactly the snapshot's entries of the stale (held) ids
        assert len(self.stale) == self.dead
        stale = Counter(self.stale)
        assert Counter(c for c in flat if c in stale) == stale, "dead entries differ from the stale ids"
        assert all(self.table.need[c] == 0 and c in self.table.held for c in stale)
        live = Counter((x, c) for x, cl in zip(self.xs, self.cs, strict=True) for c in cl)
        have = Counter(
            (x, c)
            for i, x in enumerate(self.fx)
            for c in flat[self.offs[i] : self.offs[i + 1]]
            if c not in stale
        )
        assert not have & Counter(zip(self.dx, self.dc, strict=True)), "delta entry also in snapshot"
        have.update(zip(self.dx, self.dc, strict=True))
        assert have == live, "snapshot + delta differ from the CSLists"


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

    def __init__(self, table: ClauseTable) -> None:
        self.eq: dict[Scalar, CSList] = {}
        self.ne: dict[Scalar, CSList] = {}
        # IN: member -> the CSLists of the IN lists holding it, by id (O(1) removal)
        self.in_: dict[Scalar, dict[int, CSList]] = {}
        self.not_in: dict[frozenset[Scalar], CSList] = {}
        # ordered leaves: ascending values x and their CSLists (parallel lists)
        self.gt = _Ordered(table)
        self.ge = _Ordered(table)
        self.lt = _Ordered(table)
        self.le = _Ordered(table)
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
                    self.in_.setdefault(m, {})[id(cl)] = cl
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
                    lists = self.in_[m]
                    del lists[id(cl)]
                    if not lists:
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
            o.head(v, bisect_left, parts)
        o = self.ge
        if o.xs:
            o.head(v, bisect_right, parts)
        o = self.lt
        if o.xs:
            o.tail(v, bisect_right, parts)
        o = self.le
        if o.xs:
            o.tail(v, bisect_left, parts)
        if self.in_:
            lists = self.in_.get(v)
            if lists is not None:
                ext(chain.from_iterable(lists.values()))
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
        assert all(k == id(c) for lists in self.in_.values() for k, c in lists.items())
        for a in self.affix.values():
            assert a.table
            assert sorted({len(t) for t in a.table}) == a.lens.sorted
        count = (
            len(self.eq)
            + len(self.ne)
            + len(self.not_in)
            + len({id(c) for lists in self.in_.values() for c in lists.values()})
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

    __slots__ = ("by_kind", "by_type", "table")

    def __init__(self, table: ClauseTable) -> None:
        self.table = table  # the clause table whose CSLists the leaves hold
        self.by_kind: dict[Kind, dict[str, NameIndex]] = {k: {} for k in (Kind.NUM, Kind.STR, Kind.BOOL)}
        self.by_type: dict[type, dict[str, NameIndex]] = {
            t: self.by_kind[k] for t, k in _KIND_OF_TYPE.items()
        }

    def insert(self, p: Predicate, cl: CSList) -> None:
        names = self.by_kind[_leaf_kind(p)]
        ni = names.get(p.attr)
        if ni is None:
            ni = names[p.attr] = NameIndex(self.table)
        ni.insert(p, cl)

    def delete(self, p: Predicate, cl: CSList) -> None:
        names = self.by_kind[_leaf_kind(p)]
        ni = names[p.attr]
        ni.delete(p, cl)
        if ni.size == 0:
            del names[p.attr]

    def leaf(self, p: Predicate) -> _Ordered:
        """The ordered leaf of a ``< <= > >=`` constraint (which must be indexed)."""
        return self.by_kind[p.kind][p.attr].ordered(p.op)

    def names_for(self, value: object) -> dict[str, NameIndex] | None:
        """The level-2 table for an event value's type (None for unsupported values)."""
        t = self.by_type.get(type(value))
        if t is not None:
            return t
        k = kind_of(value)
        return None if k is None else self.by_kind[k]

    def leaf_names(self, name: str, value: object) -> NameIndex | None:
        """The level-3 index of constraints on attribute ``name`` of ``value``'s type (None if no
        constraint has that type and name, or the value is of no supported type).  O(1): two
        hash lookups (type, then name) on the common path."""
        names = self.by_type.get(type(value))
        if names is None:
            names = self.names_for(value)
            if names is None:
                return None
        return names.get(name)

    def _check(self) -> None:
        for names in self.by_kind.values():
            for ni in names.values():
                assert ni.size > 0
                ni._check()
