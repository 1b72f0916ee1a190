"""Where siftmq must behave like the specification and like mosquitto (issue 21), black box
with raw packets over loopback, for MQTT 3.1.1 and 5.0 where both apply.

1 bridges (protocol level 0x84), 2 broker-owned ``$`` topics, 3 will delay and reconnect,
4 Session Present after a takeover, 5 acknowledgements that break the flow, 6 CONNECT edge
cases and the client's Maximum Packet Size, 7 MQTT 3.1, 8 topic levels and huge filters.
"""

from __future__ import annotations

import asyncio

import pytest

from broker import Broker, Hooks
from broker.packets import (
    Connack,
    Connect,
    Disconnect,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Will,
    encode,
)
from tests.rawclient import RawClient
from tests.waiting import eventually

RC = ReasonCode


async def _silent(c: RawClient, seconds: float = 0.3) -> list[Publish]:
    """The PUBLISHes that arrive within ``seconds`` (after a PINGREQ round trip)."""
    got = [p for p in await c.barrier() if isinstance(p, Publish)]
    await asyncio.sleep(seconds)
    got += [p for p in await c.barrier() if isinstance(p, Publish)]
    return got


# ---------------------------------------------------------------- 1 bridges
async def test_1_bridge_level_0x84_is_accepted_and_never_gets_its_own_messages_back(broker: Broker) -> None:
    bridge, ack = await RawClient.connect(broker.port, "edge.bridge", 4, bridge=True)
    assert ack.reason_code == RC.SUCCESS
    await bridge.subscribe(SubscriptionRequest("edge/#", 1))
    other, _ = await RawClient.connect(broker.port, "local", 4)
    await other.subscribe(SubscriptionRequest("edge/#", 1))
    await bridge.publish1("edge/x", b"from-edge", retain=True)
    got = await other.recv_where(lambda p: isinstance(p, Publish))
    assert isinstance(got, Publish) and got.payload == b"from-edge"
    assert await _silent(bridge) == []  # no echo to the bridge
    await other.publish1("edge/y", b"from-center", retain=True)
    back = await bridge.recv_where(lambda p: isinstance(p, Publish))
    assert isinstance(back, Publish) and back.payload == b"from-center"
    assert back.retain  # retain as published on a bridge's subscriptions
    # its connection-state notification is accepted (mosquitto's notifications true)
    ack1 = await bridge.publish1("$SYS/broker/connection/edge.bridge/state", b"1")
    assert ack1.reason_code == RC.SUCCESS
    assert broker.core.stats.refused_reserved_publish == 0


# ---------------------------------------------------------------- 2 broker-owned topics
@pytest.mark.parametrize("version", [5, 4])
async def test_2_clients_cannot_publish_into_sys_or_share(broker: Broker, version: int) -> None:
    watcher, _ = await RawClient.connect(broker.port, "watch", version)
    await watcher.subscribe(SubscriptionRequest("$SYS/#", 1))
    c, _ = await RawClient.connect(broker.port, "faker", version)
    for topic in ("$SYS/broker/uptime", "$SYS/broker/version", "$share/g/t"):
        ack = await c.publish1(topic, b"fake", retain=True)
        assert ack.reason_code == (RC.NOT_AUTHORIZED if version == 5 else RC.SUCCESS)
    c.send(Publish("$SYS/broker/x", b"q2", 2, packet_id=77))
    rec = await c.recv_where(lambda p: isinstance(p, Pubrec))
    assert isinstance(rec, Pubrec) and rec.reason_code == (RC.NOT_AUTHORIZED if version == 5 else RC.SUCCESS)
    assert await _silent(watcher) == []
    assert list(broker.core.router.retained_for("$SYS/#", None, 0.0)) == []
    assert broker.core.stats.refused_reserved_publish == 4


