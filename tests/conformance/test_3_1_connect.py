"""MQTT 3.1 CONNECT / 3.2 CONNACK / 3.14 DISCONNECT conformance (raw client on our codec)."""

from __future__ import annotations

import pytest

from broker import Broker
from broker.packets import (
    Connack,
    Connect,
    Disconnect,
    Properties,
    Publish,
    ReasonCode,
    SubscriptionRequest,
    Will,
    encode,
)
from tests.rawclient import RawClient

RC = ReasonCode


async def test_mqtt_3_1_0_1_first_packet_must_be_connect(broker: Broker) -> None:
    c = await RawClient.open(broker.port, 4)
    c.send_bytes(b"\xc0\x00")  # PINGREQ first
    assert await c.closed() == []


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_3_1_0_2_second_connect_is_protocol_error(broker: Broker, v: int) -> None:
    c, ack = await RawClient.connect(broker.port, "twice", v)
    assert ack.reason_code == RC.SUCCESS
    c.send(Connect("twice", v))
    got = await c.closed()
    assert got == ([Disconnect(RC.PROTOCOL_ERROR, got[0].properties)] if v == 5 else [])  # type: ignore[union-attr]


async def test_mqtt_3_1_2_2_unsupported_protocol_level(broker: Broker) -> None:
    c = await RawClient.open(broker.port, 4)
    body = b"\x00\x04MQTT\x07\x02\x00\x3c\x00\x01a"
    c.send_bytes(bytes((0x10, len(body))) + body)
    assert await c.closed() == [Connack(False, RC.UNSUPPORTED_PROTOCOL_VERSION)]  # return code 0x01


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_3_1_2_3_reserved_flag_closes(broker: Broker, v: int) -> None:
    c = await RawClient.open(broker.port, v)
    raw = bytearray(encode(Connect("r", v), v))
    raw[9] |= 0x01  # connect flags byte
    c.send_bytes(bytes(raw))
    got = await c.closed()
    assert not any(isinstance(p, Connack) and p.reason_code == RC.SUCCESS for p in got)


async def test_mqtt_3_1_3_7_empty_client_id_needs_clean_session_311(broker: Broker) -> None:
    c, ack = await RawClient.connect(broker.port, "", 4, clean_start=False)
    assert ack == Connack(False, RC.CLIENT_IDENTIFIER_NOT_VALID)  # 3.1.1 return code 0x02
    assert await c.closed() == []


async def test_mqtt_3_2_2_16_assigned_client_identifier_v5(broker: Broker) -> None:
    c, ack = await RawClient.connect(broker.port, "", 5)
    assert ack.reason_code == RC.SUCCESS
    assigned = ack.properties.assigned_client_identifier
    assert assigned
    c2, ack2 = await RawClient.connect(broker.port, "", 5)
    assert ack2.properties.assigned_client_identifier not in (None, assigned)
    await c.close()
    await c2.close()


async def test_mqtt_3_1_3_6_empty_client_id_311_accepted(broker: Broker) -> None:
    c, ack = await RawClient.connect(broker.port, "", 4)
    assert ack == Connack(False, RC.SUCCESS)
    await c.close()


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_3_1_4_2_session_takeover_closes_old_connection(broker: Broker, v: int) -> None:
    old, _ = await RawClient.connect(broker.port, "dup-id", v)
    new, ack = await RawClient.connect(broker.port, "dup-id", v)
    assert ack.reason_code == RC.SUCCESS
    got = await old.closed()
    if v == 5:
        assert [type(p) for p in got] == [Disconnect]
        assert got[0].reason_code == RC.SESSION_TAKEN_OVER  # type: ignore[union-attr]
    else:
        assert got == []
    assert await new.barrier() == []
    await new.close()


async def test_mqtt_3_2_2_2_session_present_311(broker: Broker) -> None:
    c, ack = await RawClient.connect(broker.port, "sp4", 4, clean_start=False)
    assert ack.session_present is False
    await c.subscribe("sp/#")
    c.send(Disconnect())
    await c.closed()
    c, ack = await RawClient.connect(broker.port, "sp4", 4, clean_start=False)
    assert ack.session_present is True  # [MQTT-3.2.2-2]
    await c.close()
    c, ack = await RawClient.connect(broker.port, "sp4", 4, clean_start=True)
    assert ack.session_present is False  # [MQTT-3.2.2-1]
    await c.close()


