"""TAMA: table-based matching by counting over levels of cells (seed 004's baseline [12]).

Zhao & Wu, "Towards approximate event processing in a large-scale content-based network"
(ICDCS 2011): per attribute, TAMA keeps a *hierarchical index table* whose levels cut the
attribute's value domain into ever finer cells -- level 1 is the whole domain, level ``l``
has ``2**(l-1)`` equal cells, down to the discretisation level gamma (seed 004 uses
gamma = 13, i.e. 4,096 cells at the bottom).  A subscription's range ``[lo, hi]`` on the
attribute is inserted into the fewest cells that together cover it, coarsest first (the
canonical cover of a segment tree: at most two cells per level); at level gamma a cell the
range only partly covers is taken whole.  Matching is *counting*: the event value falls
into exactly one cell per level; every subscription stored in those gamma cells has that
constraint satisfied, so its counter goes up; a subscription whose counter reaches its
number of constraints matches.  Because the bottom cells are taken whole, the original
TAMA is approximate (false positives near range ends).

Deviations (docs/content.md, "TAMA"), all for exact answers and for a value domain nobody
declares:

* **Exact bottom cells.**  A range end that cuts a bottom cell is stored there as a
  *partial* entry with its bounds; it is counted only when the event value really lies in
  the range (two comparisons).  Cells wholly covered are counted without comparison, as in
  the paper, so the answer is exact and the counting work is the paper's.
* **Domain from the data.**  The 2**(gamma-1) bottom cells have equal widths, as in the
  paper, over the span ``[min, max]`` of the attribute's range bounds (nobody declares a
  domain), recomputed whenever the index is rebuilt; the first and last cells are
  open-ended, so the cells cover the whole real line.
* **The rest of the language.**  Units are DNF conjunctions, so OR is exact; predicates
  that are not numeric ranges (and ranges beyond :data:`content._units.SLOTS` per unit) are
  residuals verified on the counted units; a missing attribute or a non-number is never
  counted, so its constraint stays false.
* **Updates.**  The table is rebuilt from the units' intervals (vectorised) when the units
  added since the last build exceed a sixteenth of it; until then those units are
  verified directly on every event.  Deletes are tombstones (their counters can never reach
  the unreachable need 255); compaction renumbers units when the dead outnumber the live.

Complexity, n units with k ranges, gamma levels: build O(n k gamma) numpy work; insert O(k)
Python plus the amortised share of the rebuild; per event O(gamma) cells per attribute, one
counter increment per satisfied (unit, constraint) pair -- the paper's cost -- plus an O(n)
scan of the counters, the residuals of the matches and the direct check of new units.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import numpy.typing as npt

from content._engine import Engine, Event, SubId
from content._filter import Filter
from content._units import EventVector, FloatArray, IntArray, UnitStore, equal_cuts, leaf_of

__all__ = ["TAMA"]

_UNREACHABLE = 255  # the need of a unit outside the table (dead, or added since the build)
_REBUILD_MIN = 8  # new units tolerated before a rebuild, at least (default)
_REBUILD_SHARE = 16  # ... and at most 1/16 of the built units
U8Array = npt.NDArray[np.uint8]


class _Table:
    """One attribute's hierarchical table: full cells (CSR over heap node ids) + partial leaves.

    Node ``1`` is the root (level 1); node ``i`` has children ``2i`` and ``2i + 1``; the
    bottom level's cells are nodes ``L .. 2L - 1`` for ``L = 2**(gamma-1)`` leaves.  Leaf
    ``j`` holds the values ``cuts[j-1] <= v < cuts[j]`` (open at both ends of the line).
    """

    __slots__ = (
        "cuts",
        "full_start",
        "full_units",
        "leaves",
        "part_hi",
        "part_lo",
        "part_start",
        "part_units",
    )

    def __init__(self, leaves: int, units: IntArray, lo: FloatArray, hi: FloatArray) -> None:
        self.leaves = leaves
        cuts = equal_cuts(lo, hi, leaves)
        self.cuts: list[float] = cuts.tolist()
        valid = lo <= hi
        units, lo, hi = units[valid], lo[valid], hi[valid]
        # the leaves holding each end, and the run of leaves the range covers wholly
        ll = np.searchsorted(cuts, lo, side="right")
        lh = np.searchsorted(cuts, hi, side="right")
        fa = np.where(lo == -np.inf, 0, np.searchsorted(cuts, lo, side="left") + 1)
        fb = np.where(hi == np.inf, leaves - 1, lh - 1)
        left = ll < fa
        right = (lh > fb) & ((lh != ll) | ~left)
        p_leaf = np.concatenate([ll[left], lh[right]])
        order = np.argsort(p_leaf.astype(np.uint16) if leaves <= 0xFFFF else p_leaf, kind="stable")
        self.part_units: IntArray = np.concatenate([units[left], units[right]])[order]
        self.part_lo: FloatArray = np.concatenate([lo[left], lo[right]])[order]
        self.part_hi: FloatArray = np.concatenate([hi[left], hi[right]])[order]
        p_start = np.zeros(leaves + 1, dtype=np.int64)
        np.cumsum(np.bincount(p_leaf, minlength=leaves), out=p_start[1:])
        self.part_start: list[int] = p_start.tolist()
        # canonical cover of [fa, fb], bottom-up: at most two cells per level
        has = fa <= fb
        lft = fa[has] + leaves
        rgt = fb[has] + leaves + 1
        who = units[has]
        nodes_l: list[npt.NDArray[np.integer]] = []
        units_l: list[IntArray] = []
        while len(who):
            take = (lft & 1).astype(np.bool_)
            nodes_l.append(lft[take])
            units_l.append(who[take])
            lft = lft + take
            take = (rgt & 1).astype(np.bool_)
            rgt = rgt - take
            nodes_l.append(rgt[take])
            units_l.append(who[take])
            lft >>= 1
            rgt >>= 1
            more = lft < rgt
            lft, rgt, who = lft[more], rgt[more], who[more]
        nodes = np.concatenate(nodes_l) if nodes_l else np.empty(0, dtype=np.int64)
        key = nodes.astype(np.uint16) if 2 * leaves <= 0xFFFF else nodes
        order = np.argsort(key, kind="stable")
        self.full_units: IntArray = np.concatenate(units_l)[order] if units_l else np.empty(0, dtype=np.int64)
        f_start = np.zeros(2 * leaves + 1, dtype=np.int64)
        np.cumsum(np.bincount(nodes, minlength=2 * leaves), out=f_start[1:])
        self.full_start: list[int] = f_start.tolist()

    def count(self, cnt: U8Array, xf: float, x_ge: bool, x_le: bool) -> None:
        """Add 1 to the counter of every unit whose range holds the event value."""
        leaf = leaf_of(self.cuts, xf, x_ge)
        start = self.full_start
        units = self.full_units
        node = leaf + self.leaves
        while node:
            s, e = start[node], start[node + 1]
            if s != e:
                cnt[units[s:e]] += 1
            node >>= 1
        s, e = self.part_start[leaf], self.part_start[leaf + 1]
        if s != e:
            lo, hi = self.part_lo[s:e], self.part_hi[s:e]
            if x_ge and x_le:
                ok = (lo <= xf) & (xf <= hi)
            else:
                ok = ((lo < xf) | ((lo == xf) & x_ge)) & ((xf < hi) | ((xf == hi) & x_le))
            cnt[self.part_units[s:e][ok]] += 1

    def entries(self) -> int:
        return len(self.full_units) + len(self.part_units)

    def nbytes(self) -> int:
        return (
            self.full_units.nbytes
            + self.part_units.nbytes
            + self.part_lo.nbytes
            + self.part_hi.nbytes
            + 8 * (len(self.full_start) + len(self.part_start) + len(self.cuts))
        )


class TAMA(Engine):
    """Seed 004's TAMA baseline, exact: counting over gamma levels of cells per attribute.

    ``levels`` is the discretisation level gamma (seed 004: 13).
    """

    name: ClassVar[str] = "tama"

    def __init__(self, levels: int = 13, rebuild_min: int | None = None) -> None:
        super().__init__()
        if not 1 <= levels <= 24:
            raise ValueError("levels must be in 1..24")
        self._levels = levels
        self._store = UnitStore()
        self._tables: dict[int, _Table] = {}
        self._need: U8Array = np.zeros(0, dtype=np.uint8)
        self._cnt: U8Array = np.zeros(0, dtype=np.uint8)
        self._built = 0  # units [0, built) are in the tables
        self._rebuild_min = _REBUILD_MIN if rebuild_min is None else rebuild_min

    # -- updates --------------------------------------------------------------------

    def _insert(self, sub_id: SubId, f: Filter) -> None:
        self._store.add(sub_id, f)

    def _delete(self, sub_id: SubId, f: Filter) -> None:
        store = self._store
        for u in store.remove(sub_id):
            if u < self._built:
                self._need[u] = _UNREACHABLE
        if store.wants_compaction():
            store.compact()
            self._build()

    def _build(self) -> None:
        """(Re)build every attribute's table from the live units' intervals."""
        store = self._store
        store.flush()
        n = store.n
        leaves = 1 << (self._levels - 1)
        self._tables = {a: _Table(leaves, *iv) for a, iv in store.intervals().items()}
        need = np.full(n, _UNREACHABLE, dtype=np.uint8)
        live = store.alive[:n]
        need[live] = store.nslot[:n][live]
        self._need = need
        self._cnt = np.zeros(n, dtype=np.uint8)
        self._built = n

    def _maintain(self) -> None:
        store = self._store
        if store.n - self._built > max(self._rebuild_min, self._built // _REBUILD_SHARE):
            self._build()

    # -- matching -------------------------------------------------------------------

    def match(self, event: Event) -> set[SubId]:
        self._maintain()
        store = self._store
        ev = EventVector(store, event)
        parts: list[IntArray] = []
        built = self._built
        if built:
            cnt = self._cnt
            cnt.fill(0)
            tables = self._tables
            for a, (xf, x_ge, x_le) in ev.nums.items():
                table = tables.get(a)
                if table is not None:
                    table.count(cnt, xf, x_ge, x_le)
            parts.append(np.flatnonzero(cnt == self._need))
        if store.n > built:
            fresh = np.flatnonzero(store.alive[built : store.n]) + built
            parts.append(store.verify(fresh, ev))
        if not parts:
            return set()
        units = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return store.collect(units, event)

    # -- introspection --------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Entries and numpy bytes of the tables (benchmarks)."""
        entries = sum(t.entries() for t in self._tables.values())
        nbytes = sum(t.nbytes() for t in self._tables.values()) + self._need.nbytes + self._cnt.nbytes
        s = self._store
        nbytes += s.alive.nbytes + s.nslot.nbytes + s.s_attr.nbytes + s.s_lo.nbytes + s.s_hi.nbytes
        return {"entries": entries, "bytes": nbytes, "built": self._built, "units": s.n}

    def _check(self) -> None:
        super()._check()
        store = self._store
        store._check(self._filters)
        built = self._built
        assert built <= store.n and len(self._need) == built == len(self._cnt)
        live = store.alive[:built]
        assert (self._need[~live] == _UNREACHABLE).all()
        assert (self._need[live] == store.nslot[:built][live]).all()
        leaves = 1 << (self._levels - 1)
        intervals = store.intervals()
        for a, table in self._tables.items():
            assert table.leaves == leaves and len(table.cuts) == leaves - 1
            # element-wise ``x <= y`` of neighbours in numpy: these and the loops below ran
            # over every node and leaf in Python (8,191 nodes at gamma 13, per attribute, after
            # every step of a model test) and were most of its time
            cuts_a = np.asarray(table.cuts, dtype=np.float64)
            assert bool((cuts_a[:-1] <= cuts_a[1:]).all())
            fs, ps = table.full_start, table.part_start
            assert len(fs) == 2 * leaves + 1 and len(ps) == leaves + 1
            fs_a, ps_a = np.asarray(fs, dtype=np.int64), np.asarray(ps, dtype=np.int64)
            assert fs[0] == 0 and fs[-1] == len(table.full_units) and bool((fs_a[:-1] <= fs_a[1:]).all())
            assert ps[0] == 0 and ps[-1] == len(table.part_units) and bool((ps_a[:-1] <= ps_a[1:]).all())
            assert fs[1] - fs[0] == 0, "node 0 does not exist"
            # every built live unit's range is covered exactly once per leaf it touches
            cuts = table.cuts

            def holds(j: int, cuts: list[float] = cuts) -> bool:
                return j in (0, leaves - 1) or cuts[j - 1] < cuts[j]

            # only the nodes and leaves that hold entries: a Python loop over all 2 * leaves
            # nodes (8,191 at gamma 13) per attribute made this check most of a model test's time
            cover: dict[int, list[int]] = {}
            for node in (np.flatnonzero(fs_a[2 : 2 * leaves + 1] != fs_a[1 : 2 * leaves]) + 1).tolist():
                depth = node.bit_length() - 1
                span = leaves >> depth
                first = (node - (1 << depth)) * span
                for u in table.full_units[fs[node] : fs[node + 1]].tolist():
                    cover.setdefault(u, []).extend(range(first, first + span))
            for leaf in np.flatnonzero(ps_a[1 : leaves + 1] != ps_a[:leaves]).tolist():
                for u in table.part_units[ps[leaf] : ps[leaf + 1]].tolist():
                    cover.setdefault(u, []).append(leaf)
            units, lo, hi = intervals.get(a, (np.empty(0, dtype=np.int64), np.empty(0), np.empty(0)))
            for u, x, y in zip(units.tolist(), lo.tolist(), hi.tolist(), strict=True):
                if u >= built:
                    continue
                got = sorted(cover.pop(u, []))
                assert len(got) == len(set(got)), "cells of one range are disjoint"
                if x <= y:  # leaves between equal cuts hold no value and may be covered
                    first_leaf = leaf_of(table.cuts, x, True)
                    last_leaf = leaf_of(table.cuts, y, True)
                    want = list(range(first_leaf, last_leaf + 1))
                    assert [j for j in got if holds(j)] == [j for j in want if holds(j)], (u, got)
                else:
                    assert got == []
            assert all(not store.alive[u] for u in cover), "only dead units' entries are left over"
