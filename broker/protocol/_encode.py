"""Sans-IO encoder of MQTT 3.1.1 and 5.0 packets (the decoder is :mod:`broker.protocol._decode`).

Specification: OASIS MQTT 3.1.1 (2014) and 5.0 (2019), conformance statements cited as
[MQTT-x.x.x-y]; no seed covers the wire format.

Encoding concatenates precomputed pieces: fixed-header first bytes come from tables indexed by
flags, variable byte integers below 16384 from a table (:mod:`broker.protocol._wire`), packet
ids from ``struct``.  :class:`PublishTemplate` encodes a PUBLISH once for fan-out and renders
each subscriber's bytes (QoS, DUP, RETAIN, packet id, subscription identifiers, topic alias)
by joining a few ready-made slices: no re-encoding of topic, properties or payload.
Complexity: O(packet size).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from broker.protocol._values import (
    NO_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from broker.protocol._wire import (
    PROP_FIELDS,
    U32,
    pack_u16,
    vbi,
)

__all__ = ["PublishTemplate", "encode", "encode_publish"]


def _enc_str(s: str) -> bytes:
    b = s.encode()
    return pack_u16(len(b)) + b


def _enc_bin(b: bytes) -> bytes:
    return pack_u16(len(b)) + b


def _props_body(p: Properties) -> bytes:
    """Encoded properties without the length prefix."""
    out: list[bytes] = []
    for field, pid, kind in PROP_FIELDS:
        v = getattr(p, field)
        if v is None or v == ():
            continue
        match kind:
            case "1":
                out.append(bytes((pid, v)))
            case "2":
                out.append(bytes((pid,)) + pack_u16(v))
            case "4":
                out.append(bytes((pid,)) + U32.pack(v))
            case "v":
                out.extend(bytes((pid,)) + vbi(i) for i in v)
            case "s":
                out.append(bytes((pid,)) + _enc_str(v))
            case "b":
                out.append(bytes((pid,)) + _enc_bin(v))
            case _:
                out.extend(b"\x26" + _enc_str(k) + _enc_str(val) for k, val in v)
    return b"".join(out)


def _props(p: Properties) -> bytes:
    if p is NO_PROPERTIES:
        return b"\x00"
    body = _props_body(p)
    return vbi(len(body)) + body


# ---------------------------------------------------------------- encoding
_V3_CONNACK: Final = {0x00: 0, 0x84: 1, 0x85: 2, 0x88: 3, 0x89: 3, 0x86: 4, 0x87: 5}


def _fixed(first: int, body: bytes) -> bytes:
    return bytes((first,)) + vbi(len(body)) + body


def _enc_connect(p: Connect, version: int) -> bytes:
    level = p.protocol_level
    v5 = level == 5
    flags = 0x02 if p.clean_start else 0
    will = p.will
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if p.password is not None:
        flags |= 0x40
    if p.username is not None:
        flags |= 0x80
    wire_level = level | 0x80 if p.bridge and level in (3, 4) else level
    parts = [_enc_str(p.protocol_name), bytes((wire_level, flags)), pack_u16(p.keep_alive)]
    if v5:
        parts.append(_props(p.properties))
    parts.append(_enc_str(p.client_id))
    if will is not None:
        if v5:
            parts.append(_props(will.properties))
        parts.append(_enc_str(will.topic))
        parts.append(_enc_bin(will.payload))
    if p.username is not None:
        parts.append(_enc_str(p.username))
    if p.password is not None:
        parts.append(_enc_bin(p.password))
    return _fixed(0x10, b"".join(parts))


def _enc_connack(p: Connack, version: int) -> bytes:
    code = int(p.reason_code)
    if version == 5:
        body = bytes((1 if p.session_present else 0, code)) + _props(p.properties)
        return _fixed(0x20, body)
    rc = _V3_CONNACK.get(code, 5)
    return bytes((0x20, 2, 1 if p.session_present and rc == 0 else 0, rc))


def _enc_ack(first: int, p: Puback | Pubrec | Pubrel | Pubcomp, version: int) -> bytes:
    pid = pack_u16(p.packet_id)
    if version != 5 or (p.reason_code == 0 and p.properties is NO_PROPERTIES):
        return bytes((first, 2)) + pid
    if p.properties is NO_PROPERTIES:
        return bytes((first, 3)) + pid + bytes((p.reason_code,))
    return _fixed(first, pid + bytes((p.reason_code,)) + _props(p.properties))


def _enc_subscribe(p: Subscribe, version: int) -> bytes:
    parts = [pack_u16(p.packet_id)]
    if version == 5:
        parts.append(_props(p.properties))
        for s in p.subscriptions:
            opts = (
                s.qos
                | (0x04 if s.no_local else 0)
                | (0x08 if s.retain_as_published else 0)
                | (s.retain_handling << 4)
            )
            parts.append(_enc_str(s.topic_filter) + bytes((opts,)))
    else:
        parts.extend(_enc_str(s.topic_filter) + bytes((s.qos,)) for s in p.subscriptions)
    return _fixed(0x82, b"".join(parts))


def _enc_suback(p: Suback, version: int) -> bytes:
    if version == 5:
        codes = bytes(int(c) for c in p.reason_codes)
        return _fixed(0x90, pack_u16(p.packet_id) + _props(p.properties) + codes)
    codes = bytes(c if c < 0x80 else 0x80 for c in p.reason_codes)
    return _fixed(0x90, pack_u16(p.packet_id) + codes)


def _enc_unsubscribe(p: Unsubscribe, version: int) -> bytes:
    parts = [pack_u16(p.packet_id)]
    if version == 5:
        parts.append(_props(p.properties))
    parts.extend(_enc_str(f) for f in p.topic_filters)
    return _fixed(0xA2, b"".join(parts))


def _enc_unsuback(p: Unsuback, version: int) -> bytes:
    if version == 5:
        codes = bytes(int(c) for c in p.reason_codes)
        return _fixed(0xB0, pack_u16(p.packet_id) + _props(p.properties) + codes)
    return b"\xb0\x02" + pack_u16(p.packet_id)


def _enc_disconnect(p: Disconnect, version: int) -> bytes:
    if version != 5 or (p.reason_code == 0 and p.properties is NO_PROPERTIES):
        return b"\xe0\x00"
    if p.properties is NO_PROPERTIES:
        return bytes((0xE0, 1, p.reason_code))
    return _fixed(0xE0, bytes((p.reason_code,)) + _props(p.properties))


def _enc_auth(p: Auth, version: int) -> bytes:
    if version != 5:
        raise ValueError("AUTH exists only in MQTT 5")
    if p.reason_code == 0 and p.properties is NO_PROPERTIES:
        return b"\xf0\x00"
    return _fixed(0xF0, bytes((p.reason_code,)) + _props(p.properties))


def _enc_publish(p: Publish, version: int) -> bytes:
    return encode_publish(p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id, p.properties, version)


_ENCODERS: Final[dict[type, Callable[[Any, int], bytes]]] = {
    Connect: _enc_connect,
    Connack: _enc_connack,
    Publish: _enc_publish,
    Puback: lambda p, v: _enc_ack(0x40, p, v),
    Pubrec: lambda p, v: _enc_ack(0x50, p, v),
    Pubrel: lambda p, v: _enc_ack(0x62, p, v),
    Pubcomp: lambda p, v: _enc_ack(0x70, p, v),
    Subscribe: _enc_subscribe,
    Suback: _enc_suback,
    Unsubscribe: _enc_unsubscribe,
    Unsuback: _enc_unsuback,
    Pingreq: lambda p, v: b"\xc0\x00",
    Pingresp: lambda p, v: b"\xd0\x00",
    Disconnect: _enc_disconnect,
    Auth: _enc_auth,
}


def encode(packet: Packet, version: int) -> bytes:
    """Encode ``packet`` for protocol ``version`` (3, 4 or 5; CONNECT uses its own level).

    On a 3/4 wire, properties are not written, CONNACK reason codes become 3.1.1 return
    codes (0x84->1, 0x85->2, 0x88/0x89->3, 0x86->4, others->5) and SUBACK codes >= 0x80
    become 0x80.  The encoder trusts its input (values come from our own code).
    """
    return _ENCODERS[type(packet)](packet, version)


_TOPIC_CACHE: dict[str, bytes] = {}


def _topic_field(topic: str) -> bytes:
    f = _TOPIC_CACHE.get(topic)
    if f is None:
        b = topic.encode()
        f = pack_u16(len(b)) + b
        if len(_TOPIC_CACHE) >= 4096:
            _TOPIC_CACHE.clear()
        _TOPIC_CACHE[topic] = f
    return f


def encode_publish(  # noqa: PLR0917 (signature fixed by the codec API)
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    properties: Properties,
    version: int,
) -> bytes:
    """Encode one PUBLISH (the hot path: a bounded cache of encoded topics, one join)."""
    tf = _topic_field(topic)
    first = 0x30 | (qos << 1) | (8 if dup else 0) | (1 if retain else 0)
    if version == 5:
        props = b"\x00" if properties is NO_PROPERTIES else _props(properties)
        n = len(tf) + len(props) + len(payload)
        if qos:
            n += 2
            return b"".join((_FIRST[first], vbi(n), tf, pack_u16(packet_id or 0), props, payload))
        return b"".join((_FIRST[first], vbi(n), tf, props, payload))
    n = len(tf) + len(payload)
    if qos:
        n += 2
        return b"".join((_FIRST[first], vbi(n), tf, pack_u16(packet_id or 0), payload))
    return b"".join((_FIRST[first], vbi(n), tf, payload))


_FIRST: Final = tuple(bytes((i,)) for i in range(256))


class PublishTemplate:
    """A PUBLISH encoded once, rendered per subscriber by joining ready-made slices.

    ``PublishTemplate(topic, payload, properties, version)`` encodes the topic, the
    properties (version 5) and keeps the payload; :meth:`render` returns the bytes for one
    subscriber with its QoS, packet id, DUP and RETAIN flags, and (v5) its subscription
    identifiers and topic alias appended to the shared properties.  Cost per render: one
    small ``bytes`` join, independent of the properties' complexity; O(1) besides the copy;
    the plain QoS 0 copy (no DUP, RETAIN, identifiers or alias) is joined once per template
    and shared, O(1) without a copy.

    Byte layout (for callers that patch bytes themselves): ``first | remaining length |
    topic length, topic | [packet id, 2 bytes big-endian, QoS > 0 only] | [properties] |
    payload``; the packet id starts at ``len(header) + 2 + len(topic bytes)``.
    """

    __slots__ = ("_plain", "_props_body", "_tf", "payload", "topic", "version")

    def __init__(self, topic: str, payload: bytes, properties: Properties, version: int) -> None:
        self.topic = topic
        self.payload = payload
        self.version = version
        self._tf = _topic_field(topic)
        self._props_body = b"" if properties is NO_PROPERTIES else _props_body(properties)
        #: the QoS 0 rendering without DUP, RETAIN, identifiers or alias: the same bytes for
        #: every such subscriber, built at the first and shared (None: not yet; a pointer
        #: test, where the truth of ``bytes`` was a generic ``PyObject_IsTrue`` call)
        self._plain: bytes | None = None

    def render(
        self,
        qos: int,
        packet_id: int | None = None,
        *,
        dup: bool = False,
        retain: bool = False,
        subscription_identifiers: tuple[int, ...] = (),
        topic_alias: int | None = None,
        send_topic: bool = True,
    ) -> bytes:
        """Bytes of this PUBLISH for one subscriber (``send_topic=False``: empty topic + alias).
        A QoS 0 copy without DUP, RETAIN, subscription identifiers or topic alias is built
        once and the same ``bytes`` object returned to every such subscriber (a fleet's
        fan-out: nothing is copied per subscriber)."""
        plain = not qos and not dup and not retain and not subscription_identifiers and topic_alias is None
        if plain:
            shared = self._plain
            if shared is not None:
                return shared
        first = _FIRST[0x30 | (qos << 1) | (8 if dup else 0) | (1 if retain else 0)]
        tf = self._tf if send_topic else b"\x00\x00"
        pid = pack_u16(packet_id or 0) if qos else b""
        if self.version == 5:
            pb = self._props_body
            if subscription_identifiers or topic_alias is not None:
                extra = b"".join(b"\x0b" + vbi(i) for i in subscription_identifiers)
                if topic_alias is not None:
                    extra += b"\x23" + pack_u16(topic_alias)
                pb += extra
            props = vbi(len(pb)) + pb
            n = len(tf) + len(pid) + len(props) + len(self.payload)
            data = b"".join((first, vbi(n), tf, pid, props, self.payload))
        else:
            n = len(tf) + len(pid) + len(self.payload)
            data = b"".join((first, vbi(n), tf, pid, self.payload))
        if plain:  # (without an alias the topic is always sent)
            self._plain = data
        return data
