"""End to end through aiomqtt (paho-based asyncio client), MQTT 3.1.1 and 5.0."""

from __future__ import annotations

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from broker import Broker
from tests.waiting import next_message

V5 = aiomqtt.ProtocolVersion.V5
V311 = aiomqtt.ProtocolVersion.V311
T = 5.0


def client(b: Broker, ident: str, protocol: aiomqtt.ProtocolVersion = V5, **kw: object) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", b.port, identifier=ident, protocol=protocol, **kw)  # type: ignore[arg-type]


async def no_message(c: aiomqtt.Client, marker_topic: str, b: Broker) -> None:
    """Assert nothing arrives before a marker message published afterwards on ``marker_topic``."""
    await b.publish(marker_topic, b"marker")
    m = await next_message(c)
    assert m.topic.value == marker_topic, f"unexpected {m.topic.value}"


def sub_props(**user: str) -> PahoProperties:
    p = PahoProperties(PacketTypes.SUBSCRIBE)
    p.UserProperty = list(user.items())
    return p


@pytest.mark.parametrize("protocol", [V311, V5])
@pytest.mark.parametrize("qos", [0, 1, 2])
async def test_publish_subscribe(broker: Broker, protocol: aiomqtt.ProtocolVersion, qos: int) -> None:
    async with client(broker, "sub", protocol) as sub, client(broker, "pub", protocol) as pub:
        await sub.subscribe("a/+/c", qos=qos)
        await pub.publish("a/b/c", b"hello", qos=qos)
        await pub.publish("a/b/d", b"other", qos=qos)
        await pub.publish("a/x/c", b"again", qos=qos)
        m1 = await next_message(sub)
        m2 = await next_message(sub)
        assert (m1.topic.value, m1.payload, m1.qos) == ("a/b/c", b"hello", qos)
        assert (m2.topic.value, m2.payload) == ("a/x/c", b"again")


async def test_retained_delivered_and_cleared(broker: Broker) -> None:
    async with client(broker, "pub") as pub:
        await pub.publish("r/1", b"one", qos=1, retain=True)
        await pub.publish("r/2", b"two", qos=1, retain=True)
        await pub.publish("r/2", b"", qos=1, retain=True)  # clears r/2
    async with client(broker, "sub") as sub:
        await sub.subscribe("r/#", qos=1)
        m = await next_message(sub)
        assert (m.topic.value, m.payload, m.retain) == ("r/1", b"one", True)
        await no_message(sub, "r/marker", broker)


async def test_retain_handling_and_retain_as_published(broker: Broker) -> None:
    await broker.publish("h/t", b"kept", retain=True)
    async with client(broker, "sub") as sub:
        await sub.subscribe("h/#", options=SubscribeOptions(qos=0, retainHandling=2))
        await no_message(sub, "h/m1", broker)
        await sub.subscribe("h/t", options=SubscribeOptions(qos=0, retainHandling=1))
        m = await next_message(sub)
        assert m.payload == b"kept" and m.retain
        await sub.subscribe("h/t", options=SubscribeOptions(qos=0, retainHandling=1))  # exists: none
        await no_message(sub, "h/m2", broker)
        # live retained publish: RETAIN flag only with retain-as-published
        await sub.unsubscribe("h/#")
        await sub.subscribe("h/t", options=SubscribeOptions(qos=0, retainHandling=2, retainAsPublished=True))
        await broker.publish("h/t", b"live", retain=True)
        m = await next_message(sub)
        assert m.payload == b"live" and m.retain


async def test_no_local(broker: Broker) -> None:
    async with client(broker, "me") as me:
        await me.subscribe("nl/#", options=SubscribeOptions(qos=1, noLocal=True))
        await me.publish("nl/x", b"mine", qos=1)
        await no_message(me, "nl/marker", broker)


async def test_dollar_topics_not_matched_by_leading_wildcards(broker: Broker) -> None:
    async with client(broker, "sub") as sub:
        await sub.subscribe("#")
        await sub.subscribe("$SYS/x")
        await broker.publish("$SYS/y", b"hidden")
        await broker.publish("$SYS/x", b"seen")
        m = await next_message(sub)
        assert m.topic.value == "$SYS/x"


async def test_subscription_identifiers(broker: Broker) -> None:
    async with client(broker, "sub") as sub:
        p1 = PahoProperties(PacketTypes.SUBSCRIBE)
        p1.SubscriptionIdentifier = 7
        await sub.subscribe("s/#", qos=1, properties=p1)
        p2 = PahoProperties(PacketTypes.SUBSCRIBE)
        p2.SubscriptionIdentifier = 9
        await sub.subscribe("s/+", qos=0, properties=p2)
        await broker.publish("s/a", b"x", qos=1)
        m = await next_message(sub)
        assert m.qos == 1
        assert sorted(m.properties.SubscriptionIdentifier) == [7, 9]  # type: ignore[union-attr]


