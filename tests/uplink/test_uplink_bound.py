"""A bridge's queue bound of its own (issue 40: count and bytes, a documented policy at the bound).

The remote mosquitto is down; a local publisher sends more QoS 1 messages than the bridge's
bound allows (all PUBACKed locally); the bridge's ``queue_dropped`` counter in ``$SYS`` and
/metrics says how many were dropped, and once the remote is back exactly the messages the
policy keeps arrive, in order: the oldest with ``drop_newest``, the most recent with
``drop_oldest``.  The broker-wide ``max_queued_messages`` (1000 here) does not apply to it.
"""

from __future__ import annotations

from pathlib import Path

import aiomqtt
import pytest

from broker import Broker
from tests.uplink._remote import MOSQUITTO, central, down_remote
from tests.uplink.test_uplink_mosquitto import in_order
from tests.waiting import eventually
from uplink import BridgeConfig, Direction, TopicRule, Uplink

pytestmark = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (make installs it)")

TOPIC = "sensors/a"  # 9 bytes; payloads are 91 bytes: 100 bytes per message


def _payload(i: int) -> bytes:
    return str(i).encode().ljust(91, b".")


@pytest.mark.parametrize(
    ("policy", "messages", "max_bytes", "kept"),
    [
        ("drop_newest", 30, 0, range(30)),
        ("drop_oldest", 30, 0, range(50, 80)),
        ("drop_oldest", 0, 2000, range(60, 80)),  # 20 messages of 100 bytes
        ("drop_newest", 5000, 1500, range(15)),  # the bytes bound comes first
    ],
)
async def test_the_bridge_queue_bound_and_its_policy(
    tmp_path: Path, policy: str, messages: int, max_bytes: int, kept: range
) -> None:
    remote, collector = down_remote(tmp_path)
    cfg = central(
        remote.port,
        TopicRule("sensors/#", Direction.OUT, 1, remote_prefix="central/"),
        max_queued_messages=messages,
        max_queued_bytes=max_bytes,
        queue_policy=policy,
    )
    uplink = Uplink([cfg])
    try:
        async with Broker(
            host="127.0.0.1", port=0, sys_interval=0, store_path=":memory:", hooks=[uplink]
        ) as b:
            bridge = uplink.bridges["central"]
            await eventually(lambda: bridge.state.connects >= 1, 10)  # its local session exists
            async with aiomqtt.Client("127.0.0.1", b.port, identifier="pub") as pub:
                for i in range(80):
                    await pub.publish(TOPIC, _payload(i), qos=1)
            sys = uplink.sys_values()
            assert sys["$SYS/uplink/central/queue_dropped"] == str(80 - len(kept))
            assert sys["$SYS/uplink/central/queued"] == str(len(kept))
            assert sys["$SYS/uplink/central/queued_bytes"] == str(100 * len(kept))
            assert uplink.metric_values()["uplink_queue_dropped"]["central"] == 80 - len(kept)
            assert b.core.stats.queue_overflow == 80 - len(kept)
            remote.start()
            await eventually(lambda: len({p for _, p, _ in collector.messages()}) == len(kept), 30)
            await eventually(lambda: uplink.sys_values()["$SYS/uplink/central/queued"] == "0", 10)
            got = [int(p.rstrip(b".")) for p in {p: None for _, p, _ in collector.messages()}]
            assert in_order([("t", str(i).encode(), False) for i in got], "t") == list(kept)
            assert uplink.sys_values()["$SYS/uplink/central/queued_bytes"] == "0"
    finally:
        collector.stop()
        remote.stop()


def test_bad_queue_keys_are_refused() -> None:
    rule = (TopicRule("a/#"),)
    with pytest.raises(ValueError, match="queue_policy"):
        BridgeConfig(name="x", urls=("mqtt://h",), topics=rule, queue_policy="wait")
    with pytest.raises(ValueError, match="max_queued_messages"):
        BridgeConfig(name="x", urls=("mqtt://h",), topics=rule, max_queued_bytes=-1)
