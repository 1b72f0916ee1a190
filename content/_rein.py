"""REIN: bucket-indexed negative search over range constraints (seed 004, section 2).

Seed 004 builds on REIN (its ref. [13]): every numeric constraint of a subscription is a
range ``[v_low, v_high]`` (``>=`` -> ``[v, R]``, ``<=`` -> ``[U, v]``, ``=`` -> ``[v, v]``,
its step 3); per attribute the lower bounds live in a bucket list ``L_low`` and the upper
bounds in ``L_high`` (:mod:`content._bucket`); a per-event bit set marks the subscriptions
an event *fails* (negative search): in ``L_low`` every bound above the event value fails, in
``L_high`` every bound below it; only the event's own bucket is compared, the buckets
beyond it are marked wholesale.  What stays unmarked matches.

Mapping of the whole selector language onto that index (docs/reference.md, "content"):

* a *unit* is one DNF conjunction of a filter (a subscription matches when any of its units
  does), so OR is exact; units are dense ids (intp: numpy scatters with native indices) into numpy arrays;
* per unit and attribute the numeric ``= < <= > >=`` predicates intersect into one range,
  stored as at most one ``L_low`` and one ``L_high`` entry (an open side is not stored: REIN's
  ``[v, R]`` with ``R`` = +infinity never fails).  Strict bounds are exact: ``x > v`` is
  ``x >= nextafter(v, +inf)`` (no int or float lies strictly between), done only for
  ``|v| < 2**53``; event ints beyond 2**53 are compared exactly through a rounding-side flag;
* an event that lacks the attribute, or carries a non-number or NaN there, fails every unit
  that has an entry in the attribute's lists (both lists are marked wholesale);
* equality on a string or a boolean (``class = 'pump'``, ``alarm = FALSE``) is indexed too,
  as a range ``[c, c]`` over the literal's *code*: per attribute every distinct literal gets
  a number (1, 2, ...; :class:`_Codes`) and the attribute has its own pair of bucket lists
  (``_cats``, apart from its numeric ones).  An event value is looked up in the codes: a
  literal no unit holds, a number, a missing value fail every unit with an entry there
  (``mark_all``), as they fail the equality.  Two different literals on one attribute give
  ``lo > hi``: the unit never matches, as the conjunction is false (a deviation from seed
  004, whose attributes are numbers: docs/content-rein-hcem.md, "Equality on strings and
  booleans"; without it a fleet's ``class = 'pump' AND temp > 90`` left ~10 % of every unit
  to be verified in Python per event);
* every other predicate (string order, ``<>``, [NOT] IN, [NOT] LIKE, prefix / suffix /
  contains, numeric literals that float64 cannot hold exactly) is a *residual* of its unit and
  is verified with :meth:`Predicate.test` on the units that survive the negative search
  (``IN`` over strings or booleans with a set lookup, :func:`residual_check`).

Per event: O(n) to reset the bit set, plus per attribute O(q) comparisons in one bucket of
each list and O(|marked|) scatter (one more dict lookup per attribute with string / boolean
equalities); the survivors are verified for residuals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from content._bucket import BucketList, UnitTable
from content._engine import Engine, Event, SubId
from content._filter import Clause, Filter
from content._predicate import Kind, Op, Predicate, Scalar, kind_of

__all__ = ["REIN"]

_EXACT = 2.0**53
_INF = math.inf
Bounds = dict[str, list[float | None]]


_NUM, _STR, _BOOL = Kind.NUM, Kind.STR, Kind.BOOL
_EQ, _GE, _LE, _GT, _LT = Op.EQ, Op.GE, Op.LE, Op.GT, Op.LT
Number = tuple[float, bool, bool]  # event_number's answer
CatKey = tuple[bool, Scalar]  # (is a boolean, literal): True and 1, 'a' and 'a' kept apart


def cat_key(v: object) -> CatKey | None:
    """The code key of an event value for string / boolean equality (None: neither)."""
    t = type(v)
    if t is str:
        return (False, v)  # type: ignore[return-value]
    if t is bool:
        return (True, v)  # type: ignore[return-value]
    k = kind_of(v)  # subclasses
    if k is _STR:
        return (False, str(v))
    if k is _BOOL:
        return (True, bool(v))
    return None


Check = tuple[str, Callable[[object], bool]]


def residual_check(p: Predicate) -> Check:
    """``(attr, test)``: ``p.test``, or for ``IN`` over strings (booleans) alone a set
    lookup for a ``str`` (``bool``) value, the same answer without the kind rules' loop."""
    members = p.value
    test = p.test
    if p.op is Op.IN and (p.members is _STR or p.members is _BOOL):
        assert isinstance(members, frozenset)
        exact = str if p.members is _STR else bool

        def check(v: object) -> bool:
            return v in members if type(v) is exact else test(v)

        return p.attr, check
    return p.attr, test


