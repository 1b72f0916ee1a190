"""MQTT 3.3-3.7 PUBLISH and its acknowledgement flows, 4.3 QoS, 4.4 redelivery, 3.3.2 properties."""

from __future__ import annotations

import pytest

from broker import Broker
from broker.packets import (
    Disconnect,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    SubscriptionRequest,
)
from tests.rawclient import RawClient

RC = ReasonCode


async def _pair(
    broker: Broker, v: int, filt: str, qos: int = 2, **sub_kw: object
) -> tuple[RawClient, RawClient]:
    sub, _ = await RawClient.connect(broker.port, f"sub-{filt}", v, **sub_kw)  # type: ignore[arg-type]
    await sub.subscribe(SubscriptionRequest(filt, qos))
    pub, _ = await RawClient.connect(broker.port, f"pub-{filt}", v)
    return sub, pub


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_4_3_2_qos1_flow(broker: Broker, v: int) -> None:
    sub, pub = await _pair(broker, v, "q1/t")
    await pub.publish1("q1/t", b"one")  # [MQTT-4.3.2-4] PUBACK
    p = await sub.recv()
    assert isinstance(p, Publish) and p.qos == 1 and p.packet_id and not p.dup and p.payload == b"one"
    sub.send(Puback(p.packet_id))
    assert await sub.barrier() == []


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_4_3_3_qos2_flow_both_directions(broker: Broker, v: int) -> None:
    sub, pub = await _pair(broker, v, "q2/t")
    pub.send(Publish("q2/t", b"two", 2, packet_id=7))
    assert await pub.recv() == Pubrec(7)  # [MQTT-4.3.3-8]
    pub.send(Pubrel(7))
    assert await pub.recv() == Pubcomp(7)  # [MQTT-4.3.3-11]
    p = await sub.recv()
    assert isinstance(p, Publish) and p.qos == 2 and p.payload == b"two"
    assert p.packet_id is not None
    sub.send(Pubrec(p.packet_id))
    assert await sub.recv() == Pubrel(p.packet_id)  # [MQTT-4.3.3-4]
    sub.send(Pubcomp(p.packet_id))
    assert await sub.barrier() == []


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_4_3_3_qos2_not_delivered_twice_on_resend(broker: Broker, v: int) -> None:
    sub, pub = await _pair(broker, v, "q2/once")
    pub.send(Publish("q2/once", b"x", 2, packet_id=9))
    assert await pub.recv() == Pubrec(9)
    pub.send(Publish("q2/once", b"x", 2, dup=True, packet_id=9))  # resent before PUBREL
    assert await pub.recv() == Pubrec(9)
    pub.send(Pubrel(9))
    assert await pub.recv() == Pubcomp(9)
    p = await sub.recv()
    assert isinstance(p, Publish)
    sub.send(Pubrec(p.packet_id or 0))
    await sub.recv_where(lambda q: isinstance(q, Pubrel))
    sub.send(Pubcomp(p.packet_id or 0))
    assert await sub.barrier() == []  # exactly once


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_4_4_0_1_redelivery_with_dup_after_reconnect(broker: Broker, v: int) -> None:
    props = Properties(session_expiry_interval=60) if v == 5 else Properties()
    sub, _ = await RawClient.connect(broker.port, "redeliver", v, clean_start=False, properties=props)
    await sub.subscribe(SubscriptionRequest("rd/t", 2))
    pub, _ = await RawClient.connect(broker.port, "rd-pub", v)
    await pub.publish1("rd/t", b"m1")
    p = await sub.recv()
    assert isinstance(p, Publish) and p.qos == 1 and not p.dup
    await sub.close()  # no PUBACK
    sub, ack = await RawClient.connect(broker.port, "redeliver", v, clean_start=False, properties=props)
    assert ack.session_present
    again = await sub.recv()
    assert isinstance(again, Publish)
    assert (again.payload, again.packet_id, again.dup) == (b"m1", p.packet_id, True)  # [MQTT-4.4.0-1]
    sub.send(Puback(again.packet_id or 0))
    assert await sub.barrier() == []


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_4_4_0_1_qos2_pubrel_resent_after_reconnect(broker: Broker, v: int) -> None:
    props = Properties(session_expiry_interval=60) if v == 5 else Properties()
    sub, _ = await RawClient.connect(broker.port, "q2rc", v, clean_start=False, properties=props)
    await sub.subscribe(SubscriptionRequest("q2rc/t", 2))
    pub, _ = await RawClient.connect(broker.port, "q2rc-pub", v)
    pub.send(Publish("q2rc/t", b"z", 2, packet_id=3))
    assert await pub.recv() == Pubrec(3)
    pub.send(Pubrel(3))
    assert await pub.recv() == Pubcomp(3)
    p = await sub.recv()
    assert isinstance(p, Publish) and p.qos == 2
    await sub.close()  # no PUBREC: the PUBLISH is resent with DUP
    sub, _ = await RawClient.connect(broker.port, "q2rc", v, clean_start=False, properties=props)
    again = await sub.recv()
    assert isinstance(again, Publish) and again.dup and again.packet_id == p.packet_id
    sub.send(Pubrec(again.packet_id or 0))
    assert await sub.recv() == Pubrel(again.packet_id or 0)
    await sub.close()  # PUBREC sent, no PUBCOMP: the PUBREL is resent, not the PUBLISH
    sub, _ = await RawClient.connect(broker.port, "q2rc", v, clean_start=False, properties=props)
    assert await sub.recv() == Pubrel(again.packet_id or 0)
    sub.send(Pubcomp(again.packet_id or 0))
    assert await sub.barrier() == []


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_3_8_4_6_delivery_qos_is_minimum(broker: Broker, v: int) -> None:
    sub, pub = await _pair(broker, v, "min/q", qos=0)
    await pub.publish1("min/q", b"x")
    p = await sub.recv()
    assert isinstance(p, Publish) and p.qos == 0 and p.packet_id is None


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_3_3_1_retained_messages(broker: Broker, v: int) -> None:
    pub, _ = await RawClient.connect(broker.port, "ret-pub", v)
    await pub.publish1("ret/a", b"kept", retain=True)
    sub, _ = await RawClient.connect(broker.port, "ret-sub", v)
    await sub.subscribe("ret/#")
    p = await sub.recv()
    assert isinstance(p, Publish) and (p.topic, p.payload, p.retain) == (
        "ret/a",
        b"kept",
        True,
    )  # [MQTT-3.3.1-6]
    await pub.publish1("ret/a", b"live", retain=True)
    p = await sub.recv()
    assert isinstance(p, Publish) and p.payload == b"live" and p.retain is False  # [MQTT-3.3.1-9]
    await pub.publish1("ret/a", b"", retain=True)  # [MQTT-3.3.1-10] empty payload clears
    await sub.recv_where(lambda q: isinstance(q, Publish) and q.payload == b"")
    sub2, _ = await RawClient.connect(broker.port, "ret-sub2", v)
    await sub2.subscribe("ret/#")
    assert await sub2.barrier() == []  # [MQTT-3.3.1-11]


