"""CONNECT decisions of the protocol machine (sans-IO): why a CONNECT is refused, who it
authenticates, and the limits an accepted one negotiates (MQTT 5 section 3.1.4, 3.2.2.3;
MQTT 3.1 and 3.1.1 rules).  Functions of a :class:`~broker.core._connection.Connection`,
kept apart so the machine's module stays one concern: the packets of a connection.

Authentication (issue 37, docs/security.md) runs in three steps from :func:`on_connect`:

1. :func:`connect_refusal` -- protocol, client id, authentication method, then the
   per-address back-off of failed logins (``core.login_backoff``, core/_backoff.py): a
   CONNECT with credentials from a blocked address is refused at once, no hook asked;
2. :func:`authenticate` asks the ``authenticate`` hooks in order.  A hook may answer at once
   (True/False/None) or with an awaitable (``broker.hooks.AuthVerdict``): then the CONNECT is
   *held* -- no CONNACK, no session attached, the connection's later packets kept in order
   and its socket not read (``Connection.authenticating``) -- and the awaitable goes to the
   transport adapter (``Core.await_check``, set by ``Broker``), which awaits it off this
   core and feeds the outcome back as an event (:meth:`_Login.done`) on the loop.  The
   CONNECT deadline (``connect_timeout``) keeps running meanwhile; a connection closed before
   the verdict ignores it.  This is the seam of slow checks: FileAuth's scrypt in a thread
   pool, later an HTTP auth service or JWT validation (issue 39);
3. the verdict decides: refused (0x87 not authorized; a failed login counts towards the
   back-off; 0x88 server unavailable when a hook raised ``AuthUnavailable``), or accepted
   with the user name *authenticated* only if a hook said True (or the listener took it from
   a verified client certificate): ``Session.authenticated``; the ``authorize`` hooks (the
   ACL) get the user name only then, never a name the client merely claimed, and the store
   keeps only authenticated names (a restored session keeps its rights).

Cost: O(hooks) per CONNECT; the back-off is one dict probe per CONNECT with credentials.

Also the log lines of a client's connection (``client.connected``,
``client.disconnected``, ``client.refused``: events of ``--log-format json``,
:mod:`broker._logging`).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from collections.abc import Awaitable
from typing import TYPE_CHECKING

import topics
from broker._logging import address, bounded, cut, fields
from broker.core._backoff import address_of
from broker.core._bans import ban_refusal
from broker.core._connrare import NO_PACKETS
from broker.core._hooks import AuthRequest, AuthUnavailable, CoreHooks
from broker.core._internal import internal_refusal
from broker.core._session import ConnectionState
from broker.packets import Connack, Connect, Packet, ReasonCode

if TYPE_CHECKING:
    from broker.core._connection import Connection

__all__ = [
    "auth_request",
    "authenticate",
    "connect_refusal",
    "hold_connack",
    "log_client",
    "log_refusal",
    "negotiate",
    "on_connect",
]

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
        tail = "" if reason is None else f": {cut(reason)}"
        log.debug(
            "client %s %s (%s)%s",
            bounded(client_id),
            what,
            where,
            tail,
            extra=fields(event, client_id, where, reason),
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


def on_connect(conn: Connection, p: Packet, now: float) -> None:
    """A packet of a connection not yet connected: a packet behind a CONNECT being
    authenticated is kept, in order, for after the verdict; else the CONNECT is refused
    (CONNACK with a reason, close) or authenticated (at once, or held while a hook's check
    runs) and then ``Connection.accept``-ed; anything else first closes the connection."""
    if conn.authenticating:
        if conn.pending is NO_PACKETS:
            conn.pending = []
        conn.pending.append(p)
        return
    if not isinstance(p, Connect):
        conn.close("first packet is not CONNECT")
        return
    conn.version = v = p.protocol_level
    if v == 5:
        conn.problem_info = p.properties.request_problem_information != 0
    if v != 5 and p.will is not None and not p.will.topic:
        # a will flag with an empty will topic breaks 3.1/3.1.1 [MQTT-3.1.2-9]: close, as
        # mosquitto does (a refusing CONNACK would point users at their credentials)
        conn.close("CONNECT with a zero-length will topic")
        return
    # secrets.token_hex(8) is this: the secrets module would import hashlib (OpenSSL, issue 42)
    client_id = p.client_id or "siftmq-" + os.urandom(8).hex()
    refusal = connect_refusal(conn, p, now)
    if refusal is None:  # the broker's own client ids and topics (issue 37, core/_internal.py)
        refusal = internal_refusal(conn, p, client_id)
    if refusal is not None:
        conn._refuse(refusal[0], refusal[1], p.client_id)
        return
    authenticate(conn, p, client_id, now)


def connect_refusal(conn: Connection, p: Connect, now: float) -> tuple[ReasonCode, str] | None:
    """Why a CONNECT is refused before any authenticate hook is asked (reason code, reason),
    or None (in the order of the checks of MQTT 5 section 3.1.4: protocol, client id,
    authentication method; then the bans, ``core/_bans.py``, and the back-off of the client's
    address)."""
    core = conn.core
    v = p.protocol_level
    if p.protocol_name != ("MQIsdp" if v == 3 else "MQTT"):
        conn.version = min(v, 4)
        return ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, f"protocol name {p.protocol_name[:50]!r}"
    if not p.client_id and (v == 3 or (v == 4 and not p.clean_start)):
        # MQTT 3.1 has no assigned identifiers (return code 2); 3.1.1 only with clean session
        return ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "empty client id"
    if v == 5 and p.properties.authentication_method is not None:
        return ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not supported"
    if (banned := ban_refusal(conn, p)) is not None:  # bans: broker/core/_bans.py, docs/admin.md
        return banned
    if (p.username is not None or p.password is not None) and core.login_backoff.failures:
        peer = conn.peer
        left = core.login_backoff.blocked(address_of(peer), now)
        if left:
            core.stats.refused_auth_backoff += 1
            core.log_limit(
                "auth_backoff",
                p.client_id,
                f"({peer}) CONNECT refused unchecked: too many failed logins from its address "
                f"(blocked {left:.3g} s more)",
                logging.INFO,
            )
            return ReasonCode.NOT_AUTHORIZED, "too many failed logins from this address"
    return None


def authenticate(conn: Connection, p: Connect, client_id: str, now: float) -> None:
    """Ask the authenticate hooks about ``p`` and go on with the verdict: now
    (``Connection.accept`` or a refusal), or, if a hook answered with an awaitable, when the
    transport adapter reports its outcome (the CONNECT is held meanwhile). O(hooks)."""
    _Login(conn, p, client_id).ask(0, now)


def auth_request(conn: Connection, p: Connect, client_id: str) -> AuthRequest:
    """The :class:`~broker.hooks.AuthRequest` of a CONNECT: its fields, the peer's address,
    the listener's socket address and the client certificate, asked from the transport
    (``Link``'s asyncio transport when it has one: ``MQTTProtocol``, WebSocket); O(1)."""
    peer = conn.peer
    address = address_of(peer) if peer else None
    transport = getattr(conn.link, "transport", None)
    info = getattr(transport, "get_extra_info", None)
    listener, port = "", None
    cert: dict[str, object] | None = None
    der: bytes | None = None
    subject: str | None = None
    if info is not None:
        sock = info("sockname")
        if isinstance(sock, tuple) and len(sock) >= 2:
            listener, port = f"{sock[0]}:{sock[1]}", int(sock[1])
        peercert = info("peercert")
        if isinstance(peercert, dict) and peercert:
            cert = peercert
            subject = ",".join(
                f"{_RDN_KEYS.get(k, k)}={v}" for rdn in reversed(peercert.get("subject", ())) for k, v in rdn
            )
        ssl_object = info("ssl_object")
        if ssl_object is not None:
            try:
                der = ssl_object.getpeercert(binary_form=True)
            except (ValueError, AttributeError):  # handshake not done / not an SSL object
                der = None
    return AuthRequest(
        client_id,
        p.username,
        p.password,
        address,
        peer,
        listener,
        port,
        p.protocol_level,
        cert,
        der,
        subject,
        p.identity,
    )


#: short names of the subject attributes in an RFC 4514 string (ssl's getpeercert uses long ones)
_RDN_KEYS = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "stateOrProvinceName": "ST",
    "localityName": "L",
    "domainComponent": "DC",
    "userId": "UID",
}


