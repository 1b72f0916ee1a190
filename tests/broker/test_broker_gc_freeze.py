"""A broker holding many sessions freezes the survivors of a full collection (issue 42 item 2).

A full (generation 2) collection walks every long-lived object: with 10,000 sessions holding
content selectors that took ~0.3 s in-process, with 100,000 selectors ~1 s, a stall of the
event loop the next full collection repeats.  After a full collection, once the sessions grew
by ``FREEZE_SESSIONS`` since the last freeze, the broker's tick moves the heap to the
permanent generation (``gc.freeze``), as the store's restore does.  A real embedded broker;
the sessions are in-process subscribers (``Core.local_subscribe``).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

from broker import Broker
from broker._broker import FREEZE_SESSIONS


async def _until(cond: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_a_full_collection_with_many_new_sessions_freezes_the_heap() -> None:
    gc.unfreeze()
    try:
        async with Broker(port=0, sys_interval=0, tick_interval=0.05) as b:
            for i in range(FREEZE_SESSIONS + 100):
                b.core.local_subscribe(f"s{i}", "t/#", None, 0, lambda m, r: None, 0.0)
            assert gc.get_freeze_count() == 0
            gc.collect()
            assert await _until(lambda: gc.get_freeze_count() > 0), "the heap was not frozen"
            frozen = gc.get_freeze_count()
            # no new growth: a later full collection freezes nothing more
            gc.collect()
            assert await _until(lambda: b._full_collections == 0)
            assert gc.get_freeze_count() <= frozen  # (frozen objects freed meanwhile leave it)
    finally:
        gc.unfreeze()


async def test_few_sessions_never_freeze() -> None:
    gc.unfreeze()
    try:
        async with Broker(port=0, sys_interval=0, tick_interval=0.05) as b:
            for i in range(50):
                b.core.local_subscribe(f"s{i}", "t/#", None, 0, lambda m, r: None, 0.0)
            gc.collect()
            assert await _until(lambda: b._full_collections == 0)  # a tick looked at it
            assert gc.get_freeze_count() == 0
        assert b._collected not in gc.callbacks  # stop removed the hook
    finally:
        gc.unfreeze()
