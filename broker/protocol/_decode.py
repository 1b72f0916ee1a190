"""Sans-IO streaming decoder of MQTT 3.1.1 and 5.0 packets (the encoder is
:mod:`broker.protocol._encode`).

Specification: OASIS MQTT 3.1.1 (2014) and 5.0 (2019), conformance statements cited as
[MQTT-x.x.x-y]; no seed covers the wire format.

:class:`Decoder` is a byte-stream state machine: ``feed(data)`` appends to a buffer, cuts
complete packets out of it and returns them.  The fixed header is checked as soon as it is
complete (reserved flag bits [MQTT-2.2.2-1/2], remaining length of at most four bytes
[MQTT-1.5.5-1], maximum packet size -> PACKET_TOO_LARGE), so a huge announced packet is
refused before its body is buffered; a partial packet whose size is known is not re-scanned
until enough bytes have arrived.  Bodies are parsed from an immutable ``bytes`` object through
a ``memoryview`` with ``struct.unpack_from``; strings are decoded strictly (UTF-8, no
surrogates [MQTT-1.5.4-1], no U+0000 [MQTT-1.5.4-2]).  PUBLISH, the hot path, is decoded
inline.  Every failure is a :class:`~broker.packets.MalformedPacket` with the reason code the
standard prescribes; no other exception leaves :meth:`Decoder.feed`.  Protocol level 0x83 /
0x84 (a mosquitto bridge: the bridge bit on 3.1 / 3.1.1) is read as a CONNECT with
``bridge=True``.  Complexity: O(bytes fed); at most one partial packet is buffered.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from broker.protocol._values import (
    NO_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    MalformedPacket,
    Packet,
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
from broker.protocol._wire import (
    MALFORMED,
    PACKET_NAMES,
    PROPS,
    PROTOCOL,
    WILL,
    unpack_u16,
    unpack_u32,
)

__all__ = ["Decoder"]


def _bad(code: ReasonCode, ptype: int, msg: str) -> MalformedPacket:
    return MalformedPacket(code, f"{PACKET_NAMES.get(ptype, '?')}: {msg}")


class _Reader:
    """Cursor over one packet body (``mv[pos:end]``); raises MalformedPacket on any overrun."""

    __slots__ = ("end", "mv", "pos", "ptype")

    def __init__(self, mv: memoryview, pos: int, end: int, ptype: int) -> None:
        self.mv = mv
        self.pos = pos
        self.end = end
        self.ptype = ptype

    def fail(self, msg: str, code: ReasonCode = MALFORMED) -> MalformedPacket:
        return _bad(code, self.ptype, msg)

    def need(self, n: int, what: str) -> int:
        p = self.pos
        if p + n > self.end:
            raise self.fail(f"truncated {what} (needs {n} bytes, {self.end - p} left)")
        self.pos = p + n
        return p

    def u8(self, what: str) -> int:
        return self.mv[self.need(1, what)]

    def u16(self, what: str) -> int:
        v: int = unpack_u16(self.mv, self.need(2, what))[0]
        return v

    def u32(self, what: str) -> int:
        v: int = unpack_u32(self.mv, self.need(4, what))[0]
        return v

    def vbi(self, what: str) -> int:
        mv, p, end = self.mv, self.pos, self.end
        value = 0
        shift = 0
        for _ in range(4):
            if p >= end:
                raise self.fail(f"truncated variable byte integer in {what}")
            b = mv[p]
            p += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                self.pos = p
                return value
            shift += 7
        raise self.fail(f"variable byte integer in {what} longer than 4 bytes")

    def binary(self, what: str) -> bytes:
        n = self.u16(what)
        p = self.need(n, what)
        return bytes(self.mv[p : p + n])

    def string(self, what: str) -> str:
        n = self.u16(what)
        p = self.need(n, what)
        return _utf8(self.mv[p : p + n], self.ptype, what, p)

    def done(self) -> bool:
        return self.pos >= self.end

    def props(self, ptype: int, server: bool) -> Properties:  # noqa: C901, PLR0912 (one case per property kind)
        n = self.vbi("property length")
        if n == 0:
            return NO_PROPERTIES
        stop = self.pos + n
        if stop > self.end:
            raise self.fail("property length exceeds the packet")
        kw: dict[str, Any] = {}
        user: list[tuple[str, str]] = []
        subids: list[int] = []
        pname = PACKET_NAMES[ptype]
        end = self.end
        self.end = stop
        while self.pos < stop:
            at = self.pos
            pid = self.vbi("property identifier")
            spec = PROPS.get(pid)
            if spec is None:
                raise self.fail(f"unknown property 0x{pid:02x} at offset {at}")
            field, kind, allowed, values = spec
            if ptype not in allowed:
                raise self.fail(f"property {field} (0x{pid:02x}) not allowed in {pname}", PROTOCOL)
            match kind:
                case "1":
                    v: Any = self.u8(field)
                case "2":
                    v = self.u16(field)
                case "4":
                    v = self.u32(field)
                case "v":
                    v = self.vbi(field)
                case "s":
                    v = self.string(field)
                case "b":
                    v = self.binary(field)
                case _:
                    user.append((self.string("user property name"), self.string("user property value")))
                    continue
            if values is not None and v not in values:
                raise self.fail(f"property {field} has invalid value {v}", PROTOCOL)
            if kind == "v":
                if v == 0:
                    raise self.fail("subscription identifier 0", PROTOCOL)
                if subids and ptype != 3:
                    raise self.fail("duplicate property subscription_identifier", PROTOCOL)
                subids.append(v)
                continue
            if field in kw:
                raise self.fail(f"duplicate property {field}", PROTOCOL)
            if v == 0 and field in ("receive_maximum", "maximum_packet_size"):
                raise self.fail(f"property {field} is 0", PROTOCOL)
            if v == 0 and field == "topic_alias":
                raise self.fail("topic alias 0", ReasonCode.TOPIC_ALIAS_INVALID)
            kw[field] = v
        self.end = end
        if user:
            kw["user_properties"] = tuple(user)
        if subids:
            if ptype == 3 and server:
                raise self.fail("subscription identifier in a PUBLISH from a client", PROTOCOL)
            kw["subscription_identifiers"] = tuple(subids)
        return Properties(**kw)


def _utf8(b: memoryview, ptype: int, what: str, at: int) -> str:
    try:
        s = str(b, "utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(
            MALFORMED, ptype, f"{what} at offset {at} is not well-formed UTF-8 ({exc.reason})"
        ) from None
    if "\x00" in s:
        raise _bad(MALFORMED, ptype, f"{what} at offset {at} contains U+0000")
    return s


def _reason(r: _Reader, allowed: frozenset[int], ptype: int) -> ReasonCode:
    c = r.u8("reason code")
    if c not in allowed:
        raise r.fail(f"reason code 0x{c:02x} is not valid in {PACKET_NAMES[ptype]}")
    return ReasonCode(c)


_CONNACK_CODES: Final = frozenset(
    {0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C}
    | {0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}
)
_PUBACK_CODES: Final = frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})
_PUBREL_CODES: Final = frozenset({0x00, 0x92})
_SUBACK_CODES: Final = frozenset({0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2})
_UNSUBACK_CODES: Final = frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91})
_DISCONNECT_CODES: Final = frozenset(
    {0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F}
    | set(range(0x90, 0xA3)) - {0x91, 0x92}
)
_AUTH_CODES: Final = frozenset({0x00, 0x18, 0x19})
_ACK_CODES: Final = {4: _PUBACK_CODES, 5: _PUBACK_CODES, 6: _PUBREL_CODES, 7: _PUBREL_CODES}
_ACK_TYPES: Final[dict[int, type[Puback | Pubrec | Pubrel | Pubcomp]]] = {
    4: Puback,
    5: Pubrec,
    6: Pubrel,
    7: Pubcomp,
}
_V3_CONNACK_IN: Final = {
    0: ReasonCode.SUCCESS,
    1: ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
    2: ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
    3: ReasonCode.SERVER_UNAVAILABLE,
    4: ReasonCode.BAD_USER_NAME_OR_PASSWORD,
    5: ReasonCode.NOT_AUTHORIZED,
}
_V3_SUBACK_IN: Final = {
    0: ReasonCode.GRANTED_QOS_0,
    1: ReasonCode.GRANTED_QOS_1,
    2: ReasonCode.GRANTED_QOS_2,
    0x80: ReasonCode.UNSPECIFIED_ERROR,
}
# fixed-header flag nibble required per type (PUBLISH: any but checked separately)
_REQUIRED_FLAGS: Final = (-1, 0, 0, -1, 0, 0, 2, 0, 2, 0, 2, 0, 0, 0, 0, 0)
_SERVER_TYPES: Final = frozenset({1, 3, 4, 5, 6, 7, 8, 10, 12, 14, 15})
_CLIENT_TYPES: Final = frozenset({2, 3, 4, 5, 6, 7, 9, 11, 13, 14, 15})
_PROTOCOLS: Final = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}


def _connect(r: _Reader, dec: Decoder) -> Connect:
    name = r.string("protocol name")
    level = r.u8("protocol level")
    # 0x83 / 0x84: a mosquitto bridge (the "bridge bit" 0x80 on 3.1 / 3.1.1; not on 5.0)
    bridge = level in (0x83, 0x84)
    if bridge:
        level &= 0x7F
    if _PROTOCOLS.get(level) != name:
        raise r.fail(f"unsupported protocol {name!r} level {level}", ReasonCode.UNSUPPORTED_PROTOCOL_VERSION)
    dec.version = level
    v5 = level == 5
    flags = r.u8("connect flags")
    if flags & 0x01:
        raise r.fail("reserved connect flag bit 0 is set [MQTT-3.1.2-3]")
    will_flag = flags & 0x04
    will_qos = (flags >> 3) & 0x03
    will_retain = bool(flags & 0x20)
    if not will_flag and (will_qos or will_retain):
        raise r.fail("will QoS/retain set without the will flag [MQTT-3.1.2-11/13]")
    if will_qos == 3:
        raise r.fail("will QoS 3 [MQTT-3.1.2-14]")
    if not v5 and flags & 0x40 and not flags & 0x80:
        raise r.fail("password flag without user name flag [MQTT-3.1.2-22]")
    keep_alive = r.u16("keep alive")
    props = r.props(1, True) if v5 else NO_PROPERTIES
    if props.authentication_data is not None and props.authentication_method is None:
        raise r.fail("authentication data without authentication method", PROTOCOL)
    client_id = r.string("client identifier")
    will = None
    if will_flag:
        wprops = r.props(WILL, True) if v5 else NO_PROPERTIES
        wtopic = r.string("will topic")
        wpayload = r.binary("will payload")
        will = Will(wtopic, wpayload, will_qos, will_retain, wprops)
    username = r.string("user name") if flags & 0x80 else None
    password = r.binary("password") if flags & 0x40 else None
    if not r.done():
        raise r.fail(f"{r.end - r.pos} unexpected bytes after the payload")
    return Connect(
        client_id, level, bool(flags & 0x02), keep_alive, will, username, password, props, name, bridge
    )


def _connack(r: _Reader, v5: bool) -> Connack:
    ack = r.u8("acknowledge flags")
    if ack & 0xFE:
        raise r.fail("reserved CONNACK acknowledge flag bits set [MQTT-3.2.2-1]")
    if v5:
        code = _reason(r, _CONNACK_CODES, 2)
        props = r.props(2, False)
    else:
        rc = r.u8("return code")
        if rc not in _V3_CONNACK_IN:
            raise r.fail(f"CONNACK return code {rc} is reserved")
        if ack and rc:
            raise r.fail("CONNACK with a non-zero return code has Session Present set [MQTT-3.2.2-4]")
        code, props = _V3_CONNACK_IN[rc], NO_PROPERTIES
    if not r.done():
        raise r.fail("unexpected bytes after CONNACK")
    return Connack(bool(ack), code, props)


def _ack(r: _Reader, ptype: int, v5: bool) -> Puback | Pubrec | Pubrel | Pubcomp:
    pid = r.u16("packet identifier")
    if pid == 0:
        raise r.fail("packet identifier 0 [MQTT-2.3.1-1]")
    code, props = ReasonCode.SUCCESS, NO_PROPERTIES
    if v5 and not r.done():
        code = _reason(r, _ACK_CODES[ptype], ptype)
        if not r.done():
            props = r.props(ptype, False)
    if not r.done():
        raise r.fail("unexpected bytes at the end")
    return _ACK_TYPES[ptype](pid, code, props)


def _subscribe(r: _Reader, v5: bool) -> Subscribe:
    pid = r.u16("packet identifier")
    if pid == 0:
        raise r.fail("packet identifier 0 [MQTT-2.3.1-1]")
    props = r.props(8, True) if v5 else NO_PROPERTIES
    subs: list[SubscriptionRequest] = []
    while not r.done():
        f = r.string("topic filter")
        opts = r.u8("subscription options")
        qos = opts & 0x03
        if qos == 3:
            raise r.fail(f"QoS 3 requested for {f!r} [MQTT-3.8.3-4]")
        if v5:
            if opts & 0xC0:
                raise r.fail(f"reserved subscription option bits set for {f!r} [MQTT-3.8.3-5]")
            rh = (opts >> 4) & 0x03
            if rh == 3:
                raise r.fail(f"retain handling 3 for {f!r}", PROTOCOL)
            no_local = bool(opts & 0x04)
            if no_local and f.startswith("$share/"):
                raise r.fail(f"no local on shared subscription {f!r} [MQTT-3.8.3-4]", PROTOCOL)
            subs.append(SubscriptionRequest(f, qos, no_local, bool(opts & 0x08), rh))
        else:
            if opts & 0xFC:
                raise r.fail(f"reserved bits of requested QoS set for {f!r} [MQTT-3-8.3-4]")
            subs.append(SubscriptionRequest(f, qos))
    if not subs:
        raise r.fail("SUBSCRIBE without a topic filter [MQTT-3.8.3-3]", PROTOCOL)
    return Subscribe(pid, tuple(subs), props)


def _suback(r: _Reader, v5: bool) -> Suback:
    pid = r.u16("packet identifier")
    props = r.props(9, False) if v5 else NO_PROPERTIES
    codes: list[ReasonCode] = []
    while not r.done():
        if v5:
            codes.append(_reason(r, _SUBACK_CODES, 9))
        else:
            c = r.u8("return code")
            if c not in _V3_SUBACK_IN:
                raise r.fail(f"SUBACK return code 0x{c:02x} is reserved")
            codes.append(_V3_SUBACK_IN[c])
    return Suback(pid, tuple(codes), props)


def _unsubscribe(r: _Reader, v5: bool) -> Unsubscribe:
    pid = r.u16("packet identifier")
    if pid == 0:
        raise r.fail("packet identifier 0 [MQTT-2.3.1-1]")
    props = r.props(10, True) if v5 else NO_PROPERTIES
    filters: list[str] = []
    while not r.done():
        filters.append(r.string("topic filter"))
    if not filters:
        raise r.fail("UNSUBSCRIBE without a topic filter [MQTT-3.10.3-2]", PROTOCOL)
    return Unsubscribe(pid, tuple(filters), props)


def _unsuback(r: _Reader, v5: bool) -> Unsuback:
    pid = r.u16("packet identifier")
    if not v5:
        if not r.done():
            raise r.fail("unexpected bytes after the packet identifier")
        return Unsuback(pid)
    props = r.props(11, False)
    codes: list[ReasonCode] = []
    while not r.done():
        codes.append(_reason(r, _UNSUBACK_CODES, 11))
    return Unsuback(pid, tuple(codes), props)


def _disconnect_or_auth(r: _Reader, ptype: int, server: bool) -> Disconnect | Auth:
    code, props = ReasonCode.SUCCESS, NO_PROPERTIES
    if not r.done():
        code = _reason(r, _DISCONNECT_CODES if ptype == 14 else _AUTH_CODES, ptype)
        if not r.done():
            props = r.props(ptype, server)
    if not r.done():
        raise r.fail("unexpected bytes at the end")
    if ptype == 14:
        if server and props.server_reference is not None:
            raise r.fail("server reference in a DISCONNECT from a client", PROTOCOL)
        return Disconnect(code, props)
    return Auth(code, props)


#: the shared decoders of idle streams (``Decoder.settle``): by max_packet_size * 2 + server,
#: then by protocol level
_SHARED: Final[dict[int, list[Decoder | None]]] = {}


class Decoder:
    """Streaming, sans-IO decoder: ``feed(bytes) -> list[Packet]``.

    ``version`` None (server side): the first packet must be CONNECT and sets ``version``.
    ``server`` True accepts only client-to-server packet types.  ``max_packet_size`` bounds
    the total packet size (fixed header included); larger -> PACKET_TOO_LARGE before the
    body is buffered.  After a :class:`MalformedPacket` the stream is unusable (the
    connection must be closed); further ``feed`` calls raise the same error.
    Complexity: O(bytes fed) overall; memory: one partial packet.

    ``shed_keep`` (set by the transport while its peer is far ahead of the broker: ingress
    load shedding, docs/broker.md "Flow control"; -1 = off): of the bytes a ``feed`` call
    decodes, QoS 0 PUBLISHes without the RETAIN flag (and, in MQTT 5, without properties, so
    no topic alias is missed) that start before the last ``shed_keep`` bytes (the older
    part) are framed and skipped without being decoded; ``shed_count`` counts them.
    """

    __slots__ = (
        "_buf",
        "_error",
        "_need",
        "_seen_connect",
        "max_packet_size",
        "server",
        "shared",
        "shed_count",
        "shed_keep",
        "version",
    )

    def __init__(
        self,
        version: int | None = None,
        max_packet_size: int = 268_435_455,
        server: bool = True,
        connected: bool = False,
    ) -> None:
        """``connected``: the stream's CONNECT was read already (by another decoder: see
        ``settle``)."""
        self.version = version
        self.shared = False  # the decoder of every idle stream of its kind (``settle``)
        self.max_packet_size = max_packet_size
        self.server = server
        # a partial packet's bytes; None while there is none (an idle connection holds no buffer)
        self._buf: bytearray | None = None
        self._need = 0
        self._seen_connect = connected
        self._error: MalformedPacket | None = None
        self.shed_keep = -1
        self.shed_count = 0

    def idle(self) -> bool:
        """Between packets, after the CONNECT, not shedding, no error: this decoder holds
        nothing of its stream but ``version``, ``max_packet_size`` and ``server``, so any
        decoder made with ``Decoder(version, max_packet_size, server, connected=True)``
        continues it."""
        return (
            self._buf is None
            and self._seen_connect
            and self._error is None
            and self.shed_keep < 0
            and self.shed_count == 0
        )

    def settle(self) -> Decoder:
        """The decoder the stream continues with after a ``feed`` (issue 27, item 2: an idle
        connection holds no decoder of its own). An idle decoder gives way to the *shared*
        one of its kind (version, maximum packet size, side), which every idle stream of
        that kind holds; a shared decoder that is not idle after a feed (a packet left
        incomplete, an error, shedding) hands that state to a new decoder of the stream's
        own and is idle again. The caller holds the result. Feeds never interleave (one
        ``feed`` then one ``settle`` per read, synchronously), so one shared decoder per
        kind is enough. O(1)."""
        if self.shared:
            if self.idle():
                return self
            own = Decoder(self.version, self.max_packet_size, self.server, True)
            own._buf, own._need, own._error = self._buf, self._need, self._error
            own.shed_keep, own.shed_count = self.shed_keep, self.shed_count
            self._buf, self._need, self._error = None, 0, None
            self.shed_keep, self.shed_count = -1, 0
            return own
        v = self.version
        if v is None or not self.idle():
            return self
        key = self.max_packet_size * 2 + int(self.server)
        kinds = _SHARED.get(key)
        if kinds is None:
            kinds = _SHARED[key] = [None] * 6
        shared = kinds[v]
        if shared is None:
            shared = kinds[v] = Decoder(v, self.max_packet_size, self.server, True)
            shared.shared = True
        return shared

    def _check(self) -> None:
        """Invariants: a buffered partial packet is shorter than what it needs."""
        assert self._need == 0 or (self._buf is not None and len(self._buf) < self._need)
        assert self._buf is None or self._buf, "an empty buffer is not kept"
        assert self.version in (None, 3, 4, 5)

    def feed(self, data: bytes) -> list[Packet]:
        """Decode every complete packet in the stream so far; keep the rest buffered."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        if buf is not None:
            buf += data
            if len(buf) < self._need:
                return []
            data = bytes(buf)
            self._buf = None  # released: kept only while a packet is incomplete
        elif not data:
            return []
        self._need = 0
        out: list[Packet] = []
        try:
            pos = self._decode(bytes(data), out)
        except MalformedPacket as exc:
            self._error = exc
            raise
        except (IndexError, ValueError, TypeError, struct.error) as exc:  # defensive: never escapes
            self._error = MalformedPacket(MALFORMED, f"malformed packet ({type(exc).__name__}: {exc})")
            raise self._error from None
        if pos < len(data):
            self._buf = bytearray(memoryview(data)[pos:])
        return out

    def _decode(  # noqa: C901, PLR0912, PLR0915 (hot path: PUBLISH decoded inline, no call per packet)
        self, data: bytes, out: list[Packet]
    ) -> int:
        mv = memoryview(data)
        n = len(data)
        pos = 0
        server = self.server
        legal = _SERVER_TYPES if server else _CLIENT_TYPES
        limit = self.max_packet_size
        append = out.append
        keep = self.shed_keep
        shed_before = n - keep if keep >= 0 else 0
        while pos < n:
            first = data[pos]
            ptype = first >> 4
            flags = first & 0x0F
            # remaining length
            p = pos + 1
            length = 0
            shift = 0
            while True:
                if p >= n:
                    return pos
                b = data[p]
                p += 1
                length |= (b & 0x7F) << shift
                if not b & 0x80:
                    break
                shift += 7
                if shift == 28:
                    raise _bad(MALFORMED, ptype, "remaining length longer than 4 bytes [MQTT-1.5.5-1]")
            if ptype not in legal:
                if ptype == 0:
                    raise MalformedPacket(MALFORMED, "reserved packet type 0")
                raise _bad(PROTOCOL, ptype, f"not allowed from a {'client' if server else 'server'}")
            total = p - pos + length
            if total > limit:
                raise _bad(
                    ReasonCode.PACKET_TOO_LARGE, ptype, f"packet of {total} bytes exceeds the maximum {limit}"
                )
            end = p + length
            if end > n:
                self._need = end - pos
                return pos
            v = self.version
            if ptype == 3:
                # ---- PUBLISH, inline hot path
                qos = (flags >> 1) & 3
                if qos == 3:
                    raise _bad(MALFORMED, 3, "QoS 3 [MQTT-3.3.1-4]")
                if qos == 0 and flags & 8:
                    raise _bad(MALFORMED, 3, "DUP set on a QoS 0 message [MQTT-3.3.1-2]")
                if v is None:
                    raise _bad(PROTOCOL, 3, "first packet is not CONNECT [MQTT-3.1.0-1]")
                if p + 2 > end:
                    raise _bad(MALFORMED, 3, "truncated topic length")
                tl = (data[p] << 8) | data[p + 1]
                q = p + 2 + tl
                if q > end:
                    raise _bad(MALFORMED, 3, "topic name exceeds the packet")
                shed = pos < shed_before and qos == 0 and not flags & 1
                if shed and (v != 5 or (q < end and not data[q])):
                    self.shed_count += 1
                    pos = end
                    continue
                topic = _utf8(mv[p + 2 : q], 3, "topic name", p + 2)
                pid: int | None = None
                if qos:
                    if q + 2 > end:
                        raise _bad(MALFORMED, 3, "truncated packet identifier")
                    pid = (data[q] << 8) | data[q + 1]
                    if pid == 0:
                        raise _bad(MALFORMED, 3, "packet identifier 0 [MQTT-2.3.1-1]")
                    q += 2
                props = NO_PROPERTIES
                if v == 5:
                    if q < end and data[q] == 0:
                        q += 1
                    else:
                        r = _Reader(mv, q, end, 3)
                        props = r.props(3, server)
                        q = r.pos
                    if not topic and props.topic_alias is None:
                        raise _bad(PROTOCOL, 3, "empty topic name without a topic alias [MQTT-3.3.2-8]")
                append(Publish(topic, data[q:end], qos, bool(flags & 1), bool(flags & 8), pid, props))
                pos = end
                continue
            required = _REQUIRED_FLAGS[ptype]
            # MQTT 3.1 gives PUBREL, SUBSCRIBE and UNSUBSCRIBE a DUP flag (0x08) beside their
            # QoS 1; 3.1.1 and 5 reserve it (mosquitto checks the flags for 3.1.1 and 5 only)
            if flags != required and not (flags == 0x0A and required == 2 and self.version == 3):
                raise _bad(MALFORMED, ptype, f"reserved fixed header flags 0x{flags:x} [MQTT-2.2.2-1]")
            r = _Reader(mv, p, end, ptype)
            if ptype == 1:
                if self._seen_connect:
                    raise _bad(PROTOCOL, 1, "second CONNECT [MQTT-3.1.0-2]")
                self._seen_connect = True
                append(_connect(r, self))
                pos = end
                continue
            if v is None:
                raise _bad(PROTOCOL, ptype, "first packet is not CONNECT [MQTT-3.1.0-1]")
            v5 = v == 5
            pkt: Packet
            match ptype:
                case 2:
                    pkt = _connack(r, v5)
                case 4 | 5 | 6 | 7:
                    pkt = _ack(r, ptype, v5)
                case 8:
                    pkt = _subscribe(r, v5)
                case 9:
                    pkt = _suback(r, v5)
                case 10:
                    pkt = _unsubscribe(r, v5)
                case 11:
                    pkt = _unsuback(r, v5)
                case 12 | 13:
                    if length:
                        raise r.fail("PINGREQ/PINGRESP with a body")
                    pkt = Pingreq() if ptype == 12 else Pingresp()
                case 14 | 15:
                    if not v5:
                        if ptype == 15:
                            raise r.fail("AUTH exists only in MQTT 5")
                        if length:
                            raise r.fail("3.1.1 DISCONNECT with a body")
                    pkt = _disconnect_or_auth(r, ptype, server)
                case _:  # pragma: no cover - all types handled above
                    raise r.fail("unknown packet type")
            append(pkt)
            pos = end
        return pos
