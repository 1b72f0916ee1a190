"""Outbound bridges against a real Debian mosquitto as the remote (issue 40, items 1-2).

An embedded siftmq with an :class:`uplink.Uplink` bridge forwards QoS 1 messages published
by a local aiomqtt client to a paho subscriber on mosquitto; mosquitto is stopped while the
local publisher goes on (its PUBACKs still come: the bridge's durable session queues), and
when it is back every message arrives, in order, for MQTT 5 and 3.1.1 towards the remote.
Waits are on conditions (the collector's list, the bridge's state), never fixed sleeps.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiomqtt
import pytest

from broker import Broker
from tests.uplink._remote import MOSQUITTO, Collector, Mosquitto, central, down_remote
from tests.waiting import eventually
from uplink import Direction, TopicRule, Uplink

pytestmark = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (make installs it)")


def in_order(got: list[tuple[str, bytes, bool]], topic: str) -> list[int]:
    """Sequence numbers received on ``topic`` with redelivered duplicates removed (at least
    once: a message may come twice, but never after a later one)."""
    seqs = [int(p) for t, p, _ in got if t == topic]
    out: list[int] = []
    for s in seqs:
        if out and s <= out[-1]:
            assert s in out, f"{topic}: {s} arrived after {out[-1]} without having arrived before"
            continue
        out.append(s)
    return out


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_out_bridge_survives_remote_outage(tmp_path: Path, protocol: str) -> None:
    remote = Mosquitto(tmp_path)
    remote.start()
    collector = Collector(remote.port, "central/#", v5=False)  # a 3.1.1 persistent session
    collector.start()
    cfg = central(
        remote.port,
        TopicRule("sensors/#", Direction.OUT, 1, remote_prefix="central/"),
        protocol=protocol,
        connect_timeout=5,
    )
    uplink = Uplink([cfg])
    n = 200
    try:
        async with Broker(
            host="127.0.0.1",
            port=0,
            sys_interval=0,
            store_path=":memory:",
            max_queued_messages=10_000,
            hooks=[uplink],
        ) as b:
            bridge = uplink.bridges["central"]
            await asyncio.wait_for(bridge.wait_connected(), 10)
            async with aiomqtt.Client("127.0.0.1", b.port, identifier="pub") as pub:
                for i in range(n):
                    await pub.publish(f"sensors/{i % 2}", str(i).encode(), qos=1)
                await eventually(lambda: len({p for _, p, _ in collector.messages()}) == n, 20)
                remote.stop()
                await eventually(lambda: not bridge.state.connected, 10)
                for i in range(n, 3 * n):  # PUBACKed locally while the remote is away
                    await pub.publish(f"sensors/{i % 2}", str(i).encode(), qos=1)
                assert uplink.sys_values()["$SYS/uplink/central/queued"] == str(2 * n)
                # the bridge retries while the remote is away: wait for a counted failure (a
                # fast machine published the 400 before the first retry)
                await eventually(lambda: bool(bridge.state.failures), 20)
                remote.start()
                try:
                    await eventually(lambda: len({p for _, p, _ in collector.messages()}) == 3 * n, 30)
                except TimeoutError:
                    raise AssertionError(
                        f"{len(collector.messages())} received; {bridge.state}; {uplink.sys_values()}"
                    ) from None
            got = collector.messages()
            assert in_order(got, "central/sensors/0") == list(range(0, 3 * n, 2))
            assert in_order(got, "central/sensors/1") == list(range(1, 3 * n, 2))
            assert bridge.state.sent >= 2 * n  # the queued ones, acknowledged by mosquitto
            assert bridge.state.failures  # the outage was counted
            await eventually(lambda: uplink.sys_values()["$SYS/uplink/central/queued"] == "0", 10)
    finally:
        collector.stop()
        remote.stop()


async def test_the_queue_bound_drops_the_newest_and_counts_them(tmp_path: Path) -> None:
    """At ``max_queued_messages`` the bridge's session drops newer QoS 1 messages, counted in
    ``queue_overflow`` (docs/bridging-out.md, "The store-and-forward bound"); the ones kept
    arrive when the remote is back."""
    remote, collector = down_remote(tmp_path)
    cfg = central(remote.port, TopicRule("sensors/#", Direction.OUT, 1, remote_prefix="central/"))
    uplink = Uplink([cfg])
    try:
        async with Broker(
            host="127.0.0.1", port=0, sys_interval=0, max_queued_messages=50, hooks=[uplink]
        ) as b:
            bridge = uplink.bridges["central"]
            await eventually(lambda: bridge.state.connects >= 1, 10)  # its local session exists
            async with aiomqtt.Client("127.0.0.1", b.port, identifier="pub") as pub:
                for i in range(80):
                    await pub.publish("sensors/a", str(i).encode(), qos=1)
            assert b.core.stats.queue_overflow == 30
            assert uplink.sys_values()["$SYS/uplink/central/queued"] == "50"
            remote.start()
            await eventually(lambda: len({p for _, p, _ in collector.messages()}) == 50, 30)
            assert in_order(collector.messages(), "central/sensors/a") == list(range(50))
    finally:
        collector.stop()
        remote.stop()
