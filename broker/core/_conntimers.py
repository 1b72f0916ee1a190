"""Connection deadlines in a coarse timer wheel (issue 27, item 2), sans-IO.

Two timers belong to a connection: the CONNECT deadline (``connect_timeout`` after accept)
and the keep-alive (1.5 x the keep-alive after the last packet read, MQTT 5 section
3.1.2.10). Neither is a loop timer: a connection is filed in the bucket of its deadline
(buckets ``granularity`` = the core's tick interval wide), and ``Core.tick`` looks only at the
buckets that came due (a heap of bucket keys), so a tick costs O(connections due), not
O(connections). Reading a packet only stores the time (``Connection.last_rx``); the
deadline is re-derived when the bucket comes due, and a connection still alive is filed
again at its new deadline -- so each connection is looked at about once per keep-alive
period. A connection that closes leaves its bucket at once (no reference kept).

Behaviour is that of the per-tick scan it replaces: the decision (``check``) is the same
code, made at the same tick (the first one after the deadline). A paused publisher (flow control)
is not timed out while paused, and is looked at again every tick until it resumes.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from broker.core._session import ConnectionState
from broker.packets import ReasonCode

if TYPE_CHECKING:
    from broker.core._connection import Connection

__all__ = ["ConnectionTimers", "check"]


class ConnectionTimers:
    """Connections by the tick after their next deadline. O(1) to file or remove, O(log
    buckets) per bucket that comes due."""

    __slots__ = ("buckets", "granularity", "keys")

    def __init__(self, granularity: float) -> None:
        self.granularity = granularity if granularity > 0 else 0.25
        self.buckets: dict[int, set[Connection]] = {}
        self.keys: list[int] = []  # a heap of the keys of ``buckets``

    def file(self, conn: Connection, at: float) -> None:
        """Look at ``conn`` again after ``at`` (instead of its earlier filing)."""
        # the bucket of ``at`` comes due up to one granularity early; ``check`` then files the
        # connection again (same bucket), so it is looked at on every tick until it is due:
        # the decision is made at the first tick after ``at``, as by a scan of every connection
        key = int(at / self.granularity)
        old = conn.timer_key
        if old == key:
            return
        buckets = self.buckets
        if old >= 0:
            held = buckets.get(old)
            if held is not None:
                held.discard(conn)
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = set()
            heapq.heappush(self.keys, key)
        bucket.add(conn)
        conn.timer_key = key

    def discard(self, conn: Connection) -> None:
        key = conn.timer_key
        if key >= 0:
            conn.timer_key = -1
            held = self.buckets.get(key)
            if held is not None:
                held.discard(conn)

    def due(self, now: float) -> list[Connection]:
        """The connections whose bucket came due by ``now`` (taken out of the wheel)."""
        out: list[Connection] = []
        keys = self.keys
        limit = now / self.granularity
        while keys and keys[0] <= limit:
            bucket = self.buckets.pop(heapq.heappop(keys), None)
            if bucket:
                for conn in bucket:
                    conn.timer_key = -1
                out.extend(bucket)
        return out

    def expire(self, now: float) -> None:
        """``Core.tick``: check every connection that came due, file the living again."""
        for conn in self.due(now):
            at = check(conn, now)
            if at is not None:
                self.file(conn, at)

    def __len__(self) -> int:
        return sum(len(b) for b in self.buckets.values())

    def _check(self, connections: set[Connection]) -> None:
        for key, bucket in self.buckets.items():
            assert key in self.keys
            for conn in bucket:
                assert conn.timer_key == key and conn in connections


def check(conn: Connection, now: float) -> float | None:
    """A connection's timers at ``now``: closed when CONNECT or keep-alive is overdue
    (counted in ``$SYS/broker/connections/connect_timeouts`` / ``keepalive_timeouts``);
    returns when to look again (None: no timer left)."""
    conn.clock = now
    state = conn.state
    if state is ConnectionState.CLOSED or conn.close_requested:
        return None
    if state is ConnectionState.AWAIT_CONNECT:
        if now > conn.connect_deadline:
            conn.core.stats.connect_timeouts += 1
            conn.close("no CONNECT")
            return None
        return conn.connect_deadline
    ka = conn.keep_alive
    if not ka:
        return None
    if conn.paused or conn.blockers or conn.pending:
        return now  # not while paused: again at the next tick
    deadline = conn.last_rx + 1.5 * ka
    if now > deadline:
        conn.core.stats.keepalive_timeouts += 1
        conn.disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep alive timeout")
        conn.lost(now)
        return None
    return deadline
