"""Fixtures of the broker tests: an embedded broker on port 0 (and the plugin's fixture)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from broker import Broker
from broker.testing import broker_fixture

__all__ = ["broker", "broker_fixture"]


@pytest_asyncio.fixture
async def broker() -> AsyncIterator[Broker]:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05) as b:
        yield b
