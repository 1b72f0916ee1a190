"""The browser fixtures of the dashboard's tests (tests/dashboard, tests/admin): one headless
Chromium per test module (skipped where it is not installed) and a fresh page on it per test.
A test module imports both names."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from tests.dashboard.cdp import Chromium, Page, find_chromium


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    binary = find_chromium()
    if binary is None:
        pytest.skip("headless Chromium is not installed (make system-packages installs it)")
    browser = Chromium(binary)
    yield browser
    browser.close()


@pytest_asyncio.fixture
async def page(chromium: Chromium) -> AsyncIterator[Page]:
    url = await asyncio.to_thread(chromium.page_url)
    p = await Page.open(url)
    yield p
    await p.close()
