"""The admin API under ``/api/v1/`` of the broker's HTTP listener (issue 39; docs/admin.md).

``siftmq serve --metrics-listen HOST:PORT`` serves it beside the dashboard, behind the same
door: :class:`broker._dashboard.Dashboard` logs the user in (HTTP Basic against the password
file, the ``dashboard_admins`` role; open on a loopback listener without a password file)
and hands ``/api/v1/...`` requests to :meth:`Admin.handle`. State-changing calls (every
method but GET) pass the dashboard's CSRF rules first (JSON content type, same origin, the
``X-CSRF-Token`` of ``GET /api/v1/session``).

Routing, input checks and the OpenAPI document come from one table
(``broker._admin_routes.ROUTES``); each entry names the method of :class:`Admin` that
answers it. Every refusal is a JSON ``{"error": ..., "detail": ...}`` with a 4xx status
(a handler's unexpected exception is logged and answered 500, which a test forbids for
every bad input it knows).

What each area does to the broker:

* **clients** -- read from ``core.sessions`` (paged by a cursor on the sorted ids); kick is
  the dashboard's (MQTT 5 DISCONNECT 0x98); ``discard`` also ends the session (a connected
  client's session gets expiry 0, so it ends when the connection does; a disconnected one
  ends at once, its stored rows deleted).
* **subscriptions** -- through ``Router.subscribe``/``unsubscribe`` as a SUBSCRIBE would
  (limits, content filters), then ``Journal.entries`` (persisted sessions are stored).
* **retained** -- lists use ``RetainedTree.match`` (the index: O(matching paths), not a scan
  of every retained message); a delete removes the message from the tree and the store
  without delivering anything (in a cluster, where each node keeps its own register, an
  empty retained message is published instead, so every node forgets it).
* **publish** -- ``Broker.publish`` (no publisher client id).
* **bridges** -- the outbound bridges of hooks that run them (``broker._admin_bridges``: the
  ``uplink`` plugin's ``Uplink`` is a ``BridgeSource``; the broker imports nothing of it):
  one snapshot per bridge per request; reconnect closes both of a bridge's connections and
  connects again at once (what was not acknowledged is sent again, as after any drop).
* **bans** -- ``core.bans`` (``broker/core/_bans.py``), stored in the store's ``bans``
  table (without a store: the JSON file ``BrokerConfig.bans_file``, else memory only);
  matching connected clients are disconnected
  (MQTT 5: DISCONNECT 0x98 Administrative action with the reason string ``banned: ...``:
  0x8A Banned is valid in a CONNACK only, MQTT 5 section 3.14.2.1) and refused at their next
  CONNECT (CONNACK 0x8A).
* **users / acl** -- the password file and ACL file of the broker's
  :class:`broker.auth.FileAuth` are rewritten (``PasswordFile.save``; the ACL file edited
  line by line and parsed before it is written, atomically, mode 0600), then
  ``FileAuth.reload()``: effective for the next CONNECT and, for ACLs, the next message.
  Deleting a user disconnects its clients; deleting the user the caller is logged in as, or
  the last dashboard admin of the password file, is refused (409): the API cannot be locked
  out.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import ipaddress
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

import topics
from broker import _admin_routes as routes
from broker import _dashboard_data as data
from broker._acl import AccessList, AclError
from broker._admin_bridges import BridgeSource, BridgeStatus, find_bridge, list_bridges
from broker._bans_file import enforce_ban, load_bans, save_ban
from broker._files import write_private
from broker._logging import bounded, fields, shown
from broker._passwd import PasswordFile, PasswordFileError
from broker.auth import FileAuth
from broker.core import COMPOSITE_PREFIX, Ban, BanKind, Message, canonical, peer_address
from broker.hooks import SubscriptionAction
from broker.net import Request, Response
from broker.packets import NO_PROPERTIES, Properties, ReasonCode, SubscriptionRequest

if TYPE_CHECKING:
    from broker._broker import Broker
    from broker.core import Session

__all__ = ["Admin", "error", "load_bans"]

log = logging.getLogger("broker.admin")

#: a request's checked query parameters or JSON body
Args = dict[str, Any]

_JSON = "application/json"
#: rows of a page when ``limit`` is not given
DEFAULT_LIMIT = 100


class Refused(Exception):
    """A handler's refusal: status, message, optional detail."""

    def __init__(self, status: int, message: str, detail: object = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


def error(
    status: int, message: str, detail: object = None, headers: tuple[tuple[str, str], ...] = ()
) -> Response:
    """The API's JSON error response."""
    body: dict[str, object] = {"error": message}
    if detail is not None:
        body["detail"] = detail
    return Response(status, orjson.dumps(body), _JSON, headers)


def _json(body: object, status: int = 200) -> Response:
    return Response(status, orjson.dumps(body), _JSON)


def _save_bans(broker: Broker, changed: Ban, gone: bool) -> None:
    """Persist one ban change (:func:`broker._bans_file.save_ban`); a file that cannot be
    written is a 409 (the change stays in memory)."""
    try:
        save_ban(broker, changed, gone)
    except OSError as exc:
        path = str(broker.config.bans_file)
        log.error("bans file %s not written: %s", path, exc, extra=fields("admin.failed", reason=str(exc)))
        raise Refused(
            409, f"changed in memory, not saved (lost at a restart): {exc.strerror}", path
        ) from None


def _page(keys: list[str], q: dict[str, Any]) -> tuple[list[str], str | None]:
    """One page of the sorted ``keys`` (``after`` cursor or ``page`` number) and the cursor
    of the next page (None: the last page). O(log n + page)."""
    limit = q.get("limit", DEFAULT_LIMIT)
    if "page" in q:
        start = (q["page"] - 1) * limit
    elif "after" in q:
        start = bisect.bisect_right(keys, q["after"])
    else:
        start = 0
    rows = keys[start : start + limit]
    more = start + limit < len(keys)
    return rows, (rows[-1] if more and rows else None)


class Admin:
    """Answers ``/api/v1/`` (see the module docstring); one per HTTP listener."""

    def __init__(self, broker: Broker, may_read: Callable[[str | None], Callable[[str], bool]]) -> None:
        self.broker = broker
        self.core = broker.core
        self.may_read = may_read
        self.auth = next((h for h in broker.hooks if isinstance(h, FileAuth)), None)
        self._files = asyncio.Lock()  # one rewrite of the password/ACL file at a time
        bans = self.core.bans
        # CONNECTs refused by a ban: siftmq_banned_total{reason="connect"} in /metrics
        self.core.metric_sources.append(lambda: {"banned": {"connect": bans.refused}})

    async def handle(
        self,
        req: Request,
        user: str | None,
        csrf: str,
        guard: Callable[[], Response | None],
    ) -> Response:
        """Answer one request: 404 for a path of no endpoint, 405 with ``Allow`` (the path's
        methods) for another method, then ``guard`` (the dashboard's CSRF rules) for a
        state-changing endpoint (required: no caller can forget the CSRF rules), the input
        checks and the handler."""
        ep, tail, allowed = routes.find(req.method, req.path)
        if ep is None:
            if allowed:
                allow = ", ".join(allowed)
                what = f"method {req.method[:20]} not allowed on {req.path[:100]} (allowed: {allow})"
                return error(405, what, None, (("Allow", allow),))
            return error(404, f"no API {req.path[:100]!r}")
        if ep.changes and (refused := guard()) is not None:
            return refused
        try:
            query = routes.parse_query(ep, req.query)
            body: dict[str, Any] = {}
            if ep.body is not None:
                try:
                    raw = orjson.loads(req.body or b"null")
                except orjson.JSONDecodeError as exc:
                    return error(400, "bad JSON", str(exc))
                body = routes.parse_body(ep, raw)
            if tail is not None:
                assert ep.tail is not None
                query[ep.tail] = tail
            handler = getattr(self, "h_" + ep.handler)
            result: Response = await handler(query, body, user, csrf)
        except routes.BadInput as exc:
            return error(400, str(exc))
        except Refused as exc:
            return error(exc.status, str(exc), exc.detail)
        except Exception:
            log.exception("admin API %s %s failed", req.method, req.path[:100])
            return error(500, "internal error (logged)")
        if ep.changes and result.status < 300:
            what = f"{req.method} {req.path[:100]}"
            log.info("admin %s by %s", what, user or "local", extra=fields("admin.change", reason=what))
        return result

    # ------------------------------------------------------------ meta
    async def h_openapi(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        from importlib.metadata import PackageNotFoundError, version

        try:
            release = version("siftmq")
        except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
            release = "0"
        return _json(routes.openapi(release))

    async def h_session(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        return _json({"user": user, "csrf": csrf, "node": self.core.node})

    # ------------------------------------------------------------ clients
    def _session(self, client_id: str) -> Session:
        s = self.core.sessions.get(client_id)
        if s is None:
            raise Refused(404, f"no client {client_id[:100]!r}")
        return s

    async def h_clients(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        sessions = self.core.sessions
        ids = sorted(sessions)
        prefix, name, where = q.get("prefix"), q.get("username"), q.get("address")
        net = None
        if where is not None:
            try:
                net = ipaddress.ip_network(where, strict=False)
            except ValueError:
                raise Refused(400, f"address: not an IP address or CIDR network: {where[:60]!r}") from None
        if prefix:
            lo = bisect.bisect_left(ids, prefix)
            hi = lo
            while hi < len(ids) and ids[hi].startswith(prefix):
                hi += 1
            ids = ids[lo:hi]
        if name is not None:
            ids = [c for c in ids if sessions[c].username == name]
        if net is not None:
            ids = [c for c in ids if self._in(sessions[c], net)]
        page, nxt = _page(ids, q)
        return _json(
            {
                "total": len(ids),
                "next": nxt,
                "clients": [data.client_row(self.core, sessions[c]) for c in page],
            }
        )

    @staticmethod
    def _in(s: Session, net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
        conn = s.conn
        addr = None if conn is None else peer_address(conn.peer)
        return addr is not None and addr.version == net.version and addr in net

    async def h_client(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        cid = q["client_id"]
        detail = data.client_detail(self.core, cid, self.core.clock.monotonic())
        if detail is None:
            raise Refused(404, f"no client {cid[:100]!r}")
        return _json(detail)

    async def h_kick(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        cid: str = b["client_id"]
        s = self._session(cid)
        discard = b.get("discard", False)
        core = self.core
        conn = s.conn
        if conn is None and not discard:
            raise Refused(409, f"client {cid[:100]!r} is not connected")
        if discard:
            s.expiry_interval = 0  # ends with its connection (Core.detach)
        if conn is not None:
            conn.disconnect(ReasonCode.ADMINISTRATIVE_ACTION, f"disconnected by admin {user or 'local'}")
        else:
            core.end_session(s, core.clock.monotonic())
        core.flush()
        return _json({"kicked": cid, "connected": conn is not None, "discarded": discard})

    # ------------------------------------------------------------ subscriptions
    async def h_subscriptions(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        """One client's entries in order (paged by position), or every client's entry of
        exactly ``filter`` (cursor: client id); the latter is O(sessions + entries)."""
        index = self.core.router.index
        cid, f = q.get("client_id"), q.get("filter")
        if (cid is None) == (f is None):
            raise Refused(400, "give client_id or filter (one of them)")
        if cid is not None:
            self._session(cid)
            entries = index.entries(cid)
            rows = [_entry_row(cid, e) for e in entries]
            keys = [e.topic_filter for e in entries]
        else:
            rows, keys = [], []
            for c in sorted(self.core.sessions):
                for e in index.entries(c):
                    if e.topic_filter == f:
                        rows.append(_entry_row(c, e))
                        keys.append(c)
        if cid is not None:  # a client's entries keep their order: page by position
            limit = q.get("limit", DEFAULT_LIMIT)
            start = (q.get("page", 1) - 1) * limit
            return _json({"total": len(rows), "subscriptions": rows[start : start + limit]})
        page, nxt = _page(keys, q)
        chosen = set(page)
        return _json(
            {"total": len(rows), "next": nxt, "subscriptions": [r for r in rows if r["client_id"] in chosen]}
        )

    async def h_subscribe(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        core = self.core
        s = self._session(b["client_id"])
        if s.sink is not None:
            raise Refused(409, "an in-process subscriber's subscriptions are its code's")
        if b["filter"].startswith(COMPOSITE_PREFIX):
            raise Refused(400, "filter: composite subscriptions are made by their client (SUBSCRIBE)")
        req = SubscriptionRequest(b["filter"], b.get("qos", 0))
        got = core.router.subscribe(s.client_id, s.selectors_for(req.topic_filter, None), req, None, None)
        if not got.ok:
            raise Refused(400, got.reason or f"subscription refused ({got.code.name})")
        qos = int(got.code)
        core.subscription_changed(
            s.client_id, SubscriptionAction.SUBSCRIBE, got.full_filter, got.selector, qos
        )
        core.journal.entries(s)
        now = core.clock.monotonic()
        if got.retained:
            for msg in core.router.retained_for(got.plain, got.selector, now):
                if core.may_receive(s, msg.topic):
                    core.deliver(s, msg, min(qos, msg.qos), True, (), got.plain, got.selector, now)
        core.flush()
        return _json({"client_id": s.client_id, "filter": got.full_filter, "qos": qos}, 201)

    async def h_unsubscribe(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        core = self.core
        s = self._session(q["client_id"])
        f = q["filter"]
        if not any(e.topic_filter == f and e.positive for e in core.router.index.entries(s.client_id)):
            raise Refused(404, f"client {s.client_id[:100]!r} has no subscription {f[:100]!r}")
        got = core.router.unsubscribe(s.client_id, s.selectors, f)
        core.subscription_changed(
            s.client_id, SubscriptionAction.UNSUBSCRIBE, got.full_filter, got.selector, None
        )
        core.journal.entries(s)
        core.flush()
        return _json({"client_id": s.client_id, "removed": f})

    # ------------------------------------------------------------ retained
    def _matching(self, f: str) -> list[tuple[str, Message]]:
        try:
            return sorted(self.core.router.retained.match(f), key=lambda tm: tm[0])
        except topics.InvalidTopic as exc:
            raise Refused(400, f"filter: {exc}") from None

    async def h_retained(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        found = self._matching(q.get("filter", "#"))
        keys = [t for t, _ in found]
        page, nxt = _page(keys, q)
        may = self.may_read(user)
        by_topic = dict(found)
        return _json(
            {
                "total": len(found),
                "next": nxt,
                "retained": [self._message(by_topic[t], may, False) for t in page],
            }
        )

    @staticmethod
    def _message(msg: Message, may: Callable[[str], bool], full: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"topic": msg.topic, "qos": msg.qos, "size": len(msg.payload)}
        if not may(msg.topic):
            out["hidden"] = "your ACL does not allow reading this topic"
            return out
        out["payload"] = data.payload_view(msg.payload)
        if full:
            out["payload_base64"] = base64.b64encode(msg.payload).decode()
            p = msg.properties
            out["properties"] = {
                "content_type": p.content_type,
                "response_topic": p.response_topic,
                "payload_format_indicator": p.payload_format_indicator,
                "user_properties": [list(kv) for kv in p.user_properties],
            }
        return out

    async def h_retained_one(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        topic = self._topic(q["topic"])
        msg = self.core.router.retained.get(topic)
        if msg is None:
            raise Refused(404, f"nothing retained at {topic[:100]!r}")
        return _json(self._message(msg, self.may_read(user), True))

    @staticmethod
    def _topic(topic: str, name: str = "topic") -> str:
        try:
            topics.validate_topic(topic)
        except topics.InvalidTopic as exc:
            raise Refused(400, f"{name}: {exc}") from None
        return topic

    async def h_retained_delete(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        if ("topic" in q) == ("filter" in q):
            raise Refused(400, "give topic or filter (one of them)")
        tree = self.core.router.retained
        if "topic" in q:
            topic = self._topic(q["topic"])
            if tree.get(topic) is None:
                raise Refused(404, f"nothing retained at {topic[:100]!r}")
            victims = [topic]
        else:
            victims = [t for t, _ in self._matching(q["filter"])]
        core = self.core
        now = core.clock.monotonic()
        for topic in victims:
            empty = Message.create(topic, b"", 0, True, NO_PROPERTIES, None, now)
            if core.retain_hook is not None:  # a cluster: every node must forget it
                core.publish(empty, now)
            else:
                core.journal.retain(empty, now)
        core.flush()
        return _json({"deleted": len(victims), "topics": victims[: data.MAX_LIMIT]})

    # ------------------------------------------------------------ publish
    async def h_publish(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        topic = self._topic(b["topic"])
        if "payload" in b and "payload_base64" in b:
            raise Refused(400, "give payload or payload_base64, not both")
        payload = b.get("payload", "").encode()
        if "payload_base64" in b:
            try:
                payload = base64.b64decode(b["payload_base64"], validate=True)
            except ValueError:
                raise Refused(400, "payload_base64: not base64") from None
        props = NO_PROPERTIES
        p = b.get("properties")
        if p:
            # MQTT 5 section 1.5.4: no U+0000 in a UTF-8 string (a subscriber's client drops
            # the connection at such a PUBLISH as malformed)
            texts = [p.get("content_type") or "", *(s for kv in p.get("user_properties", ()) for s in kv)]
            if any("\x00" in t for t in texts):
                raise Refused(400, "properties: content_type and user_properties may not contain U+0000")
            if p.get("payload_format_indicator") == 1:  # MQTT 5 section 3.3.2.3.2: 0x99 at a client
                try:
                    payload.decode()
                except UnicodeDecodeError:
                    raise Refused(400, "payload_format_indicator 1 needs a UTF-8 payload") from None
            try:
                props = Properties(
                    payload_format_indicator=p.get("payload_format_indicator"),
                    message_expiry_interval=p.get("message_expiry_interval"),
                    content_type=p.get("content_type"),
                    response_topic=self._topic(p["response_topic"], "properties.response_topic")
                    if "response_topic" in p
                    else None,
                    correlation_data=p["correlation_data"].encode() if "correlation_data" in p else None,
                    user_properties=tuple(_pair(kv) for kv in p.get("user_properties", ())),
                )
            except ValueError:
                raise Refused(400, "properties.user_properties: pairs [name, value] expected") from None
        qos = b.get("qos", 0)
        if qos > self.broker.config.maximum_qos:
            raise Refused(400, f"qos: this broker's maximum is {self.broker.config.maximum_qos}")
        n = await self.broker.publish(topic, payload, qos, b.get("retain", False), props)
        return _json({"topic": topic, "deliveries": n})

    # ------------------------------------------------------------ bans
    async def h_bans(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        now = time.time()
        self._sweep(now)
        return _json({"bans": [ban.to_json(now) for ban in self.core.bans.all()]})

    def _sweep(self, now: float) -> None:
        for gone in self.core.bans.sweep(now):
            _save_bans(self.broker, gone, True)

    async def h_ban(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        kind, value = _ban_key(b)
        now = time.time()
        expiry = b.get("expiry")
        ban = Ban(kind, value, None if expiry is None else now + expiry, b.get("reason", ""), now)
        core = self.core
        core.bans.add(ban)
        core.bans.announce(ban, False)  # the other nodes of a cluster
        _save_bans(self.broker, ban, False)
        kicked = enforce_ban(self.broker, ban, now)
        log.warning(
            "ban %s %s added by %s; %d clients disconnected",
            kind.value,
            shown(value),
            bounded(user or "local"),
            len(kicked),
            extra=fields("admin.ban", reason=f"{kind.value} {value}"),
        )
        return _json({"ban": ban.to_json(now), "disconnected": kicked[: data.MAX_LIMIT]}, 201)

    async def h_unban(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        kind, value = _ban_key(q)
        gone = self.core.bans.remove(kind, value)
        if gone is None:
            raise Refused(404, f"no {kind.value} ban {value[:100]!r}")
        self.core.bans.announce(gone, True)  # the other nodes of a cluster
        _save_bans(self.broker, gone, True)
        return _json({"removed": {"kind": kind.value, "value": value}})

    # ------------------------------------------------------------ users
    def _file_auth(self, what: str) -> FileAuth:
        auth = self.auth
        if auth is None or (auth.password_file if what == "password" else auth.acl_file) is None:
            raise Refused(409, f"the broker has no {what} file (siftmq serve --{what}-file)")
        return auth

    async def h_users(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        auth = self._file_auth("password")
        admins = set(self.broker.config.dashboard_admins)
        names = sorted(auth.passwords.entries) if auth.passwords is not None else []
        return _json({"users": [{"username": n, "admin": n in admins} for n in names]})

    async def _rewrite_passwords(self, change: Callable[[PasswordFile], bool]) -> bool:
        auth = self._file_auth("password")
        assert auth.password_file is not None
        async with self._files:

            def work() -> bool:
                pf = PasswordFile.load(auth.password_file, auth.params)  # type: ignore[arg-type]
                changed = change(pf)
                if changed:
                    pf.save(auth.password_file)  # type: ignore[arg-type]
                return changed

            try:
                changed = await asyncio.to_thread(work)
            except PasswordFileError as exc:
                raise Refused(400, str(exc)) from None
            except OSError as exc:
                raise Refused(409, f"cannot rewrite the password file: {exc.strerror}") from None
            if changed:
                auth.reload()
            return changed

    async def h_user_set(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        name, password = b["username"], b["password"]
        existed = False

        def change(pf: PasswordFile) -> bool:
            nonlocal existed
            existed = name in pf
            try:
                pf.set(name, password)
            except ValueError as exc:
                raise PasswordFileError(f"username: {exc}") from None
            return True

        await self._rewrite_passwords(change)
        return _json({"username": name, "created": not existed}, 200 if existed else 201)

    async def h_user_delete(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        name = q["username"]
        admins = set(self.broker.config.dashboard_admins)

        def change(pf: PasswordFile) -> bool:
            # checked on the file as it is now (under the files' lock): nobody can lock the
            # API out, neither by deleting the account they are logged in with nor the last
            # admin that can log in (409; the file is not rewritten)
            if name in pf and name == user:
                raise Refused(
                    409,
                    f"you cannot delete the user you are logged in as ({name[:100]!r}): "
                    "another dashboard admin can",
                )
            if name in pf and name in admins and not (admins & set(pf.entries)) - {name}:
                raise Refused(
                    409,
                    f"{name[:100]!r} is the last dashboard admin of the password file: deleting it "
                    "would lock everyone out of the API (add another admin first)",
                )
            return pf.delete(name)

        if not await self._rewrite_passwords(change):
            raise Refused(404, f"no user {name[:100]!r}")
        kicked = []
        for s in list(self.core.sessions.values()):
            if s.username == name and s.conn is not None:
                s.conn.disconnect(ReasonCode.NOT_AUTHORIZED, "user deleted")
                kicked.append(s.client_id)
        self.core.flush()
        return _json({"removed": name, "disconnected": kicked[: data.MAX_LIMIT]})

    # ------------------------------------------------------------ bridges
    async def h_bridges(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        return _json({"bridges": [s.to_json() for s in list_bridges(self.broker)]})

    def _bridge(self, name: str) -> tuple[BridgeSource, BridgeStatus]:
        found = find_bridge(self.broker, name)
        if found is None:
            known = [s.name for s in list_bridges(self.broker)]
            raise Refused(404, f"no bridge {name[:100]!r}", {"bridges": known[: data.MAX_LIMIT]})
        return found

    async def h_bridge(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        return _json(self._bridge(q["name"])[1].to_json())

    async def h_bridge_reconnect(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        name = q["name"]
        source, _ = self._bridge(name)
        if not await source.reconnect_bridge(name):
            raise Refused(404, f"no bridge {name[:100]!r}")
        return _json({"reconnecting": name})

    # ------------------------------------------------------------ acl
    async def h_acl(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        auth = self._file_auth("acl")
        acl = auth.acl or AccessList()

        def rows(rules: list[Any], who: str | None) -> list[dict[str, Any]]:
            return [
                {"user": who, "access": r.access.name.lower(), "filter": r.filter, "pattern": r.pattern}
                for r in rules
            ]

        out = rows(acl.anonymous, None)
        for name, rules in acl.users.items():
            out += rows(rules, name)
        out += rows(acl.patterns, None)
        return _json({"rules": out})

    async def _rewrite_acl(self, edit: Callable[[list[str]], list[str] | None]) -> bool:
        auth = self._file_auth("acl")
        path = auth.acl_file
        assert path is not None
        async with self._files:
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise Refused(409, f"cannot read the ACL file: {exc.strerror}") from None
            new = edit(lines)
            if new is None:
                return False
            text = "\n".join(new) + "\n"
            try:
                AccessList.parse(text, str(path))
            except AclError as exc:
                raise Refused(400, str(exc)) from None
            try:
                await asyncio.to_thread(write_private, path, text.encode(), sync=True)
            except OSError as exc:
                raise Refused(409, f"cannot write the ACL file: {exc.strerror}") from None
            auth.reload()
            return True

    async def h_acl_add(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        rule = _rule_line(b)
        who = b.get("user")
        if who is not None and (not who or who != who.strip() or "\n" in who):
            raise Refused(400, "user: a user name without surrounding spaces or newlines")
        if who is not None and b.get("pattern", False):
            raise Refused(400, "user: a pattern rule applies to every user (%u, %c): give no user")

        def edit(lines: list[str]) -> list[str]:
            if b.get("pattern", False):
                return [*lines, rule]
            start, end = _section(lines, who)
            if start is None:  # a new user section at the end
                return [*lines, f"user {who}", rule]
            return [*lines[:end], rule, *lines[end:]]

        await self._rewrite_acl(edit)
        return _json({"added": {**b, "line": rule}}, 201)

    async def h_acl_remove(self, q: Args, b: Args, user: str | None, csrf: str) -> Response:
        want = _rule_words(q)
        who = q.get("user")

        def edit(lines: list[str]) -> list[str] | None:
            if q.get("pattern", False):
                lo, hi = 0, len(lines)
            else:
                start, hi = _section(lines, who)
                if start is None:
                    return None
                lo = start
            for i in range(lo, hi):
                words = _parse_line(lines[i])
                if words == want:
                    return [*lines[:i], *lines[i + 1 :]]
            return None

        if not await self._rewrite_acl(edit):
            raise Refused(404, "no such rule", {k: v for k, v in q.items()})
        return _json({"removed": q})


def _ban_key(args: Args) -> tuple[BanKind, str]:
    """A ban's kind and its value in canonical form (an address as its network)."""
    kind = BanKind(args["kind"])
    try:
        return kind, canonical(kind, args["value"])
    except ValueError as exc:
        raise Refused(400, f"value: {exc}") from None


def _pair(kv: list[str]) -> tuple[str, str]:
    if len(kv) != 2:
        raise ValueError("a pair")
    return kv[0], kv[1]


def _entry_row(client_id: str, e: Any) -> dict[str, Any]:
    o = e.options
    return {
        "client_id": client_id,
        "filter": e.topic_filter,
        "negative": not e.positive,
        "qos": o.qos if o is not None else None,
        "selector": o.selector if o is not None else None,
    }


def _rule_words(r: dict[str, Any]) -> tuple[str, str, str]:
    return ("pattern" if r.get("pattern", False) else "topic", r.get("access", "readwrite"), r["filter"])


def _rule_line(r: dict[str, Any]) -> str:
    kw, access, f = _rule_words(r)
    if not f or "\n" in f or f != f.strip():
        raise Refused(400, "filter: a topic filter without surrounding spaces or newlines")
    return f"{kw} {access} {f}"


def _parse_line(line: str) -> tuple[str, str, str] | None:
    """A ``topic``/``pattern`` line as (keyword, access, filter), access made explicit."""
    kw, _, rest = line.strip().partition(" ")
    if kw not in ("topic", "pattern"):
        return None
    rest = rest.strip()
    word, _, tail = rest.partition(" ")
    if word in ("read", "write", "readwrite", "deny"):
        return kw, word, tail.strip()
    return kw, "readwrite", rest


def _section(lines: list[str], who: str | None) -> tuple[int | None, int]:
    """Where the rules of ``who`` are (None: the anonymous ones, before the first ``user``
    line): the first line after its header and the end of its section; (None, len) when
    the file has no section for ``who``. O(lines)."""
    start = 0 if who is None else None
    for i, line in enumerate(lines):
        kw, _, rest = line.strip().partition(" ")
        if kw != "user":
            continue
        if start is not None:
            return start, i
        if rest.strip() == who:
            start = i + 1
    return start, len(lines)
