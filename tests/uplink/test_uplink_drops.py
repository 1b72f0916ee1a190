"""A bridge's undeliverable messages counted by reason (issue 40, brief I item 3).

``dropped`` (``$SYS/uplink/<name>/dropped``, ``siftmq_uplink_dropped_total``) is the total; its
reasons are ``too_large`` (bigger than the remote's Maximum Packet Size), ``no_rule`` (no rule
matches the topic: a queued message whose rule a reload removed, tests/uplink/
test_uplink_reload.py) and ``refused`` (the destination answered with a reason code >= 0x80),
in ``$SYS/uplink/<name>/dropped/<reason>``, ``siftmq_uplink_dropped_<reason>_total`` and the
admin API's ``dropped``.  The remote is an embedded siftmq with a small maximum packet size and
an authorization hook refusing one topic.
"""

from __future__ import annotations

import asyncio

import aiomqtt

from broker import Broker
from broker.hooks import Hooks
from tests.waiting import eventually
from uplink import BridgeConfig, Direction, TopicRule, Uplink


class RefuseSecret(Hooks):
    def authorize(self, client_id: str, username: str | None, action: str, topic: str) -> bool | None:
        return False if action == "publish" and topic.startswith("t/secret") else None


async def test_undeliverable_messages_are_counted_by_reason_and_in_total() -> None:
    async with Broker(
        host="127.0.0.1", port=0, sys_interval=0, max_packet_size=512, hooks=[RefuseSecret()]
    ) as central:
        cfg = BridgeConfig(
            name="up",
            urls=(f"mqtt://127.0.0.1:{central.port}",),
            topics=(TopicRule("t/#", Direction.OUT, 1),),
            backoff_min=0.05,
            backoff_max=0.2,
        )
        uplink = Uplink([cfg])
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge:
            bridge = uplink.bridges["up"]
            await asyncio.wait_for(bridge.wait_connected(), 10)
            got = central.subscribe("t/#")
            async with got, aiomqtt.Client("127.0.0.1", edge.port) as pub:
                await pub.publish("t/big", b"x" * 2000, qos=1)
                await pub.publish("t/secret", b"s", qos=1)
                await pub.publish("t/secret", b"s", qos=1)
                await pub.publish("t/ok", b"y", qos=1)
                async with asyncio.timeout(10):
                    m = await got.queue.get()
            assert (m.topic, m.payload) == ("t/ok", b"y")
            await eventually(lambda: bridge.state.dropped == 3, 10)
            st = bridge.state
            assert (st.too_large, st.refused, st.no_rule, st.sent) == (1, 2, 0, 1)
            sys = uplink.sys_values()
            assert sys["$SYS/uplink/up/dropped"] == "3"
            assert sys["$SYS/uplink/up/dropped/too_large"] == "1"
            assert sys["$SYS/uplink/up/dropped/refused"] == "2"
            assert sys["$SYS/uplink/up/dropped/no_rule"] == "0"
            metrics = uplink.metric_values()
            assert metrics["uplink_dropped"]["up"] == 3
            assert metrics["uplink_dropped_too_large"]["up"] == 1
            assert metrics["uplink_dropped_refused"]["up"] == 2
            assert metrics["uplink_dropped_no_rule"]["up"] == 0
            (status,) = uplink.bridge_status()
            assert dict(status.dropped) == {
                "filtered": 0,
                "queue_bound": 0,
                "too_large": 1,
                "no_rule": 0,
                "refused": 2,
            }
            assert status.to_json()["dropped_total"] == 3
