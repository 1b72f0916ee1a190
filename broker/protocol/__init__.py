"""The MQTT wire protocol, sans-IO: packets as values (``_values``, ``_record``), the encoder
(``_encode``) and the streaming decoder (``_decode``) with their shared tables (``_wire``), and
the PROXY protocol header parser (``_proxy``).

Nothing here touches a socket, awaits, or knows about sessions: bytes in, packets out, and
back.

This module is the package's public seam (docs/architecture.md, "Seams"). Who may use it: the
rest of the ``broker`` package; users and the packages above the broker import the packets
through :mod:`broker.packets`, which re-exports them. Stable: the names below, within a release.

Every name is imported from its home module at its first use (PEP 562, as :mod:`broker`
does): importing the package costs nothing and a name loads only the module that defines it,
so this seam changes no import order. Cost: a dictionary lookup at a name's first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker._extras import lazy_names

if TYPE_CHECKING:
    from broker.protocol._decode import Decoder
    from broker.protocol._encode import PublishTemplate, encode, encode_publish
    from broker.protocol._proxy import ProxyError, ProxyParser
    from broker.protocol._record import Record
    from broker.protocol._values import (
        NO_PROPERTIES,
        Auth,
        Connack,
        Connect,
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
    "ProxyError",
    "ProxyParser",
    "Puback",
    "Pubcomp",
    "Publish",
    "PublishTemplate",
    "Pubrec",
    "Pubrel",
    "ReasonCode",
    "Record",
    "Suback",
    "Subscribe",
    "SubscriptionRequest",
    "Unsuback",
    "Unsubscribe",
    "Will",
    "encode",
    "encode_publish",
]

#: public name -> the module that defines it (imported at the name's first use)
_LAZY = {
    "Decoder": "broker.protocol._decode",
    "PublishTemplate": "broker.protocol._encode",
    "encode": "broker.protocol._encode",
    "encode_publish": "broker.protocol._encode",
    "ProxyError": "broker.protocol._proxy",
    "ProxyParser": "broker.protocol._proxy",
    "Record": "broker.protocol._record",
    "Auth": "broker.protocol._values",
    "Connack": "broker.protocol._values",
    "Connect": "broker.protocol._values",
    "Disconnect": "broker.protocol._values",
    "MalformedPacket": "broker.protocol._values",
    "NO_PROPERTIES": "broker.protocol._values",
    "Packet": "broker.protocol._values",
    "PacketType": "broker.protocol._values",
    "Pingreq": "broker.protocol._values",
    "Pingresp": "broker.protocol._values",
    "Properties": "broker.protocol._values",
    "Puback": "broker.protocol._values",
    "Pubcomp": "broker.protocol._values",
    "Publish": "broker.protocol._values",
    "Pubrec": "broker.protocol._values",
    "Pubrel": "broker.protocol._values",
    "ReasonCode": "broker.protocol._values",
    "Suback": "broker.protocol._values",
    "Subscribe": "broker.protocol._values",
    "SubscriptionRequest": "broker.protocol._values",
    "Unsuback": "broker.protocol._values",
    "Unsubscribe": "broker.protocol._values",
    "Will": "broker.protocol._values",
}

__getattr__ = lazy_names("broker.protocol", _LAZY)