async def test_2_an_acl_rule_can_grant_a_sys_topic_explicitly() -> None:
    class Grant(Hooks):
        def authorize(self, client_id: str, username: str | None, action: str, topic: str) -> bool | None:
            return True if topic == "$SYS/custom/feed" else None

    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[Grant()]) as b:
        c, _ = await RawClient.connect(b.port, "feeder", 5)
        assert (await c.publish1("$SYS/custom/feed", b"ok")).reason_code == RC.NO_MATCHING_SUBSCRIBERS
        assert (await c.publish1("$SYS/other", b"no")).reason_code == RC.NOT_AUTHORIZED
        await RawClient.close_all()


# ---------------------------------------------------------------- 3 will delay
async def test_3_reconnect_before_the_will_delay_cancels_the_will(broker: Broker) -> None:
    watcher, _ = await RawClient.connect(broker.port, "w-watch", 5)
    await watcher.subscribe(SubscriptionRequest("will/t", 1))
    will = Will("will/t", b"gone", 1, False, Properties(will_delay_interval=1))
    c, _ = await RawClient.connect(
        broker.port, "w", 5, will=will, properties=Properties(session_expiry_interval=60)
    )
    c.writer.transport.abort()  # no DISCONNECT
    core = broker.core
    # the broker saw the connection end: the will waits for its delay
    await eventually(lambda: any(s.client_id == "w" for s in core.pending_wills))
    c2, _ = await RawClient.connect(broker.port, "w", 5, clean_start=True)  # no will this time
    assert not core.pending_wills  # cancelled: nothing can fire once the delay is past
    assert await _silent(watcher, 0.1) == []
    await c2.close()


# ---------------------------------------------------------------- 4 Session Present
@pytest.mark.parametrize("version", [4, 5])
async def test_4_a_clean_session_taken_over_is_not_reused(broker: Broker, version: int) -> None:
    old, _ = await RawClient.connect(broker.port, "tk", version, clean_start=True)
    await old.subscribe(SubscriptionRequest("tk/t", 1))
    kw = {"properties": Properties(session_expiry_interval=60)} if version == 5 else {}
    new, ack = await RawClient.connect(broker.port, "tk", version, clean_start=False, **kw)
    assert not ack.session_present  # [MQTT-3.1.2-6]
    pub, _ = await RawClient.connect(broker.port, "tk-pub", version)
    await pub.publish1("tk/t", b"x")
    assert await _silent(new) == []  # the old subscription is gone


# ---------------------------------------------------------------- 5 protocol violations
@pytest.mark.parametrize("version", [5, 4])
@pytest.mark.parametrize(("qos", "wrong"), [(1, "pubrec"), (1, "pubcomp"), (2, "puback"), (2, "pubcomp")])
async def test_5_an_acknowledgement_that_breaks_the_flow_closes(
    broker: Broker, version: int, qos: int, wrong: str
) -> None:
    sub, _ = await RawClient.connect(broker.port, "viol", version)
    await sub.subscribe(SubscriptionRequest("v/t", qos))
    await broker.publish("v/t", b"x", qos=qos)
    p = await sub.recv_where(lambda p: isinstance(p, Publish))
    assert isinstance(p, Publish) and p.packet_id is not None
    answer = {"pubrec": Pubrec(p.packet_id), "pubcomp": Pubcomp(p.packet_id), "puback": Puback(p.packet_id)}
    sub.send(answer[wrong])
    got = await sub.closed()
    if version == 5:
        assert [x.reason_code for x in got if isinstance(x, Disconnect)] == [RC.PROTOCOL_ERROR]


# ---------------------------------------------------------------- 6 CONNECT edge cases
async def test_6_311_will_with_empty_topic_is_closed_without_connack(broker: Broker) -> None:
    c = await RawClient.open(broker.port, 4)
    c.send(Connect("ew", 4, will=Will("", b"x")))
    assert await c.closed() == []


async def test_6_v5_will_with_empty_topic_gets_0x90(broker: Broker) -> None:
    c = await RawClient.open(broker.port, 5)
    c.send(Connect("ew5", 5, will=Will("", b"x")))
    got = await c.closed()
    assert [x.reason_code for x in got if isinstance(x, Connack)] == [RC.TOPIC_NAME_INVALID]


