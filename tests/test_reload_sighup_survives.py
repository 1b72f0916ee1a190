"""A reload that fails while applying does not end the SIGHUP reloads of ``siftmq serve``:
before, an exception ended ``SighupReloads``'s task silently, and every later SIGHUP (a fixed
config file too) did nothing and logged nothing.

A real broker, real SIGHUP signals to this process (the handler ``SighupReloads.install``
puts on the loop), and a configuration that fails for real while it is applied: a connection
burst too large for the float the listeners' token buckets keep (``float()`` overflows), after
the checks passed.  The next SIGHUP applies a good configuration.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from broker import Broker
from broker._config import BrokerConfig
from broker._reload import SighupReloads
from tests.waiting import eventually

TOO_LARGE = 10**400  # an int: passes the live field's type check, float() cannot hold it


async def test_a_reload_that_fails_to_apply_leaves_the_next_sighup_working(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as broker:
        config = broker.config
        wanted = [config.replace(connection_burst=TOO_LARGE), config.replace(connection_burst=50)]

        def reconfigure() -> BrokerConfig:
            return wanted.pop(0)

        reloads = SighupReloads(reconfigure, None)
        reloads.install()
        loop = asyncio.get_running_loop()
        try:
            reloads.start(broker)
            with caplog.at_level(logging.ERROR, logger="broker"):
                os.kill(os.getpid(), signal.SIGHUP)
                await eventually(lambda: broker.reload_counters.failed == 1, timeout=30.0)
            assert "applying the configuration failed: OverflowError" in caplog.text
            assert reloads.task is not None and not reloads.task.done()
            os.kill(os.getpid(), signal.SIGHUP)
            await eventually(lambda: broker.reload_counters.done == 1, timeout=30.0)
            assert broker.config.connection_burst == 50 and not wanted
            assert broker.reload_counters.failed == 1
            assert reloads.task is not None and not reloads.task.done()
        finally:
            reloads.close()
            loop.remove_signal_handler(signal.SIGHUP)
