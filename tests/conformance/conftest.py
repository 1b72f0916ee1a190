"""An embedded broker per test (port 0, fast session ticks, no $SYS)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from broker import Broker
from tests.rawclient import RawClient


@pytest_asyncio.fixture
async def broker() -> AsyncIterator[Broker]:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05) as b:
        yield b
        # before the broker stops: a raw client still open never answers the broker's
        # DISCONNECT, and the stop would wait its whole grace (1 s) for it
        await RawClient.close_all()


@pytest_asyncio.fixture(autouse=True)
async def _close_raw_clients() -> AsyncIterator[None]:
    yield
    await RawClient.close_all()