async def test_content_filter_v5_user_property(broker: Broker) -> None:
    async with client(broker, "sub") as sub:
        await sub.subscribe("sensors/#", qos=1, properties=sub_props(filter="temp > 20 AND room = 'lab'"))
        await broker.publish("sensors/1", b'{"temp": 19, "room": "lab"}')
        await broker.publish("sensors/2", b'{"temp": 25, "room": "hall"}')
        await broker.publish("sensors/3", b"not json")
        await broker.publish("sensors/4", b'{"temp": 25.5, "room": "lab"}')
        m = await next_message(sub)
        assert m.topic.value == "sensors/4"


async def test_bad_selector_refused_with_reason(broker: Broker) -> None:
    async with client(broker, "sub") as sub:
        codes = await sub.subscribe("x/#", qos=1, properties=sub_props(filter="temp >"))
        assert [int(c.value) for c in codes] == [0x8F]  # type: ignore[union-attr]


async def test_partial_unsubscribe_v5(broker: Broker) -> None:
    async with client(broker, "sub") as sub:
        await sub.subscribe("home/#", qos=1)
        await sub.unsubscribe("home/kitchen/#")  # partial: a negative entry
        await broker.publish("home/kitchen/temp", b"no")
        await broker.publish("home/hall/temp", b"yes")
        m = await next_message(sub)
        assert m.topic.value == "home/hall/temp"
        await sub.subscribe("home/kitchen/oven", qos=1)  # newer positive entry wins
        await broker.publish("home/kitchen/oven", b"oven")
        m = await next_message(sub)
        assert m.topic.value == "home/kitchen/oven"


async def test_pure_mqtt_switch() -> None:
    async with Broker(port=0, sys_interval=0, partial_unsubscribe=False) as b, client(b, "sub") as sub:
        await sub.subscribe("home/#", qos=1)
        await sub.unsubscribe("home/kitchen/#")  # no effect in pure MQTT
        await b.publish("home/kitchen/temp", b"still")
        m = await next_message(sub)
        assert m.topic.value == "home/kitchen/temp"


async def test_shared_subscription_round_robin(broker: Broker) -> None:
    async with client(broker, "w1") as w1, client(broker, "w2") as w2:
        await w1.subscribe("$share/g/jobs/#", qos=1)
        await w2.subscribe("$share/g/jobs/#", qos=1)
        for i in range(6):
            await broker.publish(f"jobs/{i}", b"j", qos=1)
        got1 = [await next_message(w1) for _ in range(3)]
        got2 = [await next_message(w2) for _ in range(3)]
        topics_seen = sorted(m.topic.value for m in got1 + got2)
        assert topics_seen == sorted(f"jobs/{i}" for i in range(6))


async def test_message_properties_pass_through(broker: Broker) -> None:
    async with client(broker, "sub") as sub, client(broker, "pub") as pub:
        await sub.subscribe("rr/#", qos=1)
        props = PahoProperties(PacketTypes.PUBLISH)
        props.ResponseTopic = "rr/reply"
        props.CorrelationData = b"\x01\x02"
        props.ContentType = "application/json"
        props.PayloadFormatIndicator = 1
        props.UserProperty = [("k", "v")]
        props.MessageExpiryInterval = 60
        await pub.publish("rr/req", b"{}", qos=1, properties=props)
        m = await next_message(sub)
        got = m.properties
        assert got is not None
        assert got.ResponseTopic == "rr/reply"
        assert got.CorrelationData == b"\x01\x02"
        assert got.ContentType == "application/json"
        assert got.PayloadFormatIndicator == 1
        assert got.UserProperty == [("k", "v")]
        assert 0 < got.MessageExpiryInterval <= 60


async def test_persistent_session_queues_qos1(broker: Broker) -> None:
    props = PahoProperties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    async with client(broker, "durable", clean_start=False, properties=props) as sub:
        await sub.subscribe("q/#", qos=1)
    await broker.publish("q/1", b"while away", qos=1)
    await broker.publish("q/0", b"qos0 not kept", qos=0)
    async with client(broker, "durable", clean_start=False, properties=props) as sub:
        m = await next_message(sub)
        assert (m.topic.value, m.payload) == ("q/1", b"while away")
