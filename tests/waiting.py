"""Waiting for a condition of the broker's state in tests (no fixed sleeps).

``await eventually(lambda: not b.core.connections)`` re-checks the condition every 10 ms on the
test's event loop (which is the broker's loop, so the broker keeps running in between) and fails
with ``TimeoutError`` after ``timeout`` seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["eventually"]


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)
