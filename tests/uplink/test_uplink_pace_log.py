"""The line ``queue_policy = "pace"`` logs when it pauses a publisher names that publisher by
its client id, the client's own string (review rev15): bounded like every client string in a
log line (broker/_logging.py: at most 100 characters shown, a line break escaped), so a client
id can neither make the line long nor forge another line."""

from __future__ import annotations

import asyncio
import logging

import aiomqtt
import pytest

from broker import Broker
from broker._logging import TEXT_FORMAT, JsonFormatter
from tests.uplink._remote import central
from tests.waiting import eventually
from uplink import Direction, TopicRule, Uplink

BOUND = 3
FORGED = "pub\n2026-11-29 00:00:00,000 WARNING broker: forged " + "x" * 5_000


async def test_the_pace_line_bounds_the_publishers_client_id(
    caplog: pytest.LogCaptureFixture, dead_port: int
) -> None:
    caplog.set_level(logging.INFO, logger="broker")
    cfg = central(
        dead_port, TopicRule("s/#", Direction.OUT, 1), max_queued_messages=BOUND, queue_policy="pace"
    )
    uplink = Uplink([cfg])
    acked = 0

    async def publish_all(port: int) -> None:
        nonlocal acked
        async with aiomqtt.Client("127.0.0.1", port, identifier=FORGED) as pub:
            for i in range(2 * BOUND):
                await pub.publish("s/a", str(i).encode(), qos=1)
                acked += 1

    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as b:
        await eventually(lambda: uplink.bridges["central"].state.connects >= 1, 10)
        task = asyncio.create_task(publish_all(b.port))
        try:
            await eventually(lambda: b.core.stats.publishers_paused == 1 and acked == BOUND + 1, 10)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    records = [r for r in caplog.records if "queue at its bound" in r.getMessage()]
    assert len(records) == 1
    # the line names the publisher: its client id cut and escaped (not left out)
    assert "'pub\\n2026-11-29 00:00:00" in records[0].getMessage()
    assert f"... ({len(FORGED)} characters)" in records[0].getMessage()
    for line in (logging.Formatter(TEXT_FORMAT).format(records[0]), JsonFormatter().format(records[0])):
        assert "\n" not in line and len(line) < 1_000, line[:300]
