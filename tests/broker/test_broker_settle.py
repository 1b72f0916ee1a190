"""The broker settles released content selectors in small slices between its ticks (issue 42
item 2).

A fleet that leaves releases its selectors; they leave the engine a slice at a time
(``Router.settle_selectors``, ~15-20 us each).  ``Core.tick`` took 2,048 per tick, 30-45 ms of
the loop in one turn (a 100,000-selector fleet's teardown: the longest stall but one).  The
broker now takes a slice of at most ``SETTLE_SLICE`` removals and ``SETTLE_BUDGET`` seconds
every ``SETTLE_EVERY`` while some wait, at its ticks too (the first slice at the tick after
the release): the backlog drains as fast, and no loop turn holds more than a slice.  A real
embedded broker; the sessions are in-process subscribers (``Core.local_subscribe``)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

import broker._broker as broker_mod
from broker import Broker
from broker._broker import SETTLE_SLICE
from broker.core import Core
from tests.waiting import eventually


async def _leave_and_watch(core: Core, n: int) -> list[int]:
    """``n`` in-process subscribers, one selector each, leave in one turn; returns the drop of
    the release backlog at each loop turn until it is empty."""
    sessions = [core.local_subscribe(f"s{i}", "t/#", f"v > {i}", 0, lambda m, r: None, 0.0) for i in range(n)]
    left: list[int] = []  # the backlog as each loop turn sees it
    loop = asyncio.get_running_loop()

    def watch() -> None:
        left.append(core.router.releasing)
        if left[-1]:
            loop.call_soon(watch)

    for s in sessions:  # the fleet leaves in one turn: every selector released
        core.end_session(s, 0.0)
    assert core.router.releasing == n
    watch()
    await eventually(lambda: not core.router.releasing, 10.0)
    return [a - b for a, b in itertools.pairwise(left)]


async def test_released_selectors_leave_between_ticks_a_slice_per_turn() -> None:
    n = 3 * SETTLE_SLICE
    async with Broker(port=0, sys_interval=0, tick_interval=1.0, content_engine="iccounting") as b:
        core = b.core
        # from the next tick on, a slice every SETTLE_EVERY (before: 2,048 at the next tick,
        # here all at once)
        drops = await _leave_and_watch(core, n)
        assert max(drops) <= max(SETTLE_SLICE, n // 64), drops
        assert sum(1 for d in drops if d) >= 3  # in slices, not at once
        assert core.router.index.entry_count("s0") == 0


async def test_each_slice_of_the_broker_stops_at_its_time_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker hands ``SETTLE_BUDGET`` to every slice, at its ticks and between them: with a
    budget of a nanosecond, each slice stops after its first removal (the clock is read after
    each), and the backlog still drains, one removal per slice. On main a slice was 512
    removals whatever they cost (15-28 ms of one loop turn in a 100,000-selector teardown)."""
    monkeypatch.setattr(broker_mod, "SETTLE_BUDGET", 1e-9, raising=False)  # main: none
    n = 30
    async with Broker(port=0, sys_interval=0, tick_interval=1.0, content_engine="hema") as b:
        core = b.core
        drops = await _leave_and_watch(core, n)
        assert max(drops) == 1 and sum(drops) == n, drops
        assert len(core.router.engine) == 0