async def test_mqtt_3_1_2_23_session_expiry_v5(broker: Broker) -> None:
    props = Properties(session_expiry_interval=60)
    c, ack = await RawClient.connect(broker.port, "se5", 5, clean_start=False, properties=props)
    assert ack.session_present is False
    c.send(Disconnect())
    await c.closed()
    c, ack = await RawClient.connect(broker.port, "se5", 5, clean_start=False, properties=props)
    assert ack.session_present is True
    c.send(Disconnect())
    await c.closed()
    # session expiry 0 (absent): the session ends with the connection [MQTT-3.1.2-23]
    c, ack = await RawClient.connect(broker.port, "se5-0", 5, clean_start=False)
    c.send(Disconnect())
    await c.closed()
    c, ack = await RawClient.connect(broker.port, "se5-0", 5, clean_start=False)
    assert ack.session_present is False
    await c.close()


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_3_1_2_24_keep_alive_one_and_a_half(broker: Broker, v: int) -> None:
    c, _ = await RawClient.connect(broker.port, "ka", v, keep_alive=1)
    got = await c.closed(timeout=5)
    if v == 5:
        assert [p.reason_code for p in got if isinstance(p, Disconnect)] == [RC.KEEP_ALIVE_TIMEOUT]


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_3_1_2_8_will_published_on_abnormal_close(broker: Broker, v: int) -> None:
    sub, _ = await RawClient.connect(broker.port, "will-sub", v)
    await sub.subscribe("will/t")
    w, _ = await RawClient.connect(broker.port, "will-pub", v, will=Will("will/t", b"gone", 1))
    await w.close()  # no DISCONNECT
    p = await sub.recv()
    assert isinstance(p, Publish) and (p.topic, p.payload, p.qos) == ("will/t", b"gone", 1)


@pytest.mark.parametrize("v", [4, 5])
async def test_mqtt_3_1_2_10_will_discarded_on_normal_disconnect(broker: Broker, v: int) -> None:
    sub, _ = await RawClient.connect(broker.port, "will-sub2", v)
    await sub.subscribe("will/n")
    w, _ = await RawClient.connect(broker.port, "will-pub2", v, will=Will("will/n", b"gone"))
    w.send(Disconnect())
    await w.closed()
    await sub.publish1("will/n", b"marker")
    p = await sub.recv()
    assert isinstance(p, Publish) and p.payload == b"marker"


async def test_mqtt_3_14_4_3_disconnect_with_will_message(broker: Broker) -> None:
    sub, _ = await RawClient.connect(broker.port, "will-sub3", 5)
    await sub.subscribe("will/d")
    w, _ = await RawClient.connect(broker.port, "will-pub3", 5, will=Will("will/d", b"bye"))
    w.send(Disconnect(RC.DISCONNECT_WITH_WILL_MESSAGE))
    await w.closed()
    p = await sub.recv()
    assert isinstance(p, Publish) and p.payload == b"bye"


async def test_mqtt_3_1_3_9_will_delay_and_reconnect_cancels(broker: Broker) -> None:
    sub, _ = await RawClient.connect(broker.port, "wd-sub", 5)
    await sub.subscribe("will/delay")
    will = Will("will/delay", b"late", properties=Properties(will_delay_interval=1))
    sess = Properties(session_expiry_interval=30)
    # reconnecting before the delay ends: no will [MQTT-3.1.3-9]
    w, _ = await RawClient.connect(broker.port, "wd-a", 5, clean_start=False, will=will, properties=sess)
    await w.close()
    w, _ = await RawClient.connect(broker.port, "wd-a", 5, clean_start=False, properties=sess)
    # not reconnecting: the will is published after the delay
    w2, _ = await RawClient.connect(
        broker.port, "wd-b", 5, will=Will("will/delay", b"b", properties=will.properties), properties=sess
    )
    await w2.close()
    p = await sub.recv(timeout=5)
    assert isinstance(p, Publish) and p.payload == b"b"
    assert await sub.barrier() == []
    await w.close()


async def test_mqtt_3_2_2_connack_properties_v5(broker: Broker) -> None:
    c, ack = await RawClient.connect(
        broker.port, "props", 5, properties=Properties(request_problem_information=1)
    )
    p = ack.properties
    assert p.topic_alias_maximum and p.topic_alias_maximum > 0
    assert p.retain_available in (None, 1)
    await c.close()


async def test_mqtt_3_1_user_properties_in_subscribe_do_not_break(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "up", 5)
    ack = await c.subscribe(
        SubscriptionRequest("x/y", 1), properties=Properties(user_properties=(("a", "b"),))
    )
    assert ack.reason_codes == (RC.GRANTED_QOS_1,)
    await c.close()
