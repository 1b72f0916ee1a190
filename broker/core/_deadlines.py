"""Session deadlines of the core (session expiry, will delay) in O(what is due) per tick.

``Core.tick`` used to scan every detached session at each tick (4 per second) to find the
expired ones: at 100,000 restored sessions that is a 100,000-item scan for nothing (issue
27, item 2/4).  :class:`Deadlines` is a set of sessions (``add`` / ``discard`` /
``in`` / ``len`` / iteration: the interface the core used) plus a binary heap of
``(deadline, session)``; :meth:`Deadlines.due` pops only the entries whose deadline passed,
so a tick costs O(1) when nothing is due and O(k log n) for k due sessions.

The deadline lives on the session (``expires_at`` or ``will_due``, read by ``key``); the heap
is lazy: ``discard`` removes a session from the set only, and a deadline that moved leaves
its old entry behind.  A popped entry counts only if its session is still in the set with
that very deadline (else it is skipped, or pushed again at its later deadline), and the heap
is rebuilt from the set when stale entries outnumber live ones, so it stays O(sessions).
Equal deadlines are ordered by insertion (a counter in each entry: sessions do not compare).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator

from broker.core._session import Session

__all__ = ["Deadlines"]


class Deadlines:
    """Sessions with a deadline read by ``key`` (None: none), due ones found in O(k log n)."""

    __slots__ = ("_heap", "_key", "_live", "_seq")

    def __init__(self, key: Callable[[Session], float | None]) -> None:
        self._key = key
        self._live: set[Session] = set()
        self._heap: list[tuple[float, int, Session]] = []
        self._seq = itertools.count()

    def add(self, s: Session) -> None:
        """Track ``s`` at its current deadline (call again after changing it). O(log n)."""
        at = self._key(s)
        if at is None:
            return
        self._live.add(s)
        heap = self._heap
        heapq.heappush(heap, (at, next(self._seq), s))
        if len(heap) > 2 * len(self._live) + 64:
            self._rebuild()

    def discard(self, s: Session) -> None:
        """Stop tracking ``s`` (its heap entry goes when popped or rebuilt). O(1)."""
        self._live.discard(s)

    def due(self, now: float) -> list[Session]:
        """The tracked sessions whose deadline is at or before ``now`` (no longer tracked
        after this call), in deadline order.  O(k log n) for k popped entries."""
        heap = self._heap
        out: list[Session] = []
        live = self._live
        key = self._key
        while heap and heap[0][0] <= now:
            at, _, s = heapq.heappop(heap)
            if s not in live:
                continue
            cur = key(s)
            if cur is None or cur > at:
                if cur is not None:  # moved later without a new add: follow it
                    heapq.heappush(heap, (cur, next(self._seq), s))
                continue
            live.discard(s)
            out.append(s)
        return out

    def _rebuild(self) -> None:
        entries = []
        key = self._key
        seq = self._seq
        for s in self._live:
            at = key(s)
            if at is not None:
                entries.append((at, next(seq), s))
        heapq.heapify(entries)
        self._heap = entries

    def __contains__(self, s: object) -> bool:
        return s in self._live

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)

    def __iter__(self) -> Iterator[Session]:
        return iter(self._live)
