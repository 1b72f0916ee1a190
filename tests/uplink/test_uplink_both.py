"""Outbound bridges both ways: ``in`` and ``both`` rules, no loops, retained messages, content
filters, and a bridge between two siftmq brokers (issue 40, item 3).

Loop checks use a marker instead of a fixed wait: after the two messages under test, one more
is published at the remote; an echo of the edge's message would travel the same
remote -> edge path ahead of it, so once the marker has arrived everywhere the counts are
final.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import aiomqtt
import pytest

from broker import Broker
from tests.uplink._remote import MOSQUITTO, Collector, Mosquitto, central
from tests.waiting import eventually
from uplink import BridgeConfig, Direction, TopicRule, Uplink


class Recorder:
    """An aiomqtt subscriber recording (topic, payload, retain) in the background."""

    def __init__(self, port: int, topic_filter: str, name: str) -> None:
        self.port, self.filter, self.name = port, topic_filter, name
        self.got: list[tuple[str, bytes, bool]] = []
        self.ready = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async with aiomqtt.Client("127.0.0.1", self.port, identifier=self.name) as c:
            await c.subscribe(self.filter, qos=1)
            self.ready.set()
            async for m in c.messages:
                assert isinstance(m.payload, bytes)
                self.got.append((str(m.topic), m.payload, m.retain))

    async def __aenter__(self) -> Recorder:
        self.task = asyncio.create_task(self._run())
        await asyncio.wait_for(self.ready.wait(), 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    def payloads(self) -> Counter[bytes]:
        return Counter(p for _, p, _ in self.got)


async def _pub(port: int, topic: str, payload: bytes, retain: bool = False) -> None:
    async with aiomqtt.Client("127.0.0.1", port) as c:
        await c.publish(topic, payload, qos=1, retain=retain)


def _bridge(port: int, protocol: str, *rules: TopicRule) -> BridgeConfig:
    return central(port, *rules, protocol=protocol)


async def _both_ways_exactly_once(edge: int, central: int) -> None:
    async with (
        Recorder(edge, "shared/#", "edge-sub") as at_edge,
        Recorder(central, "shared/#", "central-sub") as at_center,
    ):
        await _pub(edge, "shared/from-edge", b"e")
        await _pub(central, "shared/from-center", b"c")
        await _pub(central, "shared/marker", b"m")
        await eventually(lambda: at_edge.payloads()[b"m"] == 1 and at_center.payloads()[b"m"] == 1, 10)
        await eventually(lambda: at_edge.payloads()[b"e"] == 1 and at_center.payloads()[b"e"] == 1, 10)
        assert at_edge.payloads() == Counter({b"e": 1, b"c": 1, b"m": 1})
        assert at_center.payloads() == Counter({b"e": 1, b"c": 1, b"m": 1})


@pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (make installs it)")
@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_both_ways_with_mosquitto_without_loops(tmp_path: Path, protocol: str) -> None:
    remote = Mosquitto(tmp_path)
    remote.start()
    uplink = Uplink([_bridge(remote.port, protocol, TopicRule("shared/#", Direction.BOTH, 1))])
    try:
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as b:
            await asyncio.wait_for(uplink.bridges["central"].wait_connected(), 10)
            await _both_ways_exactly_once(b.port, remote.port)
            assert uplink.bridges["central"].state.sent >= 1
            assert uplink.bridges["central"].state.received >= 2
    finally:
        remote.stop()


@pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (make installs it)")
@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_retained_prefixes_and_filters_cross_both_ways(tmp_path: Path, protocol: str) -> None:
    remote = Mosquitto(tmp_path)
    remote.start()
    rules = (
        TopicRule("status/#", Direction.OUT, 1, local_prefix="edge/", remote_prefix="sites/a/"),
        TopicRule("cmd/#", Direction.IN, 1, local_prefix="edge/", remote_prefix="sites/a/"),
        TopicRule("temp/#", Direction.OUT, 1, filter="temp > 30"),
    )
    uplink = Uplink([_bridge(remote.port, protocol, *rules)])
    try:
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as b:
            # retained before the bridge exists: sent when the bridge subscribes locally
            await _pub(b.port, "edge/status/door", b"open", retain=True)
            await asyncio.wait_for(uplink.bridges["central"].wait_connected(), 10)
            bridge = uplink.bridges["central"]
            await eventually(lambda: bridge.state.sent >= 1, 10)
            late = Collector(remote.port, "sites/#", client_id="late", v5=True)
            await asyncio.to_thread(late.start)
            try:
                await eventually(lambda: ("sites/a/status/door", b"open", True) in late.messages(), 10)
            finally:
                late.stop()
            # remote -> local with prefixes; retained crosses as retained
            await _pub(remote.port, "sites/a/cmd/reboot", b"now", retain=True)
            await eventually(lambda: bridge.state.received >= 1, 10)
            async with Recorder(b.port, "edge/#", "edge-late") as r:
                await eventually(lambda: ("edge/cmd/reboot", b"now", True) in r.got, 10)
            # content filter: only matching payloads cross
            async with Recorder(remote.port, "temp/#", "temps") as temps:
                await _pub(b.port, "temp/a", b'{"temp": 20}')
                await _pub(b.port, "temp/a", b'{"temp": 35}')
                await eventually(lambda: bridge.state.filtered == 1, 10)
                await eventually(lambda: temps.payloads()[b'{"temp": 35}'] == 1, 10)
                assert temps.payloads() == Counter({b'{"temp": 35}': 1})
    finally:
        remote.stop()


async def test_a_bridge_between_two_siftmq_brokers() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        uplink = Uplink([_bridge(central.port, "5", TopicRule("shared/#", Direction.BOTH, 1))])
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge:
            await asyncio.wait_for(uplink.bridges["central"].wait_connected(), 10)
            await _both_ways_exactly_once(edge.port, central.port)


@pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (make installs it)")
async def test_in_messages_wait_at_the_remote_while_the_edge_is_down(tmp_path: Path) -> None:
    """``in`` rules: the remote keeps the bridge's session (clean start off) while the edge is
    stopped; the QoS 1 messages published there meanwhile arrive when the edge is back."""
    remote = Mosquitto(tmp_path)
    remote.start()
    store = str(tmp_path / "edge.db")
    cfg = _bridge(remote.port, "5", TopicRule("cmd/#", Direction.IN, 1))
    try:
        uplink = Uplink([cfg])
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=store, hooks=[uplink]) as b:
            await asyncio.wait_for(uplink.bridges["central"].wait_connected(), 10)
            # a persistent local subscriber: its session (and queue) outlive the edge's stop
            async with aiomqtt.Client("127.0.0.1", b.port, identifier="device", clean_session=False) as c:
                await c.subscribe("cmd/#", qos=1)
        for i in range(20):
            await _pub(remote.port, f"cmd/{i % 2}", str(i).encode())
        uplink = Uplink([cfg])
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=store, hooks=[uplink]) as b:
            bridge = uplink.bridges["central"]
            try:
                await eventually(lambda: bridge.state.received >= 20, 15)
            except TimeoutError:
                raise AssertionError(str(bridge.state)) from None
            got: list[int] = []
            async with aiomqtt.Client("127.0.0.1", b.port, identifier="device", clean_session=False) as c:
                async with asyncio.timeout(10):
                    async for m in c.messages:
                        assert isinstance(m.payload, bytes)
                        got.append(int(m.payload))
                        if len(got) == 20:
                            break
            assert sorted(got) == list(range(20))
            assert [g for g in got if g % 2 == 0] == list(range(0, 20, 2))  # in order per topic
    finally:
        remote.stop()
