"""SUBSCRIBE and UNSUBSCRIBE of one connection (sans-IO; part of the protocol machine).

The packet handlers of :class:`~broker.core._connection.Connection` for subscriptions, kept in
their own module so that the machine's module stays a readable size: each request of a
SUBSCRIBE goes to ``Router.subscribe`` (prefixes, limits, selector, index), the SUBACK follows
(after the commit for a persisted session), then the retained messages; UNSUBSCRIBE removes
(or, partial unsubscribe, excludes) and answers with UNSUBACK.  A filter on the broker's
internal topics (``$cluster/...``, after any ``$filter/`` or ``$share/`` prefix) is refused
(SUBACK 0x87; 3.1.1 0x80) to every client but a verified cluster peer link, before the ACL
and the hooks are asked: that is the cluster's control plane (docs/cluster.md, "Security").
Functions of the connection (``conn``) rather than methods: the dispatcher
(``Connection._dispatch``) calls them.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import TYPE_CHECKING

from broker.core._hooks import SubscriptionAction
from broker.core._internal import internal_filter
from broker.packets import NO_PROPERTIES, Properties, ReasonCode, Suback, Subscribe, Unsuback, Unsubscribe
from broker.values import COMPOSITE_PREFIX, SHARE_PREFIX, Message

if TYPE_CHECKING:
    from broker.core._connection import Connection

__all__ = ["on_subscribe", "on_unsubscribe"]


def on_subscribe(conn: Connection, p: Subscribe, now: float) -> None:
    """Each request goes to ``Router.subscribe`` (prefixes, limits, selector, index); the
    SUBACK follows (after the commit for a persisted session), then retained messages."""
    core = conn.core
    router = core.router
    s = conn.session
    assert s is not None
    props = p.properties
    sub_id = props.subscription_identifiers[0] if props.subscription_identifiers else None
    packet_selector = None
    for key, value in props.user_properties:
        if key == "filter":
            packet_selector = value
    if conn.version == 5 and any(
        r.no_local and r.topic_filter.startswith(SHARE_PREFIX) for r in p.subscriptions
    ):
        conn.disconnect(ReasonCode.PROTOCOL_ERROR, "no-local on a shared subscription")
        return
    authorize = partial(core.authorize, s, "subscribe") if core.obs.authorize else None
    codes: list[ReasonCode] = []
    reasons: list[str] = []
    retained: list[tuple[Message, int, str, str | None]] = []
    for asked in p.subscriptions:
        # a bridge never gets its own publications back, and its retain flags are kept
        req = dataclasses.replace(asked, no_local=True, retain_as_published=True) if conn.bridge else asked
        if internal_filter(req.topic_filter) and not conn.peer_link:
            codes.append(ReasonCode.NOT_AUTHORIZED)
            reasons.append(f"{req.topic_filter[:60]}: internal topics")
            core.stats.refused_reserved_subscribe += 1
            core.log_limit("reserved_filter", s.client_id, "SUBSCRIBE to internal topics refused")
            continue
        if req.topic_filter.startswith(COMPOSITE_PREFIX):  # issue 16: core/_composite.py
            got = core.composite.subscribe_request(s.client_id, req, props, sub_id, authorize)
        else:
            sels = s.selectors_for(req.topic_filter, packet_selector)  # lean: own dict if needed
            got = router.subscribe(s.client_id, sels, req, packet_selector, sub_id, authorize)
        codes.append(got.code)
        if not got.ok:
            if got.reason is not None:
                reasons.append(got.reason)
            if got.limit is not None:
                core.refused(got.limit, s.client_id)
            continue
        qos = int(got.code)
        core.subscription_changed(
            s.client_id, SubscriptionAction.SUBSCRIBE, got.full_filter, got.selector, qos
        )
        if got.retained:
            retained.extend(
                (msg, min(qos, msg.qos), got.plain, got.selector)
                for msg in router.retained_for(got.plain, got.selector, now)
                if not core.obs.authorize or core.may_receive(s, msg.topic)
            )
    ack_props = NO_PROPERTIES
    if conn.version == 5 and reasons and conn.problem_info:
        text = "; ".join(reasons)  # each reason is short; their number is not bounded
        ack_props = Properties(reason_string=text if len(text) <= 1000 else text[:1000] + "...")
    core.journal.entries(s)
    # a persisted subscription is acknowledged once it is durable (retained messages may
    # go first: MQTT 5 section 3.8.4 lets PUBLISHes precede the SUBACK)
    conn.send_ordered(Suback(p.packet_id, tuple(codes), ack_props), s.persisted)
    sub_ids = () if sub_id is None else (sub_id,)
    for msg, qos, plain, selector in retained:
        core.deliver(s, msg, qos, True, sub_ids, plain, selector, now)


def on_unsubscribe(conn: Connection, p: Unsubscribe) -> None:
    core = conn.core
    s = conn.session
    assert s is not None
    codes: list[ReasonCode] = []
    for raw in p.topic_filters:
        if raw.startswith(COMPOSITE_PREFIX):
            got = core.composite.unsubscribe_request(s.client_id, raw)
        else:
            got = core.router.unsubscribe(s.client_id, s.selectors, raw)
        codes.append(got.code)
        if got.limit == "removed":
            action = SubscriptionAction.UNSUBSCRIBE
        elif got.limit == "partial":
            action = SubscriptionAction.PARTIAL_UNSUBSCRIBE
        else:
            continue
        core.subscription_changed(s.client_id, action, got.full_filter, got.selector, None)
    core.journal.entries(s)
    conn.send_ordered(Unsuback(p.packet_id, tuple(codes)), s.persisted)
