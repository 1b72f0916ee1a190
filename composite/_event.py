"""Records that cross the engine's boundary: offered components and composite events.

A :class:`Component` is one publication as the broker offers it to an atom (topic, payload,
QoS); a :class:`CompositeEvent` is what the engine hands back when a composite subscription's
expression is satisfied: the canonical expression, the deliveries (subscriber key and the
QoS to publish with, the minimum of that subscriber's QoS and the components'), the consumed
components as :class:`Part` records in arrival order, and ``begin``/``end`` (earliest and
latest arrival, seed 001 Fig. 8's ``Event.begin``/``Event.end``).  :meth:`CompositeEvent.payload`
is the JSON document of docs/composite.md, built once per event (orjson) and shared by every
subscriber.
"""

from __future__ import annotations

import base64
from collections.abc import Hashable
from typing import Protocol

import orjson

__all__ = ["Component", "ComponentLike", "CompositeEvent", "Delivery", "Part"]

Delivery = tuple[Hashable, int]
"""(subscriber key, QoS to deliver with)."""


class ComponentLike(Protocol):
    """What the engine reads of an offered publication: its topic name, payload and QoS.
    A :class:`Component`, or any record with those attributes that nobody mutates (a broker
    can offer its own message record as it is: no copy per offer)."""

    @property
    def topic(self) -> str: ...

    @property
    def payload(self) -> bytes: ...

    @property
    def qos(self) -> int: ...


class Component:
    """One publication offered to an atom: topic name, payload bytes, QoS 0..2.

    The engine keeps a reference, never a copy, and never mutates it.
    """

    __slots__ = ("payload", "qos", "topic")

    topic: str
    payload: bytes
    qos: int

    def __init__(self, topic: str, payload: bytes, qos: int = 0) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Component)
            and other.topic == self.topic
            and other.payload == self.payload
            and other.qos == self.qos
        )

    def __hash__(self) -> int:
        return hash((self.topic, self.payload, self.qos))

    def __repr__(self) -> str:
        return f"Component({self.topic!r}, {self.payload!r}, qos={self.qos})"


class Part:
    """One consumed component of a composite event: the atom it matched (canonical text),
    the component and its arrival time."""

    __slots__ = ("arrival", "component", "element")

    element: str
    component: ComponentLike
    arrival: float

    def __init__(self, element: str, component: ComponentLike, arrival: float) -> None:
        self.element = element
        self.component = component
        self.arrival = arrival

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Part)
            and other.element == self.element
            and other.component == self.component
            and other.arrival == self.arrival
        )

    def __hash__(self) -> int:
        return hash((self.element, self.arrival))

    def __repr__(self) -> str:
        return f"Part({self.element!r}, {self.component!r}, {self.arrival!r})"

    def as_json(self) -> dict[str, object]:
        c = self.component
        try:
            text, encoding = c.payload.decode("utf-8"), "text"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(c.payload).decode("ascii"), "base64"
        out: dict[str, object] = {
            "element": self.element,
            "topic": c.topic,
            "payload": text,
            "encoding": encoding,
            "qos": c.qos,
            "arrival": self.arrival,
        }
        origin = getattr(c, "origin", None)
        if origin is not None:  # the atom's identity in a cluster (docs/composite.md)
            out["origin"] = origin
        return out


class CompositeEvent:
    """A satisfied composite subscription: see the module docstring."""

    __slots__ = ("_payload", "begin", "components", "deliveries", "end", "expression", "source")

    expression: str
    deliveries: tuple[Delivery, ...]
    components: tuple[Part, ...]
    begin: float
    end: float

    def __init__(
        self,
        expression: str,
        deliveries: tuple[Delivery, ...],
        components: tuple[Part, ...],
        begin: float,
        end: float,
        *,
        source: object = None,
    ) -> None:
        self.expression = expression
        self.deliveries = deliveries
        self.components = components
        self.begin = begin
        self.end = end
        #: the engine's handle of the composite subscription that fired (opaque; for
        #: :meth:`CompositeEngine.occupancy`), None when built elsewhere
        self.source = source
        self._payload: bytes | None = None

    @property
    def qos(self) -> int:
        """The lowest QoS among the components (a delivery's QoS is at most this)."""
        return min(p.component.qos for p in self.components)

    def payload(self) -> bytes:
        """The JSON document (UTF-8): expression, begin, end, components (docs/composite.md)."""
        if self._payload is None:
            self._payload = orjson.dumps(
                {
                    "expression": self.expression,
                    "begin": self.begin,
                    "end": self.end,
                    "components": [p.as_json() for p in self.components],
                }
            )
        return self._payload

    def __repr__(self) -> str:
        return (
            f"CompositeEvent({self.expression!r}, begin={self.begin!r}, end={self.end!r}, "
            f"components={list(self.components)!r}, deliveries={list(self.deliveries)!r})"
        )
