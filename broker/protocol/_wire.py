"""Tables and helpers shared by the MQTT encoder and decoder (sans-IO).

Variable byte integers (section 1.5.5; a table below 16384, filled at each length's first use:
built whole at import it held 16,256 two-byte ``bytes`` objects, 0.7 MB of every broker, most
never used; issue 42 item 1), the MQTT 5 property table
(section 2.2.2.2: id, field, kind, packet types, allowed values) and packet type names.
The encoder is :mod:`broker.protocol._encode`, the decoder :mod:`broker.protocol._decode`.
"""

from __future__ import annotations

import struct
from typing import Final

from broker.protocol._values import (
    ReasonCode,
)

__all__ = [
    "MALFORMED",
    "MAX_REMAINING_LENGTH",
    "PACKET_NAMES",
    "PROPS",
    "PROP_FIELDS",
    "PROTOCOL",
    "RC",
    "U16",
    "U32",
    "VBI_TABLE",
    "WILL",
    "pack_u16",
    "unpack_u16",
    "unpack_u32",
    "vbi",
    "vbi_slow",
]

MAX_REMAINING_LENGTH: Final = 268_435_455

RC = ReasonCode
MALFORMED = ReasonCode.MALFORMED_PACKET
PROTOCOL = ReasonCode.PROTOCOL_ERROR

U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
pack_u16 = U16.pack
unpack_u16 = U16.unpack_from
unpack_u32 = U32.unpack_from


# ---------------------------------------------------------------- variable byte integers
def vbi_slow(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


#: the encodings below 16384 (two bytes at most), each made at its first use (None until then)
VBI_TABLE: Final[list[bytes | None]] = [None] * 16384


def vbi(n: int) -> bytes:
    """Variable byte integer (section 1.5.5); table lookup below 16384 (O(1), the entry made at
    the first use of ``n``)."""
    if n < 16384:
        b = VBI_TABLE[n]
        if b is None:
            b = VBI_TABLE[n] = vbi_slow(n)
        return b
    if n > MAX_REMAINING_LENGTH:
        raise ValueError(f"{n} does not fit a variable byte integer")
    return vbi_slow(n)


# ---------------------------------------------------------------- properties
# kinds: 1 byte, 2 two-byte int, 4 four-byte int, 'v' varint, 's' UTF-8 string, 'b' binary, 'p' string pair
WILL = 0  # pseudo packet type for will properties

# id: (field, kind, packet types where allowed, allowed values or None)
PROPS: Final[dict[int, tuple[str, str, frozenset[int], frozenset[int] | None]]] = {
    0x01: ("payload_format_indicator", "1", frozenset({3, WILL}), frozenset({0, 1})),
    0x02: ("message_expiry_interval", "4", frozenset({3, WILL}), None),
    0x03: ("content_type", "s", frozenset({3, WILL}), None),
    0x08: ("response_topic", "s", frozenset({3, WILL}), None),
    0x09: ("correlation_data", "b", frozenset({3, WILL}), None),
    0x0B: ("subscription_identifiers", "v", frozenset({3, 8}), None),
    0x11: ("session_expiry_interval", "4", frozenset({1, 2, 14}), None),
    0x12: ("assigned_client_identifier", "s", frozenset({2}), None),
    0x13: ("server_keep_alive", "2", frozenset({2}), None),
    0x15: ("authentication_method", "s", frozenset({1, 2, 15}), None),
    0x16: ("authentication_data", "b", frozenset({1, 2, 15}), None),
    0x17: ("request_problem_information", "1", frozenset({1}), frozenset({0, 1})),
    0x18: ("will_delay_interval", "4", frozenset({WILL}), None),
    0x19: ("request_response_information", "1", frozenset({1}), frozenset({0, 1})),
    0x1A: ("response_information", "s", frozenset({2}), None),
    0x1C: ("server_reference", "s", frozenset({2, 14}), None),
    0x1F: ("reason_string", "s", frozenset({2, 4, 5, 6, 7, 9, 11, 14, 15}), None),
    0x21: ("receive_maximum", "2", frozenset({1, 2}), None),
    0x22: ("topic_alias_maximum", "2", frozenset({1, 2}), None),
    0x23: ("topic_alias", "2", frozenset({3}), None),
    0x24: ("maximum_qos", "1", frozenset({2}), frozenset({0, 1})),
    0x25: ("retain_available", "1", frozenset({2}), frozenset({0, 1})),
    0x26: ("user_properties", "p", frozenset({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 14, 15, WILL}), None),
    0x27: ("maximum_packet_size", "4", frozenset({1, 2}), None),
    0x28: ("wildcard_subscription_available", "1", frozenset({2}), frozenset({0, 1})),
    0x29: ("subscription_identifier_available", "1", frozenset({2}), frozenset({0, 1})),
    0x2A: ("shared_subscription_available", "1", frozenset({2}), frozenset({0, 1})),
}
# encoding order: (field, id, kind)
PROP_FIELDS: Final = tuple((f, pid, kind) for pid, (f, kind, _, _) in PROPS.items())
PACKET_NAMES: Final = {
    0: "Will",
    1: "CONNECT",
    2: "CONNACK",
    3: "PUBLISH",
    4: "PUBACK",
    5: "PUBREC",
    6: "PUBREL",
    7: "PUBCOMP",
    8: "SUBSCRIBE",
    9: "SUBACK",
    10: "UNSUBSCRIBE",
    11: "UNSUBACK",
    12: "PINGREQ",
    13: "PINGRESP",
    14: "DISCONNECT",
    15: "AUTH",
}
