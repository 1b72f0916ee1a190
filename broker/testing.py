"""Pytest support: an embedded broker on a free port.

Use it with ``pytest_plugins = ["broker.testing"]`` in a ``conftest.py`` (or import
``broker_fixture`` into one); a test that takes ``broker_fixture`` gets a started
:class:`broker.Broker` bound to 127.0.0.1 on a port chosen by the OS (``broker_fixture.port``),
with ``$SYS`` publication off, stopped after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from broker._broker import Broker

__all__ = ["broker_fixture"]


@pytest_asyncio.fixture
async def broker_fixture() -> AsyncIterator[Broker]:
    """A started embedded broker on 127.0.0.1, port 0 (read ``.port``)."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        yield b