def cat_predicates(clause: Clause) -> tuple[list[Predicate], tuple[Predicate, ...]]:
    """The clause's string / boolean equalities, and its other predicates."""
    eqs: list[Predicate] = []
    rest: list[Predicate] = []
    for p in clause:
        if p.op is _EQ and (p.kind is _STR or p.kind is _BOOL):
            eqs.append(p)
        else:
            rest.append(p)
    return eqs, tuple(rest)


@dataclass(eq=False, slots=True)
class _Codes:
    """One attribute's string / boolean literals as numbers, and its two bucket lists.

    A literal's code is handed out at its first use and dropped when no unit holds it
    (``refs``); codes are never reused (a later use of the literal gets a new one), so a
    tombstone left in a list can never stand for another literal.  O(1) per operation."""

    low: BucketList
    high: BucketList
    codes: dict[CatKey, float] = field(default_factory=dict)
    refs: dict[CatKey, int] = field(default_factory=dict)
    next_code: int = 1

    def acquire(self, key: CatKey) -> float:
        code = self.codes.get(key)
        if code is None:
            code = self.codes[key] = float(self.next_code)
            self.next_code += 1
            self.refs[key] = 0
        self.refs[key] += 1
        return code

    def release(self, key: CatKey) -> None:
        left = self.refs[key] - 1
        if left:
            self.refs[key] = left
        else:
            del self.refs[key]
            del self.codes[key]

    def number(self, v: object) -> Number | None:
        """The event value's code as event_number's answer, or None (fails every entry)."""
        key = cat_key(v)
        code = None if key is None else self.codes.get(key)
        return None if code is None else (code, True, True)


def _exact(v: object) -> float | None:
    """``v`` as a float64 when that is exact and finite, else None."""
    if isinstance(v, int):
        return float(v) if -_EXACT <= v <= _EXACT else None
    assert isinstance(v, float)
    return v if -_INF < v < _INF else None


def intersect(bounds: Bounds, attr: str, lo: float | None, hi: float | None) -> None:
    """Narrow ``bounds[attr]`` to ``[lo, hi]`` (None: that side open)."""
    cur = bounds.get(attr)
    if cur is None:
        bounds[attr] = [lo, hi]
        return
    if lo is not None:
        old = cur[0]
        cur[0] = lo if old is None else max(old, lo)
    if hi is not None:
        old = cur[1]
        cur[1] = hi if old is None else min(old, hi)


def split_clause(clause: Clause) -> tuple[Bounds, tuple[Predicate, ...]]:
    """Per-attribute intersected ranges of the indexable predicates, and the residuals.

    Indexable: numeric ``= < <= > >=`` with a literal float64 holds exactly (strict ones only
    below 2**53 in magnitude, where ``nextafter`` leaves no int or float in between).
    """
    bounds: Bounds = {}
    residual: list[Predicate] = []
    for p in clause:
        op = p.op
        lo: float | None = None
        hi: float | None = None
        f = _exact(p.value) if p.kind is _NUM else None
        if f is not None:
            if op is _GE:
                lo = f
            elif op is _LE:
                hi = f
            elif op is _EQ:
                lo = hi = f
            elif -_EXACT < f < _EXACT:
                if op is _GT:
                    lo = math.nextafter(f, _INF)
                elif op is _LT:
                    hi = math.nextafter(f, -_INF)
        if lo is None and hi is None:
            residual.append(p)
            continue
        intersect(bounds, p.attr, lo, hi)
    return bounds, tuple(residual)


