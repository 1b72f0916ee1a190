"""QoS 2 across a bridge is exactly once end to end (issue 40, item 2: "exactly once where the
remote supports it"), through a restart of the remote mid-stream.

A local publisher sends QoS 2 messages to the edge, whose bridge (rule QoS 2) forwards them to
a real mosquitto, where a persistent QoS 2 subscriber records them.  mosquitto is stopped in
the middle of the stream (SIGTERM: it writes its persistence file, as a restarted remote that
keeps its sessions does) while the publisher goes on, then started again: every message
arrives exactly once (no duplicate, no loss) and in order.  The bridge relays each QoS 2
message under the local broker's packet identifier, so a message sent again after the
reconnection reaches mosquitto under the identifier it already holds and is not delivered
twice (uplink/_bridge.py).  The same from the remote in: QoS 2 messages waiting at mosquitto
for the bridge cross to a local subscriber, the bridge's connection to mosquitto cut after a
third of them.  (Not a restart of mosquitto there: Debian's mosquitto 2.0.11 restores a
QoS 2 message it had queued for a session and then sent and released as not yet sent, and
sends it again as a new PUBLISH after its restart: a duplicate no client can tell apart; found
by this test, docs/bridging-out.md "QoS 2".)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiomqtt
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from broker import Broker
from tests.uplink._remote import MOSQUITTO, Collector, Cutter, Mosquitto, central
from tests.waiting import eventually
from uplink import Direction, TopicRule, Uplink

pytestmark = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (make installs it)")

N = 300


def _seqs(got: list[tuple[str, bytes, bool]]) -> list[int]:
    return [int(p) for _, p, _ in got]


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_qos2_out_is_exactly_once_through_a_remote_restart(tmp_path: Path, protocol: str) -> None:
    remote = Mosquitto(tmp_path)
    remote.start()
    collector = Collector(remote.port, "central/#", v5=False, qos=2)
    collector.start()
    cfg = central(
        remote.port, TopicRule("sensors/#", Direction.OUT, 2, remote_prefix="central/"), protocol=protocol
    )
    uplink = Uplink([cfg])
    try:
        async with Broker(
            host="127.0.0.1", port=0, sys_interval=0, store_path=":memory:", hooks=[uplink]
        ) as b:
            bridge = uplink.bridges["central"]
            await asyncio.wait_for(bridge.wait_connected(), 10)
            async with aiomqtt.Client("127.0.0.1", b.port, identifier="pub") as pub:

                async def publish() -> None:
                    for i in range(N):
                        await pub.publish("sensors/x", str(i).encode(), qos=2)

                task = asyncio.create_task(publish())
                await eventually(lambda: len(collector.messages()) >= N // 3, 20)
                remote.stop()  # mid-stream, messages in flight on the bridge
                before = len(set(_seqs(collector.messages())))
                assert before < N, "the stream ended before the restart: nothing tested"
                await eventually(lambda: not bridge.state.connected, 10)
                await eventually(lambda: bool(bridge.state.failures), 20)
                remote.start()
                await task
                await eventually(lambda: len(set(_seqs(collector.messages()))) == N, 30)
                await eventually(lambda: uplink.sys_values()["$SYS/uplink/central/queued"] == "0", 10)
            got = _seqs(collector.messages())
            assert got == list(range(N)), f"duplicates or disorder: {len(got)} received"
    finally:
        collector.stop()
        remote.stop()


async def test_qos2_in_is_exactly_once_through_a_remote_restart(tmp_path: Path) -> None:
    remote = Mosquitto(tmp_path)
    remote.start()
    # the bridge's session at mosquitto exists (as after an earlier run) and N QoS 2 messages
    # wait in it, all acknowledged to their publisher before the restart (so what arrives
    # twice could only be the bridge's doing, not the publisher's sending again)
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = 3600
    bridge_id = paho.Client(CallbackAPIVersion.VERSION2, client_id="siftmq-central", protocol=paho.MQTTv5)
    bridge_id.connect("127.0.0.1", remote.port, clean_start=False, properties=props)
    bridge_id.loop_start()
    await eventually(bridge_id.is_connected, 10)
    granted: list[int] = []  # the SUBACK's reason codes (paho's network thread)
    bridge_id.on_subscribe = lambda _c, _u, _mid, codes, _p: granted.extend(rc.value for rc in codes)
    sub_info = bridge_id.subscribe([("central/cmd/#", SubscribeOptions(qos=2, noLocal=True))])
    assert sub_info[0] == paho.MQTT_ERR_SUCCESS
    # the subscription is in place at mosquitto before anything is published to it (the
    # publisher's own acknowledgements say nothing about another client's SUBSCRIBE)
    await eventually(lambda: bool(granted), 10)
    assert granted == [2]
    pub = paho.Client(CallbackAPIVersion.VERSION2, client_id="remote-pub")
    pub.connect("127.0.0.1", remote.port)
    pub.loop_start()
    try:
        await eventually(pub.is_connected, 10)
        bridge_id.disconnect()
        bridge_id.loop_stop()
        infos = [pub.publish("central/cmd/x", str(i).encode(), qos=2) for i in range(N)]
        await eventually(lambda: all(i.is_published() for i in infos), 20)
    finally:
        pub.disconnect()
        pub.loop_stop()
    cutter = Cutter(remote.port)
    await cutter.start()
    cfg = central(cutter.port, TopicRule("cmd/#", Direction.IN, 2, remote_prefix="central/"))
    uplink = Uplink([cfg])
    got: list[int] = []
    try:
        async with Broker(
            host="127.0.0.1", port=0, sys_interval=0, store_path=":memory:", hooks=[uplink]
        ) as b:
            bridge = uplink.bridges["central"]
            async with aiomqtt.Client("127.0.0.1", b.port, identifier="sub") as sub:
                await sub.subscribe("cmd/#", qos=2)

                async def collect() -> None:
                    async for m in sub.messages:
                        got.append(int(m.payload))  # type: ignore[arg-type]

                reader = asyncio.create_task(collect())
                await eventually(lambda: bridge.state.received >= N // 3, 20)
                cutter.cut()  # mid-stream: the bridge has relayed a third of them
                assert bridge.state.received < N, "the stream ended before the cut: nothing tested"
                await eventually(lambda: not bridge.state.connected, 10)
                try:
                    await eventually(lambda: len(set(got)) == N, 30)
                except TimeoutError:
                    raise AssertionError(f"{len(set(got))} of {N}; {bridge.state}") from None
                reader.cancel()
        dups = sorted({x for x in got if got.count(x) > 1})
        assert got == list(range(N)), f"twice: {dups}"
    finally:
        await cutter.stop()
        remote.stop()
