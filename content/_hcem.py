"""HCEM: high-concurrency batch matching on REIN's index (seed 004, section 3, Fig. 2, Table 2).

The index is :class:`~content._rein.REIN`'s.  For a batch, seed 004's *dynamic adjustment*
orders the events per attribute: in ``L_low`` a larger event value enters the search space
first, in ``L_high`` a smaller one, because whatever bound fails event ``e_j`` in ``L_low``
also fails every smaller event (Fig. 2(a); symmetrically Fig. 2(b)).  Each event still
compares its own bucket (the ``2 q alpha m h`` term of the paper's cost), but the buckets
beyond it are scanned once for the whole batch: the region between two consecutive events'
cut points (X1, X2, X3 in Fig. 2) is marked once with the bits of every event it fails.

Bit sets: per chunk of 64 events one ``uint64`` word per unit (bit i = "event i fails this
unit"), so a region is marked with one numpy scatter ``bits[units[a:b]] |= mask``.  A batch
of h events scans each list ``ceil(h / 64)`` times instead of h times (REIN).  With one event
``match_batch`` is :meth:`REIN.match`.

Per chunk: O(n) to reset the words and find the units some event survives, O(h q) bucket
comparisons, and one scan of each list beyond the smallest (``L_low``) / largest (``L_high``)
cut; candidates are then split per event and residual predicates verified.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from content._bucket import BucketList
from content._engine import Event, SubId
from content._rein import REIN, event_number

__all__ = ["HCEM"]

_WORD = 64
_ALL = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
_BITS = [np.uint64(1 << i) for i in range(_WORD)]

Words = npt.NDArray[np.uint64]


def _scan_low(words: Words, lst: BucketList, xs: list[tuple[int, float, bool]], missing: int) -> None:
    """Fig. 2(a): ``L_low``; events enter by descending value, regions marked cumulatively."""
    bnd, start, count, vals, units = lst.bnd, lst.start, lst.count, lst.vals, lst.units
    cuts: list[tuple[int, int]] = []
    for i, xf, x_ge in xs:
        j = bisect_right(bnd, xf)
        s = start[j]
        c = count[j]
        if c:
            seg = vals[s : s + c]
            hit = units[s : s + c][seg > xf if x_ge else seg >= xf]
            if len(hit):
                words[hit] |= _BITS[i]
        cuts.append((start[j + 1], i))
    end = lst.end
    cuts.sort()
    mask = np.uint64(missing)
    pos = 0
    for cut, i in cuts:
        if mask and cut > pos:
            words[units[pos:cut]] |= mask
        pos = max(pos, cut)
        mask |= _BITS[i]
    if mask and pos < end:
        words[units[pos:end]] |= mask


def _scan_high(words: Words, lst: BucketList, xs: list[tuple[int, float, bool]], missing: int) -> None:
    """Fig. 2(b): ``L_high``; events enter by ascending value, regions marked cumulatively."""
    bnd, start, count, vals, units = lst.bnd, lst.start, lst.count, lst.vals, lst.units
    cuts: list[tuple[int, int]] = []
    for i, xf, x_le in xs:
        j = bisect_right(bnd, xf)
        s = start[j]
        c = count[j]
        if c:
            seg = vals[s : s + c]
            hit = units[s : s + c][seg < xf if x_le else seg <= xf]
            if len(hit):
                words[hit] |= _BITS[i]
        cuts.append((s, i))
    cuts.sort(reverse=True)
    mask = np.uint64(missing)
    pos = lst.end
    for cut, i in cuts:
        if mask and cut < pos:
            words[units[cut:pos]] |= mask
        pos = min(pos, cut)
        mask |= _BITS[i]
    if mask and pos > 0:
        words[units[:pos]] |= mask


class HCEM(REIN):
    """Seed 004's HCEM: REIN's index, batches matched with per-attribute event ordering.

    ``match`` is REIN's; ``match_batch`` shares each list scan among up to 64 events.
    """

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
        for attr, (low, high) in self._lists.items():
            lows: list[tuple[int, float, bool]] = []
            highs: list[tuple[int, float, bool]] = []
            missing = 0
            for i, event in enumerate(chunk):
                num = event_number(event.get(attr))
                if num is None:
                    missing |= 1 << i
                else:
                    xf, x_ge, x_le = num
                    lows.append((i, xf, x_ge))
                    highs.append((i, xf, x_le))
            _scan_low(words, low, lows, missing)
            _scan_high(words, high, highs, missing)
        some = np.flatnonzero((words & full) != full)
        sub = words[some]
        return [self._collect(some[(sub & _BITS[i]) == 0], event) for i, event in enumerate(chunk)]