async def test_mqtt_3_3_1_9_retain_handling_options(broker: Broker) -> None:
    pub, _ = await RawClient.connect(broker.port, "rh-pub", 5)
    await pub.publish1("rh/a", b"r", retain=True)
    sub, _ = await RawClient.connect(broker.port, "rh-sub", 5)
    await sub.subscribe(SubscriptionRequest("rh/a", 1, retain_handling=2))
    assert await sub.barrier() == []  # 2: never send retained
    await sub.subscribe(SubscriptionRequest("rh/#", 1, retain_handling=1))
    assert [p.payload for p in await sub.barrier() if isinstance(p, Publish)] == [b"r"]  # 1: new sub only
    await sub.subscribe(SubscriptionRequest("rh/#", 1, retain_handling=1))
    assert await sub.barrier() == []  # existing subscription: not sent again
    await sub.subscribe(SubscriptionRequest("rh/#", 1, retain_handling=0))
    assert [p.payload for p in await sub.barrier() if isinstance(p, Publish)] == [b"r"]  # 0: always


async def test_mqtt_3_3_1_12_retain_as_published(broker: Broker) -> None:
    a, _ = await RawClient.connect(broker.port, "rap-a", 5)
    await a.subscribe(SubscriptionRequest("rap/t", 1, retain_as_published=True))
    b, _ = await RawClient.connect(broker.port, "rap-b", 5)
    await b.subscribe(SubscriptionRequest("rap/t", 1))
    pub, _ = await RawClient.connect(broker.port, "rap-p", 5)
    await pub.publish1("rap/t", b"x", retain=True)
    pa, pb = await a.recv(), await b.recv()
    assert isinstance(pa, Publish) and pa.retain is True  # [MQTT-3.3.1-13]
    assert isinstance(pb, Publish) and pb.retain is False  # [MQTT-3.3.1-12]


