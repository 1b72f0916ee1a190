"""The routing core: subscriptions, retained messages and content filters, with no I/O.

The router answers one question per PUBLISH: which clients receive it, at which QoS and
with which subscription identifiers.  It never re-implements topic matching: the
subscription lists, negative entries and partial unsubscribe (CONTRACT.md, "Negative
entries inside the MQTT broker"; seed 002, the IBM patent, Fig. 4-7) live in
:class:`topics.SubscriptionIndex`, retained messages in :class:`topics.RetainedTree`.

Content filters (seed 000 / 003 engines behind ``content.ENGINES``) are kept in one
engine keyed by selector text, with a reference count, so identical selectors are indexed
once.  Per publish the JSON attributes are computed once, and the engine is consulted only
when a subscription that matched by topic carries a filter: cost O(topic match) for
unfiltered traffic, plus one ``engine.match(event)`` otherwise.

Shared subscriptions (``$share/<group>/<filter>``) are delivered to one member of the
group, round robin over the members whose options accept the message.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass

import content
import topics
from broker.packets import NO_PROPERTIES, Properties

__all__ = [
    "Message",
    "Route",
    "Router",
    "SubOptions",
    "split_filter_prefix",
]

_message_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Message:
    """One accepted application message (immutable; shared by all its deliveries).

    ``expires_at`` is a ``time.monotonic()`` deadline or None; ``received`` is the
    ``time.time()`` of receipt (for hook latencies).
    """

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES
    publisher_id: str | None = None
    message_id: int = 0
    received: float = 0.0
    expires_at: float | None = None

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


@dataclass(frozen=True, slots=True)
class Route:
    """One delivery decided by the router: ``client_id`` receives the message."""

    client_id: str
    qos: int
    retain: bool  # RETAIN flag on the outgoing PUBLISH
    subscription_ids: tuple[int, ...]
    topic_filter: str
    selector: str | None


def split_filter_prefix(topic_filter: str) -> tuple[str | None, str]:
    """``$filter/<selector>/<topic filter>`` -> (selector, topic filter); others -> (None, f).

    The selector ends at the first ``/`` outside a single-quoted string ('' inside a string
    is an escaped quote and toggles twice, so a plain scan is exact).  Raises ValueError
    when the prefix is present but no topic filter follows.
    """
    if not topic_filter.startswith("$filter/"):
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


class Router:
    """Subscriptions + retained messages + content filters for one broker.

    ``route`` is O(size of the topic match) plus one engine match when filters are involved.
    """

    def __init__(self, partial_unsubscribe: bool = True, engine: str = "brute-force") -> None:
        self.index: topics.SubscriptionIndex[SubOptions] = topics.SubscriptionIndex(
            partial_unsubscribe=partial_unsubscribe
        )
        self.retained: topics.RetainedTree[Message] = topics.RetainedTree()
        self.engine = content.ENGINES[engine]()
        self._selector_refs: dict[str, int] = {}
        self._rr: dict[tuple[str, str], int] = {}

    # ------------------------------------------------------------ content filters
    def add_selector(self, selector: str, compiled: content.Filter) -> None:
        refs = self._selector_refs.get(selector, 0)
        if refs == 0:
            self.engine.add(selector, compiled)
        self._selector_refs[selector] = refs + 1

    def release_selector(self, selector: str) -> None:
        refs = self._selector_refs[selector] - 1
        if refs == 0:
            del self._selector_refs[selector]
            self.engine.remove(selector)
        else:
            self._selector_refs[selector] = refs

    def _matching_selectors(self, payload: bytes) -> set[object]:
        return self.engine.match(content.attributes(payload))

    # ------------------------------------------------------------ routing
    def route(self, msg: Message) -> list[Route]:
        """Decide every delivery of ``msg`` (MQTT 5 section 4.5 and CONTRACT.md rules)."""
        result = self.index.match(msg.topic)
        routes: list[Route] = []
        append = routes.append
        sel_ok: set[object] | None = None
        publisher = msg.publisher_id
        mqos = msg.qos
        mretain = msg.retain
        for client_id, subs in result.clients.items():
            best: SubOptions | None = None
            ids: list[int] = []
            rap = False
            for sub in subs:
                o = sub.options
                if o.no_local and client_id == publisher:
                    continue
                if o.selector is not None:
                    if sel_ok is None:
                        sel_ok = self._matching_selectors(msg.payload)
                    if o.selector not in sel_ok:
                        continue
                if best is None or o.qos > best.qos:
                    best = o
                if o.subscription_id is not None:
                    ids.append(o.subscription_id)
                rap = rap or o.retain_as_published
            if best is None:
                continue
            append(
                Route(
                    client_id,
                    mqos if mqos < best.qos else best.qos,
                    mretain and rap,
                    tuple(ids),
                    best.topic_filter,
                    best.selector,
                )
            )
        for key, members in result.shared.items():
            candidates = []
            for client_id, o in members:
                if o.selector is not None:
                    if sel_ok is None:
                        sel_ok = self._matching_selectors(msg.payload)
                    if o.selector not in sel_ok:
                        continue
                candidates.append((client_id, o))
            if not candidates:
                continue
            n = self._rr.get(key, 0)
            self._rr[key] = n + 1
            client_id, o = candidates[n % len(candidates)]
            ids_t = () if o.subscription_id is None else (o.subscription_id,)
            append(
                Route(
                    client_id,
                    mqos if mqos < o.qos else o.qos,
                    False,
                    ids_t,
                    o.topic_filter,
                    o.selector,
                )
            )
        return routes

    # ------------------------------------------------------------ retained
    def store_retained(self, msg: Message) -> None:
        """Store ``msg`` as the retained message of its topic (empty payload clears it)."""
        if msg.payload:
            self.retained.set(msg.topic, msg)
        else:
            self.retained.delete(msg.topic)

    def retained_for(self, topic_filter: str, selector: str | None, now: float) -> Iterator[Message]:
        """Retained messages a new subscription receives (expired ones are dropped)."""
        expired: list[str] = []
        for topic, msg in self.retained.match(topic_filter):
            if msg.expires_at is not None and msg.expires_at <= now:
                expired.append(topic)
                continue
            if selector is not None and selector not in self._matching_selectors(msg.payload):
                continue
            yield msg
        for topic in expired:
            self.retained.delete(topic)
