"""Limits inside the session (docs/broker.md, "Limits"): subscriptions per client, topic levels,
refused selectors: the reason codes on the wire and the ``$SYS`` counters."""

from __future__ import annotations

import logging

import pytest

from broker import Broker
from broker.packets import Disconnect, Publish, ReasonCode, Suback
from tests.rawclient import RawClient

RC = ReasonCode


def sys_value(b: Broker, key: str) -> int:
    return int(b.core.sys_values(0.0)[key])


@pytest.mark.parametrize(("version", "quota_code"), [(5, RC.QUOTA_EXCEEDED), (4, RC.UNSPECIFIED_ERROR)])
async def test_subscriptions_per_client(version: int, quota_code: ReasonCode) -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, max_subscriptions_per_client=3) as b:
        c, _ = await RawClient.connect(b.port, "subs", version)
        ack = await c.subscribe("a/1", "a/2", "a/3", "a/4")
        assert isinstance(ack, Suback)
        assert ack.reason_codes == (RC.GRANTED_QOS_1,) * 3 + (quota_code,)
        again = await c.subscribe("a/1")  # re-subscribing an existing filter is not a new one
        assert again.reason_codes == (RC.GRANTED_QOS_1,)
        assert sys_value(b, "$SYS/broker/subscriptions/refused/quota") == 1
        await c.unsubscribe("a/2")
        assert (await c.subscribe("a/5")).reason_codes == (RC.GRANTED_QOS_1,)
        b.core._check()
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


@pytest.mark.parametrize("version", [5, 4])
async def test_topic_levels_subscribe(version: int) -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, max_topic_levels=3) as b:
        c, _ = await RawClient.connect(b.port, "lv", version)
        ack = await c.subscribe("a/b/c", "a/b/c/d", "a/+/#")
        bad = RC.TOPIC_FILTER_INVALID if version == 5 else RC.UNSPECIFIED_ERROR
        assert ack.reason_codes == (RC.GRANTED_QOS_1, bad, RC.GRANTED_QOS_1)
        assert sys_value(b, "$SYS/broker/topic_levels/refused") == 1
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


async def test_topic_levels_publish_v5_disconnect_311_close() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, max_topic_levels=3) as b:
        c5, _ = await RawClient.connect(b.port, "p5", 5)
        assert await c5.publish1("a/b/c") is not None  # at the limit: accepted
        c5.send(Publish("a/b/c/d", b"x", 1, packet_id=9))
        got = await c5.closed()
        assert [type(p) for p in got] == [Disconnect]
        assert got[0].reason_code == RC.TOPIC_NAME_INVALID  # type: ignore[union-attr]
        c4, _ = await RawClient.connect(b.port, "p4", 4)
        c4.send(Publish("a/b/c/d", b"x", 0))
        assert await c4.closed() == []
        assert sys_value(b, "$SYS/broker/topic_levels/refused") == 2


async def test_refused_selectors_counted_and_log_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    complex_sel = " AND ".join(f"(a{i} = 1 OR b{i} = 2)" for i in range(10))  # 2**10 alternatives
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        c, _ = await RawClient.connect(b.port, "sel", 5)
        with caplog.at_level(logging.WARNING, logger="broker"):
            for _ in range(20):
                ack = await c.subscribe(f"$filter/{complex_sel}/t", "$filter/n >/t")
                assert ack.reason_codes == (RC.TOPIC_FILTER_INVALID, RC.TOPIC_FILTER_INVALID)
        assert sys_value(b, "$SYS/broker/subscriptions/refused/selector") == 40
        assert len([r for r in caplog.records if "content filter refused" in r.getMessage()]) == 1
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace
