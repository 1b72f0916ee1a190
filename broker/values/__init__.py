"""The values every layer of the broker passes around, below all of them.

The core (:mod:`broker.core`), the store (:mod:`broker.durability`), the network adapters and
the cluster all build or read these; this package imports nothing of the broker but its
protocol (``broker.packets``), so the dependency arrows point one way (docs/architecture.md,
"Layers"): ``protocol <- values <- durability <- core <- net <- app``.

* :mod:`broker.values._message`: an accepted application message (:class:`Message`), one
  subscriber's delivery of it (:class:`Route`), the options of a subscription
  (:class:`SubOptions`), the filter prefixes and their parsers.
* :mod:`broker.values._flow`: the QoS 1/2 flow state of an outgoing message and the "never
  expires" Session Expiry Interval, one encoding each for the core, the store and the cluster.
"""

from __future__ import annotations

from broker.values._flow import NEVER, PUBLISH_SENT, PUBREL_SENT, QUEUED, MessageState
from broker.values._message import (
    ATOM_CLIENT,
    COMPOSITE_PREFIX,
    FILTER_PREFIX,
    INTERNAL_CLIENT_PREFIXES,
    INTERNAL_PREFIXES,
    PEER_PREFIX,
    RESERVED_PREFIXES,
    SHARE_PREFIX,
    Message,
    Route,
    SubOptions,
    split_filter_prefix,
    split_share,
)

__all__ = [
    "ATOM_CLIENT",
    "COMPOSITE_PREFIX",
    "FILTER_PREFIX",
    "INTERNAL_CLIENT_PREFIXES",
    "INTERNAL_PREFIXES",
    "NEVER",
    "PEER_PREFIX",
    "PUBLISH_SENT",
    "PUBREL_SENT",
    "QUEUED",
    "RESERVED_PREFIXES",
    "SHARE_PREFIX",
    "Message",
    "MessageState",
    "Route",
    "SubOptions",
    "split_filter_prefix",
    "split_share",
]
