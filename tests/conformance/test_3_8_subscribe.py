"""MQTT 3.8/3.9 SUBSCRIBE/SUBACK, 3.10/3.11 UNSUBSCRIBE/UNSUBACK, with the project's extensions
(docs/reference.md): content filters from both versions and partial unsubscribe (negative entries)."""

from __future__ import annotations

import pytest

from broker import Broker
from broker.packets import Properties, Publish, ReasonCode, SubscriptionRequest
from tests.rawclient import RawClient

RC = ReasonCode


async def _payloads(c: RawClient) -> list[bytes]:
    return [p.payload for p in await c.barrier() if isinstance(p, Publish)]


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_3_9_3_suback_codes_in_order(broker: Broker, v: int) -> None:
    c, _ = await RawClient.connect(broker.port, "sa", v)
    ack = await c.subscribe(
        SubscriptionRequest("a/0", 0), SubscriptionRequest("a/1", 1), SubscriptionRequest("a/2", 2)
    )
    assert ack.reason_codes == (RC.GRANTED_QOS_0, RC.GRANTED_QOS_1, RC.GRANTED_QOS_2)  # [MQTT-3.9.3-1]


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_4_7_1_invalid_filter_refused(broker: Broker, v: int) -> None:
    c, _ = await RawClient.connect(broker.port, "inv", v)
    ack = await c.subscribe(SubscriptionRequest("a/#/b", 1), SubscriptionRequest("ok/+", 1))
    expected = RC.TOPIC_FILTER_INVALID if v == 5 else RC.UNSPECIFIED_ERROR  # 3.1.1: 0x80
    assert ack.reason_codes == (expected, RC.GRANTED_QOS_1)


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_3_8_4_3_resubscribe_replaces(broker: Broker, v: int) -> None:
    c, _ = await RawClient.connect(broker.port, "resub", v)
    await c.subscribe(SubscriptionRequest("rs/t", 0))
    await c.subscribe(SubscriptionRequest("rs/t", 1))
    await c.publish1("rs/t", b"x")
    got = [p for p in await c.barrier() if isinstance(p, Publish)]
    assert [(p.payload, p.qos) for p in got] == [(b"x", 1)]  # one copy, new QoS


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_4_7_2_dollar_topics_not_matched_by_leading_wildcard(broker: Broker, v: int) -> None:
    c, _ = await RawClient.connect(broker.port, "dollar", v)
    await c.subscribe("#", "+/x")
    pub, _ = await RawClient.connect(broker.port, "dollar-p", v)
    await pub.publish1("$data/x", b"hidden")
    await pub.publish1("plain/x", b"seen")
    got = await _payloads(c)
    assert got and set(got) == {b"seen"}  # [MQTT-4.7.2-1]: "$data/x" matched by neither


async def test_content_filter_v5_user_property(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "cf5", 5)
    ack = await c.subscribe(
        SubscriptionRequest("cf/#", 1), properties=Properties(user_properties=(("filter", "temp > 20"),))
    )
    assert ack.reason_codes == (RC.GRANTED_QOS_1,)
    pub, _ = await RawClient.connect(broker.port, "cf5-p", 5)
    await pub.publish1("cf/a", b'{"temp": 25}')
    await pub.publish1("cf/a", b'{"temp": 15}')
    await pub.publish1("cf/a", b"not json")
    assert await _payloads(c) == [b'{"temp": 25}']


async def test_content_filter_311_dollar_filter_prefix(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "cf4", 4)
    ack = await c.subscribe(SubscriptionRequest("$filter/kind = 'a/b' AND n >= 2/cf4/+", 1))
    assert ack.reason_codes == (RC.GRANTED_QOS_1,)
    pub, _ = await RawClient.connect(broker.port, "cf4-p", 4)
    await pub.publish1("cf4/x", b'{"kind": "a/b", "n": 2}')
    await pub.publish1("cf4/x", b'{"kind": "a/b", "n": 1}')
    await pub.publish1("other/x", b'{"kind": "a/b", "n": 5}')
    assert await _payloads(c) == [b'{"kind": "a/b", "n": 2}']


async def test_content_filter_bad_selector_v5_0x8f_with_reason(broker: Broker) -> None:
    c, _ = await RawClient.connect(
        broker.port, "cfbad5", 5, properties=Properties(request_problem_information=1)
    )
    ack = await c.subscribe(
        SubscriptionRequest("cf/#", 1), properties=Properties(user_properties=(("filter", "temp >"),))
    )
    assert ack.reason_codes == (RC.TOPIC_FILTER_INVALID,)
    reason = ack.properties.reason_string
    assert reason and any(ch.isdigit() for ch in reason)  # names the error and its position


async def test_content_filter_bad_selector_311_0x80(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "cfbad4", 4)
    ack = await c.subscribe(SubscriptionRequest("$filter/temp >/cf/#", 1))
    assert ack.reason_codes == (RC.UNSPECIFIED_ERROR,)


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_3_10_4_unsubscribe(broker: Broker, v: int) -> None:
    c, _ = await RawClient.connect(broker.port, "uns", v)
    await c.subscribe("u/t")
    ack = await c.unsubscribe("u/t", "never/subscribed")
    if v == 5:
        assert ack.reason_codes == (RC.SUCCESS, RC.NO_SUBSCRIPTION_EXISTED)  # [MQTT-3.11.3-1]
    await c.publish1("u/t", b"x")
    assert await _payloads(c) == []  # [MQTT-3.10.4-2]


@pytest.mark.parametrize("v", [4, 5])
async def test_partial_unsubscribe_negative_entry(broker: Broker, v: int) -> None:
    c, _ = await RawClient.connect(broker.port, "pu", v)
    await c.subscribe("home/#")
    ack = await c.unsubscribe("home/kitchen/#")
    if v == 5:
        assert ack.reason_codes == (RC.SUCCESS,)  # partial unsubscribe answers 0x00
    pub, _ = await RawClient.connect(broker.port, "pu-p", v)
    await pub.publish1("home/kitchen/temp", b"k")
    await pub.publish1("home/hall/temp", b"h")
    assert await _payloads(c) == [b"h"]
    await c.subscribe("home/kitchen/temp")  # newer than the negative entry, which stays
    await pub.publish1("home/kitchen/temp", b"k2")
    await pub.publish1("home/kitchen/oven", b"o")
    assert await _payloads(c) == [b"k2"]
    await c.subscribe("home/kitchen/#")  # includes the negative entry: removes it
    await pub.publish1("home/kitchen/oven", b"o2")
    assert await _payloads(c) == [b"o2"]


async def test_partial_unsubscribe_switched_off() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, partial_unsubscribe=False) as b:
        c, _ = await RawClient.connect(b.port, "pu-off", 5)
        await c.subscribe("home/#")
        ack = await c.unsubscribe("home/kitchen/#")
        assert ack.reason_codes == (RC.NO_SUBSCRIPTION_EXISTED,)  # pure MQTT
        await c.publish1("home/kitchen/temp", b"k")
        assert await _payloads(c) == [b"k"]
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace
