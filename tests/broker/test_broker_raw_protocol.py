"""Packet-level tests over loopback: exactly the packets a rule is about, through our codec."""

from __future__ import annotations

from broker import Broker
from broker.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
)
from tests.rawclient import RawClient
from tests.waiting import eventually

T = 5.0


async def subscribe(c: RawClient, *filters: str, qos: int = 1, props: Properties | None = None) -> Suback:
    c.send(Subscribe(1, tuple(SubscriptionRequest(f, qos) for f in filters), props or Properties()))
    ack = await c.recv()
    assert isinstance(ack, Suback)
    return ack


async def test_connack_assigned_client_id(broker: Broker) -> None:
    c, ack = await RawClient.connect(broker.port, "", 5)
    assert isinstance(ack, Connack) and ack.reason_code == ReasonCode.SUCCESS
    assert ack.properties.assigned_client_identifier
    await c.close()


async def test_v311_empty_id_without_clean_session_refused(broker: Broker) -> None:
    c, ack = await RawClient.connect(broker.port, "", 4, clean_start=False)
    assert isinstance(ack, Connack) and ack.reason_code != ReasonCode.SUCCESS
    assert await c.closed() == []


async def test_takeover_closes_old_connection(broker: Broker) -> None:
    old, _ = await RawClient.connect(broker.port, "same", 5)
    new, ack = await RawClient.connect(broker.port, "same", 5)
    assert isinstance(ack, Connack)
    got = await old.closed()
    assert got == [Disconnect(ReasonCode.SESSION_TAKEN_OVER, got[0].properties)]  # type: ignore[union-attr]
    new.send(Pingreq())
    assert isinstance(await new.recv(), Pingresp)
    await new.close()


async def test_takeover_v311_keeps_session(broker: Broker) -> None:
    old, _ = await RawClient.connect(broker.port, "same3", 4, clean_start=False)
    await subscribe(old, "t/#")
    new, ack = await RawClient.connect(broker.port, "same3", 4, clean_start=False)
    assert isinstance(ack, Connack) and ack.session_present
    assert await old.closed() == []
    await broker.publish("t/1", b"x", qos=1)
    p = await new.recv()
    assert isinstance(p, Publish) and p.topic == "t/1"
    await new.close()


async def test_will_on_abnormal_close_not_on_disconnect(broker: Broker) -> None:
    async with broker.subscribe("w/#") as local:
        c, _ = await RawClient.connect(broker.port, "w1", 5, will=Will("w/w1", b"bye"))
        c.send(Disconnect())
        await c.closed()
        c, _ = await RawClient.connect(broker.port, "w2", 5, will=Will("w/w2", b"gone"))
        await c.close()
        msg = await local.get(T)
        assert (msg.topic, msg.payload) == ("w/w2", b"gone")
        c, _ = await RawClient.connect(broker.port, "w3", 5, will=Will("w/w3", b"asked"))
        c.send(Disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE))
        msg = await local.get(T)
        assert msg.topic == "w/w3"
        assert await c.closed() == []


async def test_will_delay_cancelled_by_reconnect(broker: Broker) -> None:
    props = Properties(session_expiry_interval=60)
    will = Will("wd/x", b"late", properties=Properties(will_delay_interval=1))
    async with broker.subscribe("wd/#") as local:
        c, _ = await RawClient.connect(broker.port, "wd", 5, will=will, properties=props, clean_start=False)
        await c.close()
        c, ack = await RawClient.connect(broker.port, "wd", 5, properties=props, clean_start=False)
        assert isinstance(ack, Connack) and ack.session_present
        # the will of the first connection is not sent; a second one after its delay is
        c2, _ = await RawClient.connect(broker.port, "wd2", 5, will=will, properties=props)
        await c2.close()
        msg = await local.get(T)
        assert msg.publisher_id == "wd2"
        await c.close()


async def test_session_expiry() -> None:
    async with Broker(port=0, sys_interval=0, tick_interval=0.05) as b:
        props = Properties(session_expiry_interval=1)
        c, _ = await RawClient.connect(b.port, "exp", 5, properties=props, clean_start=False)
        await subscribe(c, "e/#")
        await c.close()
        await eventually(lambda: "exp" not in b.core.sessions)  # ends after one second
        c, ack = await RawClient.connect(b.port, "exp", 5, properties=props, clean_start=False)
        assert isinstance(ack, Connack) and not ack.session_present
        await c.close()


async def test_keep_alive_timeout(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "ka", 5, keep_alive=1)
    got = await c.closed(timeout=T)
    assert [type(p) for p in got] == [Disconnect]
    assert got[0].reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT  # type: ignore[union-attr]