def event_number(v: object) -> tuple[float, bool, bool] | None:
    """``(xf, v >= xf, v <= xf)`` for a comparable number ``v`` (xf its float64), else None.

    The flags are exact (Python compares int with float exactly), so a huge int rounded to
    ``xf`` still decides every bound that equals ``xf`` correctly.
    """
    if isinstance(v, float):
        if math.isnan(v):
            return None
        return float(v), True, True
    if isinstance(v, int) and not isinstance(v, bool):
        try:
            xf = float(v)
        except OverflowError:
            xf = _INF if v > 0 else -_INF
        return xf, v >= xf, v <= xf
    return None


class REIN(Engine):
    """Seed 004's REIN index; ``match`` is one negative search per event.

    ``buckets`` is the maximum number of buckets per list (seed 004 uses b = 1000).
    Insert O(k log b) amortised, delete O(k) amortised (tombstones, per-list compaction);
    memory ~ 1.25 x 16 bytes per stored bound plus one unit record per conjunction.
    """

    name: ClassVar[str] = "rein"

    def __init__(self, buckets: int = 1000) -> None:
        super().__init__()
        self._buckets = buckets
        self._table = UnitTable()
        self._lists: dict[str, tuple[BucketList, BucketList]] = {}
        self._cats: dict[str, _Codes] = {}  # string / boolean equalities, per attribute
        self._unit_sub: list[Hashable] = [None]
        self._residual: list[tuple[Check, ...] | None] = [None]
        self._units_of: dict[SubId, int | list[int]] = {}  # one int for a one-clause filter
        self._fail: npt.NDArray[np.bool_] = np.zeros(64, dtype=np.bool_)
        self._dirty: set[BucketList] = set()

    # -- updates --------------------------------------------------------------------

    def _lists_for(self, attr: str) -> tuple[BucketList, BucketList]:
        pair = self._lists.get(attr)
        if pair is None:
            pair = (BucketList(self._table, self._buckets), BucketList(self._table, self._buckets))
            self._lists[attr] = pair
        return pair

    def _codes_for(self, attr: str) -> _Codes:
        codes = self._cats.get(attr)
        if codes is None:
            codes = self._cats[attr] = _Codes(
                BucketList(self._table, self._buckets), BucketList(self._table, self._buckets)
            )
        return codes

    def columns(self) -> Iterator[tuple[str, BucketList, BucketList, Callable[[object], Number | None]]]:
        """Every indexed attribute's lists: ``(attr, L_low, L_high, value -> number)``."""
        for attr, (low, high) in self._lists.items():
            yield attr, low, high, event_number
        for attr, codes in self._cats.items():
            yield attr, codes.low, codes.high, codes.number

    def _insert(self, sub_id: SubId, f: Filter) -> None:
        table = self._table
        dirty = self._dirty
        units: list[int] = []
        for clause in f.clauses:
            eqs, others = cat_predicates(clause)
            bounds, residual = split_clause(others)
            checks = tuple(map(residual_check, residual)) or None
            u = table.allocate()
            if u == len(self._unit_sub):
                self._unit_sub.append(sub_id)
                self._residual.append(checks)
            else:
                self._unit_sub[u] = sub_id
                self._residual[u] = checks
            entries = 0
            for attr, (lo, hi) in bounds.items():
                low, high = self._lists_for(attr)
                if lo is not None:
                    low.insert(lo, u)
                    dirty.add(low)
                    entries += 1
                if hi is not None:
                    high.insert(hi, u)
                    dirty.add(high)
                    entries += 1
            if eqs:
                cat: Bounds = {}
                for p in eqs:
                    code = self._codes_for(p.attr).acquire((p.kind is _BOOL, p.value))  # type: ignore[arg-type]
                    intersect(cat, p.attr, code, code)
                for attr, (lo, hi) in cat.items():
                    codes = self._cats[attr]
                    assert lo is not None and hi is not None
                    codes.low.insert(lo, u)
                    codes.high.insert(hi, u)
                    dirty.add(codes.low)
                    dirty.add(codes.high)
                    entries += 2
            table.pending[u] = entries
            units.append(u)
        self._units_of[sub_id] = units[0] if len(units) == 1 else units

    def _delete(self, sub_id: SubId, f: Filter) -> None:
        stored = self._units_of.pop(sub_id)
        units = [stored] if isinstance(stored, int) else stored
        for u, clause in zip(units, f.clauses, strict=True):
            eqs, others = cat_predicates(clause)
            bounds, _ = split_clause(others)
            self._unit_sub[u] = None
            self._residual[u] = None
            self._table.release(u)
            for attr, (lo, hi) in bounds.items():
                low, high = self._lists[attr]
                if lo is not None:
                    low.kill()
                if hi is not None:
                    high.kill()
            for attr in {p.attr for p in eqs}:
                codes = self._cats[attr]
                codes.low.kill()
                codes.high.kill()
            for p in eqs:
                self._cats[p.attr].release((p.kind is _BOOL, p.value))  # type: ignore[arg-type]

    # -- matching -------------------------------------------------------------------

    def _flush(self) -> None:
        """Write queued inserts into their buckets (before any negative search)."""
        for lst in self._dirty:
            lst.flush()
        self._dirty.clear()

    def _mark(self, fail: npt.NDArray[np.bool_], event: Event) -> None:
        get = event.get
        for attr, (low, high) in self._lists.items():
            num = event_number(get(attr))
            if num is None:
                low.mark_all(fail)
                high.mark_all(fail)
            else:
                xf, x_ge, x_le = num
                low.mark_low(fail, xf, x_ge)
                high.mark_high(fail, xf, x_le)
        for attr, codes in self._cats.items():
            num = codes.number(get(attr))
            if num is None:
                codes.low.mark_all(fail)
                codes.high.mark_all(fail)
            else:
                code = num[0]
                codes.low.mark_low(fail, code, True)
                codes.high.mark_high(fail, code, True)

    def _collect(self, survivors: npt.NDArray[np.intp], event: Event) -> set[SubId]:
        unit_sub = self._unit_sub
        residual = self._residual
        get = event.get
        us = survivors.tolist()
        if len(us) > 1:  # fast path: no survivor has residuals -> two C-level gathers
            pick = itemgetter(*us)
            if not any(pick(residual)):
                return set(pick(unit_sub))
        out: set[SubId] = set()
        add = out.add
        for u in us:
            rest = residual[u]
            if rest is not None:
                for attr, test in rest:
                    if not test(get(attr)):
                        break
                else:
                    add(unit_sub[u])
            else:
                add(unit_sub[u])
        return out

    def match(self, event: Event) -> set[SubId]:
        if self._dirty:
            self._flush()
        n = self._table.n
        if len(self._fail) < n:
            self._fail = np.zeros(len(self._table.alive), dtype=np.bool_)
        fail = self._fail[:n]
        np.logical_not(self._table.alive[:n], out=fail)
        self._mark(fail, event)
        return self._collect(np.flatnonzero(~fail), event)

    def _check(self) -> None:
        super()._check()
        table = self._table
        n = table.n
        assert len(self._unit_sub) == n == len(self._residual)
        units_of = {sid: [us] if isinstance(us, int) else us for sid, us in self._units_of.items()}
        alive_units = [u for us in units_of.values() for u in us]
        assert len(alive_units) == len(set(alive_units)) == int(table.alive[:n].sum())
        assert not table.alive[0] and bool(table.alive[alive_units].all())
        assert set(self._units_of) == set(self._filters)
        for sid, us in units_of.items():
            assert len(us) == len(self._filters[sid].clauses)
            assert all(self._unit_sub[u] == sid for u in us)
        entries = np.zeros(n, dtype=np.int32)
        for codes in self._cats.values():
            assert set(codes.codes) == set(codes.refs) and all(codes.refs.values())
            assert len(set(codes.codes.values())) == len(codes.codes)
            assert all(0 < c < codes.next_code for c in codes.codes.values())
        held: dict[tuple[str, CatKey], int] = {}
        for f in self._filters.values():
            for clause in f.clauses:
                for p in cat_predicates(clause)[0]:
                    k: tuple[str, CatKey] = (p.attr, (p.kind is _BOOL, p.value))  # type: ignore[assignment]
                    held[k] = held.get(k, 0) + 1
        assert held == {(a, k): r for a, c in self._cats.items() for k, r in c.refs.items()}
        for _attr, low, high, _number in self.columns():
            for lst in (low, high):
                lst._check()
                units = lst.units[: lst.end]
                np.add.at(entries, units[units != 0], 1)
                np.add.at(entries, np.array(lst.buf_u, dtype=np.int64), 1)
                assert not lst.buf_u or lst in self._dirty
        assert (entries == table.pending[:n]).all()
        free = set(table.free)
        assert len(free) == len(table.free) and 0 not in free
        assert not table.alive[list(free)].any() and not entries[list(free)].any()
