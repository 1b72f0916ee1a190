"""The broker's seam for the packages built on it: the cluster, the bridge and the uplink.

Who may use it: the first-party packages of a higher layer (``cluster``, ``bridge``,
``uplink``: docs/architecture.md, "Seams") and plugins that accept to follow the broker's
releases. They import from here, never from a ``_``-module of ``broker``
(``tests/test_layers.py`` enforces it). A user embedding the broker needs none of this: the
user's API is :mod:`broker` (``Broker``, ``BrokerConfig``, ``Message``, ...), :mod:`broker.hooks`,
:mod:`broker.plugins`, :mod:`broker.packets`, :mod:`broker.store` and :mod:`broker.testing`.

What is stable: the names below keep their meaning within a release, and a change of one comes
with the change of every package that uses it (the layer test names them). They are the
broker's own types, not copies, re-exported from where they live:

* **building a plugin** (``siftmq serve`` options, optional extras, private files, log fields):
  :class:`Option`, :class:`Kind`, :class:`ConfigError`, :func:`flag_type`,
  :func:`split_hostport`, :class:`Listener`; :class:`Extra`, :class:`MissingExtra`,
  :func:`require`, :func:`missing_module`, :func:`lazy_names`; :func:`private_dir`,
  :func:`open_private`, :func:`write_private`, :func:`shared_access`, :func:`tighten`,
  :data:`PRIVATE_FILE`; :func:`address`, :func:`fields`, :data:`LIMIT_LOG_INTERVAL`,
  :class:`LogLimiter` (the rate limit of a log site);
* **the broker's state** (what the cluster moves between nodes and the bridge reads):
  :class:`Broker`, :class:`LocalCompositeSubscription`, :class:`Core`, :class:`Session`,
  :class:`Outgoing` with its flow states :data:`PUBLISH_SENT` / :data:`PUBREL_SENT`,
  :class:`MessageState` (the same states as an enum: one encoding, :mod:`broker.values`),
  :class:`Message`, :class:`Route`,
  :data:`PEER_PREFIX`, :data:`SHARE_PREFIX`; the composite atom ids (:class:`Atom`,
  :func:`event_key`, :data:`ORIGIN_PROPERTY`, :func:`boot_tag`, :func:`split_origin`); the
  delivery log the bridge drains (:class:`DeliveryLog`, :class:`LogColumns`); the bans the
  cluster shares between nodes (:class:`Ban`, :class:`BanKind`, :func:`canonical`,
  :func:`save_ban`, :func:`enforce_ban`);
* **reporting outbound bridges** (the uplink's state in the admin API, the dashboard and
  ``siftmq ctl bridges``): :class:`BridgeSource`, the protocol a hook running bridges
  implements, and :class:`BridgeStatus`, the snapshot of one bridge it returns.

Every name is imported from its home module at its first use (PEP 562, as :mod:`broker`
does): importing this module costs nothing, and ``from broker.ext import Option`` loads the
configuration module alone, not the core. Cost: one dictionary lookup and the home module's
import at a name's first use, an ordinary attribute after.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker._extras import Extra, MissingExtra, lazy_names, missing_module, require

if TYPE_CHECKING:
    from broker._admin_bridges import BridgeSource, BridgeStatus
    from broker._bans_file import enforce_ban, save_ban
    from broker._broker import Broker, LocalCompositeSubscription
    from broker._config import ConfigError, Kind, Listener, Option, flag_type, split_hostport
    from broker._files import PRIVATE_FILE, open_private, private_dir, shared_access, tighten, write_private
    from broker._logging import LogLimiter, address, fields
    from broker.core import (
        LIMIT_LOG_INTERVAL,
        ORIGIN_PROPERTY,
        PEER_PREFIX,
        PUBLISH_SENT,
        PUBREL_SENT,
        SHARE_PREFIX,
        Atom,
        Ban,
        BanKind,
        Core,
        DeliveryLog,
        LogColumns,
        Message,
        Outgoing,
        QueueBound,
        Route,
        Session,
        boot_tag,
        canonical,
        event_key,
        split_origin,
    )
    from broker.durability import MessageState

__all__ = [
    "LIMIT_LOG_INTERVAL",
    "ORIGIN_PROPERTY",
    "PEER_PREFIX",
    "PRIVATE_FILE",
    "PUBLISH_SENT",
    "PUBREL_SENT",
    "SHARE_PREFIX",
    "Atom",
    "Ban",
    "BanKind",
    "BridgeSource",
    "BridgeStatus",
    "Broker",
    "ConfigError",
    "Core",
    "DeliveryLog",
    "Extra",
    "Kind",
    "Listener",
    "LocalCompositeSubscription",
    "LogColumns",
    "LogLimiter",
    "Message",
    "MessageState",
    "MissingExtra",
    "Option",
    "Outgoing",
    "QueueBound",
    "Route",
    "Session",
    "address",
    "boot_tag",
    "canonical",
    "enforce_ban",
    "event_key",
    "fields",
    "flag_type",
    "lazy_names",
    "missing_module",
    "open_private",
    "private_dir",
    "require",
    "save_ban",
    "shared_access",
    "split_hostport",
    "split_origin",
    "tighten",
    "write_private",
]

#: public name -> the module that defines it (imported at the name's first use)
_LAZY = {
    "BridgeSource": "broker._admin_bridges",
    "BridgeStatus": "broker._admin_bridges",
    "QueueBound": "broker.core",
    "save_ban": "broker._bans_file",
    "enforce_ban": "broker._bans_file",
    "Ban": "broker.core",
    "BanKind": "broker.core",
    "canonical": "broker.core",
    "Broker": "broker._broker",
    "LocalCompositeSubscription": "broker._broker",
    "ConfigError": "broker._config",
    "Kind": "broker._config",
    "Listener": "broker._config",
    "Option": "broker._config",
    "flag_type": "broker._config",
    "split_hostport": "broker._config",
    "PRIVATE_FILE": "broker._files",
    "open_private": "broker._files",
    "private_dir": "broker._files",
    "shared_access": "broker._files",
    "tighten": "broker._files",
    "write_private": "broker._files",
    "address": "broker._logging",
    "fields": "broker._logging",
    "LogLimiter": "broker._logging",
    "ORIGIN_PROPERTY": "broker.core",
    "Atom": "broker.core",
    "boot_tag": "broker.core",
    "event_key": "broker.core",
    "split_origin": "broker.core",
    "LIMIT_LOG_INTERVAL": "broker.core",
    "Core": "broker.core",
    "DeliveryLog": "broker.core",
    "LogColumns": "broker.core",
    "PEER_PREFIX": "broker.core",
    "SHARE_PREFIX": "broker.core",
    "Message": "broker.core",
    "Route": "broker.core",
    "PUBLISH_SENT": "broker.core",
    "PUBREL_SENT": "broker.core",
    "Outgoing": "broker.core",
    "Session": "broker.core",
    "MessageState": "broker.durability",
}

__getattr__ = lazy_names("broker.ext", _LAZY)
