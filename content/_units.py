"""Units with numeric interval slots: the store shared by the TAMA and H-Tree baselines.

Seed 004 (section 4) measures HCEM against TAMA and H-Tree.  Both index *range constraints*
``[v_low, v_high]`` per attribute, like REIN (seed 004, Definition 2), and both must answer
exactly like brute force here (docs/reference.md, "content"), so both need the same things around
their index: units, exact verification of candidates and residual predicates.  This module
holds them; :mod:`content.baselines._tama` and :mod:`content.baselines._htree` add their index.

* A *unit* is one DNF conjunction of a filter (a filter matches when any unit does), as in
  :mod:`content._rein`; per unit and attribute the numeric ``= < <= > >=`` predicates are
  intersected into one closed interval by :func:`content._rein.split_clause` (strict bounds
  through ``nextafter``, open sides as -inf / +inf).  Everything else (strings, booleans,
  ``<>``, IN, LIKE, literals float64 cannot hold) is the unit's *residual*, tested with
  :meth:`Predicate.test` on the units that survive.
* Intervals are stored *slot-major*: slot ``j`` of every unit is one row of three arrays
  (attribute id, low, high) over unit ids; empty slots hold attribute 0, a sentinel whose
  event value is 0.0 and whose interval is (-inf, +inf), so they always pass.  Verifying a
  candidate set walks the slots and drops failures as it goes (:meth:`UnitStore.verify`):
  the gathers read each row in unit order, and every slot removes about half of the
  survivors on seed 004's workload.  At most :data:`SLOTS` attributes per unit get a slot;
  the predicates on further attributes become residuals (exact, slower).
* Unit ids are dense and never reused in place: a delete marks the unit dead; when dead
  units outnumber live ones :meth:`UnitStore.compact` renumbers the live units 0..n-1 (in
  order) and the engine rebuilds its index.  Units inserted after the engine's last build
  (ids ``>= built``) are not in its index yet: they are candidates of every event, verified
  exactly, until the engine rebuilds (when they exceed a share of the index).

Exact comparison with event numbers float64 cannot hold (ints beyond 2**53) uses the flags
of :func:`content._rein.event_number`: ``lo <= v`` is ``lo < xf or (lo == xf and v >= xf)``.

Complexity: insert O(k) Python plus amortised O(1) numpy per slot (queued, written in
vectorised chunks); delete O(units of the filter) plus the amortised compaction; verifying
c candidates O(c) numpy work per slot row while survivors remain.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left, bisect_right
from collections.abc import Hashable
from operator import itemgetter

import numpy as np
import numpy.typing as npt

from content._engine import Event, SubId
from content._filter import Filter
from content._predicate import Predicate
from content._rein import event_number, split_clause

__all__ = ["SLOTS", "EventVector", "UnitStore", "equal_cuts", "leaf_of"]

#: numeric attributes per unit that get an interval slot; further ones are residuals
SLOTS = 32
_QUEUE = 1 << 16  # queued slot writes before they are flushed into the arrays
_INF = math.inf

IntArray = npt.NDArray[np.int64]
I32Array = npt.NDArray[np.int32]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def leaf_of(cuts: list[float], xf: float, x_ge: bool) -> int:
    """Number of cuts ``<= v`` for the event number ``v`` given as ``(xf, v >= xf)``.

    ``v < xf`` happens only for ints that float64 rounds up; then a cut equal to ``xf`` lies
    above ``v`` (and no float lies strictly between ``v`` and ``xf``).
    """
    return bisect_right(cuts, xf) if x_ge else bisect_left(cuts, xf)


def equal_cuts(lo: FloatArray, hi: FloatArray, parts: int) -> FloatArray:
    """``parts - 1`` cuts dividing ``[min, max]`` of the finite bounds into equal widths.

    The papers divide a declared value domain ``[U, R]`` evenly (seed 004 section 2; TAMA's
    discretisation levels; H-Tree's cells); nobody declares one here, so the domain is the
    span of the bounds present.  O(len(lo)).
    """
    fl, fh = lo[np.isfinite(lo)], hi[np.isfinite(hi)]
    if len(fl) == 0 and len(fh) == 0:
        return np.zeros(parts - 1)
    u = min(float(fl.min()) if len(fl) else _INF, float(fh.min()) if len(fh) else _INF)
    r = max(float(fl.max()) if len(fl) else -_INF, float(fh.max()) if len(fh) else -_INF)
    cuts: FloatArray = u + (r - u) * (np.arange(1, parts, dtype=np.float64) / parts)
    return np.maximum.accumulate(cuts)  # rounding never makes them decrease


class EventVector:
    """One event as arrays over attribute ids: value (NaN when missing or not a number)."""

    __slots__ = ("exact", "ge", "le", "nums", "x")

    def __init__(self, store: UnitStore, event: Event) -> None:
        ids = store.attr_ids
        x = np.full(len(store.attr_names), np.nan)
        x[0] = 0.0  # the empty-slot sentinel passes
        self.exact = True
        ge: BoolArray | None = None
        le: BoolArray | None = None
        nums: dict[int, tuple[float, bool, bool]] = {}
        for name, v in event.items():
            a = ids.get(name)
            if a is None:
                continue
            num = event_number(v)
            if num is None:
                continue
            xf, x_ge, x_le = num
            x[a] = xf
            nums[a] = num
            if not (x_ge and x_le):
                if ge is None or le is None:
                    ge = np.ones(len(x), dtype=np.bool_)
                    le = np.ones(len(x), dtype=np.bool_)
                ge[a] = x_ge
                le[a] = x_le
                self.exact = False
        self.x = x
        self.ge = ge
        self.le = le
        self.nums = nums  # attr id -> (xf, v >= xf, v <= xf) for the numbers of the event

    def passes(self, a: I32Array, lo: FloatArray, hi: FloatArray) -> BoolArray:
        """``lo <= v_a <= hi`` exactly, elementwise (attribute ids ``a``)."""
        xv = self.x[a]
        if self.exact or self.ge is None or self.le is None:
            ok: BoolArray = (lo <= xv) & (xv <= hi)
            return ok
        ge, le = self.ge[a], self.le[a]
        exact: BoolArray = ((lo < xv) | ((lo == xv) & ge)) & ((xv < hi) | ((xv == hi) & le))
        return exact


class UnitStore:
    """Units (dense ids), their interval slots, residuals, liveness and owners.

    ``n`` ids have been handed out since the last compaction; ``alive[:n]`` says which are
    live.  ``nslot[u]`` is the number of slots unit ``u`` uses; slot rows ``s_attr``,
    ``s_lo``, ``s_hi`` are ``rows x capacity`` arrays (rows grow on demand up to SLOTS).
    """

    def __init__(self) -> None:
        self.attr_ids: dict[str, int] = {}
        self.attr_names: list[str | None] = [None]  # id 0: the empty-slot sentinel
        self.n = 0
        self.dead = 0
        self.cap = 64
        self.rows = 0
        self.alive: BoolArray = np.zeros(self.cap, dtype=np.bool_)
        self.nslot: npt.NDArray[np.uint8] = np.zeros(self.cap, dtype=np.uint8)
        self.s_attr: I32Array = np.zeros((0, self.cap), dtype=np.int32)
        self.s_lo: FloatArray = np.full((0, self.cap), -_INF)
        self.s_hi: FloatArray = np.full((0, self.cap), _INF)
        self.sub: list[Hashable] = []
        self.residual: list[tuple[Predicate, ...] | None] = []
        self.units_of: dict[SubId, int | list[int]] = {}  # one int for a one-clause filter
        self._q_unit: list[int] = []
        self._q_slot: list[int] = []
        self._q_attr: list[int] = []
        self._q_lo: list[float] = []
        self._q_hi: list[float] = []

    # -- updates ------------------------------------------------------------------

    def _attr(self, name: str) -> int:
        a = self.attr_ids.get(name)
        if a is None:
            a = self.attr_ids[name] = len(self.attr_names)
            self.attr_names.append(name)
        return a

    def _grow(self, need_units: int, need_rows: int) -> None:
        cap = self.cap
        while cap < need_units:
            cap *= 2
        rows = max(self.rows, need_rows)
        if cap == self.cap and rows == self.rows:
            return
        self.flush()
        alive = np.zeros(cap, dtype=np.bool_)
        alive[: self.cap] = self.alive
        nslot = np.zeros(cap, dtype=np.uint8)
        nslot[: self.cap] = self.nslot
        s_attr = np.zeros((rows, cap), dtype=np.int32)
        s_lo = np.full((rows, cap), -_INF)
        s_hi = np.full((rows, cap), _INF)
        s_attr[: self.rows, : self.cap] = self.s_attr
        s_lo[: self.rows, : self.cap] = self.s_lo
        s_hi[: self.rows, : self.cap] = self.s_hi
        self.alive, self.nslot, self.s_attr, self.s_lo, self.s_hi = alive, nslot, s_attr, s_lo, s_hi
        self.cap, self.rows = cap, rows

    def add(self, sub_id: SubId, f: Filter) -> list[int]:
        """Allocate one unit per conjunction of ``f``; returns the new unit ids."""
        units: list[int] = []
        for clause in f.clauses:
            bounds, residual = split_clause(clause)
            if len(bounds) > SLOTS:  # the rest are verified as residual predicates
                extra = set(sorted(bounds)[SLOTS:])
                residual = residual + tuple(p for p in clause if p.attr in extra)
                bounds = {a: b for a, b in bounds.items() if a not in extra}
            u = self.n
            if u >= self.cap or len(bounds) > self.rows:
                self._grow(u + 1, len(bounds))
            self.n = u + 1
            self.alive[u] = True
            self.nslot[u] = len(bounds)
            self.sub.append(sub_id)
            self.residual.append(residual or None)
            q_unit, q_slot, q_attr, q_lo, q_hi = (
                self._q_unit,
                self._q_slot,
                self._q_attr,
                self._q_lo,
                self._q_hi,
            )
            for j, (attr, (lo, hi)) in enumerate(bounds.items()):
                q_unit.append(u)
                q_slot.append(j)
                q_attr.append(self._attr(attr))
                q_lo.append(-_INF if lo is None else lo)
                q_hi.append(_INF if hi is None else hi)
            if len(q_unit) >= _QUEUE:
                self.flush()
            units.append(u)
        self.units_of[sub_id] = units[0] if len(units) == 1 else units
        return units

    def remove(self, sub_id: SubId) -> list[int]:
        """Mark the units of ``sub_id`` dead; returns them."""
        stored = self.units_of.pop(sub_id)
        units = [stored] if isinstance(stored, int) else stored
        for u in units:
            self.alive[u] = False
            self.sub[u] = None
            self.residual[u] = None
        self.dead += len(units)
        return units

    def flush(self) -> None:
        """Write the queued slot entries into the slot rows (one vectorised step)."""
        if not self._q_unit:
            return
        units = np.array(self._q_unit, dtype=np.int64)
        slots = np.array(self._q_slot, dtype=np.int64)
        self.s_attr[slots, units] = np.array(self._q_attr, dtype=np.int32)
        self.s_lo[slots, units] = np.array(self._q_lo, dtype=np.float64)
        self.s_hi[slots, units] = np.array(self._q_hi, dtype=np.float64)
        self._q_unit, self._q_slot, self._q_attr, self._q_lo, self._q_hi = [], [], [], [], []

    def wants_compaction(self) -> bool:
        live = self.n - self.dead
        return self.dead > max(64, live)

    def compact(self) -> None:
        """Renumber the live units ``0..live-1`` in their order; drops the dead ones.  O(n)."""
        self.flush()
        n = self.n
        keep = np.flatnonzero(self.alive[:n])
        live = len(keep)
        remap = np.full(n, -1, dtype=np.int64)
        remap[keep] = np.arange(live)
        cap = max(64, self.cap)
        while cap // 4 >= max(64, live) and cap > 64:
            cap //= 2
        alive = np.zeros(cap, dtype=np.bool_)
        alive[:live] = True
        nslot = np.zeros(cap, dtype=np.uint8)
        nslot[:live] = self.nslot[keep]
        s_attr = np.zeros((self.rows, cap), dtype=np.int32)
        s_lo = np.full((self.rows, cap), -_INF)
        s_hi = np.full((self.rows, cap), _INF)
        s_attr[:, :live] = self.s_attr[:, keep]
        s_lo[:, :live] = self.s_lo[:, keep]
        s_hi[:, :live] = self.s_hi[:, keep]
        self.alive, self.nslot, self.s_attr, self.s_lo, self.s_hi = alive, nslot, s_attr, s_lo, s_hi
        self.cap = cap
        kl = keep.tolist()
        self.sub = [self.sub[u] for u in kl]
        self.residual = [self.residual[u] for u in kl]
        rl = remap.tolist()
        self.units_of = {
            sid: rl[us] if isinstance(us, int) else [rl[u] for u in us] for sid, us in self.units_of.items()
        }
        self.n = live
        self.dead = 0

    # -- reading --------------------------------------------------------------------

    def intervals(self, lo_unit: int = 0) -> dict[int, tuple[IntArray, FloatArray, FloatArray]]:
        """Per attribute id, ``(units, low, high)`` of the live units ``>= lo_unit``, by unit.

        O(rows x n) to scan the slots plus a stable sort of the entries by attribute.
        """
        self.flush()
        n = self.n
        units_l: list[IntArray] = []
        attrs_l: list[I32Array] = []
        lo_l: list[FloatArray] = []
        hi_l: list[FloatArray] = []
        alive = self.alive[lo_unit:n]
        for j in range(self.rows):
            a = self.s_attr[j, lo_unit:n]
            sel = np.flatnonzero((a != 0) & alive)
            if len(sel) == 0:
                continue
            units_l.append(sel + lo_unit)
            attrs_l.append(a[sel])
            lo_l.append(self.s_lo[j, lo_unit:n][sel])
            hi_l.append(self.s_hi[j, lo_unit:n][sel])
        if not units_l:
            return {}
        units = np.concatenate(units_l)
        attrs = np.concatenate(attrs_l)
        lo = np.concatenate(lo_l)
        hi = np.concatenate(hi_l)
        # stable radix sort by attribute id (ids fit 16 bits in practice)
        key = attrs.astype(np.uint16) if len(self.attr_names) <= 0xFFFF else attrs
        order = np.argsort(key, kind="stable")
        attrs = attrs[order]
        cuts = np.flatnonzero(np.diff(attrs)) + 1
        bounds = [0, *cuts.tolist(), len(attrs)]
        out: dict[int, tuple[IntArray, FloatArray, FloatArray]] = {}
        for s, e in itertools.pairwise(bounds):
            sel = order[s:e]
            sel = sel[np.argsort(units[sel], kind="stable")]  # by unit: runs, one per slot
            out[int(attrs[s])] = (units[sel], lo[sel], hi[sel])
        return out

    def event(self, event: Event) -> EventVector:
        return EventVector(self, event)

    def verify(self, cand: IntArray, ev: EventVector) -> IntArray:
        """The candidates (sorted unit ids) whose every interval contains its event value.

        Slot by slot, dropping failures: O(|cand|) per row while survivors remain.
        """
        if self._q_unit:
            self.flush()
        s_attr, s_lo, s_hi = self.s_attr, self.s_lo, self.s_hi
        c = cand
        for j in range(self.rows):
            if len(c) == 0:
                break
            ok = ev.passes(s_attr[j][c], s_lo[j][c], s_hi[j][c])
            c = c[ok]
        return c

    def collect(self, units: IntArray, event: Event) -> set[SubId]:
        """Owners of the ``units`` whose residual predicates hold for ``event``."""
        sub = self.sub
        residual = self.residual
        us = units.tolist()
        if len(us) > 1:  # fast path: no residuals among them -> two C-level gathers
            pick = itemgetter(*us)
            if not any(pick(residual)):
                return set(pick(sub))
        get = event.get
        out: set[SubId] = set()
        for u in us:
            rest = residual[u]
            if rest is None or all(p.test(get(p.attr)) for p in rest):
                out.add(sub[u])
        return out

    def _check(self, filters: dict[SubId, Filter]) -> None:
        """Units, owners, slots and residuals agree with the filters."""
        self.flush()
        n = self.n
        assert len(self.sub) == len(self.residual) == n <= self.cap
        assert set(self.units_of) == set(filters)
        owned: list[int] = []
        for sid, us in self.units_of.items():
            ul = [us] if isinstance(us, int) else us
            f = filters[sid]
            assert len(ul) == len(f.clauses)
            owned.extend(ul)
            for u, clause in zip(ul, f.clauses, strict=True):
                assert self.alive[u] and self.sub[u] == sid
                bounds, residual = split_clause(clause)
                k = int(self.nslot[u])
                assert k == min(len(bounds), SLOTS)
                got = {
                    self.attr_names[int(self.s_attr[j, u])]: (float(self.s_lo[j, u]), float(self.s_hi[j, u]))
                    for j in range(k)
                }
                assert len(got) == k and all(self.s_attr[j, u] == 0 for j in range(k, self.rows))
                for attr, (lo, hi) in got.items():
                    assert attr is not None
                    want = bounds[attr]
                    assert (lo, hi) == (
                        -_INF if want[0] is None else want[0],
                        _INF if want[1] is None else want[1],
                    )
                assert set(residual) <= set(self.residual[u] or ())
        assert len(owned) == len(set(owned)) == int(self.alive[:n].sum()) == n - self.dead
        assert not self.alive[n:].any()
