"""The values every layer of the broker passes around: an accepted application message
(:class:`Message`), one subscriber's delivery of it (:class:`Route`), the options of a
subscription (:class:`SubOptions`), and the two filter prefixes siftmq and MQTT define
(``$share/<group>/`` and ``$filter/<selector>/``), each parsed in exactly one place.

Per-message values are hand-written immutable records (:mod:`broker.protocol._record`): one is
built per PUBLISH or per delivery, so their constructor is on the hot path.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Final

from broker.packets import NO_PROPERTIES, Properties
from broker.protocol import Record

__all__ = [
    "ATOM_CLIENT",
    "COMPOSITE_PREFIX",
    "FILTER_PREFIX",
    "INTERNAL_CLIENT_PREFIXES",
    "INTERNAL_PREFIXES",
    "PEER_PREFIX",
    "RESERVED_PREFIXES",
    "SHARE_PREFIX",
    "Message",
    "Route",
    "SubOptions",
    "split_filter_prefix",
    "split_share",
]

#: MQTT 5 section 4.8.2: ``$share/<group>/<filter>``
SHARE_PREFIX: Final = "$share/"
#: the client id prefix of another cluster broker's link (docs/cluster.md): a message that
#: arrived over a link is never routed to a link (:meth:`Router.route_peer`)
PEER_PREFIX: Final = "$cluster/"
#: topic prefixes the broker uses internally (the cluster's control plane ``$cluster/ctl/...``
#: and its store rows ``$cluster-in/...``): only a verified cluster peer link may PUBLISH or
#: SUBSCRIBE there, whatever an ACL or authorize hook says (docs/cluster.md, "Security")
INTERNAL_PREFIXES: Final = ("$cluster/", "$cluster-in/")
#: every broker-owned topic prefix a client PUBLISH (or a message hook's rewrite) may not take
#: unless allowed (``Connection._may_publish_reserved``; broker.core._msghooks)
RESERVED_PREFIXES: Final = ("$SYS", "$share/", *INTERNAL_PREFIXES)
#: client ids the broker gives its own sessions (in-process subscriptions ``$local/<n>``, a
#: peer's received QoS 2 ids ``$cluster-in/<peer>``): a network CONNECT may not take them
INTERNAL_CLIENT_PREFIXES: Final = ("$local/", "$cluster-in/")
#: siftmq's 3.1.1 content filter: ``$filter/<selector>/<filter>`` (docs/reference.md)
FILTER_PREFIX: Final = "$filter/"
#: a composite subscription's filter prefix and the topic prefix of its events (issue 16,
#: broker.core._composite); here, not there, so that the core tells one apart without
#: importing the composite modules (made at the first such subscription, issue 42 item 1)
COMPOSITE_PREFIX: Final = "$composite/"
#: the index client id prefix of a composite subscription's atoms (U+0000 is refused in MQTT
#: client ids, so no client can take it)
ATOM_CLIENT: Final = "\x00composite/"


def split_share(topic_filter: str) -> tuple[str, str] | None:
    """``(group, filter)`` of a ``$share/<group>/<filter>``, None for any other filter.

    Raises ValueError when the shape is wrong (empty group, wildcard in the group, no filter).
    """
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    parts = topic_filter.split("/", 2)
    if len(parts) < 3 or not parts[1] or "+" in parts[1] or "#" in parts[1]:
        raise ValueError(f"{topic_filter[:100]!r}: $share/<group>/<filter> expected")
    return parts[1], parts[2]


_message_ids = itertools.count(1)


class Message(Record):
    """One accepted application message (immutable; shared by all its deliveries).

    ``expires_at`` is a ``time.monotonic()`` deadline or None; ``received`` is the
    ``time.time()`` of receipt (for hook latencies).  A hand-written record rather than a
    frozen dataclass because one is built per PUBLISH (:mod:`broker.protocol._record`).
    """

    __slots__ = (
        "expires_at",
        "message_id",
        "payload",
        "properties",
        "publisher_id",
        "qos",
        "received",
        "retain",
        "topic",
    )
    __match_args__ = (
        "topic",
        "payload",
        "qos",
        "retain",
        "properties",
        "publisher_id",
        "message_id",
        "received",
        "expires_at",
    )

    def __init__(  # noqa: PLR0917 (the dataclass-style positional constructor)
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        properties: Properties = NO_PROPERTIES,
        publisher_id: str | None = None,
        message_id: int = 0,
        received: float = 0.0,
        expires_at: float | None = None,
    ) -> None:
        self.topic: Final = topic
        self.payload: Final = payload
        self.qos: Final = qos
        self.retain: Final = retain
        self.properties: Final = properties
        self.publisher_id: Final = publisher_id
        self.message_id: Final = message_id
        self.received: Final = received
        self.expires_at: Final = expires_at

    @staticmethod
    def create(  # noqa: PLR0917 (hot path: positional arguments)
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        properties: Properties,
        publisher_id: str | None,
        now: float,
    ) -> Message:
        expiry = properties.message_expiry_interval
        return Message(
            topic,
            payload,
            qos,
            retain,
            properties,
            publisher_id,
            next(_message_ids),
            time.time(),
            None if expiry is None else now + expiry,
        )


@dataclass(frozen=True, slots=True)
class SubOptions:
    """The options of one MQTT subscription (what the index stores per entry)."""

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None
    selector: str | None = None  # content filter source text
    topic_filter: str = ""  # the plain topic filter (without $share / $filter prefixes)


class Route(Record):
    """One delivery decided by the router: ``client_id`` receives the message (a record
    built per delivery to a selector subscriber, :mod:`broker.protocol._record`)."""

    __slots__ = ("client_id", "qos", "retain", "selector", "subscription_ids", "topic_filter")
    __match_args__ = ("client_id", "qos", "retain", "subscription_ids", "topic_filter", "selector")

    def __init__(  # noqa: PLR0917 (hot path: positional arguments)
        self,
        client_id: str,
        qos: int,
        retain: bool,  # RETAIN flag on the outgoing PUBLISH
        subscription_ids: tuple[int, ...],
        topic_filter: str,
        selector: str | None,
    ) -> None:
        self.client_id: Final = client_id
        self.qos: Final = qos
        self.retain: Final = retain
        self.subscription_ids: Final = subscription_ids
        self.topic_filter: Final = topic_filter
        self.selector: Final = selector


def split_filter_prefix(topic_filter: str) -> tuple[str | None, str]:
    """``$filter/<selector>/<topic filter>`` -> (selector, topic filter); others -> (None, f).

    The selector ends at the first ``/`` outside a single-quoted string ('' inside a string
    is an escaped quote and toggles twice, so a plain scan is exact).  Raises ValueError
    when the prefix is present but no topic filter follows.
    """
    if not topic_filter.startswith(FILTER_PREFIX):
        return None, topic_filter
    quoted = False
    for i in range(8, len(topic_filter)):
        ch = topic_filter[i]
        if ch == "'":
            quoted = not quoted
        elif ch == "/" and not quoted:
            rest = topic_filter[i + 1 :]
            if not rest:
                break
            return topic_filter[8:i], rest
    raise ValueError("$filter/<selector>/<topic filter>: no topic filter after the selector")
