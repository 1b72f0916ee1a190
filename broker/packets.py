"""MQTT 3.1.1 and 5.0 control packets as values, and their codec (sans-IO): the public face
of :mod:`broker.protocol`.

The packets are defined in :mod:`broker.protocol._values`; the encoder (:func:`encode`,
:func:`encode_publish`, :class:`PublishTemplate` for fan-out) in
:mod:`broker.protocol._encode`; the streaming :class:`Decoder` in
:mod:`broker.protocol._decode` (no sockets, no asyncio: bytes in, packets out).  Topic and
filter *syntax* (wildcards) is not the codec's business: the broker validates with
:func:`topics.validate_topic` and :func:`topics.validate_filter`.  The codec validates
everything else the standards call a Malformed Packet or Protocol Error at the packet level.
"""

from __future__ import annotations

from broker.protocol import (
    NO_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    MalformedPacket,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    PublishTemplate,
    Pubrec,
    Pubrel,
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

__all__ = [
    "NO_PROPERTIES",
    "Auth",
    "Connack",
    "Connect",
    "Decoder",
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
    "PublishTemplate",
    "Pubrec",
    "Pubrel",
    "ReasonCode",
    "Suback",
    "Subscribe",
    "SubscriptionRequest",
    "Unsuback",
    "Unsubscribe",
    "Will",
    "encode",
    "encode_publish",
]
