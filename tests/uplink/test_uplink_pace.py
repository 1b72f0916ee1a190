"""``queue_policy = "pace"`` (issue 40, brief I item 2): at the bridge's bound its local
publishers wait instead of losing messages.

The remote mosquitto is down; the bridge's bound is 10 messages.  A local QoS 1 publisher
sends 30 messages for the bridge, one PUBACK at a time: it gets 11 PUBACKs (the 11th message
is queued past the bound: it was being routed when the bound was reached) and is then paused
(its socket is not read, its 12th PUBLISH waits unacknowledged).  Meanwhile another publisher
of a topic the bridge does not carry is not paused, and a local subscriber gets its messages.
Once mosquitto is back the queue drains, the publisher resumes below 3/4 of the bound, and
all 30 messages reach the remote subscriber in order: nothing dropped.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import aiomqtt
import pytest

from broker import Broker
from tests.uplink._remote import MOSQUITTO, central, down_remote
from tests.uplink.test_uplink_mosquitto import in_order
from tests.waiting import eventually, next_message
from uplink import BridgeConfig, Direction, TopicRule, Uplink

pytestmark = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (make installs it)")

BOUND = 10
N = 30


async def test_pace_pauses_the_bridges_publishers_at_the_bound_and_loses_nothing(tmp_path: Path) -> None:
    remote, collector = down_remote(tmp_path)
    cfg = central(
        remote.port,
        TopicRule("sensors/#", Direction.OUT, 1, remote_prefix="central/"),
        max_queued_messages=BOUND,
        queue_policy="pace",
    )
    uplink = Uplink([cfg])
    acked = 0

    async def publish_all(port: int) -> None:
        nonlocal acked
        async with aiomqtt.Client("127.0.0.1", port, identifier="pub") as pub:
            for i in range(N):
                await pub.publish("sensors/a", str(i).encode(), qos=1)
                acked += 1

    try:
        async with Broker(
            host="127.0.0.1", port=0, sys_interval=0, store_path=":memory:", hooks=[uplink]
        ) as b:
            bridge = uplink.bridges["central"]
            await eventually(lambda: bridge.state.connects >= 1, 10)  # its local session exists
            bound = b.core.queue_bounds["$uplink/central"]
            task = asyncio.create_task(publish_all(b.port))
            await eventually(lambda: b.core.stats.publishers_paused == 1 and acked == BOUND + 1, 10)
            assert [c.client_id for c in bound.paced] == ["pub"]
            assert len(b.core.sessions["$uplink/central"].queue) == BOUND + 1
            b.core._check()  # the pause gauge and the pause edges agree (core/_qbound.py)

            # the broker serves on; a publisher of another topic is not paced
            async with (
                aiomqtt.Client("127.0.0.1", b.port, identifier="sub") as sub,
                aiomqtt.Client("127.0.0.1", b.port, identifier="other") as other,
            ):
                await sub.subscribe("local/#", qos=1)
                for i in range(5):
                    await other.publish("local/x", str(i).encode(), qos=1)
                got = [(await next_message(sub, 10)).payload for _ in range(5)]
            assert got == [str(i).encode() for i in range(5)]
            assert acked == BOUND + 1 and not task.done()  # the 12th PUBLISH is not read: no PUBACK
            sys = uplink.sys_values()
            assert sys["$SYS/uplink/central/queue_paces"] == "1"
            assert sys["$SYS/uplink/central/queue_dropped"] == "0"
            assert uplink.metric_values()["uplink_queue_paces"]["central"] == 1

            remote.start()  # the queue drains, the publisher resumes
            await asyncio.wait_for(task, 30)
            await eventually(lambda: len({p for _, p, _ in collector.messages()}) == N, 30)
            got_remote = [int(p) for p in {p: None for _, p, _ in collector.messages()}]
            assert in_order([("t", str(i).encode(), False) for i in got_remote], "t") == list(range(N))
            assert uplink.sys_values()["$SYS/uplink/central/queue_dropped"] == "0"
            assert b.core.stats.queue_overflow == 0
            assert b.core.stats.publishers_paused == 0 and not bound.paced
            b.core._check()
    finally:
        collector.stop()
        remote.stop()


def test_pace_is_a_queue_policy() -> None:
    cfg = BridgeConfig(name="x", urls=("mqtt://h",), topics=(TopicRule("a/#"),), queue_policy="pace")
    assert cfg.own_queue_bound


async def test_a_reload_away_from_pace_resumes_the_paused_publishers(dead_port: int) -> None:
    dead = dead_port  # nothing listens (a bound socket that does not listen): the queue only grows
    cfg = central(
        dead,
        TopicRule("sensors/#", Direction.OUT, 1),
        max_queued_messages=BOUND,
        queue_policy="pace",
    )
    current = [cfg]
    uplink = Uplink(current, source=lambda: current)
    acked = 0

    async def publish_all(port: int) -> None:
        nonlocal acked
        async with aiomqtt.Client("127.0.0.1", port, identifier="pub") as pub:
            for i in range(N):
                await pub.publish("sensors/a", str(i).encode(), qos=1)
                acked += 1

    async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=":memory:", hooks=[uplink]) as b:
        await eventually(lambda: uplink.bridges["central"].state.connects >= 1, 10)
        task = asyncio.create_task(publish_all(b.port))
        await eventually(lambda: b.core.stats.publishers_paused == 1 and acked == BOUND + 1, 10)
        current[0] = dataclasses.replace(cfg, queue_policy="drop_newest")
        result = await b.reload()
        assert result.ok and "queue_policy changed" in "; ".join(result.changed)
        await asyncio.wait_for(task, 10)  # resumed: the rest were acknowledged and dropped
        assert b.core.stats.publishers_paused == 0
        s = b.core.sessions["$uplink/central"]
        held = len(s.queue) + len(s.inflight)  # the restarted bridge's session may take one in flight
        assert held in {BOUND + 1, BOUND + 2}
        assert uplink.sys_values()["$SYS/uplink/central/queue_dropped"] == str(N - held)
        b.core._check()
