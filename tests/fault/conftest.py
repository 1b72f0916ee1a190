"""Raw clients opened by a fault test are closed on that test's own event loop (they are
collected in ``RawClient.instances``; a later test's fixture must not find them)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from tests.rawclient import RawClient


@pytest_asyncio.fixture(autouse=True)
async def _close_raw_clients() -> AsyncIterator[None]:
    yield
    await RawClient.close_all()