async def test_mqtt_3_8_3_3_no_local(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "nl", 5)
    await c.subscribe(SubscriptionRequest("nl/t", 1, no_local=True))
    await c.publish1("nl/t", b"own")
    assert await c.barrier() == []


async def test_mqtt_3_3_2_properties_forwarded(broker: Broker) -> None:
    sub, pub = await _pair(broker, 5, "fw/t", qos=1)
    props = Properties(
        payload_format_indicator=1,
        content_type="application/json",
        response_topic="fw/reply",
        correlation_data=b"\x01\x02",
        user_properties=(("a", "1"), ("b", "2"), ("a", "3")),
        message_expiry_interval=3600,
    )
    await pub.publish1("fw/t", b"{}", properties=props)
    p = await sub.recv()
    assert isinstance(p, Publish)
    got = p.properties
    assert (got.payload_format_indicator, got.content_type, got.response_topic, got.correlation_data) == (
        1,
        "application/json",
        "fw/reply",
        b"\x01\x02",
    )  # [MQTT-3.3.2-4], [MQTT-3.3.2-20], [MQTT-3.3.2-15], [MQTT-3.3.2-16]
    assert got.user_properties == props.user_properties  # [MQTT-3.3.2-17/18] order kept
    assert (
        got.message_expiry_interval is not None and 3590 <= got.message_expiry_interval <= 3600
    )  # [MQTT-3.3.2-6]


async def test_mqtt_3_3_2_5_expired_message_not_delivered(broker: Broker) -> None:
    props = Properties(session_expiry_interval=60)
    sub, _ = await RawClient.connect(broker.port, "exp", 5, clean_start=False, properties=props)
    await sub.subscribe(SubscriptionRequest("exp/t", 1))
    await sub.close()
    pub, _ = await RawClient.connect(broker.port, "exp-pub", 5)
    await pub.publish1("exp/t", b"short", properties=Properties(message_expiry_interval=1))
    await pub.publish1("exp/t", b"long", properties=Properties(message_expiry_interval=100))
    # wait (without sleeping) for longer than 1 s: the keep-alive of a throwaway connection
    ka, _ = await RawClient.connect(broker.port, "clock", 5, keep_alive=1)
    await ka.closed()
    sub, _ = await RawClient.connect(broker.port, "exp", 5, clean_start=False, properties=props)
    got = [p.payload for p in await sub.barrier() if isinstance(p, Publish)]
    assert got == [b"long"]


