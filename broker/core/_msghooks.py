"""Message hooks (issue 39, item 3): ``Hooks.on_publish`` keeps, drops, rewrites or adds to a
client's PUBLISH before it is routed (sans-IO, no awaits).

Where: :meth:`Connection._accept_publish` (:mod:`broker.core._connection`) calls
:func:`run_message_hooks` after every check of the broker's own (QoS, retain, topic alias,
topic name, topic levels, QoS 2 duplicate, broker-owned topics) and after the publisher's ACL
check of its *original* topic, only when some registered hook overrides ``on_publish``
(``Observers.message``): without one, the PUBLISH path pays one list test.

Order and semantics (docs/broker.md, "Message hooks"):

* hooks run in registration order; each sees the previous one's result (:class:`PublishContext`);
* a drop ends the chain: nothing is routed, the extra messages of earlier hooks are discarded,
  the MQTT 5 publisher's PUBACK/PUBREC carries the hook's reason code (3.1.1: acknowledged and
  dropped; QoS 0: nothing), counted in ``Stats.hook_dropped``;
* a topic rewritten by the chain is checked like a published one *after* the chain: a valid
  topic name within ``max_topic_levels``, not broker-owned (``$SYS``, ``$share``, the
  cluster's internal ``$cluster/...``: broker/core/_internal.py), and authorized for the
  publisher (``authorize(..., "publish", new topic)``); a refusal answers 0x87 Not
  authorized (0x90 for an invalid name) and counts in ``Stats.hook_rewrite_refused``;
* a hook that raises, or returns something other than a :class:`PublishDecision` or None,
  drops the publication (fail-closed: a filtering hook that fails lets nothing through
  unfiltered) with 0x83, counted in ``Stats.hook_errors`` and ``Stats.hook_dropped``, logged
  at most once per 10 s (``Core.log_limit``);
* derived messages (``extra``) are published by the broker itself (no publisher id, no ACL
  check, not passed through the hooks again) after the original is routed and acknowledged;
  one with an invalid topic name is skipped and counted in ``hook_errors``; their QoS is
  capped at ``maximum_qos``.  Counted in ``Stats.hook_derived``.

Cost with a hook: one :class:`PublishContext` per PUBLISH plus the hooks' own time, and a
``dataclasses.replace`` per rewrite (benchmarks/bench_hooks.py; docs/broker.md).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import topics
from broker.core._hooks import DerivedMessage, PublishAction, PublishContext, PublishDecision
from broker.packets import Properties, Puback, Publish, Pubrec, ReasonCode
from broker.values import RESERVED_PREFIXES, Message, Route

if TYPE_CHECKING:
    from broker.core._connection import Connection

__all__ = ["refused_publish", "run_message_hooks"]


#: ``broker.core._publish.deliver_accepted`` (passed in: that module imports this one)
Deliver = Callable[["Connection", Publish, Message, "list[Route] | None", float], None]


def run_message_hooks(  # noqa: PLR0917
    conn: Connection, p: Publish, topic: str, props: Properties, now: float, deliver: Deliver
) -> Message | Callable[[], None]:
    """The registered ``on_publish`` hooks' verdict on ``p`` (topic aliases resolved to
    ``topic``, ``props`` stripped of alias and subscription ids): the Message to route, or
    the answer to give instead (a refusal, or the routing of the message followed by its
    derived messages).  O(hooks)."""
    core = conn.core
    s = conn.session
    assert s is not None
    stats = core.stats
    user = s.verified_username
    ctx = PublishContext(s.client_id, user, conn.version, topic, p.payload, p.qos, p.retain, props)
    extra: list[DerivedMessage] = []
    for h in core.obs.message:
        try:
            decision = h.on_publish(ctx)
            if decision is not None and not isinstance(decision, PublishDecision):
                raise TypeError(f"on_publish returned {type(decision).__name__}, not a PublishDecision")
        except Exception as exc:
            stats.hook_errors += 1
            stats.hook_dropped += 1
            what = f"hook {type(h).__name__}.on_publish failed ({exc!r:.200}): publication dropped"
            core.log_limit("publish_hook", s.client_id, what, logging.ERROR, event="hook.failed")
            return refused_publish(
                conn, p.qos, p.packet_id, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "hook failed"
            )
        if decision is None:
            continue
        match decision.action:
            case PublishAction.DROP:
                stats.hook_dropped += 1
                return refused_publish(conn, p.qos, p.packet_id, decision.reason, "dropped by a message hook")
            case PublishAction.REPLACE:
                ctx = PublishContext(  # not dataclasses.replace: 3x faster
                    ctx.client_id,
                    ctx.username,
                    ctx.protocol_level,
                    ctx.topic if decision.topic is None else decision.topic,
                    ctx.payload if decision.payload is None else decision.payload,
                    ctx.qos,
                    ctx.retain,
                    ctx.properties if decision.properties is None else decision.properties,
                )
            case PublishAction.KEEP:
                pass
        extra.extend(decision.extra)
    if ctx.topic != topic:
        refusal = _check_rewritten(conn, p, ctx.topic)
        if refusal is not None:
            return refusal
    props = ctx.properties
    if props.topic_alias is not None or props.subscription_identifiers:
        props = dataclasses.replace(props, topic_alias=None, subscription_identifiers=())
    msg = Message.create(ctx.topic, ctx.payload, p.qos, p.retain, props, s.client_id, now)
    if not extra:
        return msg
    return partial(_deliver_with_extra, deliver, conn, p, msg, extra, now)


def refused_publish(
    conn: Connection, qos: int, pid: int | None, code: ReasonCode, why: str
) -> Callable[[], None]:
    """A refused PUBLISH's answer: PUBACK/PUBREC ``code`` with ``why`` as its reason string
    (MQTT 5, when the client asked for problem information; 3.1.1: a plain ack, the message
    dropped); QoS 0: nothing.  Shared by the ACL checks (``Connection._denied``), the message
    hooks and the quotas (:mod:`broker.core._quota`).  O(1)."""
    if qos == 0:
        return _nothing
    props = conn._reason(why)
    ack = Puback(pid or 0, code, props) if qos == 1 else Pubrec(pid or 0, code, props)
    return partial(conn.send_ordered, ack, False)


def _nothing() -> None:
    """The answer to a refused QoS 0 PUBLISH: none."""


def _check_rewritten(conn: Connection, p: Publish, new_topic: str) -> Callable[[], None] | None:
    """A rewritten topic passes the checks of a published one, or the refusal to answer."""
    core = conn.core
    s = conn.session
    assert s is not None
    code: ReasonCode | None = None
    try:
        topics.validate_topic(new_topic)
    except topics.InvalidTopic:
        code = ReasonCode.TOPIC_NAME_INVALID
    if code is None and new_topic.count("/") >= core.config.max_topic_levels:
        code = ReasonCode.TOPIC_NAME_INVALID
    if code is None and new_topic.startswith(RESERVED_PREFIXES):
        code = ReasonCode.NOT_AUTHORIZED
    if code is None and core.obs.authorize and not core.authorize(s, "publish", new_topic):
        code = ReasonCode.NOT_AUTHORIZED
    if code is None:
        return None
    core.stats.hook_rewrite_refused += 1
    core.log_limit("hook_rewrite", s.client_id, f"topic rewritten by a message hook refused ({code.name})")
    return refused_publish(conn, p.qos, p.packet_id, code, "rewritten topic refused")


def _deliver_with_extra(  # noqa: PLR0917
    deliver: Deliver, conn: Connection, p: Publish, msg: Message, extra: list[DerivedMessage], now: float
) -> None:
    """Route and acknowledge ``msg`` (``deliver``), then publish the derived messages as the broker."""
    deliver(conn, p, msg, None, now)
    core = conn.core
    max_qos = core.config.maximum_qos
    core.current = conn  # flow control pauses this publisher for congested receivers
    try:
        for d in extra:
            try:
                topics.validate_topic(d.topic)
            except topics.InvalidTopic as exc:
                core.stats.hook_errors += 1
                core.log_limit("hook_derived", conn.client_id, f"derived message skipped: {exc}"[:300])
                continue
            derived = Message.create(
                d.topic, d.payload, min(d.qos, max_qos), d.retain, d.properties, None, now
            )
            core.stats.hook_derived += 1
            core.publish(derived, now)
    finally:
        core.current = None
