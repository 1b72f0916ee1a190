"""Vectorised match-boundary test for HEMA's Mlist (seed 003, section 3.4, steps 3 to 5).

In the paper a candidate in ``Sa`` walks its linked nodes and survives while every node lies
inside the match boundary.  For a unit whose predicates are all numeric order comparisons or
numeric equalities, "every node inside the boundary" is a box test: per attribute the unit
allows a closed interval ``[lo, hi]`` (strict bounds are turned into closed ones with
``nextafter``; several predicates on one attribute intersect), and the event's value must lie
inside the interval of every attribute the unit constrains.  :class:`BoundaryBoxes` keeps
those intervals as rows of two float64 matrices so that all candidates of one event are
tested by a few numpy operations instead of one Python step per node.

With ``box_of(clause, booleans=True)`` (HEMA) an equality on a boolean is a box side too:
``alarm = FALSE`` is the interval ``[0, 0]`` of a column of its own (keyed ``(attr,)``, apart
from the attribute's numeric column), where an event's ``True`` / ``False`` is 1 / 0 and any
other value fails it (``need``).

Exactness: a unit is stored only if every literal converts to float64 exactly (no NaN, ints
within 2**53); an event value is used only if it is a number (never a bool) that converts
exactly, otherwise :meth:`event_vector` reports the event as not vectorisable and HEMA walks
the links instead.  A missing or non-numeric attribute makes every unit constraining it
fail (the ``need`` mask) and leaves the others alone.

Cost: ``add``/``remove`` O(A) (a free slot; the matrices double when full or when a new
attribute appears, amortised O(A)); ``test`` O(c A) numpy work for ``c`` candidates over ``A``
attribute columns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, overload

import numpy as np

from content._engine import SubId
from content._predicate import Kind, Op, Predicate

__all__ = ["BoundaryBoxes", "box_of", "int64_id"]

_EXACT = 2**53
Column = str | tuple[str]  # an attribute's numbers, or (attribute,): its booleans
NumBox = dict[str, tuple[float, float]]
Box = dict[Column, tuple[float, float]]


def _exact_float(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    if isinstance(v, int):
        return float(v) if -_EXACT <= v <= _EXACT else None
    return None if v != v else float(v)  # noqa: PLR0124 (NaN)


def int64_id(sid: object) -> int | None:
    """``sid`` if it is a plain int (not a bool) within int64, else None."""
    if type(sid) is int and -(2**63) <= sid < 2**63:
        return sid
    return None


@overload
def box_of(clause: tuple[Predicate, ...], *, booleans: Literal[False] = False) -> NumBox | None: ...
@overload
def box_of(clause: tuple[Predicate, ...], *, booleans: bool) -> Box | None: ...
def box_of(clause: tuple[Predicate, ...], *, booleans: bool = False) -> Box | NumBox | None:
    """The closed interval per attribute of a numeric conjunction, or None if not boxable
    (``booleans``: equalities on booleans are boxable too, in columns of their own)."""
    box: Box = {}
    for p in clause:
        if booleans and p.kind is Kind.BOOL and p.op is Op.EQ:
            b = 1.0 if p.value else 0.0
            lo, hi = box.get((p.attr,), (-math.inf, math.inf))
            box[(p.attr,)] = (max(lo, b), min(hi, b))
            continue
        if p.kind is not Kind.NUM or p.op not in (Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ):
            return None
        v = _exact_float(p.value)
        if v is None:
            return None
        lo, hi = box.get(p.attr, (-math.inf, math.inf))
        match p.op:
            case Op.LT:
                hi = min(hi, math.nextafter(v, -math.inf))
            case Op.LE:
                hi = min(hi, v)
            case Op.GT:
                lo = max(lo, math.nextafter(v, math.inf))
            case Op.GE:
                lo = max(lo, v)
            case _:
                lo, hi = max(lo, v), min(hi, v)
        box[p.attr] = (lo, hi)
    return box


class BoundaryBoxes:
    """Slots of per-attribute closed intervals; see the module docstring."""

    def __init__(self) -> None:
        self.columns: dict[Column, int] = {}
        self._cap = 0
        self.lo: np.ndarray[Any, np.dtype[np.float64]] = np.empty((0, 0))
        self.hi: np.ndarray[Any, np.dtype[np.float64]] = np.empty((0, 0))
        self.need: np.ndarray[Any, np.dtype[np.bool_]] = np.empty((0, 0), dtype=bool)
        self.sids: list[SubId | None] = []
        # the ids again as int64 while every stored id is a plain int (n_obj: the others)
        self.ids: np.ndarray[Any, np.dtype[np.int64]] = np.zeros(0, dtype=np.int64)
        self.n_obj = 0
        self._free: list[int] = []
        self.boxes: dict[int, Box | NumBox] = {}

    def __len__(self) -> int:
        return len(self.boxes)

    def _grow(self, rows: int, cols: int) -> None:
        lo = np.full((rows, cols), -np.inf)
        hi = np.full((rows, cols), np.inf)
        need = np.zeros((rows, cols), dtype=bool)
        r, c = self.lo.shape
        lo[:r, :c] = self.lo
        hi[:r, :c] = self.hi
        need[:r, :c] = self.need
        self.lo, self.hi, self.need = lo, hi, need
        ids = np.zeros(rows, dtype=np.int64)
        ids[:r] = self.ids
        self.ids = ids
        self._free.extend(range(rows - 1, r - 1, -1))
        self.sids.extend([None] * (rows - r))
        self._cap = rows

    def add(self, sid: SubId, box: Box | NumBox) -> int:
        """Store ``box`` for subscription ``sid``; returns its slot."""
        new_cols = [a for a in box if a not in self.columns]
        for a in new_cols:
            self.columns[a] = len(self.columns)
        need_rows = not self._free
        need_cols = len(self.columns) > self.lo.shape[1]
        if need_rows or need_cols:
            rows = max(16, 2 * self._cap) if need_rows else self._cap
            cols = max(len(self.columns), 2 * self.lo.shape[1]) if need_cols else self.lo.shape[1]
            self._grow(rows, cols)
        slot = self._free.pop()
        for a, (lo, hi) in box.items():
            c = self.columns[a]
            self.lo[slot, c] = lo
            self.hi[slot, c] = hi
            self.need[slot, c] = True
        self.sids[slot] = sid
        as_int = int64_id(sid)
        if as_int is None:
            self.n_obj += 1
        else:
            self.ids[slot] = as_int
        self.boxes[slot] = box
        return slot

    def remove(self, slot: int) -> None:
        box = self.boxes.pop(slot)
        for a in box:
            c = self.columns[a]
            self.lo[slot, c] = -np.inf
            self.hi[slot, c] = np.inf
            self.need[slot, c] = False
        if int64_id(self.sids[slot]) is None:
            self.n_obj -= 1
        self.sids[slot] = None
        self._free.append(slot)

    def event_vector(
        self, event: Mapping[str, object]
    ) -> tuple[np.ndarray[Any, np.dtype[np.float64]], list[int]] | None:
        """(values per column, columns the event cannot satisfy) or None (not vectorisable)."""
        width = self.lo.shape[1]
        vec = np.zeros(width)
        bad: list[int] = []
        get = event.get
        for a, c in self.columns.items():
            if type(a) is tuple:  # a boolean column
                v = get(a[0])
                if v is True:
                    vec[c] = 1.0
                elif v is not False:
                    bad.append(c)
                continue
            v = get(a)  # type: ignore[arg-type]
            t = type(v)
            if t is float:
                if v != v:  # noqa: PLR0124 (NaN satisfies no comparison)
                    bad.append(c)
                    continue
                vec[c] = v
            elif t is int or (v is not None and t is not bool and isinstance(v, int | float)):
                x = _exact_float(v)
                if x is None:
                    if isinstance(v, float):  # a float subclass holding NaN
                        bad.append(c)
                        continue
                    return None  # a huge int: compare exactly in Python instead
                vec[c] = x
            else:
                bad.append(c)
        return vec, bad

    def test(
        self,
        slots: np.ndarray[Any, np.dtype[np.intp]],
        vec: np.ndarray[Any, np.dtype[np.float64]],
        bad: list[int],
        out: set[SubId],
        int_parts: list[np.ndarray[Any, np.dtype[np.int64]]],
    ) -> None:
        """Add the ids of the candidate slots whose box contains the event: to ``out``, or
        as an int64 array to ``int_parts`` while every stored id is a plain int."""
        ok = ((self.lo[slots] <= vec) & (self.hi[slots] >= vec)).all(axis=1)
        if bad:
            ok &= ~self.need[slots][:, bad].any(axis=1)
        hit = slots[ok]
        if not self.n_obj:
            int_parts.append(self.ids[hit])
            return
        sids = self.sids
        out.update([sids[s] for s in hit.tolist()])

    def _check(self) -> None:
        assert len(self.boxes) + len(self._free) == self._cap == len(self.sids)
        assert len(set(self._free)) == len(self._free)
        assert not set(self._free) & set(self.boxes)
        assert self.lo.shape == self.hi.shape == self.need.shape
        assert self.lo.shape[0] == self._cap and self.lo.shape[1] >= len(self.columns)
        for slot, box in self.boxes.items():
            assert self.sids[slot] is not None
            assert int(self.need[slot].sum()) == len(box)
            for a, (lo, hi) in box.items():
                c = self.columns[a]
                assert self.lo[slot, c] == lo and self.hi[slot, c] == hi and self.need[slot, c]
        assert len(self.ids) == self._cap
        assert self.n_obj == sum(1 for sid in self.sids if sid is not None and int64_id(sid) is None)
        for slot, sid in enumerate(self.sids):
            if sid is not None and int64_id(sid) is not None:
                assert self.ids[slot] == sid
        for slot in self._free:
            assert self.sids[slot] is None and not self.need[slot].any()
