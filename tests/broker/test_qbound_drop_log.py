"""A queue bound's drops (core/_qbound.py) build their log line only when it is logged.

The rate limit (``Core.log_limit``) keeps one line per ``LIMIT_LOG_INTERVAL`` per kind, but
``QueueBound._drop`` formatted the line (the queue's length and bytes) for every dropped message
and threw all but one away.  Here an offline persistent session of a real broker has a bound of
one message; 1,000 QoS 1 messages published past it are all dropped and counted, and the queued
byte count, which the line quotes, is formatted no more often than a line is logged.
"""

from __future__ import annotations

import logging
import time

import aiomqtt
import pytest

from broker import Broker
from broker.core._core import LIMIT_LOG_INTERVAL
from broker.core._qbound import QueueBound
from tests.waiting import eventually

DROPS = 1000


class _CountedInt(int):
    """An int that counts how often it is formatted into a string."""

    formatted = 0

    def __format__(self, spec: str) -> str:
        type(self).formatted += 1
        return int.__format__(self, spec)


async def test_drops_past_a_queue_bound_format_their_line_only_when_logged(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    v311 = aiomqtt.ProtocolVersion.V311
    port = broker.port
    async with aiomqtt.Client("127.0.0.1", port, identifier="sink", clean_session=False, protocol=v311) as c:
        await c.subscribe("t/#", qos=1)
    await eventually(lambda: "sink" in broker.core.sessions and broker.core.sessions["sink"].conn is None)
    bound = broker.core.queue_bounds["sink"] = QueueBound(1)
    await broker.publish("t/0", b"kept", qos=1)
    assert len(broker.core.sessions["sink"].queue) == 1
    assert bound.queued_bytes == len("t/0") + len("kept")
    _CountedInt.formatted = 0
    bound.queued_bytes = _CountedInt(bound.queued_bytes)  # drop_newest leaves it as it is
    caplog.set_level(logging.WARNING)
    started = time.monotonic()
    for i in range(DROPS):
        await broker.publish(f"t/{i}", b"dropped", qos=1)
    assert bound.dropped == DROPS
    assert len(broker.core.sessions["sink"].queue) == 1
    lines = [r for r in caplog.records if "queue at its bound" in r.getMessage()]
    most = 1 + int((time.monotonic() - started) / LIMIT_LOG_INTERVAL)
    assert 1 <= len(lines) <= most, lines  # rate-limited: one, then one per interval
    assert type(bound.queued_bytes) is _CountedInt  # still the counting int the lines quote
    assert _CountedInt.formatted == len(lines)  # once per logged line (was one per drop)