async def test_mqtt_3_3_4_3_subscription_identifiers(broker: Broker) -> None:
    sub, _ = await RawClient.connect(broker.port, "sid", 5)
    await sub.subscribe(SubscriptionRequest("sid/+", 1), properties=Properties(subscription_identifiers=(5,)))
    await sub.subscribe(SubscriptionRequest("sid/#", 1), properties=Properties(subscription_identifiers=(9,)))
    pub, _ = await RawClient.connect(broker.port, "sid-pub", 5)
    await pub.publish1("sid/x", b"x")
    got = [p for p in await sub.barrier() if isinstance(p, Publish)]
    ids = sorted(i for p in got for i in p.properties.subscription_identifiers)
    assert ids == [5, 9]  # one message with both, or one per subscription [MQTT-3.3.4-3/5]


async def test_mqtt_4_8_2_shared_subscriptions(broker: Broker) -> None:
    a, _ = await RawClient.connect(broker.port, "sh-a", 5)
    b, _ = await RawClient.connect(broker.port, "sh-b", 5)
    await a.subscribe(SubscriptionRequest("$share/g/sh/t", 0))
    await b.subscribe(SubscriptionRequest("$share/g/sh/t", 0))
    pub, _ = await RawClient.connect(broker.port, "sh-p", 5)
    for i in range(20):
        await pub.publish1("sh/t", str(i).encode())
    got_a = [p.payload for p in await a.barrier() if isinstance(p, Publish)]
    got_b = [p.payload for p in await b.barrier() if isinstance(p, Publish)]
    assert sorted(got_a + got_b, key=int) == [str(i).encode() for i in range(20)]  # each exactly once
    assert got_a and got_b  # distributed


async def test_mqtt_3_3_2_topic_alias_client_to_server(broker: Broker) -> None:
    sub, pub = await _pair(broker, 5, "al/t", qos=1)
    await pub.publish1("al/t", b"1", properties=Properties(topic_alias=1))
    await pub.publish1("", b"2", properties=Properties(topic_alias=1))  # [MQTT-3.3.2-12]
    got = [(p.topic, p.payload) for p in await sub.barrier() if isinstance(p, Publish)]
    assert got == [("al/t", b"1"), ("al/t", b"2")]


async def test_mqtt_3_3_2_10_topic_alias_over_maximum(broker: Broker) -> None:
    c, ack = await RawClient.connect(broker.port, "al-bad", 5)
    limit = ack.properties.topic_alias_maximum or 0
    assert limit < 65535 or limit == 65535
    c.send(Publish("", b"x", 0, properties=Properties(topic_alias=1)))  # unknown alias
    got = await c.closed()
    assert [p.reason_code for p in got if isinstance(p, Disconnect)] in (
        [RC.PROTOCOL_ERROR],
        [RC.TOPIC_ALIAS_INVALID],
    )


async def test_mqtt_3_3_2_topic_alias_server_to_client(broker: Broker) -> None:
    sub, pub = await _pair(broker, 5, "als/t", qos=0, properties=Properties(topic_alias_maximum=5))
    for i in range(3):
        await pub.publish1("als/t", str(i).encode())
    got = [p for p in await sub.barrier() if isinstance(p, Publish)]
    assert [p.payload for p in got] == [b"0", b"1", b"2"]
    aliases = {p.properties.topic_alias for p in got}
    assert all(a is None or 1 <= a <= 5 for a in aliases)  # [MQTT-3.3.2-9]
    assert got[0].topic == "als/t"
    # later messages may use the alias alone; the first must establish it
    assert all(p.topic in ("als/t", "") for p in got)


async def test_mqtt_3_3_4_9_receive_maximum_of_client(broker: Broker) -> None:
    sub, pub = await _pair(broker, 5, "rm/t", qos=1, properties=Properties(receive_maximum=2))
    for i in range(4):
        await pub.publish1("rm/t", str(i).encode())
    got = [p for p in await sub.barrier() if isinstance(p, Publish)]
    assert [p.payload for p in got] == [b"0", b"1"]  # [MQTT-3.3.4-9]
    sub.send(Puback(got[0].packet_id or 0))
    more = [p for p in await sub.barrier() if isinstance(p, Publish)]
    assert [p.payload for p in more] == [b"2"]


