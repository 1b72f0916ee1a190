"""The broker's internal names: who may use them (sans-IO; issue 37, docs/cluster.md "Security").

The broker uses a few names of its own that clients must not take:

* topics ``$cluster/...`` (a cluster's control plane, ``$cluster/ctl/<node>``) and
  ``$cluster-in/...``: only a connection marked as a verified cluster **peer link** may
  PUBLISH (``Connection._may_publish_reserved``) or SUBSCRIBE (:func:`internal_filter`, asked
  by ``on_subscribe``) there, whatever an ACL or an authorize hook says;
* client ids ``$cluster/<node>``: a peer's link, accepted only with a token of the cluster's
  secret (``Core.peer_auth``, set by the cluster; without a cluster, refused), then marked
  (``Connection.peer_link``);
* client ids ``$local/<n>`` (in-process subscriptions) and ``$cluster-in/<peer>`` (a peer's
  received QoS 2 ids in the store): never taken by a network client;
* a will on an internal topic: refused at CONNECT (the broker would publish it for the
  client), even for a peer link (links set no will).

Functions of a :class:`~broker.core._connection.Connection`, called at CONNECT (by
``broker.core._connect.on_connect``, after the protocol checks, before the authenticate
hooks) and SUBSCRIBE; PUBLISH's fast path is one ``startswith`` for topics not starting
with ``$``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.packets import Connect, ReasonCode
from broker.values import (
    INTERNAL_CLIENT_PREFIXES,
    INTERNAL_PREFIXES,
    PEER_PREFIX,
    split_filter_prefix,
    split_share,
)

if TYPE_CHECKING:
    from broker.core._connection import Connection

__all__ = ["internal_filter", "internal_refusal"]


def internal_refusal(conn: Connection, p: Connect, client_id: str) -> tuple[ReasonCode, str] | None:
    """Why a CONNECT is refused for the broker's internal names, or None: a client id that
    is the broker's, or a will on an internal topic (a will is published by the broker when
    the connection ends: without this check, a control message). When None, a ``$cluster/``
    id is a verified peer link (``conn.peer_link`` set).  Refusals are counted here and
    logged by the caller (``Connection._refuse``, rate-limited; a bad link token's reason by
    the cluster's check). O(1) (an HMAC for a token)."""
    core = conn.core
    will = p.will
    if will is not None and will.topic.startswith(INTERNAL_PREFIXES):
        core.stats.refused_reserved_publish += 1
        return ReasonCode.NOT_AUTHORIZED, "will topic not authorized"
    if not client_id.startswith("$"):
        return None
    if client_id.startswith(PEER_PREFIX):
        check = core.peer_auth
        why = "no cluster on this broker" if check is None else check(client_id, p.password)
        if why is not None:  # the cluster's check logs its reason (rate-limited)
            core.stats.refused_non_peer += 1
            return ReasonCode.NOT_AUTHORIZED, "not authorized"
        conn.peer_link = True
        return None
    if client_id.startswith(INTERNAL_CLIENT_PREFIXES):
        core.stats.refused_reserved_client_id += 1
        return ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "client id reserved by the broker"
    return None


def internal_filter(topic_filter: str) -> bool:
    """Does ``topic_filter`` name the broker's internal topics (``$cluster/...``), itself or
    behind a ``$filter/<selector>/`` or ``$share/<group>/`` prefix?  O(length); False at
    once for a filter not starting with ``$`` (a malformed prefix is the router's to refuse)."""
    if not topic_filter.startswith("$"):
        return False
    try:
        _, full = split_filter_prefix(topic_filter)
        share = split_share(full)
    except ValueError:
        return False
    plain = full if share is None else share[1]
    return plain.startswith(INTERNAL_PREFIXES)
