"""An asyncio MQTT 3.1.1 and 5.0 broker that routes by topic and by content.

The protocol core is sans-IO (bytes in, events and bytes out); the asyncio transport is a
thin adapter around it.  Routing uses :mod:`topics` (topic tree, negative entries) and
:mod:`content` (content filters).  See docs/architecture.md and docs/broker.md.

``broker.hooks`` is importable on its own (a hook needs nothing else); every name of this
package (``Broker``, ``BrokerConfig``, ``Listener``, ``Message``, the hook types) is imported
lazily on first access, so that ``import broker._x`` of a light module (the command line's
``siftmq pub``/``sub``, ``broker._cli``) does not load the protocol core behind ``broker.hooks``
(docs/development.md, "Suite time (session 17)").

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

if TYPE_CHECKING:
    from broker._broker import Broker, LocalCompositeSubscription, LocalSubscription
    from broker._config import BrokerConfig, Listener, load_toml
    from broker.core import Message, QuotaRule
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
    "CompositeAction": "broker.hooks",
    "CompositeChange": "broker.hooks",
    "CompositeEventRecord": "broker.hooks",
    "CompositeLoss": "broker.hooks",
    "Delivery": "broker.hooks",
    "DerivedMessage": "broker.hooks",
    "Hooks": "broker.hooks",
    "Publication": "broker.hooks",
    "PublishAction": "broker.hooks",
    "PublishContext": "broker.hooks",
    "PublishDecision": "broker.hooks",
    "SubscriptionAction": "broker.hooks",
    "SubscriptionChange": "broker.hooks",
}


__getattr__ = lazy_names("broker", _LAZY)