async def test_qos2_outgoing_across_reconnect(broker: Broker) -> None:
    props = Properties(session_expiry_interval=60)
    c, _ = await RawClient.connect(broker.port, "q2", 5, properties=props, clean_start=False)
    await subscribe(c, "q2/#", qos=2)
    await broker.publish("q2/a", b"A", qos=2)
    await broker.publish("q2/b", b"B", qos=2)
    pa = await c.recv()
    pb = await c.recv()
    assert isinstance(pa, Publish) and isinstance(pb, Publish) and pa.qos == 2
    assert pa.packet_id is not None and pb.packet_id is not None
    c.send(Pubrec(pa.packet_id))
    assert await c.recv() == Pubrel(pa.packet_id)
    await c.close()  # pa awaits PUBCOMP, pb awaits PUBREC
    c, ack = await RawClient.connect(broker.port, "q2", 5, properties=props, clean_start=False)
    assert isinstance(ack, Connack) and ack.session_present
    again = [await c.recv(), await c.recv()]
    assert Pubrel(pa.packet_id) in again
    dup = next(p for p in again if isinstance(p, Publish))
    assert (dup.topic, dup.dup, dup.packet_id) == ("q2/b", True, pb.packet_id)
    c.send(Pubcomp(pa.packet_id))
    c.send(Pubrec(pb.packet_id))
    assert await c.recv() == Pubrel(pb.packet_id)
    c.send(Pubcomp(pb.packet_id))
    await c.close()


async def test_qos2_incoming_exactly_once(broker: Broker) -> None:
    async with broker.subscribe("in/#") as local:
        c, _ = await RawClient.connect(broker.port, "pub2", 5)
        c.send(Publish("in/x", b"1", qos=2, packet_id=5))
        assert isinstance(await c.recv(), Pubrec)
        c.send(Publish("in/x", b"1", qos=2, packet_id=5, dup=True))  # duplicate before PUBREL
        assert isinstance(await c.recv(), Pubrec)
        c.send(Pubrel(5))
        assert await c.recv() == Pubcomp(5)
        c.send(Publish("in/x", b"marker", qos=1, packet_id=6))
        assert isinstance(await c.recv(), Puback)
        first = await local.get(T)
        second = await local.get(T)
        assert (first.payload, second.payload) == (b"1", b"marker")
        await c.close()


async def test_topic_alias_both_directions(broker: Broker) -> None:
    sub, _ = await RawClient.connect(broker.port, "as", 5, properties=Properties(topic_alias_maximum=5))
    await subscribe(sub, "alias/#", qos=0)
    pub, ack = await RawClient.connect(broker.port, "ap", 5)
    assert isinstance(ack, Connack) and (ack.properties.topic_alias_maximum or 0) > 0
    pub.send(Publish("alias/long/topic", b"1", properties=Properties(topic_alias=3)))
    pub.send(Publish("", b"2", properties=Properties(topic_alias=3)))
    m1 = await sub.recv()
    m2 = await sub.recv()
    assert isinstance(m1, Publish) and isinstance(m2, Publish)
    assert m1.topic == "alias/long/topic" and m1.properties.topic_alias is not None
    assert m2.topic == "" and m2.properties.topic_alias == m1.properties.topic_alias
    assert m2.payload == b"2"
    pub.send(Publish("", b"3", properties=Properties(topic_alias=4)))  # unknown alias
    got = await pub.closed()
    assert [p.reason_code for p in got if isinstance(p, Disconnect)] == [ReasonCode.PROTOCOL_ERROR]
    await sub.close()


async def test_partial_unsubscribe_reason_codes(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "pu", 5)
    await subscribe(c, "a/#")
    c.send(Unsubscribe(2, ("a/b/#", "zzz/#", "a/#")))
    ack = await c.recv()
    assert ack == Unsuback(2, (ReasonCode.SUCCESS, ReasonCode.NO_SUBSCRIPTION_EXISTED, ReasonCode.SUCCESS))
    await c.close()


async def test_queue_limit_disconnects_with_quota_exceeded() -> None:
    async with Broker(
        port=0, sys_interval=0, max_inflight=2, max_queued_messages=3, slow_consumer_policy="disconnect"
    ) as b:
        c, _ = await RawClient.connect(b.port, "slow", 5)
        await subscribe(c, "f/#")
        for i in range(6):  # never acknowledged: 2 in flight, 3 queued, the 6th overflows
            await b.publish(f"f/{i}", b"x", qos=1)
        got = await c.closed()
        assert [p.topic for p in got if isinstance(p, Publish)] == ["f/0", "f/1"]
        assert got[-1] == Disconnect(ReasonCode.QUOTA_EXCEEDED, got[-1].properties)  # type: ignore[union-attr]
        assert b.core.stats.queue_overflow == 1


async def test_queue_limit_drops_by_default() -> None:
    """Policy ``drop`` (the default): a full queue drops and counts; the client stays."""
    async with Broker(port=0, sys_interval=0, max_inflight=2, max_queued_messages=3) as b:
        c, _ = await RawClient.connect(b.port, "slow", 5)
        await subscribe(c, "f/#")
        for i in range(6):  # never acknowledged: 2 in flight, 3 queued, the 6th is dropped
            await b.publish(f"f/{i}", b"x", qos=1)
        assert b.core.stats.dropped_queue_full == 1
        for i in range(5):
            p = await c.recv_where(lambda p: isinstance(p, Publish))
            assert isinstance(p, Publish) and p.topic == f"f/{i}" and p.packet_id is not None
            c.send(Puback(p.packet_id))
        await c.barrier()
        assert b.core.sessions["slow"].conn is not None
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


