"""An asyncio MQTT 3.1.1 and 5.0 broker that routes by topic and by content.

The protocol core is sans-IO (bytes in, events and bytes out); the asyncio transport is a
thin adapter around it.  Routing uses :mod:`topics` (topic tree, negative entries) and
:mod:`content` (content filters).  See docs/architecture.md and docs/broker.md.

``broker.hooks`` is importable on its own (a hook needs nothing else); the broker
itself (``Broker``, ``BrokerConfig``, ``Listener``, ``Message``) is imported lazily on first access.

Seams (docs/architecture.md, "Seams"): users import this module and :mod:`broker.hooks`,
:mod:`broker.plugins`, :mod:`broker.packets`, :mod:`broker.store`, :mod:`broker.auth`,
:mod:`broker.authn`, :mod:`broker.testing`; the packages built on the broker (cluster, bridge,
uplink) also :mod:`broker.ext`. Nobody outside ``broker`` imports its ``_``-modules, and inside
it the subpackages (``core``, ``net``, ``durability``, ``protocol``) are reached through their
``__init__`` (``tests/test_layers.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker._extras import lazy_names
from broker.hooks import (
    CompositeAction,
    CompositeChange,
    CompositeEventRecord,
    CompositeLoss,
    Delivery,
    DerivedMessage,
    Hooks,
    Publication,
    PublishAction,
    PublishContext,
    PublishDecision,
    SubscriptionAction,
    SubscriptionChange,
)

if TYPE_CHECKING:
    from broker._broker import Broker, LocalCompositeSubscription, LocalSubscription
    from broker._config import BrokerConfig, Listener, load_toml
    from broker.core import Message, QuotaRule

__all__ = [
    "Broker",
    "BrokerConfig",
    "CompositeAction",
    "CompositeChange",
    "CompositeEventRecord",
    "CompositeLoss",
    "Delivery",
    "DerivedMessage",
    "Hooks",
    "Listener",
    "LocalCompositeSubscription",
    "LocalSubscription",
    "Message",
    "Publication",
    "PublishAction",
    "PublishContext",
    "PublishDecision",
    "QuotaRule",
    "SubscriptionAction",
    "SubscriptionChange",
    "load_toml",
]

_LAZY = {
    "Broker": "broker._broker",
    "LocalSubscription": "broker._broker",
    "LocalCompositeSubscription": "broker._broker",
    "BrokerConfig": "broker._config",
    "Listener": "broker._config",
    "load_toml": "broker._config",
    "Message": "broker.core",
    "QuotaRule": "broker.core",
}


__getattr__ = lazy_names("broker", _LAZY)
