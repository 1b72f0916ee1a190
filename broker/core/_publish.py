"""PUBLISH and its acknowledgements, both directions (sans-IO; as mosquitto's handle_publish.c).

A client's PUBLISH: every check in one frame (:func:`accept_publish`: QoS, alias, topic,
levels, a QoS 2 duplicate, reserved topics, ACL, retained caps, message hooks), then
:func:`deliver_accepted` routes and delivers it through the core and acknowledges it (PUBACK /
PUBREC, after the store's durable signal when it wrote; a QoS 2 message of a persisted
publisher is delivered only once its packet id is durable: ``Core.defer_qos2``); PUBREL
releases its packet id (:func:`on_pubrel`).  The other direction: the client's PUBACK, PUBREC
and PUBCOMP move an outgoing message along the transition table of its flow
(:data:`~broker.core._session.OUTGOING_FLOW`, :func:`acknowledged`), and a resumed session
sends its in-flight messages again (:func:`resend`).

The functions take the :class:`~broker.core._connection.Connection` whose packet it is
(:mod:`broker.core._subscribe` is the same for SUBSCRIBE); ``Connection.received`` calls
:func:`accept_publish` and :func:`deliver_accepted` on its hot path (compiled: a native call).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Final

import topics
from broker.core._connect import log_refusal
from broker.core._connrare import NO_ALIASES_IN
from broker.core._msghooks import refused_publish, run_message_hooks
from broker.core._quota import retained_refusal
from broker.core._session import (
    DONE,
    OUTGOING_FLOW,
    PUBREC,
    PUBREL_SENT,
    VIOLATION,
    Session,
    flow_row,
)
from broker.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel, ReasonCode
from broker.values import INTERNAL_PREFIXES, RESERVED_PREFIXES, Message, Route

if TYPE_CHECKING:
    from broker.core._connection import Connection

__all__ = [
    "accept_publish",
    "acknowledged",
    "deliver_accepted",
    "on_publish",
    "on_pubrel",
    "resend",
]

#: what a client that acknowledges out of its flow is told (by acknowledgement, as in OUTGOING_FLOW)
_VIOLATIONS: Final = (
    "PUBACK for the QoS 2 message {}",
    "PUBREC for the QoS 1 message {}",
    "PUBCOMP before PUBREL for message {}",
)


# ------------------------------------------------------------ PUBLISH from the client


def on_publish(conn: Connection, p: Publish, now: float) -> None:
    accepted = accept_publish(conn, p, now)
    if isinstance(accepted, Message):
        deliver_accepted(conn, p, accepted, None, now)
    else:
        accepted()


def accept_publish(conn: Connection, p: Publish, now: float) -> Message | Callable[[], None]:  # noqa: C901, PLR0912 (hot path: every check in one frame)
    """Every check of an incoming PUBLISH: the Message to route, or the answer to give
    instead (a refusal, or the PUBREC of a QoS 2 duplicate) as a call, so that a batch can
    deliver and acknowledge the PUBLISHes before it first (``received``)."""
    core = conn.core
    cfg = core.config
    s = conn.session
    assert s is not None
    qos = p.qos
    if qos > cfg.maximum_qos:
        return partial(conn.disconnect, ReasonCode.QOS_NOT_SUPPORTED, f"QoS {qos} not supported")
    if p.retain and not cfg.retain_available:
        return partial(conn.disconnect, ReasonCode.RETAIN_NOT_SUPPORTED, "retain not supported")
    topic = p.topic
    props = p.properties
    if conn.version == 5 and props.topic_alias is not None:
        alias = props.topic_alias
        if alias == 0 or alias > cfg.topic_alias_maximum:
            return partial(
                conn.disconnect, ReasonCode.TOPIC_ALIAS_INVALID, f"topic alias {alias} out of range"
            )
        if topic:
            if conn.alias_in is NO_ALIASES_IN:  # its own map at its first alias
                conn.alias_in = {}
            conn.alias_in[alias] = topic
        else:
            known = conn.alias_in.get(alias)
            if known is None:
                return partial(conn.disconnect, ReasonCode.PROTOCOL_ERROR, f"unknown topic alias {alias}")
            topic = known
    try:
        topics.validate_topic(topic)
    except topics.InvalidTopic as exc:
        return partial(conn.disconnect, ReasonCode.TOPIC_NAME_INVALID, str(exc)[:300])  # names it
    if topic.count("/") >= cfg.max_topic_levels:
        core.stats.refused_topic_levels += 1
        core.log_limit("topic_levels", s.client_id, "topic name beyond max_topic_levels")
        return partial(
            conn.disconnect,
            ReasonCode.TOPIC_NAME_INVALID,
            f"more than {cfg.max_topic_levels} topic levels",
        )
    pid = p.packet_id
    if qos == 2 and pid in s.qos2_received:
        # duplicate: already routed (method A, MQTT 5 4.3.3)
        return partial(conn.send_ordered, Pubrec(pid), False)
    if qos == 2 and len(s.qos2_received) >= cfg.receive_maximum:
        return partial(conn.disconnect, ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "receive maximum exceeded")
    if topic.startswith("$") and not may_publish_reserved(conn, topic):
        # broker-owned topics: refused (v5 0x87; 3.1.1 acknowledged and dropped), counted
        core.stats.refused_reserved_publish += 1
        core.log_limit("reserved_topic", s.client_id, "PUBLISH to a broker-owned topic refused")
        return denied(conn, qos, pid, "broker-owned topic")
    if core.obs.authorize and not core.authorize(s, "publish", topic):
        return denied(conn, qos, pid, "not authorized")
    if p.retain and p.payload and (cfg.max_retained_messages or cfg.max_retained_bytes):
        full = retained_refusal(conn, p, topic)  # retained store caps (issue 39)
        if full is not None:
            return full
    if props.topic_alias is not None or props.subscription_identifiers:
        props = dataclasses.replace(props, topic_alias=None, subscription_identifiers=())
    if core.obs.message:  # message hooks (issue 39): one list test when there are none
        return run_message_hooks(conn, p, topic, props, now, deliver_accepted)
    return Message.create(topic, p.payload, qos, p.retain, props, s.client_id, now)


def denied(conn: Connection, qos: int, pid: int | None, why: str) -> Callable[[], None]:
    """A refused PUBLISH's answer: PUBACK/PUBREC 0x87 (3.1.1: plain ack, dropped); QoS 0: none."""
    return refused_publish(conn, qos, pid, ReasonCode.NOT_AUTHORIZED, why)


