"""HCEM: high-concurrency batch matching on REIN's index (seed 004, section 3, Fig. 2, Table 2).

The index is :class:`~content._rein.REIN`'s.  For a batch, seed 004's *dynamic adjustment*
orders the events per attribute: in ``L_low`` a larger event value enters the search space
first, in ``L_high`` a smaller one, because whatever bound fails event ``e_j`` in ``L_low``
also fails every smaller event (Fig. 2(a); symmetrically Fig. 2(b)).  Each event still
compares its own bucket (the ``2 q alpha m h`` term of the paper's cost), but the buckets
beyond it are scanned once for the whole batch: the region between two consecutive events'
cut points (X1, X2, X3 in Fig. 2) is marked once with the bits of every event it fails.

Bit sets: per chunk of 64 events one ``uint64`` word per unit (bit i = "event i fails this
unit").  The cumulative regions of Fig. 2 are computed per *bucket*, not per entry: one
cumulative OR over the list's b buckets gives, for every bucket, the bits of the events it
fails wholesale (:func:`_beyond`); every unit then takes its mask from that b-entry table
through the list's dense per-unit bucket index (``BucketList.bkt``): ``words |=
table[bkt]``, a sequential gather from a table that stays in L1 instead of a random
scatter over the unit ids (about 2x less per list at 1M units; see
docs/content-rein-hcem.md, "Deviation: per-unit bucket index").  Lists with fewer entries
than a quarter of the units scatter over their own slots instead.  The marking stays seed
004's: the same buckets fail the same events.  A batch of h events reads each list's
index ``ceil(h / 64)`` times instead of scanning the list h times (REIN).  With one event
``match_batch`` is :meth:`REIN.match`.

Per chunk and list: O(h q) own-bucket comparisons, O(b + h) for the table and O(n) for the
gather (n = units); candidates are then split per event and residual predicates verified.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from content._bucket import BktArray, BucketList
from content._engine import Event, SubId
from content._rein import REIN

__all__ = ["HCEM"]

_WORD = 64
_BLOCK = 1 << 16  # units per block of the gather: 512 KB of words + 512 KB temporary
_ALL = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
_BITS = [np.uint64(1 << i) for i in range(_WORD)]

Words = npt.NDArray[np.uint64]


def _own_bucket(
    words: Words, lst: BucketList, xs: list[tuple[int, float, bool]], low: bool
) -> npt.NDArray[np.intp]:
    """Compare each event with the bounds of its own bucket; returns the events' buckets.

    ``L_low``: a bound above the event value fails it; ``L_high``: a bound below it.
    """
    bnd, start, count, vals, units = lst.bnd, lst.start, lst.count, lst.vals, lst.units
    js = np.empty(len(xs), dtype=np.intp)
    for k, (i, xf, x_ok) in enumerate(xs):
        j = js[k] = bisect_right(bnd, xf)
        c = count[j]
        if c:
            s = start[j]
            seg = vals[s : s + c]
            if low:
                hit = units[s : s + c][seg > xf if x_ok else seg >= xf]
            else:
                hit = units[s : s + c][seg < xf if x_ok else seg <= xf]
            if len(hit):
                words[hit] |= _BITS[i]
    return js


def _beyond(lst: BucketList, js: npt.NDArray[np.intp], bits: Words, missing: int, low: bool) -> Words:
    """Fig. 2: the bits failing each bucket wholesale, by one cumulative OR over the buckets.

    ``L_low`` (Fig. 2(a)): bucket ``j`` fails every event whose bucket is below ``j``;
    ``L_high`` (Fig. 2(b)): every event whose bucket is above ``j``.  Slot ``max_buckets``
    ("no entry in this list") stays 0.  O(b + h).
    """
    nb = len(lst.count)
    table = np.zeros(lst.max_buckets + 1, dtype=np.uint64)
    head = table[:nb]
    if low:
        keep = js + 1 < nb
        np.bitwise_or.at(head, js[keep] + 1, bits[keep])
        np.bitwise_or.accumulate(head, out=head)
    else:
        keep = js > 0
        rev = head[::-1]
        np.bitwise_or.at(rev, nb - js[keep], bits[keep])
        np.bitwise_or.accumulate(rev, out=rev)
    if missing:
        head |= np.uint64(missing)
    return table


def _gather(words: Words, dense: list[tuple[Words, BktArray]]) -> None:
    """``words |= table[bkt]`` for every dense list, in blocks of units that stay in L2.

    One block of words is OR-ed with all lists before the next block is touched
    (measured ~1.5-2x faster than whole-array passes at 1M units).
    """
    n = len(words)
    tmp: Words = np.empty(min(n, _BLOCK), dtype=np.uint64)
    take, bor = np.take, np.bitwise_or
    for s in range(0, n, _BLOCK):
        e = min(n, s + _BLOCK)
        w = words[s:e]
        t = tmp[: e - s]
        for table, bkt in dense:
            take(table, bkt[s:e], out=t)
            bor(w, t, out=w)


class HCEM(REIN):
    """Seed 004's HCEM: REIN's index, batches matched with per-attribute event ordering.

    ``match`` is REIN's; ``match_batch`` shares each list scan among up to 64 events.
    """

    batch_native = True
    batch_min_events = 16  # its 64-event words cost more than they share below ~16 events

    name: ClassVar[str] = "hcem"

    def match_batch(self, events: Sequence[Event]) -> list[set[SubId]]:
        if len(events) <= 1:
            return [self.match(e) for e in events]
        if self._dirty:
            self._flush()
        out: list[set[SubId]] = []
        for k in range(0, len(events), _WORD):
            out.extend(self._match_chunk(events[k : k + _WORD]))
        return out

    def _match_chunk(self, chunk: Sequence[Event]) -> list[set[SubId]]:
        h = len(chunk)
        n = self._table.n
        full = _ALL if h == _WORD else np.uint64((1 << h) - 1)
        words: Words = np.where(self._table.alive[:n], np.uint64(0), full)
        dense: list[tuple[Words, BktArray]] = []
        for attr, low, high, number in self.columns():
            lows: list[tuple[int, float, bool]] = []
            highs: list[tuple[int, float, bool]] = []
            missing = 0
            for i, event in enumerate(chunk):
                num = number(event.get(attr))
                if num is None:
                    missing |= 1 << i
                else:
                    xf, x_ge, x_le = num
                    lows.append((i, xf, x_ge))
                    highs.append((i, xf, x_le))
            bits = np.array([_BITS[i] for i, _, _ in lows], dtype=np.uint64)
            for lst, xs, is_low in ((low, lows, True), (high, highs, False)):
                js = _own_bucket(words, lst, xs, is_low)
                table = _beyond(lst, js, bits, missing, is_low)
                if 4 * len(lst) >= n:  # dense: gathered below, block by block
                    dense.append((table, lst.bucket_index(n)))
                elif len(lst):  # sparse: over the list's slots (slack slots hold unit 0)
                    words[lst.units[: lst.end]] |= table[lst.positions_bucket()]
        if dense:
            _gather(words, dense)
        some = np.flatnonzero((words & full) != full)
        sub = words[some]
        return [self._collect(some[(sub & _BITS[i]) == 0], event) for i, event in enumerate(chunk)]
