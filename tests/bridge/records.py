"""Record factories for bridge tests, and feeding them through the broker's batched hook.

``delivery``/``publication``/``change`` (and ``composite_change``/``composite_event``/
``composite_loss``) build the broker's public hook records with chosen
values; ``feed`` hands a ``Delivery`` or ``Publication`` to :meth:`Bridge.on_deliveries` the way
the broker does (a message object with the receipt time ``time - latency``, one delivery entry;
a publication is a call with its route count and no entry).
"""

from __future__ import annotations

from broker import Message
from broker.hooks import (
    CompositeAction,
    CompositeChange,
    CompositeEventRecord,
    CompositeLoss,
    Delivery,
    Hooks,
    Publication,
    SubscriptionAction,
    SubscriptionChange,
)
from broker.packets import NO_PROPERTIES


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


#: the composite kinds of ``BridgeStats`` when no composite record was seen
NO_COMPOSITE = {"composite_changes": 0, "composite_events": 0, "composite_losses": 0, "messages": 0}


def composite_change(
    t: float,
    client: str,
    name: str,
    action: CompositeAction,
    expression: str = "a & b",
    *,
    window: float | None = 60.0,
    subscriptions: int = 1,
) -> CompositeChange:
    return CompositeChange(t, client, name, action, expression, window, 64, 1, subscriptions)


def composite_event(
    t: float, expression: str = "a & b", *, completion: float = 1.0, buffered: int = 0, window: float = 60.0
) -> CompositeEventRecord:
    return CompositeEventRecord(
        t, expression, window, 64, (("c1", "n"), ("c2", "m")), t - completion, t, 2, completion, buffered
    )


def composite_loss(
    t: float, expression: str = "a & b", element: str = "a", *, expired: int = 1, dropped: int = 0
) -> CompositeLoss:
    return CompositeLoss(t, expression, 60.0, 64, element, expired, dropped)


def feed(hook: Hooks, record: Delivery | Publication) -> None:
    """Pass ``record`` to ``hook.on_deliveries`` as the broker would."""
    received = record.time - record.latency if isinstance(record, Delivery) else record.time
    msg = Message(
        record.topic,
        bytes(record.payload_size),
        record.qos,
        record.retained,
        NO_PROPERTIES,
        record.publisher_id,
        record.message_id,
        received,
    )
    match record:
        case Delivery():
            entry = (
                record.subscriber_id,
                record.subscription_filter,
                record.content_filter,
                record.qos,
                record.retained,
            )
            hook.on_deliveries(record.time, msg, [entry], -1)
        case Publication():
            hook.on_deliveries(record.time, msg, [], record.deliveries)
