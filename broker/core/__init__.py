"""The sans-IO broker core: routing (``_router``), sessions
(``_session``), the core's state transitions and delivery with flow control (``_core``), the
per-connection protocol machine (``_connection``), hooks (``_observers``) and durability
(``_journal``).  No sockets, no awaits: bytes and times in, bytes out (docs/architecture.md).

This module is the core's public seam (docs/architecture.md, "Seams"). Who may use it: the
rest of the ``broker`` package (the app level: ``broker._broker``, the admin API, the
dashboard, the CLI; the I/O adapters of :mod:`broker.net`; the public modules :mod:`broker`,
:mod:`broker.hooks` and :mod:`broker.ext`), which import the core from here and never from its
``_``-modules (``tests/test_layers.py``). Packages above the broker (cluster, bridge, uplink)
use :mod:`broker.ext`, users :mod:`broker`. Stable: the names below, within a release; the
modules behind them are the core's to rearrange.

Every name is imported from its home module at its first use (PEP 562, as :mod:`broker`
does): importing the package costs nothing and a name loads only the module that defines it,
so this seam changes no import order. Cost: a dictionary lookup at a name's first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker._extras import lazy_names

if TYPE_CHECKING:
    from broker.core._atom_ids import ORIGIN_PROPERTY, Atom, boot_tag, event_key, split_origin
    from broker.core._backoff import address_of
    from broker.core._bans import Ban, BanKind, canonical, peer_address
    from broker.core._clock import Clock
    from broker.core._composite import Composites, split_composite
    from broker.core._connection import Connection
    from broker.core._core import LIMIT_LOG_INTERVAL, Core
    from broker.core._deliverylog import DeliveryLog, LogColumns
    from broker.core._hooks import (
        DROP_REASONS,
        AuthRequest,
        AuthUnavailable,
        AuthVerdict,
        CompositeAction,
        CompositeChange,
        CompositeEventRecord,
        CompositeLoss,
        CoreHooks,
        Delivery,
        DeliveryEntry,
        DerivedMessage,
        Publication,
        PublishAction,
        PublishContext,
        PublishDecision,
        SubscriptionAction,
        SubscriptionChange,
    )
    from broker.core._options import CoreConfig
    from broker.core._qbound import QueueBound
    from broker.core._quota import ACTIONS, QuotaRule, parse_quotas
    from broker.core._router import SETTLE_BUDGET
    from broker.core._session import PUBLISH_SENT, PUBREL_SENT, ConnectionState, Outgoing, Session, Stats
    from broker.core._shared import Strategy, group_strategies
    from broker.values import (
        ATOM_CLIENT,
        COMPOSITE_PREFIX,
        PEER_PREFIX,
        SHARE_PREFIX,
        Message,
        Route,
        SubOptions,
        split_filter_prefix,
    )

__all__ = [
    "ACTIONS",
    "ATOM_CLIENT",
    "COMPOSITE_PREFIX",
    "DROP_REASONS",
    "LIMIT_LOG_INTERVAL",
    "ORIGIN_PROPERTY",
    "PEER_PREFIX",
    "PUBLISH_SENT",
    "PUBREL_SENT",
    "SETTLE_BUDGET",
    "SHARE_PREFIX",
    "Atom",
    "AuthRequest",
    "AuthUnavailable",
    "AuthVerdict",
    "Ban",
    "BanKind",
    "Clock",
    "CompositeAction",
    "CompositeChange",
    "CompositeEventRecord",
    "CompositeLoss",
    "Composites",
    "Connection",
    "ConnectionState",
    "Core",
    "CoreConfig",
    "CoreHooks",
    "Delivery",
    "DeliveryEntry",
    "DeliveryLog",
    "DerivedMessage",
    "LogColumns",
    "Message",
    "Outgoing",
    "Publication",
    "PublishAction",
    "PublishContext",
    "PublishDecision",
    "QueueBound",
    "QuotaRule",
    "Route",
    "Session",
    "Stats",
    "Strategy",
    "SubOptions",
    "SubscriptionAction",
    "SubscriptionChange",
    "address_of",
    "boot_tag",
    "canonical",
    "event_key",
    "group_strategies",
    "parse_quotas",
    "peer_address",
    "split_composite",
    "split_filter_prefix",
    "split_origin",
]

#: public name -> the module that defines it (imported at the name's first use)
_LAZY = {
    "QueueBound": "broker.core._qbound",
    "Atom": "broker.core._atom_ids",
    "ORIGIN_PROPERTY": "broker.core._atom_ids",
    "boot_tag": "broker.core._atom_ids",
    "event_key": "broker.core._atom_ids",
    "split_origin": "broker.core._atom_ids",
    "address_of": "broker.core._backoff",
    "Ban": "broker.core._bans",
    "BanKind": "broker.core._bans",
    "canonical": "broker.core._bans",
    "peer_address": "broker.core._bans",
    "Clock": "broker.core._clock",
    "ATOM_CLIENT": "broker.values",
    "COMPOSITE_PREFIX": "broker.values",
    "Composites": "broker.core._composite",
    "split_composite": "broker.core._composite",
    "Connection": "broker.core._connection",
    "Core": "broker.core._core",
    "LIMIT_LOG_INTERVAL": "broker.core._core",
    "DeliveryLog": "broker.core._deliverylog",
    "LogColumns": "broker.core._deliverylog",
    "Message": "broker.values",
    "PEER_PREFIX": "broker.values",
    "Route": "broker.values",
    "SHARE_PREFIX": "broker.values",
    "SubOptions": "broker.values",
    "split_filter_prefix": "broker.values",
    "ACTIONS": "broker.core._quota",
    "QuotaRule": "broker.core._quota",
    "parse_quotas": "broker.core._quota",
    "SETTLE_BUDGET": "broker.core._router",
    "ConnectionState": "broker.core._session",
    "Outgoing": "broker.core._session",
    "PUBLISH_SENT": "broker.core._session",
    "PUBREL_SENT": "broker.core._session",
    "Session": "broker.core._session",
    "Stats": "broker.core._session",
    "DROP_REASONS": "broker.core._hooks",
    "AuthRequest": "broker.core._hooks",
    "AuthUnavailable": "broker.core._hooks",
    "AuthVerdict": "broker.core._hooks",
    "CompositeAction": "broker.core._hooks",
    "CompositeChange": "broker.core._hooks",
    "CompositeEventRecord": "broker.core._hooks",
    "CompositeLoss": "broker.core._hooks",
    "CoreHooks": "broker.core._hooks",
    "Delivery": "broker.core._hooks",
    "DeliveryEntry": "broker.core._hooks",
    "DerivedMessage": "broker.core._hooks",
    "Publication": "broker.core._hooks",
    "PublishAction": "broker.core._hooks",
    "PublishContext": "broker.core._hooks",
    "PublishDecision": "broker.core._hooks",
    "SubscriptionAction": "broker.core._hooks",
    "SubscriptionChange": "broker.core._hooks",
    "CoreConfig": "broker.core._options",
    "Strategy": "broker.core._shared",
    "group_strategies": "broker.core._shared",
}

__getattr__ = lazy_names("broker.core", _LAZY)
