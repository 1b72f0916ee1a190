"""What the broker reports about itself: the records its hooks receive.

The bridge (``bridge/``) and any embedding program observe the broker through these frozen,
slotted records.  They are built on the hot path only when a hook is registered, and a hook
must not block: it appends the record to a buffer and returns (the bridge's writer turns
buffers into files off the event loop).  Times are ``time.time()`` seconds (UTC epoch).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Delivery", "Publication", "SubscriptionAction", "SubscriptionChange"]


class SubscriptionAction(enum.Enum):
    SUBSCRIBE = "subscribe"
    UNSUBSCRIBE = "unsubscribe"
    PARTIAL_UNSUBSCRIBE = "partial_unsubscribe"
    SESSION_END = "session_end"
    TAKEOVER = "takeover"


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message delivered to one subscriber (one record per subscriber, per message)."""

    time: float
    message_id: int  # broker-wide id of the publication (same for all its deliveries)
    publisher_id: str | None  # client id, or None for messages published from code
    subscriber_id: str
    topic: str
    subscription_filter: str  # the topic filter of the subscription that matched
    content_filter: str | None  # its selector, or None
    qos: int  # the QoS of this delivery
    retained: bool
    payload_size: int
    latency: float  # seconds from receipt of the PUBLISH to the write to the subscriber


@dataclass(frozen=True, slots=True)
class Publication:
    """One message accepted by the broker, with its fan-out."""

    time: float
    message_id: int
    publisher_id: str | None
    topic: str
    payload_size: int
    qos: int
    retained: bool
    deliveries: int


@dataclass(frozen=True, slots=True)
class SubscriptionChange:
    """A change to one client's subscription list."""

    time: float
    client_id: str
    action: SubscriptionAction
    topic_filter: str | None  # None for session_end / takeover
    content_filter: str | None
    qos: int | None
    entries: int  # the client's resulting number of entries (subscriptions + negative entries)