class _Login:
    """The authentication of one CONNECT: the hooks asked in order, possibly waiting for one."""

    __slots__ = ("asked", "client_id", "conn", "connect", "index", "request")

    def __init__(self, conn: Connection, p: Connect, client_id: str) -> None:
        self.conn = conn
        self.connect = p
        self.client_id = client_id
        self.index = 0
        #: the hook whose verdict is awaited (its index may move: ``Core.observe``)
        self.asked: CoreHooks | None = None
        self.request: AuthRequest | None = None  # built for the first new-style hook asked

    def _ask(self, h: CoreHooks) -> object:
        """One hook's answer: the new-style call with the whole request if it overrides
        ``authenticate_request``, else ``authenticate(client_id, username, password)``."""
        if type(h).authenticate_request is CoreHooks.authenticate_request:
            p = self.connect
            return h.authenticate(self.client_id, p.username, p.password)
        request = self.request
        if request is None:
            request = self.request = auth_request(self.conn, self.connect, self.client_id)
        return h.authenticate_request(request)

    def ask(self, start: int, now: float) -> None:
        """Ask the hooks from ``start`` on; the first opinion decides."""
        core = self.conn.core
        hooks = core.obs.authenticate
        for i in range(start, len(hooks)):
            h = hooks[i]
            try:
                answer = self._ask(h)
            except AuthUnavailable:
                self.unavailable(type(h).__name__)
                return
            except Exception:
                core.stats.hook_errors += 1
                log.exception("hook %s.authenticate failed", type(h).__name__)
                self.refuse(ReasonCode.NOT_AUTHORIZED, "not authorized")
                return
            if answer is None:
                continue
            if isinstance(answer, bool):
                self.decide(answer, now)
                return
            if inspect.isawaitable(answer):
                self.wait(i, answer)
                return
            self.decide(bool(answer), now)
            return
        self.decide(None, now)

    def wait(self, index: int, answer: Awaitable[bool | None]) -> None:
        """Hold the CONNECT until the adapter reports the awaitable's outcome."""
        conn = self.conn
        core = conn.core
        run = core.await_check
        if run is None:  # a bare core (no transport adapter) cannot await: refuse
            if inspect.iscoroutine(answer):
                answer.close()
            core.stats.hook_errors += 1
            log.error("an authenticate hook returned an awaitable, but nothing awaits it (no Broker)")
            self.refuse(ReasonCode.NOT_AUTHORIZED, "not authorized")
            return
        self.index = index
        self.asked = core.obs.authenticate[index]
        conn.authenticating = True
        conn.link.throttle(True)  # read nothing more until the verdict (bounded memory)
        core.stats.auth_pending += 1
        run(answer, self.done)

    def done(self, outcome: object) -> None:
        """The awaitable's outcome (its result or its exception), on the loop; the adapter
        flushes the core after this returns."""
        conn = self.conn
        core = conn.core
        core.stats.auth_pending -= 1
        if conn.state is ConnectionState.CLOSED or conn.close_requested:
            return  # closed meanwhile (connect_timeout, the peer left): nothing to decide
        conn.authenticating = False
        now = conn.clock = core.clock.monotonic()
        hooks, asked = core.obs.authenticate, self.asked
        if asked is not None and (self.index >= len(hooks) or hooks[self.index] is not asked):
            self.index = hooks.index(asked)  # a hook added meanwhile (Core.observe): O(hooks)
        if isinstance(outcome, AuthUnavailable):
            self.unavailable(type(core.obs.authenticate[self.index]).__name__)
        elif isinstance(outcome, BaseException):
            core.stats.hook_errors += 1
            log.error(
                "hook %s.authenticate failed",
                type(core.obs.authenticate[self.index]).__name__,
                exc_info=outcome,
            )
            self.refuse(ReasonCode.NOT_AUTHORIZED, "not authorized")
        elif outcome is None:
            self.ask(self.index + 1, now)
        else:
            self.decide(bool(outcome), now)
        if not conn.authenticating:  # decided (not waiting for a later hook)
            conn.resume()  # the packets read after the CONNECT, in order; then read again

    def refuse(self, code: ReasonCode, reason: str) -> None:
        self.conn._refuse(code, reason, self.connect.client_id)

    def unavailable(self, hook: str) -> None:
        """A hook cannot decide now (saturated, its service down): 0x88 / 3.1.1 return code 3."""
        core = self.conn.core
        core.stats.refused_auth_busy += 1
        why = f"CONNECT refused: {hook} cannot check credentials now (server unavailable)"
        core.log_limit("auth_busy", self.client_id, why)
        self.refuse(ReasonCode.SERVER_UNAVAILABLE, "authentication unavailable, try again later")

    def decide(self, verdict: bool | None, now: float) -> None:
        """Refuse, or accept with the user name authenticated if a hook said True."""
        conn = self.conn
        core = conn.core
        cfg = core.config
        p = self.connect
        client_id = self.client_id
        if verdict is False or (verdict is None and not cfg.allow_anonymous and p.username is None):
            if verdict is False and (p.username is not None or p.password is not None):
                self.failed(now)
            self.refuse(ReasonCode.NOT_AUTHORIZED, "not authorized")
            return
        authenticated = p.identity or (verdict is True and p.username is not None)
        will = p.will
        if will is not None:
            refusal = _will_refusal(conn, p, client_id, p.username if authenticated else None)
            if refusal is not None:
                self.refuse(*refusal)
                return
        conn.accept(p, client_id, authenticated, now)

    def failed(self, now: float) -> None:
        """A failed login: counted, and towards its address's back-off."""
        conn = self.conn
        core = conn.core
        core.stats.auth_failures += 1
        peer = conn.peer
        period = core.login_backoff.failed(address_of(peer), now)
        if period:
            core.log_limit(
                "auth_backoff_start",
                self.client_id,
                f"({peer}) {core.login_backoff.failures} failed logins: CONNECTs with credentials "
                f"from its address refused unchecked for {period:g} s",
                logging.WARNING,
                "auth.backoff",
                address(peer),
            )
        # the refusal itself is logged by Connection._refuse (client.refused, rate-limited)


def _will_refusal(
    conn: Connection, p: Connect, client_id: str, username: str | None
) -> tuple[ReasonCode, str] | None:
    """Why the will of an authenticated CONNECT is refused, or None."""
    core = conn.core
    cfg = core.config
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
        and core._opinion(core.obs.authorize, "authorize", client_id, username, "publish", will.topic)
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
