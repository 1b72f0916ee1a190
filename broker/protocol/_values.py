"""MQTT 3.1.1 and 5.0 control packets as values (sans-IO; the public face is :mod:`broker.packets`).

The packet types are frozen, slotted dataclasses (one per control packet, MQTT 5.0 section 3),
except PUBLISH and its acknowledgements, built once per message: immutable records with the
same value semantics but a constructor ten times cheaper (:mod:`broker.protocol._record`);
:class:`Properties` carries every MQTT 5 property (section 2.2.2.2) as an optional field.
3.1.1 packets use the same classes: properties and v5-only reason codes are simply not
written on a 3.1.1 wire, and 3.1.1 return codes are read into the equivalent v5 reason codes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, TypeAlias

from broker.protocol._record import Record

__all__ = [
    "NO_PROPERTIES",
    "Auth",
    "Connack",
    "Connect",
    "Disconnect",
    "MalformedPacket",
    "Packet",
    "PacketType",
    "Pingreq",
    "Pingresp",
    "Properties",
    "Puback",
    "Pubcomp",
    "Publish",
    "Pubrec",
    "Pubrel",
    "ReasonCode",
    "Suback",
    "Subscribe",
    "SubscriptionRequest",
    "Unsuback",
    "Unsubscribe",
    "Will",
]


class PacketType(enum.IntEnum):
    """MQTT control packet types (fixed header bits 7-4; MQTT 5.0 section 2.1.2)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class ReasonCode(enum.IntEnum):
    """Every MQTT 5 reason code (MQTT 5.0 section 2.4), named as in the standard.

    Codes sharing a value are aliases (``SUCCESS``, ``NORMAL_DISCONNECTION`` and
    ``GRANTED_QOS_0`` are all 0x00).
    """

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


@dataclass(frozen=True, slots=True)
class Properties:
    """MQTT 5 properties (section 2.2.2.2); ``None`` / ``()`` means absent."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None


NO_PROPERTIES = Properties()


@dataclass(frozen=True, slots=True)
class Will:
    """The Will Message of a CONNECT (3.1.2.5 / 3.1.3.2-3.1.3.4)."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT (3.1). ``protocol_level`` 3 (MQIsdp, 3.1), 4 (3.1.1) or 5 decides the wire form."""

    client_id: str
    protocol_level: int = 4
    clean_start: bool = True
    keep_alive: int = 60
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = NO_PROPERTIES
    protocol_name: str = "MQTT"
    #: a broker bridging to us (mosquitto's protocol level 0x83 / 0x84): no echo of its own
    #: publications, retain flags kept as published
    bridge: bool = False
    #: never on the wire: set by a listener with ``use_identity_as_username``, whose
    #: ``username`` is then the verified client certificate's CN (authenticated by TLS)
    identity: bool = False


@dataclass(frozen=True, slots=True)
class Connack:
    """CONNACK (3.2); on a 3.1.1 wire the reason code maps to a return code."""

    session_present: bool = False
    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


class Publish(Record):
    """PUBLISH (3.3). ``topic`` may be "" in v5 when a topic alias is set.

    A hand-written immutable record, not a frozen dataclass: it is built once per message
    (:mod:`broker.protocol._record` says why and what it keeps of a dataclass).
    """

    __slots__ = ("dup", "packet_id", "payload", "properties", "qos", "retain", "topic")
    __match_args__ = ("topic", "payload", "qos", "retain", "dup", "packet_id", "properties")

    def __init__(  # noqa: PLR0917 (the dataclass-style positional constructor)
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        dup: bool = False,
        packet_id: int | None = None,
        properties: Properties = NO_PROPERTIES,
    ) -> None:
        self.topic: Final = topic
        self.payload: Final = payload
        self.qos: Final = qos
        self.retain: Final = retain
        self.dup: Final = dup
        self.packet_id: Final = packet_id
        self.properties: Final = properties


class _Ack(Record):
    """The shape shared by PUBACK, PUBREC, PUBREL and PUBCOMP (one per QoS 1/2 message)."""

    __slots__ = ("packet_id", "properties", "reason_code")
    __match_args__ = ("packet_id", "reason_code", "properties")

    def __init__(
        self,
        packet_id: int,
        reason_code: ReasonCode = ReasonCode.SUCCESS,
        properties: Properties = NO_PROPERTIES,
    ) -> None:
        self.packet_id: Final = packet_id
        self.reason_code: Final = reason_code
        self.properties: Final = properties


class Puback(_Ack):
    """PUBACK (3.4)."""

    __slots__ = ()


class Pubrec(_Ack):
    """PUBREC (3.5)."""

    __slots__ = ()


class Pubrel(_Ack):
    """PUBREL (3.6)."""

    __slots__ = ()


class Pubcomp(_Ack):
    """PUBCOMP (3.7)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class SubscriptionRequest:
    """One topic filter of a SUBSCRIBE with its subscription options (3.8.3.1)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    """SUBSCRIBE (3.8)."""

    packet_id: int
    subscriptions: tuple[SubscriptionRequest, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Suback:
    """SUBACK (3.9); on a 3.1.1 wire every code >= 0x80 is written as 0x80."""

    packet_id: int
    reason_codes: tuple[ReasonCode, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """UNSUBSCRIBE (3.10)."""

    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsuback:
    """UNSUBACK (3.11); 3.1.1 has no reason codes on the wire (decoded as ``()``)."""

    packet_id: int
    reason_codes: tuple[ReasonCode, ...] = ()
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Pingreq:
    """PINGREQ (3.12)."""


@dataclass(frozen=True, slots=True)
class Pingresp:
    """PINGRESP (3.13)."""


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT (3.14)."""

    reason_code: ReasonCode = ReasonCode.NORMAL_DISCONNECTION
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Auth:
    """AUTH (3.15, MQTT 5 only)."""

    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


Packet: TypeAlias = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
    | Auth
)


class MalformedPacket(Exception):
    """Input that breaks the standard; ``reason_code`` is what a v5 DISCONNECT should carry.

    ``str()`` says what was wrong and where (packet type and byte offset when known).
    """

    def __init__(self, reason_code: ReasonCode, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code
