"""A reload that fails while applying (a hook's prepared reload raises) does not end the
SIGHUP reloads of ``siftmq serve``: before, the exception ended ``SighupReloads``'s task
silently, and every later SIGHUP (a fixed config file too) did nothing and logged nothing.
"""

from __future__ import annotations

import logging

import pytest

from broker._reload import ReloadCounters, SighupReloads
from tests.waiting import eventually


class _Broker:
    def __init__(self) -> None:
        self.reload_counters = ReloadCounters()
        self.calls = 0

    async def reload(self, config: object = None) -> None:
        self.calls += 1
        if self.calls == 1:
            raise ValueError("cannot convert float NaN to integer")


async def test_a_reload_that_raises_leaves_the_next_sighup_working(caplog: pytest.LogCaptureFixture) -> None:
    broker = _Broker()
    reloads = SighupReloads(None, None)
    reloads.start(broker)  # type: ignore[arg-type]
    try:
        with caplog.at_level(logging.ERROR, logger="broker"):
            reloads.wanted.set()
            await eventually(lambda: broker.reload_counters.failed == 1)
            assert "reload: applying failed: ValueError: cannot convert float NaN" in caplog.text
        reloads.wanted.set()
        await eventually(lambda: broker.calls == 2)
        assert reloads.task is not None and not reloads.task.done()
    finally:
        reloads.close()