def may_publish_reserved(conn: Connection, topic: str) -> bool:
    """``$SYS/...`` and ``$share/...`` belong to the broker: a client may publish there only
    when an authorize hook (an ACL rule) grants that topic explicitly, or (mosquitto
    bridges) to ``$SYS/broker/connection/<its client id>/state``; ``$cluster/...`` only a
    verified peer link, whatever a hook says (broker/core/_internal.py). Other ``$``: free."""
    if not topic.startswith(RESERVED_PREFIXES):  # asked only for topics starting with "$"
        return True
    if topic.startswith(INTERNAL_PREFIXES):
        return conn.peer_link
    s = conn.session
    assert s is not None
    if topic == f"$SYS/broker/connection/{s.client_id}/state":
        return True
    core = conn.core
    user = s.verified_username  # a claimed name has no rights
    grant = core._opinion(core.obs.authorize, "authorize", s.client_id, user, "publish", topic)
    return grant is True


def deliver_accepted(
    conn: Connection, p: Publish, msg: Message, routes: list[Route] | None, now: float
) -> None:
    """Route (unless ``routes`` is given) and deliver an accepted PUBLISH, then acknowledge it."""
    core = conn.core
    s = conn.session
    assert s is not None
    qos = p.qos
    pid = p.packet_id
    journal = core.journal
    store = journal.store
    before = 0 if store is None else store.submitted
    track = qos == 1 and store is not None
    if track:
        journal.track()
    defer = qos == 2 and core.defer_qos2(s.persisted)  # QoS 2: its deliveries after the commit
    core.current = conn  # the connection flow control pauses for a congested receiver
    try:
        n = core.publish(msg, now, routes)
    finally:
        core.current = None
        waiter = journal.tracked() if track else None
        deferred = core.take_deferred() if defer else None
    if store is not None and qos != 0:
        # durability before acknowledgement (docs/persistence.md, "Acknowledgements")
        if qos == 2:
            journal.qos2_received(s, pid or 0)
            if deferred:  # after the id: they leave with the commit that holds it
                journal.hold_writes(deferred)
        wrote = store.submitted != before
        if wrote:
            journal.bound(conn)
        code = ReasonCode.SUCCESS if n or conn.version != 5 else ReasonCode.NO_MATCHING_SUBSCRIBERS
        if qos == 2:
            assert pid is not None
            s.own_ids().add(pid)
            conn.send_ordered(Pubrec(pid, code), wrote)
        else:
            # early PUBACK only when the publication wrote nothing but its deliveries
            early = waiter is not None and waiter.writes == store.submitted - before
            conn.send_ordered(Puback(pid or 0, code), wrote, waiter if early else None)
        return None
    if qos == 1:
        code = ReasonCode.SUCCESS if n or conn.version != 5 else ReasonCode.NO_MATCHING_SUBSCRIBERS
        conn.send(Puback(pid or 0, code))
    elif qos == 2:
        assert pid is not None
        s.own_ids().add(pid)
        code = ReasonCode.SUCCESS if n or conn.version != 5 else ReasonCode.NO_MATCHING_SUBSCRIBERS
        conn.send(Pubrec(pid, code))


