"""REIN's bucket lists and unit table (seed 004, section 2 "index structure", Fig. 1).

Seed 004 indexes, per attribute, two bucket lists: ``L_low`` holds the lower bound of every
range constraint and ``L_high`` its upper bound, each over ``b`` buckets chosen by
discretising the attribute's value domain ``[U_i, R_i]`` (its formulas (1), (2)).  Negative
search then compares an event value only inside its own bucket and marks every constraint of
the buckets beyond it (lower list: larger values; upper list: smaller values) as failed.

Here a list is one contiguous pair of numpy arrays (``vals`` float64, ``units`` intp) cut
into buckets that are consecutive slices, each with free slack at its end.  Consequences:

* "every bucket beyond the event's bucket" is one slice ``units[start[j+1]:end]`` (lower
  list) or ``units[:start[j]]`` (upper list), marked by a single numpy scatter; slack slots
  hold the sentinel unit 0, whose mark is ignored;
* an insert is queued (O(1)); before the next match the queue is written into the buckets'
  slack in one vectorised step (O(log b) per entry to find its bucket, O(1) to write);
* users declare no value domain: the boundaries are *quantiles of the data* computed when
  the list is (re)bucketed.  A list is rebucketed -- alone, never the whole index -- when a
  bucket's slack is exhausted (slack is a quarter of the bucket's size, so rebuilds are geometric,
  amortised O(log n) numpy work per insert) or when its tombstones outnumber its live
  entries (lazy compaction after deletes).  Rebucketing sorts the live entries once,
  O(N log N) in numpy, so buckets also start sorted; inserts append unsorted;
* the number of buckets is ``min(b, N // 4)`` (at least 1): tiny lists do not carry
  thousands of empty buckets.

Each list also keeps ``bkt``, a dense array over unit ids giving the bucket of the unit's
written entry (``max_buckets`` = none): HCEM marks a chunk of events with one gather through
it (content._hcem).  It costs 2 bytes per unit id, so it is built only on demand and only
for lists holding at least a quarter as many entries as there are units (sparser lists are
marked through their slots instead); ``flush`` keeps it up to date (O(p)) and ``rebucket``
drops it (rebuilt at the next use, O(N + units)).

Deleted units are tombstones: their entries stay until their list is compacted.  A unit id
is reused only after every list holding one of its entries dropped it (``pending`` counts
those entries), so a stale entry can never fail a new unit.

Complexity: insert O(log b) amortised; delete O(1) amortised (plus the compaction share);
single-event marking for one list O(q + |marked|) with q the bucket size.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["BktArray", "BucketList", "UnitTable"]

_FLUSH = 8192  # queued entries per list before they are written (bounds the queue's memory)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]
Int64Array = npt.NDArray[np.int64]
BktArray = npt.NDArray[np.integer[Any]]


def _bkt_dtype(max_buckets: int) -> type[np.uint16] | type[np.int32]:
    return np.uint16 if max_buckets < 0xFFFF else np.int32


class UnitTable:
    """Unit ids (one per DNF conjunction): liveness, pending list entries, free ids.

    Unit 0 is a sentinel (slack slots point at it) and is never allocated.
    Allocation and release are O(1) amortised (capacity doubling).
    """

    __slots__ = ("alive", "free", "n", "pending")

    def __init__(self) -> None:
        self.alive: npt.NDArray[np.bool_] = np.zeros(64, dtype=np.bool_)
        self.pending: npt.NDArray[np.int32] = np.zeros(64, dtype=np.int32)
        self.free: list[int] = []
        self.n = 1  # high-water mark: ids < n have been handed out (0 = sentinel)

    def allocate(self) -> int:
        if self.free:
            u = self.free.pop()
        else:
            u = self.n
            self.n += 1
            if u >= len(self.alive):
                cap = 2 * len(self.alive)
                self.alive = np.concatenate([self.alive, np.zeros(cap - len(self.alive), dtype=np.bool_)])
                self.pending = np.concatenate(
                    [self.pending, np.zeros(cap - len(self.pending), dtype=np.int32)]
                )
        self.alive[u] = True
        return u

    def release(self, u: int) -> None:
        """Mark ``u`` dead; its id is freed once no list holds an entry of it."""
        self.alive[u] = False
        if self.pending[u] == 0:
            self.free.append(u)

    def dropped(self, units: IntArray) -> None:
        """Entries of the (dead, distinct) ``units`` were purged from one list."""
        if len(units) == 0:
            return
        self.pending[units] -= 1
        self.free.extend(units[self.pending[units] == 0].tolist())


class BucketList:
    """One bucket list (``L_low`` or ``L_high``) of one attribute.

    Buckets are slices ``[start[j], start[j+1])`` of ``vals``/``units``; bucket ``j`` holds
    values ``v`` with ``bnd[j-1] <= v < bnd[j]`` in its first ``count[j]`` slots.
    """

    __slots__ = (
        "bkt",
        "bnd",
        "bnd_np",
        "buf_u",
        "buf_v",
        "count",
        "dead",
        "end",
        "live",
        "max_buckets",
        "start",
        "start_np",
        "table",
        "units",
        "vals",
    )

    def __init__(self, table: UnitTable, max_buckets: int) -> None:
        self.table = table
        self.max_buckets = max_buckets
        self.live = 0
        self.dead = 0
        self.bnd: list[float] = []
        self.bnd_np: FloatArray = np.empty(0)
        self.buf_v: list[float] = []
        self.buf_u: list[int] = []
        self.vals: FloatArray = np.full(4, np.nan)
        self.units: IntArray = np.zeros(4, dtype=np.intp)
        self.start: list[int] = [0, 4]
        self.start_np: Int64Array = np.array(self.start, dtype=np.int64)
        self.count: list[int] = [0]
        self.end = 4
        # bkt[u]: the bucket holding u's (written) entry, ``max_buckets`` (never a bucket) if none
        self.bkt: BktArray | None = None  # built on demand (HCEM), dropped by rebucket

    def __len__(self) -> int:
        return self.live + self.dead

    def insert(self, v: float, u: int) -> None:
        """Queue ``(v, u)``; :meth:`flush` writes queued entries into their buckets."""
        self.live += 1
        self.buf_v.append(v)
        self.buf_u.append(u)
        if len(self.buf_u) >= _FLUSH:
            self.flush()

    def flush(self) -> None:
        """Append the queued entries to their buckets (vectorised); rebucket on overflow.

        O(p log b) for p queued entries, plus O(b) bookkeeping; a bucket without room for its
        new entries triggers :meth:`rebucket` of this list.
        """
        if not self.buf_v:
            return
        vals = np.array(self.buf_v, dtype=np.float64)
        units = np.array(self.buf_u, dtype=np.intp)
        nb = len(self.count)
        j = np.searchsorted(self.bnd_np, vals, side="right")
        added = np.bincount(j, minlength=nb)
        count = np.array(self.count, dtype=np.int64)
        new_count = count + added
        if (new_count > np.diff(self.start_np)).any():
            self.rebucket()
            return
        order = np.argsort(j, kind="stable")
        js = j[order]
        first = np.searchsorted(js, js, side="left")
        pos = self.start_np[js] + count[js] + (np.arange(len(js)) - first)
        self.vals[pos] = vals[order]
        self.units[pos] = units[order]
        if self.bkt is not None:
            self.bucket_index(len(self.table.alive))[units] = j
        self.count = new_count.tolist()
        self.buf_v = []
        self.buf_u = []

    def kill(self) -> None:
        """One entry of this list now belongs to a dead unit; compact lazily."""
        self.live -= 1
        self.dead += 1
        if self.dead > max(32, self.live):
            self.rebucket()

    def rebucket(self) -> None:
        """Drop tombstones, recompute quantile boundaries, lay buckets out with slack.

        O(N log N) for the N entries of this list only.
        """
        used = self.units[: self.end] != 0
        vals = self.vals[: self.end][used]
        units = self.units[: self.end][used]
        if self.buf_u:
            vals = np.concatenate([vals, np.array(self.buf_v, dtype=np.float64)])
            units = np.concatenate([units, np.array(self.buf_u, dtype=np.intp)])
            self.buf_v = []
            self.buf_u = []
        keep = self.table.alive[units]
        if not keep.all():
            self.table.dropped(units[~keep])
            vals = vals[keep]
            units = units[keep]
        order = np.argsort(vals, kind="stable")
        vals = vals[order]
        units = units[order]
        n = len(vals)
        nb = max(1, min(self.max_buckets, n // 4))
        if nb > 1:
            bnd = np.unique(vals[(np.arange(1, nb) * n) // nb])
            if len(bnd) and bnd[0] == vals[0]:
                bnd = bnd[1:]  # no empty first bucket
        else:
            bnd = np.empty(0)
        nb = len(bnd) + 1
        cut = np.empty(nb + 1, dtype=np.int64)
        cut[0] = 0
        cut[-1] = n
        cut[1:-1] = np.searchsorted(vals, bnd, side="left")
        counts = np.diff(cut)
        caps = counts + counts // 4 + 4
        start = np.zeros(nb + 1, dtype=np.int64)
        np.cumsum(caps, out=start[1:])
        end = int(start[-1])
        dest = np.arange(n, dtype=np.int64) + np.repeat(start[:-1] - cut[:-1], counts)
        self.vals = np.full(end, np.nan)
        self.units = np.zeros(end, dtype=np.intp)
        self.vals[dest] = vals
        self.units[dest] = units
        self.bkt = None
        self.bnd = bnd.tolist()
        self.bnd_np = bnd
        self.start_np = start
        self.start = start.tolist()
        self.count = counts.tolist()
        self.end = end
        self.live = n
        self.dead = 0

    def positions_bucket(self) -> IntArray:
        """The bucket of every slot ``[0, end)`` (slack slots included); O(end)."""
        return np.repeat(np.arange(len(self.count)), np.diff(self.start_np))

    def bucket_index(self, n: int) -> BktArray:
        """``bkt[:n]``: per unit id the bucket of its written entry, ``max_buckets`` if none.

        Built on first use (O(end + n)), then kept up to date by :meth:`flush` and dropped by
        :meth:`rebucket`; grown with "none" when the unit table outgrew it.
        """
        bkt = self.bkt
        if bkt is None:
            bkt = np.full(max(n, len(self.table.alive)), self.max_buckets, dtype=_bkt_dtype(self.max_buckets))
            units = self.units[: self.end]
            used = units != 0
            bkt[units[used]] = self.positions_bucket()[used]
            self.bkt = bkt
        elif len(bkt) < n:
            grown = np.full(max(n, 2 * len(bkt)), self.max_buckets, dtype=bkt.dtype)
            grown[: len(bkt)] = bkt
            bkt = self.bkt = grown
        return bkt[:n]

    # -- single-event negative search (REIN) ------------------------------------------

    def mark_low(self, fail: npt.NDArray[np.bool_], xf: float, x_ge: bool) -> None:
        """Lower-bound list: mark units with ``lo > x`` (``x_ge``: the event value >= xf)."""
        j = bisect_right(self.bnd, xf)
        s = self.start[j]
        c = self.count[j]
        if c:
            seg = self.vals[s : s + c]
            fail[self.units[s : s + c][seg > xf if x_ge else seg >= xf]] = True
        e = self.start[j + 1]
        if e < self.end:
            fail[self.units[e : self.end]] = True

    def mark_high(self, fail: npt.NDArray[np.bool_], xf: float, x_le: bool) -> None:
        """Upper-bound list: mark units with ``hi < x`` (``x_le``: the event value <= xf)."""
        j = bisect_right(self.bnd, xf)
        s = self.start[j]
        if s:
            fail[self.units[:s]] = True
        c = self.count[j]
        if c:
            seg = self.vals[s : s + c]
            fail[self.units[s : s + c][seg < xf if x_le else seg <= xf]] = True

    def mark_all(self, fail: npt.NDArray[np.bool_]) -> None:
        fail[self.units[: self.end]] = True

    def _check(self) -> None:
        nb = len(self.count)
        assert len(self.bnd) == nb - 1 and len(self.start) == nb + 1
        assert self.start[0] == 0 and self.start[-1] == self.end
        assert list(self.start_np) == self.start and list(self.bnd_np) == self.bnd
        assert all(a < b for a, b in zip(self.bnd, self.bnd[1:], strict=False))
        assert len(self.buf_v) == len(self.buf_u)
        n_used = len(self.buf_u)
        for j in range(nb):
            s, c, e = self.start[j], self.count[j], self.start[j + 1]
            assert 0 <= c <= e - s
            assert (self.units[s : s + c] != 0).all() and (self.units[s + c : e] == 0).all()
            seg = self.vals[s : s + c]
            if j > 0:
                assert (seg >= self.bnd[j - 1]).all()
            if j < nb - 1:
                assert (seg < self.bnd[j]).all()
            n_used += c
        assert n_used == self.live + self.dead
        units = self.units[: self.end]
        units = np.concatenate([units[units != 0], np.array(self.buf_u, dtype=np.intp)])
        assert len(np.unique(units)) == len(units), "one entry per unit per list"
        assert int(self.table.alive[units].sum()) == self.live
        if self.bkt is not None:
            written = self.units[: self.end]
            written = written[written != 0]
            assert int((self.bkt != self.max_buckets).sum()) == len(written)
            for j in range(nb):
                s, c = self.start[j], self.count[j]
                assert (self.bkt[self.units[s : s + c]] == j).all()
