"""Composite subscriptions (seed 001): expressions over topic/content atoms, shared elements,
buffered merging of component events.  Sans-IO: no clock, no sockets, no asyncio.

Placeholder docstring; see docs/composite.md.
"""

from __future__ import annotations

from composite._elements import AtomInfo
from composite._engine import Change, CompositeEngine, EngineStats, SubscriptionStats
from composite._event import Component, CompositeEvent, Delivery, Part
from composite._syntax import (
    MAX_ATOMS,
    MAX_DEPTH,
    MAX_EXPRESSION_LENGTH,
    Atom,
    CompositeSyntaxError,
    Expr,
    Op,
    canonical,
    parse,
)

__all__ = [
    "MAX_ATOMS",
    "MAX_DEPTH",
    "MAX_EXPRESSION_LENGTH",
    "Atom",
    "AtomInfo",
    "Change",
    "Component",
    "CompositeEngine",
    "CompositeEvent",
    "CompositeSyntaxError",
    "Delivery",
    "EngineStats",
    "Expr",
    "Op",
    "Part",
    "SubscriptionStats",
    "canonical",
    "parse",
]
