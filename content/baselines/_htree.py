"""H-Tree: a hash tree over overlapping cells of indexed attributes (seed 004's baseline [10]).

Qian, Cao, Zhu, Li, Wang, "H-Tree: an efficient index structure for event matching in
content-based publish/subscribe systems" (IEEE TPDS 26(6), 2015).  H-Tree chains one *hash
list* per indexed attribute into a tree: level ``l`` of the tree hashes on the ``l``-th
indexed attribute, whose value domain is divided into overlapping *cells*; a subscription
sits in the leaf *bucket* reached by its cells on every level, and an event visits only the
buckets whose cells can hold its values, then checks the subscriptions found there.  Seed
004 runs it with tau = delta = 6 (cells per attribute = indexed attributes = 6).

The division follows the authors' own implementation (the ``Htree`` of their public C++
matching-algorithm suite, which seed 004's group used): the domain is cut into tau segments;
*value cells* ``0 .. tau-2`` are pairs of neighbouring segments (cell ``i`` = segments ``i``
and ``i+1``, so neighbouring cells overlap by one segment) and cell ``tau-1`` holds what no
value cell bounds: subscriptions without a constraint on the attribute.  A range whose low
and high ends lie in segments ``sl <= sh`` is stored in cell ``min(sl, tau-2)`` when
``sh - sl <= 1`` (it fits in one cell: the overlapping division's point), otherwise it is
replicated into cells ``sl .. sh-1``; the bucket of a subscription is the product of its
cells over the levels, so wide ranges multiply its copies.  An event value in segment ``s``
visits cells ``s-1`` and ``s`` (those that exist) and cell ``tau-1`` on every level, i.e. at
most ``3**delta`` buckets (729).

Deviations (docs/content.md, "H-Tree"), for exact answers over the whole language:

* **Exact verification.**  The candidates of the visited buckets are verified exactly
  (interval slots, :meth:`content._units.UnitStore.verify`), then their residual
  predicates; duplicates (a replicated unit found in two visited cells) are removed first.
* **Bounded replication.**  A range spanning every value cell goes to cell ``tau-1``
  (same buckets visited, one copy instead of tau-1); a unit whose copies would exceed
  ``max_copies`` (default ``3**delta``, never reached at seed 004's width 0.5) has its
  widest levels moved to cell ``tau-1`` until it fits.  The paper's structure runs out of
  memory at widths >= 0.8 (seed 004, Fig. 8); this one stays bounded.
* **Indexed attributes and domain from the data.**  The delta attributes constrained by
  most units are indexed (ties: first seen); each one's tau segments have equal widths,
  as in the paper, over the span ``[min, max]`` of its range bounds (nobody declares a
  domain), recomputed at rebuilds; the first and last segments are open-ended.
* **Updates.**  As in :mod:`content.baselines._tama`: the tree is rebuilt (vectorised) when units
  added since the last build exceed a sixteenth of it; those units are candidates of every
  event until then; deletes are tombstones, compacted when the dead outnumber the live.

Complexity (n units, delta levels, c copies per unit on average): build O(n c) numpy work
(a radix sort of the bucket keys); per event O(3**delta) bucket slices, O(candidates)
to concatenate and deduplicate, and verification O(candidates) per interval slot while
candidates survive; memory O(n c) bucket entries.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import numpy.typing as npt

from content._engine import Engine, Event, SubId
from content._filter import Filter
from content._units import EventVector, IntArray, UnitStore, equal_cuts, leaf_of

__all__ = ["HTree"]

_REBUILD_MIN = 8  # new units tolerated before a rebuild, at least (default)
_REBUILD_SHARE = 16  # ... and at most 1/16 of the built units
_CHUNK = 1 << 16  # units per chunk of the build
BoolArray = npt.NDArray[np.bool_]


class HTree(Engine):
    """Seed 004's H-Tree baseline with exact verification.

    ``cells`` is tau (cells per indexed attribute, >= 3), ``levels`` delta (indexed
    attributes); ``max_copies`` bounds the buckets one unit is replicated into.
    """

    name: ClassVar[str] = "htree"

    def __init__(
        self, cells: int = 6, levels: int = 6, max_copies: int | None = None, rebuild_min: int | None = None
    ) -> None:
        super().__init__()
        if cells < 3 or levels < 1 or cells**levels > 1 << 31:
            raise ValueError("need cells >= 3, levels >= 1 and cells**levels < 2**31")
        self._tau = cells
        self._delta = levels
        self._max_copies = 3**levels if max_copies is None else max(1, max_copies)
        self._store = UnitStore()
        self._attrs: list[int] = []  # indexed attribute ids, one per level
        self._cuts: list[list[float]] = []  # per level: tau - 1 segment boundaries
        self._start: IntArray = np.zeros(2, dtype=np.int64)  # CSR over bucket keys
        self._units: IntArray = np.zeros(0, dtype=np.int64)
        self._mark: BoolArray = np.zeros(0, dtype=np.bool_)
        self._built = 0  # units [0, built) are in the tree
        self._rebuild_min = _REBUILD_MIN if rebuild_min is None else rebuild_min

    # -- updates --------------------------------------------------------------------

    def _insert(self, sub_id: SubId, f: Filter) -> None:
        self._store.add(sub_id, f)

    def _delete(self, sub_id: SubId, f: Filter) -> None:
        store = self._store
        store.remove(sub_id)
        if store.wants_compaction():
            store.compact()
            self._build()

    def _cells(
        self, lo: npt.NDArray[np.float64], hi: npt.NDArray[np.float64], cuts: list[float]
    ) -> tuple[IntArray, IntArray]:
        """First cell and number of copies of each range on one level (before the budget)."""
        tau = self._tau
        catch = tau - 1
        c = np.asarray(cuts, dtype=np.float64)
        sl = np.searchsorted(c, lo, side="right")
        sh = np.searchsorted(c, hi, side="right")
        span = sh - sl
        first = np.where(span <= 1, np.minimum(sl, tau - 2), sl)
        copies = np.where(span <= 1, 1, span)
        wide = (span >= tau - 1) | (lo > hi)
        first[wide] = catch
        copies[wide] = 1
        return first, copies

    def _build(self) -> None:
        """(Re)build the tree from the live units' intervals.

        Cells per level are computed for all units at once; the bucket entries are then
        produced in chunks of units and placed by a counting sort over the bucket keys, so
        the transient memory is one chunk's, not a second copy of every entry.
        """
        store = self._store
        store.flush()
        n = store.n
        tau, catch = self._tau, self._tau - 1
        intervals = store.intervals()
        size = {a: len(iv[0]) for a, iv in intervals.items()}
        ranked = sorted(size, key=lambda a: (-size[a], a))
        self._attrs = ranked[: self._delta]
        levels = len(self._attrs)
        first = np.full((levels, n), catch, dtype=np.int32)
        copies = np.ones((levels, n), dtype=np.int32)
        self._cuts = []
        for lvl, a in enumerate(self._attrs):
            units, lo, hi = intervals[a]
            cuts = equal_cuts(lo, hi, tau)
            self._cuts.append(cuts.tolist())
            first[lvl, units], copies[lvl, units] = self._cells(lo, hi, self._cuts[lvl])
        del intervals
        total = copies.prod(axis=0, dtype=np.int64)
        while levels:  # the budget: move a unit's widest level to the catch-all cell until it fits
            over = np.flatnonzero(total > self._max_copies)
            if len(over) == 0:
                break
            widest = copies[:, over].argmax(axis=0)
            first[widest, over] = catch
            copies[widest, over] = 1
            total[over] = copies[:, over].prod(axis=0, dtype=np.int64)
        live = np.flatnonzero(store.alive[:n])
        nkeys = tau**levels
        key_type = np.uint16 if nkeys <= 0xFFFF else np.int64
        counts = np.zeros(nkeys, dtype=np.int64)
        chunks: list[tuple[npt.NDArray[np.integer], IntArray]] = []
        for c in range(0, len(live), _CHUNK):
            rows = live[c : c + _CHUNK]
            keys = np.zeros(len(rows), dtype=np.int64)
            for lvl in range(levels):
                rep = copies[lvl, rows]
                ends = np.cumsum(rep, dtype=np.int64)
                off = np.arange(int(ends[-1]), dtype=np.int64) - np.repeat(ends - rep, rep)
                keys = np.repeat(keys * tau + first[lvl, rows], rep) + off
                rows = np.repeat(rows, rep)
            order = np.argsort(keys.astype(key_type), kind="stable")
            chunks.append((keys[order].astype(key_type), rows[order]))
            counts += np.bincount(keys, minlength=nkeys)
        start = np.zeros(nkeys + 1, dtype=np.int64)
        np.cumsum(counts, out=start[1:])
        out = np.empty(int(start[-1]), dtype=np.int64)
        fill = start[:-1].copy()  # next free slot of every bucket
        for keys_c, rows_c in chunks:  # chunks come in unit order: buckets stay sorted by unit
            cnt = np.bincount(keys_c, minlength=nkeys)
            first_of = np.cumsum(cnt) - cnt  # where each key's run starts inside the chunk
            k64 = keys_c.astype(np.int64)
            out[fill[k64] + (np.arange(len(k64)) - first_of[k64])] = rows_c
            fill += cnt
        self._units = out
        self._start = start
        self._mark = np.zeros(n, dtype=np.bool_)
        self._built = n

    def _maintain(self) -> None:
        if self._store.n - self._built > max(self._rebuild_min, self._built // _REBUILD_SHARE):
            self._build()

    # -- matching -------------------------------------------------------------------

    def _keys(self, ev: EventVector) -> IntArray:
        """The bucket keys an event visits: per level cells ``s-1``, ``s`` and ``tau-1``."""
        tau, catch = self._tau, self._tau - 1
        keys = np.zeros(1, dtype=np.int64)
        for a, cuts in zip(self._attrs, self._cuts, strict=True):
            num = ev.nums.get(a)
            if num is None:
                cells = [catch]
            else:
                s = leaf_of(cuts, num[0], num[1])
                cells = [c for c in (s - 1, s) if 0 <= c <= tau - 2]
                cells.append(catch)
            keys = (keys[:, None] * tau + np.array(cells, dtype=np.int64)[None, :]).ravel()
        return keys

    def match(self, event: Event) -> set[SubId]:
        self._maintain()
        store = self._store
        ev = EventVector(store, event)
        built, n = self._built, store.n
        parts: list[IntArray] = []
        if built:
            keys = self._keys(ev)
            start, units = self._start, self._units
            got = [
                units[s:e]
                for s, e in zip(start[keys].tolist(), start[keys + 1].tolist(), strict=True)
                if s != e
            ]
            found = np.concatenate(got) if got else units[:0]
            mark = self._mark
            mark[found] = True
            mark &= store.alive[:built]
            cand = np.flatnonzero(mark)
            mark[cand] = False
            parts.append(store.verify(cand, ev))
        if n > built:
            fresh = np.flatnonzero(store.alive[built:n]) + built
            parts.append(store.verify(fresh, ev))
        if not parts:
            return set()
        units = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return store.collect(units, event)

    # -- introspection --------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Bucket entries and numpy bytes (benchmarks)."""
        s = self._store
        nbytes = self._units.nbytes + self._start.nbytes + self._mark.nbytes
        nbytes += s.alive.nbytes + s.nslot.nbytes + s.s_attr.nbytes + s.s_lo.nbytes + s.s_hi.nbytes
        return {"entries": len(self._units), "bytes": nbytes, "built": self._built, "units": s.n}

    def _check(self) -> None:
        super()._check()
        store = self._store
        store._check(self._filters)
        built, tau = self._built, self._tau
        levels = len(self._attrs)
        assert levels <= self._delta and len(self._cuts) == levels
        assert len(set(self._attrs)) == levels
        assert all(len(c) == tau - 1 and c == sorted(c) for c in self._cuts)
        start = self._start
        assert len(start) == tau**levels + 1 and start[0] == 0 and start[-1] == len(self._units)
        assert (np.diff(start) >= 0).all()
        assert len(self._mark) == built and not self._mark.any()
        assert (self._units < built).all()
        keys = np.repeat(np.arange(tau**levels), np.diff(start))
        per_unit: dict[int, list[int]] = {}
        for k, u in zip(keys.tolist(), self._units.tolist(), strict=True):
            per_unit.setdefault(u, []).append(k)
        for u in np.flatnonzero(store.alive[:built]).tolist():
            got = per_unit.get(u, [])
            assert got, "every built live unit sits in a bucket"
            assert len(got) == len(set(got)) <= self._max_copies
            cells = [[(k // tau ** (levels - 1 - lvl)) % tau for k in got] for lvl in range(levels)]
            for lvl, a in enumerate(self._attrs):
                slots = [j for j in range(int(store.nslot[u])) if store.s_attr[j, u] == a]
                used = sorted(set(cells[lvl]))
                if not slots:
                    assert used == [tau - 1], "unconstrained levels use the catch-all cell"
                    continue
                lo, hi = float(store.s_lo[slots[0], u]), float(store.s_hi[slots[0], u])
                if used == [tau - 1] or lo > hi:
                    continue
                # the cells cover every segment the range touches
                sl = leaf_of(self._cuts[lvl], lo, True)
                sh = leaf_of(self._cuts[lvl], hi, True)
                reach = {s for c in used for s in (c, c + 1)}
                assert set(range(sl, sh + 1)) <= reach, (u, lvl, used, sl, sh)