async def test_6_client_maximum_packet_size_applies_to_every_packet(broker: Broker) -> None:
    small, ack = await RawClient.connect(broker.port, "mps", 5, properties=Properties(maximum_packet_size=16))
    assert len(encode(ack, 5)) <= 16
    small.send(Subscribe(1, (SubscriptionRequest("bad/#/x", 1),)))  # refused: reason string left out
    sa = await small.recv()
    assert isinstance(sa, Suback) and sa.reason_codes == (RC.TOPIC_FILTER_INVALID,)
    assert sa.properties.reason_string is None
    tiny = await RawClient.open(broker.port, 5)  # even the bare CONNACK (11 B) does not fit 8 B
    tiny.send(Connect("mps8", 5, properties=Properties(maximum_packet_size=8)))
    assert await tiny.closed() == []


# ---------------------------------------------------------------- 7 MQTT 3.1
async def test_7_mqtt31_connack_has_no_session_present_and_needs_a_client_id(broker: Broker) -> None:
    first, _ = await RawClient.connect(broker.port, "v31", 3, clean_start=False, protocol_name="MQIsdp")
    await first.close()
    _again, ack = await RawClient.connect(broker.port, "v31", 3, clean_start=False, protocol_name="MQIsdp")
    assert ack.reason_code == RC.SUCCESS and not ack.session_present  # the byte is reserved in 3.1
    anon = await RawClient.open(broker.port, 3)
    anon.send(Connect("", 3, clean_start=True, protocol_name="MQIsdp"))
    refused = await anon.recv()
    assert isinstance(refused, Connack) and refused.reason_code == RC.CLIENT_IDENTIFIER_NOT_VALID


# ---------------------------------------------------------------- 8 limits
@pytest.mark.parametrize("version", [5, 4])
async def test_8_two_hundred_separators_as_mosquitto(broker: Broker, version: int) -> None:
    """mosquitto's 02-subpub-qos0-long-topic: a topic and a filter of 200 ``/`` (201 levels)
    are accepted, 201 ``/`` are refused (TOPIC_HIERARCHY_LIMIT)."""
    longest = "/" * 200
    c, _ = await RawClient.connect(broker.port, "lv", version)
    ok = await c.subscribe(SubscriptionRequest(longest, 1), SubscriptionRequest("a" + longest + "#", 1))
    assert ok.reason_codes == (RC.GRANTED_QOS_1, RC.GRANTED_QOS_1)
    assert (await c.publish1(longest)).packet_id
    got = await c.recv_where(lambda p: isinstance(p, Publish))
    assert isinstance(got, Publish) and got.topic == longest
    bad = RC.TOPIC_FILTER_INVALID if version == 5 else RC.UNSPECIFIED_ERROR
    too_many = await c.subscribe(
        SubscriptionRequest(longest + "/", 1), SubscriptionRequest("a" + longest + "/#", 1)
    )
    assert too_many.reason_codes == (bad, bad)
    c.send(Publish(longest + "/", b"x", 1, packet_id=c.pid()))
    closed = await c.closed()
    assert [p.reason_code for p in closed if isinstance(p, Disconnect)] == (
        [RC.TOPIC_NAME_INVALID] if version == 5 else []
    )
    assert not any(isinstance(p, Puback) for p in closed)


async def test_8_huge_filters_get_a_reason_code(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "lv", 5)
    huge = await c.subscribe(SubscriptionRequest("a/" * 30_000 + "#", 1))  # 60,001 bytes
    assert huge.reason_codes == (RC.TOPIC_FILTER_INVALID,)
    assert huge.properties.reason_string is not None and len(huge.properties.reason_string) < 1100
    bad = await c.subscribe(SubscriptionRequest("x" * 65_000 + "/+x", 1))
    assert bad.reason_codes == (RC.TOPIC_FILTER_INVALID,)