async def test_mqtt_3_1_2_25_maximum_packet_size_of_client(broker: Broker) -> None:
    sub, pub = await _pair(broker, 5, "mps/t", qos=0, properties=Properties(maximum_packet_size=64))
    await pub.publish1("mps/t", b"x" * 200)
    await pub.publish1("mps/t", b"small")
    got = [p.payload for p in await sub.barrier() if isinstance(p, Publish)]
    assert got == [b"small"]  # the too-large one is discarded for this client


async def test_mqtt_3_2_2_maximum_packet_size_of_server() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, max_packet_size=256) as b:
        c, ack = await RawClient.connect(b.port, "big", 5)
        assert ack.properties.maximum_packet_size == 256
        c.send(Publish("big/t", b"x" * 1000))
        got = await c.closed()
        assert [p.reason_code for p in got if isinstance(p, Disconnect)] == [RC.PACKET_TOO_LARGE]


async def test_queue_limit_disconnects_stalled_qos1_consumer() -> None:
    """Flow control, policy ``disconnect``: the publisher of a stalled QoS 1 consumer is paused
    (its PUBACKs wait) until the consumer is a slow consumer, which is then disconnected."""
    async with Broker(
        host="127.0.0.1",
        port=0,
        sys_interval=0,
        max_queued_messages=5,
        slow_consumer_policy="disconnect",
        slow_consumer_grace=0.3,
        tick_interval=0.05,
    ) as b:
        sub, _ = await RawClient.connect(b.port, "stall", 5, properties=Properties(receive_maximum=1))
        await sub.subscribe(SubscriptionRequest("stall/t", 1))
        pub, _ = await RawClient.connect(b.port, "stall-p", 5)
        for i in range(10):  # 1 in flight + 5 queued, then the queue is full
            await pub.publish1("stall/t", str(i).encode())
        got = await sub.closed()
        assert [p.reason_code for p in got if isinstance(p, Disconnect)] == [RC.QUOTA_EXCEEDED]
        assert b.core.stats.publisher_pauses >= 1 and b.core.stats.slow_disconnected == 1
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


async def test_queue_limit_offline_session_bounded() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, max_queued_messages=3) as b:
        props = Properties(session_expiry_interval=60)
        sub, _ = await RawClient.connect(b.port, "off", 5, clean_start=False, properties=props)
        await sub.subscribe(SubscriptionRequest("off/t", 1))
        sub.send(Disconnect())
        await sub.closed()
        pub, _ = await RawClient.connect(b.port, "off-p", 5)
        for i in range(10):
            await pub.publish1("off/t", str(i).encode())
        sub, _ = await RawClient.connect(b.port, "off", 5, clean_start=False, properties=props)
        got = [p for p in await sub.barrier() if isinstance(p, Publish)]
        assert 1 <= len(got) <= 3  # memory for an offline session stays bounded
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


async def test_mqtt_3_2_2_request_response_information(broker: Broker) -> None:
    _c, ack = await RawClient.connect(
        broker.port, "rri", 5, properties=Properties(request_response_information=1)
    )
    assert ack.properties.response_information  # [MQTT-3.1.2-28] may be sent when requested
    _c2, ack2 = await RawClient.connect(broker.port, "rri0", 5)
    assert ack2.properties.response_information is None  # [MQTT-3.1.2-28] not sent unrequested


async def test_mqtt_3_3_4_7_server_receive_maximum_exceeded() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, receive_maximum=2) as b:
        c, ack = await RawClient.connect(b.port, "rmx", 5)
        assert ack.properties.receive_maximum == 2
        for pid in (1, 2, 3):  # QoS 2 without PUBREL: three unacknowledged, one over the maximum
            c.send(Publish("rmx/t", b"x", 2, packet_id=pid))
        got = await c.closed()
        assert [p.reason_code for p in got if isinstance(p, Disconnect)] == [RC.RECEIVE_MAXIMUM_EXCEEDED]
