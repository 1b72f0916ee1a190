"""An asyncio MQTT 3.1.1 and 5.0 broker that routes by topic and by content.

The protocol core is sans-IO (bytes in, events and bytes out); the asyncio transport is a
thin adapter around it.  Routing uses :mod:`topics` (topic tree, negative entries) and
:mod:`content` (content filters).  See docs/architecture.md.
"""

from __future__ import annotations

from broker.hooks import Delivery, Hooks, Publication, SubscriptionAction, SubscriptionChange

__all__ = ["Delivery", "Hooks", "Publication", "SubscriptionAction", "SubscriptionChange"]
