"""Minimal MQTT 3.1.1 / 5.0 encoder and a fast frame scanner for the load generator.

The generator must measure *any* broker, so it does not import ``broker/``: it speaks the wire
format itself (MQTT 3.1.1 section 2-3, MQTT 5.0 section 2-3) with only what a load generator
needs: CONNECT, SUBSCRIBE, UNSUBSCRIBE, PUBLISH, PUBACK, PINGREQ, and a scanner that splits a
byte stream into frames.

Hot-path design: every PUBLISH the generator sends is pre-encoded once. The payload is JSON
``{"ts":NNNNNNNNNNNNNNNNNNN,...}`` whose 19-digit timestamp (``10**18 + time.monotonic_ns()``,
i.e. CLOCK_MONOTONIC, comparable across processes on one machine, valid JSON) sits at a fixed
offset, so a batch of frames is built with a single ``bytes.join`` around the timestamp
(:class:`Block`), and the receiver reads the timestamp with one slice + ``int``
(:data:`TS_OFFSET`, :data:`TS_LEN`).
Encoding is O(len(packet)); a block send is one C-level join, O(total bytes).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

__all__ = [
    "PINGREQ",
    "TS_BIAS",
    "TS_LEN",
    "TS_OFFSET",
    "Block",
    "PacketType",
    "connect",
    "make_payload",
    "puback",
    "publish",
    "subscribe",
    "ts_bytes",
    "unsubscribe",
    "varint",
]

TS_PREFIX = b'{"ts":'
TS_OFFSET = len(TS_PREFIX)  # the timestamp's offset inside the payload
TS_LEN = 19  # digits: TS_BIAS + monotonic_ns, a valid JSON number with no leading zero
TS_BIAS = 10**18
TS_PLACEHOLDER = b"%d" % TS_BIAS
PINGREQ = b"\xc0\x00"


class PacketType(IntEnum):
    """MQTT control packet types (high nibble of the fixed header)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14


def varint(n: int) -> bytes:
    """Encode a Variable Byte Integer (MQTT 3.1.1 section 2.2.3)."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(b)) + b


def _frame(first: int, body: bytes) -> bytes:
    return bytes([first]) + varint(len(body)) + body


def _props(props: bytes) -> bytes:
    return varint(len(props)) + props


def connect(client_id: str, *, version: int = 4, keepalive: int = 600, clean: bool = True) -> bytes:
    """CONNECT with no will, user name or password; ``version`` 4 = 3.1.1, 5 = 5.0."""
    body = _str("MQTT") + bytes([version, 0x02 if clean else 0]) + struct.pack("!H", keepalive)
    if version == 5:
        body += _props(b"")
    return _frame(0x10, body + _str(client_id))


def subscribe(pid: int, filters: list[tuple[str, int]], *, version: int = 4, selector: str = "") -> bytes:
    """SUBSCRIBE; on 5.0 a non-empty ``selector`` travels as user property ``filter``."""
    body = struct.pack("!H", pid)
    if version == 5:
        props = b"\x26" + _str("filter") + _str(selector) if selector else b""
        body += _props(props)
    for f, qos in filters:
        body += _str(f) + bytes([qos])
    return _frame(0x82, body)


def unsubscribe(pid: int, filters: list[str], *, version: int = 4) -> bytes:
    body = struct.pack("!H", pid)
    if version == 5:
        body += _props(b"")
    for f in filters:
        body += _str(f)
    return _frame(0xA2, body)


def puback(pid: int) -> bytes:
    return b"\x40\x02" + struct.pack("!H", pid)


def make_payload(size: int, extra: str = "") -> bytes:
    """A JSON payload ``{"ts":<19 digits><extra>,"pad":"xxx"}`` of at least ``size`` bytes."""
    head = TS_PREFIX + TS_PLACEHOLDER + extra.encode()
    base = head + b',"pad":""}'
    return head + b',"pad":"' + b"x" * max(0, size - len(base)) + b'"}'


def publish(
    topic: str, payload: bytes, *, qos: int = 0, pid: int = 0, retain: bool = False, version: int = 4
) -> bytes:
    """One PUBLISH frame (DUP 0)."""
    body = _str(topic)
    if qos:
        body += struct.pack("!H", pid)
    if version == 5:
        body += _props(b"")
    return _frame(0x30 | (qos << 1) | int(retain), body + payload)


def ts_bytes(ns: int) -> bytes:
    """A timestamp rendered as the payload's fixed-width field."""
    return b"%d" % (ns + TS_BIAS)


@dataclass(frozen=True, slots=True)
class Block:
    """A pre-encoded run of PUBLISH frames that share one timestamp.

    ``pieces`` are the frames' bytes split around each timestamp placeholder, so that
    ``ts.join(pieces)`` yields the wire bytes in one C call. ``count`` frames, ``expected``
    deliveries they cause in total (fan-out, content filters and negative entries make it
    differ from ``count``).
    """

    pieces: tuple[bytes, ...]
    count: int
    expected: int

    @staticmethod
    def of(frames: list[bytes], expected: int) -> Block:
        joined = b"".join(frames)
        pieces = tuple(joined.split(TS_PREFIX + TS_PLACEHOLDER))
        assert len(pieces) == len(frames) + 1, "payload must carry exactly one timestamp"
        pieces = (pieces[0] + TS_PREFIX, *(p + TS_PREFIX for p in pieces[1:-1]), pieces[-1])
        return Block(pieces, len(frames), expected)

    def render(self, ts: bytes) -> bytes:
        return ts.join(self.pieces)

    def _check(self) -> None:
        assert len(self.pieces) == self.count + 1
        assert self.expected >= 0
