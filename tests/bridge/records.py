"""Record factories for bridge tests (built from the broker's public hook records)."""

from __future__ import annotations

from broker.hooks import Delivery, Publication, SubscriptionAction, SubscriptionChange


def delivery(
    i: int, t: float, *, topic: str = "a/b", subscriber: str = "s1", cf: str | None = None, sf: str = "a/#"
) -> Delivery:
    return Delivery(
        time=t,
        message_id=i,
        publisher_id="p1" if i % 2 else None,
        subscriber_id=subscriber,
        topic=topic,
        subscription_filter=sf,
        content_filter=cf,
        qos=i % 3,
        retained=i % 5 == 0,
        payload_size=10 + i % 7,
        latency=0.001 * (1 + i % 10),
    )


def publication(i: int, t: float, *, topic: str = "a/b", fanout: int = 1) -> Publication:
    return Publication(
        time=t,
        message_id=i,
        publisher_id="p1",
        topic=topic,
        payload_size=10 + i % 7,
        qos=i % 3,
        retained=False,
        deliveries=fanout,
    )


def change(
    t: float,
    client: str,
    action: SubscriptionAction,
    topic_filter: str | None,
    entries: int,
    *,
    cf: str | None = None,
) -> SubscriptionChange:
    return SubscriptionChange(
        time=t,
        client_id=client,
        action=action,
        topic_filter=topic_filter,
        content_filter=cf,
        qos=None if topic_filter is None else 1,
        entries=entries,
    )