def on_pubrel(conn: Connection, p: Pubrel) -> None:
    s = conn.session
    assert s is not None
    if p.packet_id in s.qos2_received:
        s.qos2_received.discard(p.packet_id)
        wrote = conn.core.journal.qos2_released(s, p.packet_id)
        conn.send_ordered(Pubcomp(p.packet_id), wrote)
    else:
        conn.send_ordered(Pubcomp(p.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND), False)


# ------------------------------------------------------------ acknowledgements from the client
def acknowledged(conn: Connection, ack: int, pid: int, ok: bool, now: float) -> None:
    """A PUBACK, PUBREC or PUBCOMP (``ack``) from the client for the outgoing flow of ``pid``,
    as :data:`~broker.core._session.OUTGOING_FLOW` says: the flow ends (the packet id is freed,
    the next queued message sent), goes on with PUBREL (after the store wrote the state, for a
    persisted session: a crash cannot then duplicate a QoS 2 delivery, and a Paho receiver hands
    the message over on PUBREL), or the client broke the protocol (0x82, closed).  ``ok``: the
    PUBREC's reason code is below 0x80 (a refusing PUBREC ends the flow).  A PUBACK or PUBCOMP of
    a flow that is over (resent before a takeover) is ignored; a PUBREC of an unknown packet id
    is answered PUBREL 0x92.  O(1)."""
    s = conn.session
    assert s is not None
    out = s.inflight.get(pid)
    if out is None:
        if ack == PUBREC:
            conn.send(Pubrel(pid, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
        return
    step = OUTGOING_FLOW[flow_row(out.qos, out.state)][ack]
    if step == VIOLATION:
        violation(conn, _VIOLATIONS[ack].format(pid))
    elif step == DONE or not ok:
        complete(conn, s, pid, now)
    else:
        out.state = step
        conn.send_ordered(Pubrel(pid), conn.core.journal.pubrec(s, pid))


def complete(conn: Connection, s: Session, pid: int, now: float) -> None:
    """An outgoing QoS 1/2 flow ended (PUBACK, PUBCOMP, PUBREC refusal): free it, refill."""
    out = s.inflight.pop(pid)
    conn.core.journal.completed(s, pid, out)
    conn.core.drain(s, now)


def violation(conn: Connection, what: str) -> None:
    """An ack that does not fit its packet id's flow [MQTT-4.8.0-1]: 0x82, close (logged)."""
    w = logging.WARNING
    log_refusal(conn, "protocol_violation", "client.protocol_violation", conn.client_id, what, what, w)
    conn.disconnect(ReasonCode.PROTOCOL_ERROR, what)


# ------------------------------------------------------------ a resumed session
def resend(conn: Connection, now: float) -> None:
    """Resumed session: in-flight messages again (PUBLISH with DUP, or PUBREL), then the queue."""
    s = conn.session
    assert s is not None
    for pid, out in list(s.inflight.items()):
        if out.state == PUBREL_SENT:
            conn.send_ordered(Pubrel(pid), s.persisted)
        else:
            conn.write_publish(
                out.msg, out.qos, out.retain, True, pid, out.sub_ids, out.topic_filter, out.selector, now
            )
    conn.core.drain(s, now)
