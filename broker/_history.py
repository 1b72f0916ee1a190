"""The dashboard's server-side history: a ring buffer per series (issue 38, item 5).

The broker records its clients' message rates and a few gauges every
``BrokerConfig.dashboard_history_interval`` seconds (5 s) whether or not a page is open, so a
page opened now draws the last ``dashboard_history_points`` samples (180: 15 minutes) at once
instead of starting from an empty chart. Memory is fixed when the broker starts: one
:class:`Ring` of ``array('d')`` per series (8 bytes a point; 180 points x 8 series = 11.5 kB),
the oldest point overwritten by the newest. Recording a point is O(series), reading the
history O(series x points).

The series (:data:`SERIES`): ``t`` (wall-clock seconds), ``rate_in`` (messages/s the clients
published, ``Stats.messages_received``), ``rate_out`` (deliveries/s), ``rate_internal`` (the
broker's own publications/s: ``$SYS``, cluster control), ``connections``, ``memory_rss``,
``publishers_paused``, ``slow_consumers``.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator

__all__ = ["SERIES", "History", "Ring"]

#: the recorded series, in the order of a point
SERIES = (
    "t",
    "rate_in",
    "rate_out",
    "rate_internal",
    "connections",
    "memory_rss",
    "publishers_paused",
    "slow_consumers",
)


class Ring:
    """At most ``capacity`` floats, oldest first; appending to a full ring drops the oldest.

    One preallocated ``array('d')`` and two ints: ``_start`` (index of the oldest value) and
    ``_len`` (values held). ``append`` is O(1), ``values`` O(len)."""

    __slots__ = ("_buf", "_len", "_start", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a ring holds at least one value")
        self.capacity = capacity
        self._buf = array("d", bytes(8 * capacity))
        self._start = 0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def append(self, value: float) -> None:
        """Add ``value`` as the newest; when full, the oldest is overwritten. O(1)."""
        cap = self.capacity
        if self._len < cap:
            self._buf[(self._start + self._len) % cap] = value
            self._len += 1
        else:
            self._buf[self._start] = value
            self._start = (self._start + 1) % cap

    def __iter__(self) -> Iterator[float]:
        buf, cap, start = self._buf, self.capacity, self._start
        for i in range(self._len):
            yield buf[(start + i) % cap]

    def values(self) -> list[float]:
        """The values, oldest first. O(len)."""
        end = self._start + self._len
        if end <= self.capacity:
            return self._buf[self._start : end].tolist()
        return self._buf[self._start :].tolist() + self._buf[: end - self.capacity].tolist()

    def last(self) -> float | None:
        """The newest value (None when empty). O(1)."""
        if not self._len:
            return None
        return self._buf[(self._start + self._len - 1) % self.capacity]

    def clear(self) -> None:
        self._start = self._len = 0

    def _check(self) -> None:
        assert len(self._buf) == self.capacity >= 1
        assert 0 <= self._len <= self.capacity
        assert 0 <= self._start < self.capacity
        assert self._len == self.capacity or self._start == 0  # wraps only once full
        assert self.values() == list(self)


class History:
    """One :class:`Ring` per name of :data:`SERIES`, all of the same length."""

    __slots__ = ("capacity", "interval", "rings")

    def __init__(self, capacity: int, interval: float) -> None:
        self.capacity = capacity
        self.interval = interval
        self.rings = {name: Ring(capacity) for name in SERIES}

    def __len__(self) -> int:
        return len(self.rings["t"])

    def record(self, point: dict[str, float]) -> None:
        """Append one point (every name of :data:`SERIES`, KeyError otherwise). O(series)."""
        values = [float(point[name]) for name in SERIES]  # all or nothing: the rings stay aligned
        for name, value in zip(SERIES, values, strict=True):
            self.rings[name].append(value)

    def points(self) -> list[dict[str, float]]:
        """The points, oldest first, as the dashboard's JSON rows. O(series x points)."""
        columns = [self.rings[name].values() for name in SERIES]
        return [dict(zip(SERIES, row, strict=True)) for row in zip(*columns, strict=True)]

    def as_json(self) -> dict[str, object]:
        return {"interval": self.interval, "capacity": self.capacity, "points": self.points()}

    def _check(self) -> None:
        for ring in self.rings.values():
            ring._check()
            assert len(ring) == len(self) and ring.capacity == self.capacity
        times = self.rings["t"].values()
        assert all(a <= b for a, b in itertools.pairwise(times)), "time goes forward"
