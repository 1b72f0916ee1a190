"""Outbound bridges: this broker as a client of remote brokers, with store and forward.

A small broker at the edge keeps serving its local devices and forwards to a central broker
(mosquitto, EMQX, another siftmq) whenever the uplink is there (issue 40, docs/bridging-out.md).
Configured by ``[[bridges]]`` tables of ``siftmq serve --config`` or, embedded, by
``Broker(hooks=[Uplink([BridgeConfig(...)])])``.  A bridge is a durable local session (QoS 1)
whose deliveries are published to the remote and acknowledged locally only when the remote
acknowledged them, so the broker's store keeps what the remote has not taken yet
(:mod:`uplink._bridge`).  This package sits above ``broker`` (a plugin, like ``cluster``).

Seam (docs/architecture.md, "Seams"): this module is the package's public face, for users
(``Uplink``, ``BridgeConfig`` and its parts); ``siftmq`` reaches the plugin through its entry
point. Nothing outside ``uplink`` imports its ``_``-modules, and the uplink imports from
``broker`` only public modules (:mod:`broker.ext`, :mod:`broker.hooks`,
:mod:`broker.plugins`), checked by ``tests/test_layers.py``. Stable: the names in
``__all__``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from uplink._bridge import Bridge, BridgeState
    from uplink._config import BridgeConfig, Direction, Remote, TopicRule, parse_bridges
    from uplink._hook import Uplink

# The names are loaded at first use (issue 42, the idle footprint): ``siftmq serve`` loads the
# plugin (uplink._plugin, then this package) whether or not a [[bridges]] table is configured,
# and uplink._bridge with its MQTT client was 2.4 MB of a broker that has no uplink. O(1).
_LAZY = {
    "Bridge": "uplink._bridge",
    "BridgeState": "uplink._bridge",
    "BridgeConfig": "uplink._config",
    "Direction": "uplink._config",
    "Remote": "uplink._config",
    "TopicRule": "uplink._config",
    "parse_bridges": "uplink._config",
    "Uplink": "uplink._hook",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'uplink' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Bridge",
    "BridgeConfig",
    "BridgeState",
    "Direction",
    "Remote",
    "TopicRule",
    "Uplink",
    "parse_bridges",
]
