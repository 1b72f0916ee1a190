"""CONNECT decisions of the protocol machine (sans-IO): why a CONNECT is refused, and the
limits an accepted one negotiates (MQTT 5 section 3.1.4, 3.2.2.3; MQTT 3.1 and 3.1.1 rules).
Functions of a :class:`~broker.core._connection.Connection`, kept apart so the machine's
module stays one concern: the packets of a connection; and the log lines of a client's
connection (``client.connected``, ``client.disconnected``, ``client.refused``: events of
``--log-format json``, :mod:`broker._logging`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import topics
from broker._logging import address, fields
from broker.core._session import ConnectionState
from broker.packets import Connack, Connect, ReasonCode

if TYPE_CHECKING:
    from broker.core._connection import Connection

__all__ = ["connect_refusal", "hold_connack", "log_client", "log_refusal", "negotiate"]

log = logging.getLogger("broker")


def log_client(conn: Connection, event: str, client_id: str, what: str, reason: str | None) -> None:
    """A client connected or disconnected: one DEBUG line with its ``event``, id, address and
    ``reason`` (``--log-format json``, :mod:`broker._logging`); nothing below DEBUG. O(1).
    At DEBUG a connected client's address is kept (``fixed_peer``): a closed socket has none."""
    if log.isEnabledFor(logging.DEBUG):
        peer = conn.peer
        if conn.fixed_peer is None and peer:
            conn.fixed_peer = peer
        where = address(peer)
        tail = "" if reason is None else f": {reason}"
        log.debug(
            "client %s %s (%s)%s", client_id, what, where, tail, extra=fields(event, client_id, where, reason)
        )


def log_refusal(  # noqa: PLR0917 (a log site's fields)
    conn: Connection,
    kind: str,
    event: str,
    client_id: str | None,
    what: str,
    reason: str,
    level: int = logging.INFO,
) -> None:
    """Bad input or a refused CONNECT of ``conn``: at most one line per ``kind`` every 10 s
    (``Core.log_limit``) with its ``event`` and fields. O(1)."""
    where = address(conn.peer)
    conn.core.log_limit(kind, client_id, f"({where}) {what}", level, event, where, reason)


def connect_refusal(conn: Connection, p: Connect, client_id: str) -> tuple[ReasonCode, str] | None:
    """Why a CONNECT is refused (reason code, reason), or None (in the order of the checks
    of MQTT 5 section 3.1.4: protocol, client id, authentication, will)."""
    core = conn.core
    cfg = core.config
    v = p.protocol_level
    if p.protocol_name != ("MQIsdp" if v == 3 else "MQTT"):
        conn.version = min(v, 4)
        return ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, f"protocol name {p.protocol_name[:50]!r}"
    if not p.client_id and (v == 3 or (v == 4 and not p.clean_start)):
        # MQTT 3.1 has no assigned identifiers (return code 2); 3.1.1 only with clean session
        return ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "empty client id"
    if v == 5 and p.properties.authentication_method is not None:
        return ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not supported"
    verdict = core._opinion(core.obs.authenticate, "authenticate", client_id, p.username, p.password)
    if verdict is False or (verdict is None and not cfg.allow_anonymous and p.username is None):
        return ReasonCode.NOT_AUTHORIZED, "not authorized"
    will = p.will
    if will is None:
        return None
    if will.qos > cfg.maximum_qos:
        return ReasonCode.QOS_NOT_SUPPORTED, "will not supported"
    if will.retain and not cfg.retain_available:
        return ReasonCode.RETAIN_NOT_SUPPORTED, "will not supported"
    try:
        topics.validate_topic(will.topic)
    except topics.InvalidTopic as exc:
        return ReasonCode.TOPIC_NAME_INVALID, f"will {str(exc)[:200]}"  # "will topic name ..."
    if (
        core.obs.authorize
        and core._opinion(core.obs.authorize, "authorize", client_id, p.username, "publish", will.topic)
        is False
    ):
        return ReasonCode.NOT_AUTHORIZED, "will topic not authorized"
    return None


def negotiate(conn: Connection, p: Connect) -> int | None:
    """Keep-alive, receive window, packet size and topic aliases of an accepted CONNECT;
    returns the Server Keep Alive to announce (MQTT 5), if any. The keep-alive deadline
    replaces the CONNECT deadline in the core's timer wheel (core/_conntimers.py)."""
    core = conn.core
    cfg = core.config
    ka = p.keep_alive
    server_ka: int | None = None
    if p.protocol_level == 5:
        props = p.properties
        cap = cfg.server_keep_alive
        if cap is not None and (ka == 0 or ka > cap):
            server_ka = ka = cap
        conn.window = min(cfg.max_inflight, props.receive_maximum or 65535)
        if props.maximum_packet_size is not None:
            conn.client_max_packet = props.maximum_packet_size
        conn.client_alias_max = props.topic_alias_maximum or 0
        if conn.client_alias_max:
            conn.alias_out = {}
        # ``alias_in`` stays the shared empty map until the client sets its first alias
    conn.keep_alive = float(ka)
    if ka:
        core.conn_timers.file(conn, conn.last_rx + 1.5 * ka)
    else:
        core.conn_timers.discard(conn)
    return server_ka


def hold_connack(conn: Connection, client_id: str, clean_start: bool, connack: Connack) -> bool:
    """Ask the hooks that override ``hold_connack`` whether ``connack`` must wait (the
    cluster fetching the session from another node); True if one holds it: the connection is
    gated (nothing leaves before the CONNACK [MQTT-3.2.0-1]) until every holder released,
    then the CONNACK goes out, through the store's commit for a persisted session, as
    ``Journal.hold`` does without hooks."""
    hold = _Hold(conn, connack)
    for h in conn.core.obs.hold_connack:
        try:
            held = h.hold_connack(client_id, clean_start, hold.release)
        except Exception:
            conn.core.stats.hook_errors += 1
            log.exception("hook %s.hold_connack failed", type(h).__name__)
            continue
        if held:
            hold.pending += 1
    hold.asking = False
    if not hold.pending:
        return False
    conn.gated = True
    if hold.done == hold.pending:  # released while being asked: the caller flushes
        hold.open(False)
    return True


class _Hold:
    """A CONNACK held by hooks: sent when every holder called :meth:`release` once."""

    __slots__ = ("asking", "conn", "connack", "done", "pending", "present")

    def __init__(self, conn: Connection, connack: Connack) -> None:
        self.conn = conn
        self.connack = connack
        self.asking = True
        self.pending = 0
        self.done = 0
        self.present = False

    def release(self, present: bool) -> None:
        self.present = self.present or present
        self.done += 1
        if not self.asking and self.done == self.pending:
            self.open(True)

    def open(self, flush: bool) -> None:
        conn = self.conn
        if conn.state is ConnectionState.CLOSED or conn.close_requested:
            conn.gated = False
            return
        connack = self.connack
        if self.present and not connack.session_present and conn.version != 3:
            connack = dataclasses.replace(connack, session_present=True)
        core = conn.core
        s = conn.session
        if s is not None and s.persisted and core.journal.store is not None:
            core.journal.hold(conn, connack)  # Journal._release opens the gate
        else:
            conn.open_gate(connack)
        if flush:
            core.flush()
