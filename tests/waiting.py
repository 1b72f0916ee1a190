"""Waiting for a condition of the broker's state in tests (no fixed sleeps).

``await eventually(lambda: not b.core.connections)`` re-checks the condition every 10 ms on the
test's event loop (which is the broker's loop, so the broker keeps running in between) and fails
with ``TimeoutError`` after ``timeout`` seconds.  ``await next_message(client)`` is the next
message an aiomqtt client receives, with the same kind of timeout.  ``until(condition)`` is
``eventually`` for a test without an event loop (a thread or a process does the work): it
re-checks every ``pause`` seconds and fails naming ``what`` after ``timeout`` seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiomqtt

__all__ = ["eventually", "next_message", "until"]


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 (polls broker state that has no event to await)
            await asyncio.sleep(0.01)


async def next_message(c: aiomqtt.Client, timeout: float = 5.0) -> aiomqtt.Message:
    async def first() -> aiomqtt.Message:
        async for m in c.messages:
            return m
        raise AssertionError("no message")

    return await asyncio.wait_for(first(), timeout)


def until(
    condition: Callable[[], bool], timeout: float = 30.0, what: str = "the condition", pause: float = 0.001
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(pause)