async def test_inflight_window_releases_queue() -> None:
    async with Broker(port=0, sys_interval=0, max_inflight=1) as b:
        c, _ = await RawClient.connect(b.port, "win", 5)
        await subscribe(c, "f/#")
        for i in range(3):
            await b.publish(f"f/{i}", b"x", qos=1)
        for i in range(3):
            p = await c.recv()
            assert isinstance(p, Publish) and p.topic == f"f/{i}" and p.packet_id is not None
            c.send(Puback(p.packet_id))
        await c.close()


async def test_v311_filter_prefix_and_bad_selector(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "f3", 4)
    ack = await subscribe(c, "$filter/kind = 'a/b' AND n > 1/data/#", "$filter/n >/data/#")
    assert ack.reason_codes == (ReasonCode.GRANTED_QOS_1, ReasonCode.UNSPECIFIED_ERROR)
    await broker.publish("data/1", b'{"kind": "a/b", "n": 1}')
    await broker.publish("data/2", b'{"kind": "a/b", "n": 2}')
    p = await c.recv()
    assert isinstance(p, Publish) and p.topic == "data/2"
    await c.close()


async def test_v5_bad_selector_reason_string(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "f5", 5)
    ack = await subscribe(c, "d/#", props=Properties(user_properties=(("filter", "n > "),)))
    assert ack.reason_codes == (ReasonCode.TOPIC_FILTER_INVALID,)
    # the position once (it was appended to a message that ends with it: "... at 4 at position 4")
    assert (
        ack.properties.reason_string
        == "content filter 'n > ': expected a value after '>' but found end of input at 4"
    )
    await c.close()


ONLY_IN_FILTERS = "(wildcards are only allowed in topic filters)"


async def test_v5_reason_strings_say_each_thing_once(broker: Broker) -> None:
    """Issue 31 item 6: a composite syntax error said its position twice, a topic error its
    topic twice."""
    c, _ = await RawClient.connect(broker.port, "once5", 5)
    ack = await subscribe(c, "$composite/r/d/a & & d/b", "a/#/b")
    assert ack.reason_codes == (ReasonCode.TOPIC_FILTER_INVALID, ReasonCode.TOPIC_FILTER_INVALID)
    assert ack.properties.reason_string == (
        "composite 'd/a & & d/b': expected an atom but found '&' at 6; "
        "topic filter 'a/#/b': '#' must be the last level (position 2)"
    )
    c.send(Publish("a/+", b"x", 0))
    got = await c.closed()
    assert [p.properties.reason_string for p in got if isinstance(p, Disconnect)] == [
        "topic name 'a/+' contains the wildcard '+' at position 2 " + ONLY_IN_FILTERS
    ]
    bad_will = await RawClient.open(broker.port, 5)
    bad_will.send(Connect("once5w", 5, will=Will("w/#", b"")))
    refused = await bad_will.recv()
    assert isinstance(refused, Connack) and refused.reason_code == ReasonCode.TOPIC_NAME_INVALID
    assert refused.properties.reason_string == (
        "will topic name 'w/#' contains the wildcard '#' at position 2 " + ONLY_IN_FILTERS
    )


async def test_invalid_topic_filter_refused(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "tf", 5)
    ack = await subscribe(c, "a/#/b", "ok/+")
    assert ack.reason_codes == (ReasonCode.TOPIC_FILTER_INVALID, ReasonCode.GRANTED_QOS_1)
    await c.close()


async def test_malformed_v5_gets_disconnect_then_close(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "bad", 5)
    c.send_bytes(b"\x82\x00")  # SUBSCRIBE with an empty remaining length
    got = await c.closed()
    assert len(got) == 1 and isinstance(got[0], Disconnect) and got[0].reason_code >= 0x80
    assert broker.core.stats.malformed == 1


async def test_malformed_v311_is_closed(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "bad3", 4)
    c.send_bytes(b"\xf0\x00")  # AUTH does not exist in 3.1.1
    assert await c.closed() == []


async def test_packet_before_connect_is_closed(broker: Broker) -> None:
    c = await RawClient.open(broker.port)
    c.send_bytes(b"\xc0\x00")  # PINGREQ
    assert await c.closed() == []
    c = await RawClient.open(broker.port)
    c.send_bytes(b"\x10\x04\xff\xff\xff\xff")  # CONNECT with a broken protocol name
    assert await c.closed() == []
    # the broker still serves others
    ok, ack = await RawClient.connect(broker.port, "after", 5)
    assert isinstance(ack, Connack) and ack.reason_code == ReasonCode.SUCCESS
    await ok.close()


async def test_publish_to_invalid_topic_disconnects(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "wild", 5)
    c.send(Publish("a/+", b"x"))
    got = await c.closed()
    assert [p.reason_code for p in got if isinstance(p, Disconnect)] == [ReasonCode.TOPIC_NAME_INVALID]
