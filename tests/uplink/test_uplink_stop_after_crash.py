"""Stopping a bridge whose task had ended on an error does not raise it again.

Before, ``Bridge.stop`` re-raised the task's exception: the broker's stop logged a traceback
(``hook Uplink.stopping failed``) and a reload changing that bridge failed half-way, the
bridge gone from the list and from ``/api/v1/bridges``.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from uplink import BridgeConfig, TopicRule
from uplink._bridge import Bridge, LocalEndpoint


async def test_stop_after_the_task_crashed(caplog: pytest.LogCaptureFixture) -> None:
    cfg = BridgeConfig(name="central", urls=("mqtt://127.0.0.1:1",), topics=(TopicRule("x/#"),))
    bridge = Bridge(cfg, LocalEndpoint("127.0.0.1", 1, "pw"))

    async def crash() -> None:
        raise ValueError("cannot convert float NaN to integer")

    bridge._task = asyncio.get_running_loop().create_task(crash())
    await asyncio.wait([bridge._task])
    with caplog.at_level(logging.ERROR, logger="siftmq.uplink"):
        await bridge.stop()  # no exception
    assert "bridge central: had stopped on an error: ValueError: cannot convert float NaN" in caplog.text
