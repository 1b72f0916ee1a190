"""Codec tests: round trips of every packet type in 3.1.1 and 5.0, byte vectors written by
hand from the standards, and the validation rules (each malformed case -> its reason code)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.packets import (
    NO_PROPERTIES,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    MalformedPacket,
    Packet,
    Pingreq,
    Properties,
    Puback,
    Publish,
    PublishTemplate,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
    encode_publish,
)
from tests.broker.codec_strategies import client_packets, connects, server_packets

RC = ReasonCode


def decode_all(data: bytes, version: int | None, server: bool = True) -> list[Packet]:
    d = Decoder(version, server=server)
    out = d.feed(data)
    d._check()
    assert not d._buf, "bytes left over"
    return out


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("v", [3, 4, 5])
@settings(max_examples=30)
@given(data=st.data())
def test_round_trip_client_to_server(v: int, data: st.DataObject) -> None:
    c = data.draw(connects(v))
    pkts = data.draw(st.lists(server_packets(v), max_size=5))
    wire = encode(c, v) + b"".join(encode(p, v) for p in pkts)
    d = Decoder(None, server=True)
    assert d.feed(wire) == [c, *pkts]
    assert d.version == v


@pytest.mark.parametrize("v", [4, 5])
@settings(max_examples=30)
@given(data=st.data())
def test_round_trip_server_to_client(v: int, data: st.DataObject) -> None:
    pkts = data.draw(st.lists(client_packets(v), min_size=1, max_size=5))
    wire = b"".join(encode(p, v) for p in pkts)
    assert decode_all(wire, v, server=False) == pkts


@pytest.mark.parametrize("v", [4, 5])
@settings(max_examples=25)
@given(data=st.data())
def test_round_trip_any_chunking(v: int, data: st.DataObject) -> None:
    c = data.draw(connects(v))
    pkts = data.draw(st.lists(server_packets(v), max_size=5))
    wire = encode(c, v) + b"".join(encode(p, v) for p in pkts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    d = Decoder(None)
    got: list[Packet] = []
    prev = 0
    for cut in [*cuts, len(wire)]:
        got += d.feed(wire[prev:cut])
        d._check()
        prev = cut
    assert got == [c, *pkts]


@settings(max_examples=30)
@given(
    topic=st.text(min_size=1, max_size=20).filter(lambda t: "\x00" not in t),
    payload=st.binary(max_size=300),
    qos=st.integers(0, 2),
    pid=st.integers(1, 0xFFFF),
    dup=st.booleans(),
    retain=st.booleans(),
    subids=st.lists(st.integers(1, 268_435_455), max_size=3).map(tuple),
    alias=st.none() | st.integers(1, 0xFFFF),
    v=st.sampled_from([4, 5]),
)
def test_publish_template_equals_encode(
    topic: str,
    payload: bytes,
    qos: int,
    pid: int,
    dup: bool,
    retain: bool,
    subids: tuple[int, ...],
    alias: int | None,
    v: int,
) -> None:
    base = Properties(content_type="application/json", user_properties=(("k", "v"),))
    t = PublishTemplate(topic, payload, base, v)
    got = t.render(
        qos,
        pid if qos else None,
        dup=dup and qos > 0,
        retain=retain,
        subscription_identifiers=subids,
        topic_alias=alias,
    )
    props = Properties(
        content_type="application/json",
        user_properties=(("k", "v"),),
        subscription_identifiers=subids,
        topic_alias=alias,
    )
    (p,) = decode_all(got, v, server=False)
    assert p == Publish(
        topic, payload, qos, retain, dup and qos > 0, pid if qos else None, props if v == 5 else NO_PROPERTIES
    )
    if not subids and alias is None:
        assert got == encode_publish(
            topic, payload, qos, retain, dup and qos > 0, pid if qos else None, base, v
        )


# ------------------------------------------------------------------ byte vectors from the standards
def test_vector_connect_311_minimal() -> None:
    # 3.1.2 example: protocol name "MQTT", level 4, flags clean session, keep alive 60, client id "a"
    wire = bytes.fromhex("10 0d 0004 4d515454 04 02 003c 0001 61".replace(" ", ""))
    assert encode(Connect("a", 4, True, 60), 4) == wire
    assert decode_all(wire, None) == [Connect("a", 4, True, 60)]


def test_vector_connect_31_mqisdp() -> None:
    wire = bytes.fromhex("100f 0006 4d5149736470 03 02 000a 0001 78")
    p = Connect("x", 3, True, 10, protocol_name="MQIsdp")
    assert encode(p, 3) == wire
    assert decode_all(wire, None) == [p]


def test_vector_connect_5_with_will_and_credentials() -> None:
    # 3.1.2.11: properties length then session expiry interval (0x11) = 10
    wire = bytes.fromhex(
        "10 28 0004 4d515454 05 ee 001e 05 11 0000000a 0002 6964"
        " 05 18 00000005 0001 77 0002 6869 0001 75 0002 7077".replace(" ", "")
    )
    p = Connect(
        "id",
        5,
        True,
        30,
        Will("w", b"hi", 1, True, Properties(will_delay_interval=5)),
        "u",
        b"pw",
        Properties(session_expiry_interval=10),
    )
    assert encode(p, 5) == wire
    assert decode_all(wire, None) == [p]


def test_vector_publish_qos1_311_and_5() -> None:
    assert encode(Publish("a/b", b"hi", 1, False, False, 10), 4) == bytes.fromhex(
        "3209 0003 612f62 000a 6869"
    )
    assert encode(Publish("a/b", b"hi", 1, False, False, 10), 5) == bytes.fromhex(
        "320a 0003 612f62 000a 00 6869"
    )
    # v5 with topic alias 2 (0x23) and empty topic
    wire = bytes.fromhex("3308 0000 0007 03 230002")
    assert decode_all(wire, 5) == [Publish("", b"", 1, True, False, 7, Properties(topic_alias=2))]


def test_vector_acks_short_forms_v5() -> None:
    # 3.4.2.1: reason code and property length may be omitted when 0x00 / no properties
    assert encode(Puback(5), 5) == b"\x40\x02\x00\x05"
    assert encode(Puback(5, RC.NO_MATCHING_SUBSCRIBERS), 5) == b"\x40\x03\x00\x05\x10"
    assert decode_all(b"\x40\x03\x00\x05\x10", 5) == [Puback(5, RC.NO_MATCHING_SUBSCRIBERS)]
    assert decode_all(b"\x40\x04\x00\x05\x10\x00", 5) == [Puback(5, RC.NO_MATCHING_SUBSCRIBERS)]
    assert decode_all(b"\x62\x02\x00\x05", 5)[0].packet_id == 5  # type: ignore[union-attr]
    assert encode(Disconnect(), 5) == b"\xe0\x00"
    assert decode_all(b"\xe0\x00", 5) == [Disconnect()]


def test_vector_subscribe_options() -> None:
    # 3.8.3.1: options byte = retain handling 2, RAP, NL, QoS 1 -> 0b00101101
    p = Subscribe(
        3, (SubscriptionRequest("a/#", 1, True, True, 2),), Properties(subscription_identifiers=(7,))
    )
    wire = bytes.fromhex("820b 0003 02 0b07 0003 612f23 2d")
    assert encode(p, 5) == wire
    assert decode_all(wire, 5) == [p]
    assert encode(Subscribe(3, (SubscriptionRequest("a", 2),)), 4) == bytes.fromhex("8206 0003 000161 02")


def test_vector_suback_connack_311_mapping() -> None:
    assert encode(Suback(1, (RC.GRANTED_QOS_1, RC.TOPIC_FILTER_INVALID)), 4) == b"\x90\x04\x00\x01\x01\x80"
    assert encode(Connack(True, RC.NOT_AUTHORIZED), 4) == b"\x20\x02\x00\x05"
    assert encode(Connack(False, RC.BAD_USER_NAME_OR_PASSWORD), 4) == b"\x20\x02\x00\x04"
    assert encode(Connack(False, RC.SERVER_BUSY), 4) == b"\x20\x02\x00\x03"
    assert encode(Connack(False, RC.UNSUPPORTED_PROTOCOL_VERSION), 4) == b"\x20\x02\x00\x01"
    assert encode(Connack(True), 4) == b"\x20\x02\x01\x00"
    assert encode(Unsuback(9, (RC.SUCCESS,)), 4) == b"\xb0\x02\x00\x09"
    assert encode(Unsuback(9, (RC.NO_SUBSCRIPTION_EXISTED,)), 5) == b"\xb0\x04\x00\x09\x00\x11"


def test_vector_remaining_length_boundaries() -> None:
    # 1.5.5: 127 -> 1 byte, 128 -> 2 bytes, 16383 -> 2, 16384 -> 3, 2097152 -> 4
    for size, nbytes in ((127, 1), (128, 2), (16383, 2), (16384, 3), (2_097_152, 4)):
        payload = b"x" * (size - 3)  # topic "a" (3 bytes) + payload
        wire = encode(Publish("a", payload), 4)
        assert len(wire) == 1 + nbytes + size
        assert decode_all(wire, 4) == [Publish("a", payload)]


# ------------------------------------------------------------------ validation
def bad(
    data: bytes, version: int | None = 5, server: bool = True, max_size: int = 268_435_455
) -> MalformedPacket:
    d = Decoder(version, max_packet_size=max_size, server=server)
    with pytest.raises(MalformedPacket) as ei:
        d.feed(data)
    with pytest.raises(MalformedPacket):  # stays broken
        d.feed(b"\xc0\x00")
    assert str(ei.value)
    return ei.value


CONNECT4 = bytes.fromhex("100d00044d5154540402003c000161")


@pytest.mark.parametrize(
    ("data", "version", "code", "words"),
    [
        (b"\x30\xff\xff\xff\xff\x01", 5, RC.MALFORMED_PACKET, "4 bytes"),  # [MQTT-1.5.5-1]
        (b"\x00\x00", 5, RC.MALFORMED_PACKET, "reserved packet type"),
        (b"\x20\x02\x00\x00", 5, RC.PROTOCOL_ERROR, "not allowed from a client"),
        (b"\x60\x02\x00\x01", 5, RC.MALFORMED_PACKET, "flags"),  # PUBREL flags 0010
        (b"\x80\x06\x00\x01\x00\x01a\x00", 4, RC.MALFORMED_PACKET, "flags"),  # SUBSCRIBE flags 0010
        (b"\xc1\x00", 4, RC.MALFORMED_PACKET, "flags"),
        (b"\x36\x05\x00\x01a\x00\x01", 4, RC.MALFORMED_PACKET, "QoS 3"),  # [MQTT-3.3.1-4]
        (b"\x38\x03\x00\x01a", 4, RC.MALFORMED_PACKET, "DUP"),  # [MQTT-3.3.1-2]
        (b"\x32\x05\x00\x01a\x00\x00", 4, RC.MALFORMED_PACKET, "packet identifier 0"),
        (b"\x30\x04\x00\x02\xc3\x28", 4, RC.MALFORMED_PACKET, "UTF-8"),
        (b"\x30\x05\x00\x03\xed\xa0\x80", 4, RC.MALFORMED_PACKET, "UTF-8"),  # surrogate U+D800
        (b"\x30\x04\x00\x02a\x00", 4, RC.MALFORMED_PACKET, "U+0000"),
        (b"\x30\x03\x00\x00\x00", 5, RC.PROTOCOL_ERROR, "topic alias"),  # [MQTT-3.3.2-8]
        (b"\x30\x07\x00\x01a\x03\x23\x00\x00", 5, RC.TOPIC_ALIAS_INVALID, "alias 0"),
        (b"\x30\x06\x00\x01a\x02\x0b\x01", 5, RC.PROTOCOL_ERROR, "subscription identifier"),  # from a client
        (b"\x30\x07\x00\x01a\x03\x11\x00\x00", 5, RC.PROTOCOL_ERROR, "not allowed in PUBLISH"),
        (b"\x30\x08\x00\x01a\x04\x01\x00\x01\x01", 5, RC.PROTOCOL_ERROR, "duplicate"),
        (b"\x30\x06\x00\x01a\x02\x01\x02", 5, RC.PROTOCOL_ERROR, "invalid value"),
        (b"\x30\x05\x00\x01a\x01\x7f", 5, RC.MALFORMED_PACKET, "unknown property"),
        (b"\x30\x05\x00\x01a\x05\x01", 5, RC.MALFORMED_PACKET, "property length"),
        (b"\x82\x02\x00\x01", 4, RC.PROTOCOL_ERROR, "without a topic filter"),  # [MQTT-3.8.3-3]
        (b"\x82\x03\x00\x01\x00", 5, RC.PROTOCOL_ERROR, "without a topic filter"),
        (b"\xa2\x02\x00\x01", 4, RC.PROTOCOL_ERROR, "without a topic filter"),  # [MQTT-3.10.3-2]
        (b"\x82\x06\x00\x01\x00\x01a\x03", 4, RC.MALFORMED_PACKET, "QoS 3"),
        (b"\x82\x06\x00\x01\x00\x01a\x04", 4, RC.MALFORMED_PACKET, "reserved bits"),
        (b"\x82\x07\x00\x01\x00\x00\x01a\x40", 5, RC.MALFORMED_PACKET, "reserved subscription option"),
        (b"\x82\x07\x00\x01\x00\x00\x01a\x30", 5, RC.PROTOCOL_ERROR, "retain handling 3"),
        (b"\x82\x0d\x00\x01\x00\x00\x07$share/\x04", 5, RC.PROTOCOL_ERROR, "shared"),
        (b"\x82\x07\x00\x00\x00\x00\x01a\x00", 5, RC.MALFORMED_PACKET, "packet identifier 0"),
        (b"\x82\x0b\x00\x01\x04\x0b\x01\x0b\x02\x00\x01a\x00", 5, RC.PROTOCOL_ERROR, "duplicate"),
        (b"\x82\x09\x00\x01\x02\x0b\x00\x00\x01a\x00", 5, RC.PROTOCOL_ERROR, "identifier 0"),
        (b"\x40\x03\x00\x01\x05", 5, RC.MALFORMED_PACKET, "reason code"),
        (b"\x40\x03\x00\x01\x00", 4, RC.MALFORMED_PACKET, "unexpected bytes"),
        (b"\xe0\x01\x00", 4, RC.MALFORMED_PACKET, "3.1.1 DISCONNECT"),
        (b"\xf0\x00", 4, RC.MALFORMED_PACKET, "only in MQTT 5"),
        (b"\xc0\x01\x00", 5, RC.MALFORMED_PACKET, "with a body"),
        (b"\xe0\x05\x00\x03\x1c\x00\x00", 5, RC.PROTOCOL_ERROR, "server reference"),
        (b"\x30\x03\x00\x01a", None, RC.PROTOCOL_ERROR, "first packet is not CONNECT"),
        (b"\xc0\x00", None, RC.PROTOCOL_ERROR, "first packet is not CONNECT"),
        (CONNECT4 + CONNECT4, None, RC.PROTOCOL_ERROR, "second CONNECT"),  # [MQTT-3.1.0-2]
    ],
)
def test_malformed(data: bytes, version: int | None, code: ReasonCode, words: str) -> None:
    exc = bad(data, version)
    assert exc.reason_code == code, str(exc)
    assert words in str(exc)


def _connect_bytes(
    name: bytes, level: int, flags: int, tail: bytes = b"\x00\x01a", props: bytes = b""
) -> bytes:
    body = len(name).to_bytes(2, "big") + name + bytes((level, flags)) + b"\x00\x3c" + props + tail
    return bytes((0x10, len(body))) + body


@pytest.mark.parametrize(
    ("data", "code", "words"),
    [
        (_connect_bytes(b"MQTT", 6, 2), RC.UNSUPPORTED_PROTOCOL_VERSION, "level 6"),  # [MQTT-3.1.2-2]
        (_connect_bytes(b"MQTX", 4, 2), RC.UNSUPPORTED_PROTOCOL_VERSION, "'MQTX'"),  # [MQTT-3.1.2-1]
        (_connect_bytes(b"MQTT", 3, 2), RC.UNSUPPORTED_PROTOCOL_VERSION, "level 3"),
        (_connect_bytes(b"MQTT", 4, 3), RC.MALFORMED_PACKET, "reserved connect flag"),  # [MQTT-3.1.2-3]
        (_connect_bytes(b"MQTT", 4, 0x0A), RC.MALFORMED_PACKET, "without the will flag"),  # [MQTT-3.1.2-11]
        (_connect_bytes(b"MQTT", 4, 0x22), RC.MALFORMED_PACKET, "without the will flag"),  # [MQTT-3.1.2-15]
        (_connect_bytes(b"MQTT", 4, 0x1E), RC.MALFORMED_PACKET, "will QoS 3"),  # [MQTT-3.1.2-14]
        (_connect_bytes(b"MQTT", 4, 0x42, b"\x00\x01a\x00\x01p"), RC.MALFORMED_PACKET, "[MQTT-3.1.2-22]"),
        (_connect_bytes(b"MQTT", 4, 0x02, b"\x00\x01a\x00"), RC.MALFORMED_PACKET, "unexpected bytes"),
        (_connect_bytes(b"MQTT", 4, 0x06, b"\x00\x01a"), RC.MALFORMED_PACKET, "truncated"),
        (_connect_bytes(b"MQTT", 5, 2, props=b"\x02\x24\x01"), RC.PROTOCOL_ERROR, "maximum_qos"),
        (_connect_bytes(b"MQTT", 5, 2, props=b"\x03\x21\x00\x00"), RC.PROTOCOL_ERROR, "receive_maximum"),
        (
            _connect_bytes(b"MQTT", 5, 2, props=b"\x05\x27\x00\x00\x00\x00"),
            RC.PROTOCOL_ERROR,
            "maximum_packet_size",
        ),
        (_connect_bytes(b"MQTT", 5, 2, props=b"\x03\x16\x00\x00"), RC.PROTOCOL_ERROR, "authentication"),
        (_connect_bytes(b"MQTT", 5, 2, props=b"\x02\x17\x02"), RC.PROTOCOL_ERROR, "invalid value"),
    ],
)
def test_malformed_connect(data: bytes, code: ReasonCode, words: str) -> None:
    exc = bad(data, None)
    assert exc.reason_code == code, str(exc)
    assert words in str(exc)


def test_connect_5_password_without_username_is_legal() -> None:
    p = Connect("c", 5, password=b"secret")
    assert decode_all(encode(p, 5), None) == [p]


def test_will_property_not_allowed_in_connect() -> None:
    # will delay interval (0x18) is a will property, not a CONNECT property
    exc = bad(_connect_bytes(b"MQTT", 5, 2, props=b"\x05\x18\x00\x00\x00\x01"), None)
    assert exc.reason_code == RC.PROTOCOL_ERROR


def test_packet_too_large_refused_from_the_header() -> None:
    # only the fixed header of a 1 MB packet arrives: refused before buffering the body
    exc = bad(b"\x30\x80\x80\x40", 4, max_size=1000)
    assert exc.reason_code == RC.PACKET_TOO_LARGE
    ok = encode(Publish("a", b"x" * 990), 4)
    assert len(ok) <= 1000
    assert Decoder(4, max_packet_size=len(ok)).feed(ok) == [Publish("a", b"x" * 990)]
    assert bad(ok, 4, max_size=len(ok) - 1).reason_code == RC.PACKET_TOO_LARGE


def test_client_side_rejects_server_only_packets() -> None:
    assert bad(encode(Pingreq(), 5), 5, server=False).reason_code == RC.PROTOCOL_ERROR
    assert (
        bad(encode(Subscribe(1, (SubscriptionRequest("a"),)), 5), 5, server=False).reason_code
        == RC.PROTOCOL_ERROR
    )
    assert bad(b"\x20\x02\x02\x00", 4, server=False).reason_code == RC.MALFORMED_PACKET  # reserved ack flags
    assert bad(b"\x20\x02\x00\x06", 4, server=False).reason_code == RC.MALFORMED_PACKET  # return code 6
    # [MQTT-3.2.2-4] session present with a refusal (found by test_mutated_streams: the encoder
    # clears the flag, so accepting it broke decode(encode(p)) == p)
    assert "Session Present" in str(bad(b"\x20\x02\x01\x01", 4, server=False))
    assert bad(b"\x90\x03\x00\x01\x03", 4, server=False).reason_code == RC.MALFORMED_PACKET  # SUBACK 3


def test_partial_header_then_rest() -> None:
    wire = encode(Publish("t", b"p" * 200, 1, packet_id=4), 5)
    d = Decoder(5)
    assert d.feed(wire[:1]) == []
    assert d.feed(wire[1:2]) == []  # remaining length still incomplete (2 bytes)
    assert d.feed(wire[2:50]) == []
    assert d._need == len(wire)
    assert d.feed(wire[50:] + encode(Unsubscribe(2, ("x",)), 5)) == [
        Publish("t", b"p" * 200, 1, packet_id=4),
        Unsubscribe(2, ("x",)),
    ]
    d._check()


def test_publish_template_documented_packet_id_offset() -> None:
    t = PublishTemplate("a/b", b"payload", NO_PROPERTIES, 4)
    wire = bytearray(t.render(1, 0x0102))
    header = 2  # first byte + one remaining-length byte
    at = header + 2 + len(b"a/b")
    assert wire[at : at + 2] == b"\x01\x02"
    wire[at : at + 2] = b"\x0a\x0b"  # patching the id in place gives that subscriber's bytes
    assert bytes(wire) == t.render(1, 0x0A0B)


_RENDER = st.tuples(
    st.integers(0, 2),  # qos
    st.booleans(),  # dup (QoS > 0 only)
    st.booleans(),  # retain
    st.lists(st.integers(1, 268_435_455), max_size=2).map(tuple),  # subscription identifiers
    st.none() | st.integers(1, 0xFFFF),  # topic alias
    st.booleans(),  # send the topic (with an alias only)
)


@settings(max_examples=40)
@given(renders=st.lists(_RENDER, min_size=1, max_size=8), v=st.sampled_from([4, 5]))
def test_publish_template_renders_in_any_order_as_a_fresh_one(
    renders: list[tuple[int, bool, bool, tuple[int, ...], int | None, bool]], v: int
) -> None:
    """One template rendered for a fan-out's subscribers in any order gives each the bytes a
    fresh template would: the shared plain QoS 0 copy never leaks into another rendering."""
    t = PublishTemplate("a/b", b"payload", Properties(content_type="x"), v)
    for qos, dup, retain, subids, alias, send_topic in renders:
        fresh = PublishTemplate("a/b", b"payload", Properties(content_type="x"), v)
        got = [
            x.render(
                qos,
                7 if qos else None,
                dup=dup and qos > 0,
                retain=retain,
                subscription_identifiers=subids,
                topic_alias=alias,
                send_topic=send_topic or alias is None,
            )
            for x in (t, fresh)
        ]
        assert got[0] == got[1]


def test_publish_template_builds_the_plain_qos0_copy_once() -> None:
    """A fleet's fan-out: every QoS 0 subscriber without identifiers, alias, DUP or RETAIN
    gets the same bytes object (built at the first, nothing copied per subscriber)."""
    for v in (4, 5):
        t = PublishTemplate("fleet/telemetry", b"x" * 200, NO_PROPERTIES, v)
        first = t.render(0)
        assert t.render(1, 3) != first
        assert t.render(0, retain=True) != first
        assert t.render(0) is first
        if v == 5:  # (3.1.1 has no identifiers)
            assert t.render(0, subscription_identifiers=(1,)) != first
        assert t.render(0) is first
