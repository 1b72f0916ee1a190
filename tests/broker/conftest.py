"""Fixtures of the broker tests: an embedded broker on port 0 (and the plugin's fixture)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from broker import Broker
from broker.testing import broker_fixture
from tests.rawclient import RawClient

__all__ = ["broker", "broker_fixture"]


@pytest_asyncio.fixture
async def broker() -> AsyncIterator[Broker]:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05) as b:
        yield b
        # before the broker stops: a raw client still open never answers the broker's
        # DISCONNECT, and the stop would wait its whole grace (1 s) for it
        await RawClient.close_all()


@pytest_asyncio.fixture(autouse=True)
async def _close_raw_clients() -> AsyncIterator[None]:
    """Close the raw clients a test left open (their sockets would warn in a later test)."""
    yield
    await RawClient.close_all()
