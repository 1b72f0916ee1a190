"""The time source of the core: handed in, never read directly (issue 15).

The sans-IO core needs two clocks: a monotonic one for deadlines (keep-alive, will delay,
session and message expiry, flow control's grace time, log throttling) and the wall clock
for timestamps that leave the broker (hook records, stored rows). :class:`Clock` reads the
system clocks; tests hand the core a :class:`ManualClock` and move time themselves. The
transport and the timer loop pass the monotonic time into every call (``now``); the core
asks its clock only where no caller has the time at hand.
"""

from __future__ import annotations

import time

from librt.time import time as wall_time

__all__ = ["Clock", "ManualClock"]


class Clock:
    """The system clocks (``time.monotonic``, ``time.time``)."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        # librt.time.time is time.time() as a mypyc primitive: compiled, a C call returning a
        # native float (time.time() was a module attribute lookup, a call through Python and a
        # float object each time: ~70 ns of the ~100 ns that recording a publication's time
        # cost the bridge's defaults, issue 42 item 4)
        return wall_time()


class ManualClock(Clock):
    """A clock that moves only when told (tests): both clocks advance together."""

    def __init__(self, monotonic: float = 0.0, wall: float = 1_700_000_000.0) -> None:
        self._mono = monotonic
        self._wall = wall

    def monotonic(self) -> float:
        return self._mono

    def wall(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> float:
        """Move both clocks forward; returns the new monotonic time."""
        self._mono += seconds
        self._wall += seconds
        return self._mono
