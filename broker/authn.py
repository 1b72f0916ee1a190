"""Identity and policy from outside the broker: an HTTP auth service and JWT tokens (issue 39, item 2).

Two :class:`~broker.hooks.Hooks` that plug into ``Broker(hooks=[...])`` (or ``siftmq serve``'s
``[serve]`` keys ``auth_http_*`` / ``auth_jwt_*``, :data:`SERVE_KEYS`); both need the ``auth``
extra (``pip install 'siftmq[auth]'``: aiohttp, PyJWT, cryptography; a missing one raises
:class:`broker._extras.MissingExtra` naming it).  Both implement the new-style
:meth:`~broker.hooks.Hooks.authenticate_request` and so see the whole
:class:`~broker.hooks.AuthRequest` (address, listener, protocol, client certificate).

:class:`HttpAuth` -- POSTs a JSON body (the contract of EMQX's HTTP authentication and of
mosquitto-go-auth's HTTP backend, merged; docs/security.md, "HTTP auth service")::

    {"clientid": ..., "username": ..., "password": ..., "peerhost": ..., "listener": ...,
     "listener_port": ..., "protocol": 3|4|5, "cert_subject": ..., "cert_common_name": ...}

and reads the answer: status 200 with ``{"result": "allow"|"deny"|"ignore", "is_superuser":
bool, "acl": [...]}`` (no body, or 204: allow); 401/403 or any other 4xx: deny; 5xx, a timeout
or no connection: the service is *unavailable* and the CONNECT is refused fail-closed with
0x88 Server unavailable (MQTT 3.1.1 return code 3: ``AuthUnavailable``; it does not count as a
failed login).  ``retries`` more attempts follow a connection error or a 5xx, all within the
one ``timeout`` (seconds, the whole decision's bound).  Verdicts are cached for
``cache_ttl`` (allow) and ``negative_ttl`` (deny) seconds, at most ``cache_size`` of them
(least recently used evicted), keyed by client id, user name, an HMAC of the password under a
per-process key (no password is kept), address, listener and certificate subject: a cache hit
answers at once, on the loop, with no await (measured: benchmarks/bench_auth_backends.py).
At most ``max_pending`` requests are in flight; beyond that a CONNECT is refused 0x88 at once.

:class:`JwtAuth` -- the CONNECT password carries a JSON Web Token, verified with PyJWT against
a key file (an HS* secret or an RS*/ES* PEM public key) or a JWKS file (the key by the token's
``kid``): signature, ``exp`` (required), ``nbf``, and ``iss``/``aud`` when configured; the
``alg`` must be one of ``algorithms`` (``none`` is refused when the hook is built and PyJWT
never accepts it for a token).  The user name is bound to a claim (``username_claim``, default
``username``, falling back to ``sub``): a CONNECT whose user name differs from it is denied.
Verification runs on the event loop by default: 0.03 ms (HS256) to 0.12 ms (ES256) at the
median, against 0.04 ms for a no-op's round trip through a :class:`~broker.auth.CheckPool`
(benchmarks/bench_auth_backends.py; docs/security.md): a thread would cost about what it
saves.  ``JwtAuth(pool=CheckPool())`` verifies on threads anyway (bounded, 0x88 past it).

Both backends carry authorisation with the identity: the rules of the service's ``acl`` field or
of the token's ``acl`` claim (:func:`parse_acl`: EMQX's list of ``{"permission", "action",
"topic"}`` or the ``{"pub": [...], "sub": [...], "all": [...]}`` form; ``%u`` and ``%c``
substituted, deny rules win) become the client's :class:`broker._acl.ClientRules` when its
CONNECT is accepted; ``authorize`` is then one dict probe plus the memoised decision (O(1) on
PUBLISH).  ``is_superuser`` allows everything.  A client authenticated without rules gets no
opinion (the next hook or the broker's configuration decides).  The rules live while the client
is connected (``on_connect`` to ``on_disconnect``, a takeover keeps the newer ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from broker._acl import ClientRules, inner_filter
from broker._extras import Extra, require
from broker._logging import cut, shown
from broker.hooks import AuthRequest, AuthUnavailable, AuthVerdict, Hooks

if TYPE_CHECKING:
    import aiohttp

    from broker._broker import Broker
    from broker.auth import CheckPool
    from broker.core import Core

__all__ = [
    "SERVE_KEYS",
    "SERVE_KEY_HELP",
    "Grant",
    "HttpAuth",
    "HttpAuthz",
    "JwtAuth",
    "hooks_from_serve_options",
    "parse_acl",
]

log = logging.getLogger("broker")

#: the ``[serve]`` keys of ``siftmq serve`` that build these hooks, with their meaning
#: (docs/config-reference.md is generated from it; docs/security.md explains them)
SERVE_KEY_HELP: dict[str, str] = {
    "auth_http_url": "URL of the HTTP auth service: HttpAuth POSTs each CONNECT's JSON there (broker.authn)",
    "auth_http_authz_url": "URL of the HTTP authorization service: HttpAuthz POSTs each PUBLISH topic and "
    "SUBSCRIBE filter it has no cached decision for (broker.authn; the auth_http_* keys apply too)",
    "auth_http_timeout": "seconds for the auth service's whole decision, retries included (default 5); "
    "no answer by then: refused 0x88 server unavailable",
    "auth_http_retries": "further attempts after a connection error or a 5xx, within the timeout (default 1)",
    "auth_http_cache_ttl": "seconds an allow of the auth service is remembered (default 60; 0: not cached)",
    "auth_http_negative_ttl": "seconds a deny of the auth service is remembered (default 5; 0: not cached)",
    "auth_http_cache_size": "verdicts of the auth service remembered at most, LRU (default 10000)",
    "auth_http_headers": "a table of HTTP headers sent to the auth service (e.g. an API key)",
    "auth_jwt_key_file": "JwtAuth: the CONNECT password is a JWT verified with this HS* secret "
    "or PEM public key",
    "auth_jwt_jwks_file": "JwtAuth: verify the JWT with the key of this JWKS file named by its kid",
    "auth_jwt_algorithms": "JWT algorithms accepted (default [\"HS256\"]; 'none' is refused)",
    "auth_jwt_audience": "the JWT's aud must be this (default: aud not checked)",
    "auth_jwt_issuer": "the JWT's iss must be this (default: iss not checked)",
    "auth_jwt_username_claim": "claim the CONNECT user name must equal (default username, else sub)",
    "auth_jwt_acl_claim": "claim holding the client's rules (default acl; docs/security.md)",
    "auth_jwt_leeway": "seconds of clock skew allowed for the JWT's exp and nbf (default 0)",
    "auth_jwt_watch_interval": "seconds between two looks at the JWT key or JWKS file, read again when it "
    "changed (default 5; 0: only at a reload)",
}
SERVE_KEYS = frozenset(SERVE_KEY_HELP)

#: seconds between two log lines of an unavailable auth service
LOG_EVERY = 10.0

#: seconds an idle connection to the HTTP auth service is kept
KEEPALIVE = 5.0

#: pending (authenticated, not yet connected) grants kept at most (LRU)
_PENDING_LIMIT = 10_000


# ------------------------------------------------------------------ rules carried by identity


@dataclass(frozen=True, slots=True)
class Grant:
    """What a backend said about one authenticated client: superuser, or its rules (None: the
    backend gave none, so it has no opinion on authorisation)."""

    superuser: bool
    rules: ClientRules | None


def _expand(topic: str, username: str | None, client_id: str) -> str | None:
    """``%u``/``%c`` substituted (None when the value is missing or would add levels/wildcards)."""
    for mark, value in (("%u", username), ("%c", client_id)):
        if mark in topic:
            if not value or "/" in value or "+" in value or "#" in value:
                return None
            topic = topic.replace(mark, value)
    return topic


def parse_acl(acl: object, username: str | None, client_id: str) -> ClientRules:
    """The rules of a service's ``acl`` field or a token's ``acl`` claim for one client.

    Two forms: EMQX's list ``[{"permission": "allow"|"deny", "action": "publish"|"subscribe"|
    "all", "topic": "t/%u/#"}, ...]`` (``"topics": [...]`` for several; ``access`` may stand for
    ``action``), or ``{"pub": [...], "sub": [...], "all": [...]}`` (allow rules only; the keys
    ``publish``/``subscribe`` too).  Subscribe rules also cover receiving.  Raises ValueError
    on another shape.  O(rules)."""
    read: list[str] = []
    write: list[str] = []
    deny: list[str] = []

    def add(action: str, permission: str, filters: Iterable[object]) -> None:
        for f in filters:
            if not isinstance(f, str) or not f:
                raise ValueError(f"acl: topic {f!r} is not a non-empty string")
            topic = _expand(f, username, client_id)
            if topic is None:
                continue  # a pattern this client cannot fill: the rule does not apply
            if permission == "deny":
                deny.append(topic)  # deny wins whatever the action (as in the ACL file)
            elif action in ("publish", "pub"):
                write.append(topic)
            elif action in ("subscribe", "sub"):
                read.append(topic)
            elif action == "all":
                read.append(topic)
                write.append(topic)
            else:
                raise ValueError(f"acl: unknown action {action!r}")

    for action, permission, filters in _acl_entries(acl):
        add(action, permission, filters)
    return ClientRules(tuple(read), tuple(write), tuple(deny))


def _acl_entries(acl: object) -> list[tuple[str, str, list[object]]]:
    """(action, permission, filters) of each rule of either ``acl`` form; ValueError else."""
    entries: list[tuple[str, str, list[object]]] = []
    if isinstance(acl, Mapping):
        for key, filters in acl.items():
            if not isinstance(filters, list):
                raise ValueError(f"acl: {key!r} must be a list of topic filters")
            entries.append((str(key), "allow", filters))
    elif isinstance(acl, list):
        for rule in acl:
            if not isinstance(rule, Mapping):
                raise ValueError(f"acl: rule {rule!r} is not an object")
            permission = str(rule.get("permission", "allow"))
            if permission not in ("allow", "deny"):
                raise ValueError(f"acl: permission {permission!r} (allow or deny)")
            action = str(rule.get("action", rule.get("access", "all")))
            many = rule.get("topics")
            entries.append((action, permission, many if isinstance(many, list) else [rule.get("topic")]))
    else:
        raise ValueError("acl: a list of rules or an object of pub/sub/all lists expected")
    return entries


class _Grants(Hooks):
    """The per-client grants of a backend: set at authentication, live while connected.

    ``authorize`` is one dict probe and the memoised :class:`ClientRules` decision (O(1) on
    PUBLISH once a topic was seen).  A grant waits in ``_pending`` (bounded, LRU) from the
    verdict until ``on_connect``; the will's topic is authorised from there."""

    def __init__(self) -> None:
        self._pending: OrderedDict[str, Grant] = OrderedDict()
        self._grants: dict[str, Grant] = {}
        self._connected: dict[str, int] = {}

    def _granted(self, client_id: str, grant: Grant) -> None:
        pending = self._pending
        pending[client_id] = grant
        pending.move_to_end(client_id)
        if len(pending) > _PENDING_LIMIT:
            pending.popitem(last=False)

    def _denied(self, client_id: str) -> None:
        self._pending.pop(client_id, None)

    def on_connect(self, client_id: str, username: str | None, protocol_level: int) -> None:
        grant = self._pending.pop(client_id, None)
        if grant is not None:
            self._grants[client_id] = grant
            self._connected[client_id] = self._connected.get(client_id, 0) + 1
        else:  # another hook let this client in: an older connection's grant is not its own
            self._grants.pop(client_id, None)
            self._connected.pop(client_id, None)

    def on_disconnect(self, client_id: str, reason: str) -> None:
        n = self._connected.get(client_id)
        if n is None:
            return
        if n > 1:  # a takeover: the newer connection's grant stays
            self._connected[client_id] = n - 1
            return
        del self._connected[client_id]
        self._grants.pop(client_id, None)

    def authorize(self, client_id: str, username: str | None, action: str, topic: str) -> bool | None:
        grant = self._grants.get(client_id) or self._pending.get(client_id)
        if grant is None:
            return None
        if grant.superuser:
            return True
        rules = grant.rules
        if rules is None:
            return None
        if action == "publish":
            return rules.may_publish(topic)
        if action == "subscribe":
            try:
                inner_filter(topic)
            except ValueError:
                return False
            return rules.may_subscribe(topic)
        return rules.may_receive(topic)


def _grant(superuser: object, acl: object, username: str | None, client_id: str) -> Grant:
    rules = None if acl is None else parse_acl(acl, username, client_id)
    return Grant(superuser is True, rules)


# ------------------------------------------------------------------ HTTP


class _HttpService(_Grants):
    """What the HTTP backends share: the URL, timeout, retries, caches' TTLs and bound, headers,
    the bound on requests in flight, and the aiohttp session (see :class:`HttpAuth` for the
    parameters).

    The client is aiohttp's: its HTTP parser is compiled and its connection pool does O(1)
    work per request, where httpx (the first choice) cost 1.9-2.7 ms of the event loop's CPU
    per request, against 0.5-0.9 ms for aiohttp and 0.13-0.25 ms for a hook that only sleeps
    (benchmarks/bench_auth_backends.py part 5, same runs; docs/security.md, "Measured").  The
    session is made on the loop when the broker starts (:meth:`start`; else at the first
    request: aiohttp wants a running loop), from parts made at build time: the SSL context
    (the CA bundle is read once, 0.1-0.3 s of CPU) and the import."""

    #: what the service decides: the ``reason`` label of its ``/metrics`` counters
    SERVICE: ClassVar[str] = "authentication"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 5.0,
        retries: int = 1,
        cache_ttl: float = 60.0,
        negative_ttl: float = 5.0,
        cache_size: int = 10_000,
        headers: Mapping[str, str] | None = None,
        max_pending: int = 256,
    ) -> None:
        require(Extra.AUTH, type(self).__name__)
        import aiohttp  # at build time: an import on the event loop would stall it

        if timeout <= 0 or retries < 0 or cache_ttl < 0 or negative_ttl < 0 or cache_size < 0:
            raise ValueError(
                f"{type(self).__name__}: timeout > 0, retries/cache_ttl/negative_ttl/cache_size >= 0"
            )
        if max_pending < 1:
            raise ValueError(f"{type(self).__name__}: max_pending >= 1")
        # checked here, not at the first CONNECT (which a wrong URL or header would refuse
        # 0x88, as an auth service that is down)
        try:
            parsed = urlsplit(url)
            parsed.port  # noqa: B018 (raises ValueError for a bad port)
        except ValueError as exc:
            raise ValueError(f"{type(self).__name__}: url {url[:200]!r}: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(
                f"{type(self).__name__}: url must be http://HOST[:PORT]/PATH or https://..., "
                f"not {url[:200]!r}"
            )
        for name, value in (headers or {}).items():
            if not name or any(c in name for c in ":\r\n ") or "\r" in value or "\n" in value:
                raise ValueError(f"{type(self).__name__}: header {name[:100]!r}: a name without ':', "
                                 "spaces or line breaks, a value without line breaks")  # fmt: skip
        super().__init__()
        self.url = url
        self.timeout = timeout
        self.retries = retries
        self.cache_ttl = cache_ttl
        self.negative_ttl = negative_ttl
        self.cache_size = cache_size
        self.headers = dict(headers or {})
        self.max_pending = max_pending
        self.pending = 0
        #: requests sent / answered from the cache / refused unavailable (tests, benchmarks)
        self.requests = 0
        self.hits = 0
        self.unavailable = 0
        #: answers that could not be read (denied; logged rate-limited: :meth:`_bad`)
        self.bad_answers = 0
        self._logged_at = -LOG_EVERY
        self._core: Core | None = None
        self._aiohttp = aiohttp
        import secrets
        import ssl  # here, not with the module: OpenSSL only with an HTTP backend (issue 42 item 1)

        #: built now, not at the first CONNECT (the CA bundle: see the class docstring)
        self._ssl = ssl.create_default_context() if parsed.scheme == "https" else None
        self._session: aiohttp.ClientSession | None = None
        self._key = secrets.token_bytes(32)
        self._cache: OrderedDict[bytes, tuple[float, bool | None, Grant | None]] = OrderedDict()

    def _client(self) -> aiohttp.ClientSession:
        """The session (made at the first request, on the loop; again after :meth:`stop`).
        Its pool keeps up to ``max_pending`` connections, idle ones for ``KEEPALIVE`` s."""
        session = self._session
        if session is None or session.closed:
            hx = self._aiohttp
            connector = hx.TCPConnector(
                limit=self.max_pending,
                keepalive_timeout=KEEPALIVE,
                ssl=self._ssl if self._ssl is not None else True,
            )
            session = self._session = hx.ClientSession(
                connector=connector, headers=self.headers, raise_for_status=False
            )
        return session

    async def start(self) -> None:
        self._client()  # made when the broker starts, not by the first CONNECT's request

    async def stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def attach(self, broker: Broker) -> None:
        self._core = broker.core  # its log_limit: the per-request warnings (:meth:`_bad`)
        broker.core.metric_sources.append(self.metric_values)

    def metric_values(self) -> dict[str, dict[str, int]]:
        """``/metrics`` (``Core.metric_sources``): the bad answers by service,
        ``siftmq_auth_bad_answers_total{reason="authentication"|"authorization"}``. O(1)."""
        return {"auth_bad_answers": {self.SERVICE: self.bad_answers}}

    def _bad(self, client_id: str, what: str, *args: object) -> None:
        """Count an answer that could not be read (the request is denied) and log ``what`` as
        the broker logs its other per-request refusals: at most one line per
        ``LIMIT_LOG_INTERVAL`` (``Core.log_limit``, kind ``auth_bad_answer``), so a service
        that answers garbage to every CONNECT or PUBLISH does not flood the log; the line
        (``what % args``, as ``logging`` does) is made only when it is logged. O(1)."""
        self.bad_answers += 1
        core = self._core
        if core is None:  # not in a broker (a hook used on its own): every line
            log.warning("client %s: %s", shown(client_id), cut(what % args))
        else:
            core.log_limit("auth_bad_answer", client_id, lambda: what % args, event="auth.bad_answer")

    def _finished(self, _task: object) -> None:
        self.pending -= 1

    async def _send(self, body: dict[str, object]) -> tuple[int, bytes]:
        """POST ``body``: the status and content of an answer that is not a 5xx, within
        ``timeout`` and ``retries``; raises AuthUnavailable (fail-closed), logged (limited)."""
        hx = self._aiohttp
        session = self._client()
        attempt = 0
        try:
            async with asyncio.timeout(self.timeout):
                while True:
                    attempt += 1
                    self.requests += 1
                    try:
                        async with session.post(self.url, json=body, allow_redirects=False) as resp:
                            status, content = resp.status, await resp.read()
                    except hx.ClientError as exc:
                        if attempt > self.retries:
                            raise AuthUnavailable(f"auth service {self.url}: {type(exc).__name__}") from exc
                        continue
                    if status >= 500:
                        if attempt > self.retries:
                            raise AuthUnavailable(f"auth service {self.url}: HTTP {status}")
                        continue
                    return status, content
        except TimeoutError as exc:
            why = AuthUnavailable(f"auth service {self.url}: no answer within {self.timeout:g} s")
            self._down(why)
            raise why from exc
        except AuthUnavailable as why:
            self._down(why)
            raise

    def _down(self, why: AuthUnavailable) -> None:
        """Count an unavailable answer; log why at most once per ``LOG_EVERY`` seconds."""
        self.unavailable += 1
        now = time.monotonic()
        if now >= self._logged_at + LOG_EVERY:
            self._logged_at = now
            log.warning("%s (%d refused 0x88 so far; next such line in %g s at the earliest)",
                        why, self.unavailable, LOG_EVERY)  # fmt: skip


class HttpAuth(_HttpService):
    """Authentication (and rules) from an HTTP service; see the module docstring.

    ``url``: where to POST; ``timeout``: seconds for the whole decision (all attempts);
    ``retries``: further attempts after a connection error or a 5xx; ``cache_ttl`` /
    ``negative_ttl``: seconds an allow / a deny is remembered (0: not cached); ``cache_size``:
    verdicts remembered at most; ``headers``: sent with each request (e.g. an API key);
    ``max_pending``: requests in flight at most (beyond: 0x88 at once)."""

    def _cache_key(self, r: AuthRequest) -> bytes:
        import hashlib
        import hmac
        import json

        parts = (r.client_id, r.username, r.address, r.listener, r.certificate_subject)
        text = json.dumps(parts).encode() + b"\0" + (b"-" if r.password is None else b"+" + r.password)
        return hmac.new(self._key, text, hashlib.sha256).digest()

    def authenticate_request(self, request: AuthRequest) -> AuthVerdict:
        """A cached verdict at once (O(1)), else an awaitable of the service's answer."""
        key = self._cache_key(request)
        cache = self._cache
        hit = cache.get(key)
        if hit is not None:
            expires, verdict, grant = hit
            if expires > time.monotonic():
                cache.move_to_end(key)
                self.hits += 1
                self._remember(request.client_id, verdict, grant)
                return verdict
            del cache[key]
        if self.pending >= self.max_pending:
            self.unavailable += 1
            raise AuthUnavailable(f"{self.pending} HTTP auth requests pending")
        # a task of its own, counted until it is done whatever happens to it (even cancelled
        # before it ran: a coroutine closed unstarted would never run a ``finally``)
        task = asyncio.get_running_loop().create_task(self._ask(request, key))
        self.pending += 1
        task.add_done_callback(self._finished)
        return task

    def _remember(self, client_id: str, verdict: bool | None, grant: Grant | None) -> None:
        if verdict is True and grant is not None:
            self._granted(client_id, grant)
        else:
            self._denied(client_id)

    async def _ask(self, r: AuthRequest, key: bytes) -> bool | None:
        verdict, grant = await self._post(r)
        ttl = self.cache_ttl if verdict else self.negative_ttl
        if ttl > 0 and self.cache_size > 0:
            cache = self._cache
            cache[key] = (time.monotonic() + ttl, verdict, grant)
            if len(cache) > self.cache_size:
                cache.popitem(last=False)
        self._remember(r.client_id, verdict, grant)
        return verdict

    def _body(self, r: AuthRequest) -> dict[str, object]:
        cn = None
        if r.certificate is not None:
            for rdn in r.certificate.get("subject", ()):  # type: ignore[attr-defined]
                for k, v in rdn:
                    if k == "commonName":
                        cn = v
        return {
            "clientid": r.client_id,
            "username": r.username,
            "password": None if r.password is None else r.password.decode("utf-8", "replace"),
            "peerhost": r.address,
            "listener": r.listener,
            "listener_port": r.listener_port,
            "protocol": r.protocol_version,
            "cert_subject": r.certificate_subject,
            "cert_common_name": cn,
        }

    async def _post(self, r: AuthRequest) -> tuple[bool | None, Grant | None]:
        """The service's verdict and grant; raises AuthUnavailable (fail-closed)."""
        status, content = await self._send(self._body(r))
        return self._verdict(r, status, content)

    def _verdict(self, r: AuthRequest, status: int, content: bytes) -> tuple[bool | None, Grant | None]:
        if status >= 300:
            return False, None  # 401/403 and every other 4xx (3xx is not followed: a deny)
        if status == 204 or not content.strip():
            return True, Grant(False, None)
        import json

        try:
            answer = json.loads(content)
            if not isinstance(answer, dict):
                raise ValueError("not a JSON object")
            result = answer.get("result", "allow")
            if result == "deny":
                return False, None
            if result == "ignore":
                return None, None
            if result != "allow":
                raise ValueError(f"result {result!r}")
            return True, _grant(answer.get("is_superuser"), answer.get("acl"), r.username, r.client_id)
        except ValueError as exc:  # a broken answer: deny, and say so (rate-limited)
            self._bad(r.client_id, "auth service %s: bad answer (%s): denied", self.url, exc)
            return False, None


# ------------------------------------------------------------------ HTTP authorisation

#: decisions of the packet being processed kept per client at most (see HttpAuthz)
_NOW_LIMIT = 1024


class HttpAuthz(_HttpService):
    """Authorisation from an HTTP service: EMQX's HTTP authorizer (issue 39).

    For each PUBLISH and each filter of a SUBSCRIBE whose decision it does not know, the hook
    POSTs ``{"clientid", "username", "action": "publish"|"subscribe", "topic", "qos",
    "retain"}`` to ``url`` and reads the answer as :class:`HttpAuth` does: 200 with
    ``{"result": "allow"|"deny"|"ignore"}`` (no body, or 204: allow), 4xx: deny, 5xx / a
    timeout / no connection after ``retries``: deny (fail-closed, not cached; counted in
    ``unavailable``, logged at most every ``LOG_EVERY`` s).  ``ignore``: no opinion (the next
    hook, the ACL file decide).

    The core asks :meth:`authorize_ahead` before it processes the packet
    (broker/core/_ahead.py): a decision in the cache (``cache_ttl`` for an allow,
    ``negative_ttl`` for a deny, keyed by client id, user name, action, topic, QoS and retain,
    at most ``cache_size``, LRU) answers at once, O(1), and the packet goes on; otherwise the
    connection is held (nothing more read from it, its packets kept in order) until the
    service answered or ``timeout`` passed, and the packet is processed then.  So a SUBSCRIBE
    is checked when it comes, and a PUBLISH costs one dict probe once its topic is known.
    At most ``max_pending`` requests are in flight; beyond that a packet is denied at once.

    Not sent to the service (the other hooks and the ACL file decide them; with none, the
    broker's default): the will's topic at CONNECT, a topic rewritten by a message hook,
    composite subscriptions' atoms, and deliveries (``receive``: a subscription allowed by
    the service receives what its filter matches).  A client whose authentication gave it
    rules (:class:`HttpAuth`'s ``acl``, a JWT's claim) is decided by those first when that
    hook comes before this one in ``hooks``."""

    SERVICE: ClassVar[str] = "authorization"

    def __init__(self, url: str, **kw: Any) -> None:
        super().__init__(url, **kw)
        #: decisions: key -> (expires, verdict)
        self._decisions: OrderedDict[tuple[object, ...], tuple[float, bool | None]] = OrderedDict()
        #: per client: what the service answered and was not asked for again yet (a one-shot
        #: decision, so that a TTL of 0 still decides the packet that waited for it)
        self._fresh: dict[str, dict[tuple[str, str, int, bool], bool | None]] = {}
        #: per client: the decision of the packet being processed, (action, topic) -> verdict,
        #: set by authorize_ahead just before the core's authorize reads it
        self._now: dict[str, dict[tuple[str, str], bool | None]] = {}

    def authenticate_request(self, request: AuthRequest) -> AuthVerdict:
        return None  # authorisation only

    def on_connect(self, client_id: str, username: str | None, protocol_level: int) -> None:
        pass

    def on_disconnect(self, client_id: str, reason: str) -> None:
        self._now.pop(client_id, None)
        self._fresh.pop(client_id, None)

    def authorize_ahead(  # noqa: PLR0917 (the hook's signature)
        self, client_id: str, username: str | None, action: str, topic: str, qos: int, retain: bool
    ) -> Awaitable[None] | None:
        """The decision known (cached, or just fetched): None, O(1); else the request."""
        ask = (action, topic, qos, retain)
        fresh = self._fresh.get(client_id)
        if fresh is not None and ask in fresh:
            verdict = fresh.pop(ask)
            if not fresh:
                del self._fresh[client_id]
            self._decide(client_id, action, topic, verdict)
            return None
        key = (client_id, username, action, topic, qos, retain)
        hit = self._decisions.get(key)
        if hit is not None:
            expires, verdict = hit
            if expires > time.monotonic():
                self._decisions.move_to_end(key)
                self.hits += 1
                self._decide(client_id, action, topic, verdict)
                return None
            del self._decisions[key]
        if self.pending >= self.max_pending:
            self.unavailable += 1
            self._decide(client_id, action, topic, False)
            return None
        task = asyncio.get_running_loop().create_task(self._fetch(key))
        self.pending += 1
        task.add_done_callback(self._finished)
        return task

    def _decide(self, client_id: str, action: str, topic: str, verdict: bool | None) -> None:
        now = self._now.get(client_id)
        if now is None:
            now = self._now[client_id] = {}
        elif len(now) >= _NOW_LIMIT:  # decisions the core never read (refused before): drop
            now.clear()
        now[(action, topic)] = verdict

    async def _fetch(self, key: tuple[object, ...]) -> None:
        client_id, username, action, topic, qos, retain = key
        body = {
            "clientid": client_id,
            "username": username,
            "action": action,
            "topic": topic,
            "qos": qos,
            "retain": retain,
        }
        try:
            status, content = await self._send(body)
        except AuthUnavailable:
            verdict: bool | None = False  # fail-closed, not cached
        else:
            verdict = self._answer(status, content, str(client_id))
            ttl = self.cache_ttl if verdict is not False else self.negative_ttl
            if ttl > 0 and self.cache_size > 0:
                decisions = self._decisions
                decisions[key] = (time.monotonic() + ttl, verdict)
                if len(decisions) > self.cache_size:
                    decisions.popitem(last=False)
        fresh = self._fresh.setdefault(str(client_id), {})
        fresh[(str(action), str(topic), int(qos), bool(retain))] = verdict  # type: ignore[call-overload]

    def _answer(self, status: int, content: bytes, client_id: str) -> bool | None:
        if status >= 300:
            return False
        if status == 204 or not content.strip():
            return True
        import json

        try:
            answer = json.loads(content)
            if not isinstance(answer, dict):
                raise ValueError("not a JSON object")
            result = answer.get("result", "allow")
        except ValueError as exc:
            self._bad(client_id, "authorization service %s: bad answer (%s): denied", self.url, exc)
            return False
        if result == "allow":
            return True
        if result == "ignore":
            return None
        if result != "deny":
            self._bad(client_id, "authorization service %s: bad result %r: denied", self.url, result)
        return False

    def authorize(self, client_id: str, username: str | None, action: str, topic: str) -> bool | None:
        """The decision authorize_ahead just made for this packet (O(1)); None for what is
        not asked ahead (deliveries, the will, a rewritten topic)."""
        if action == "receive":
            return None
        now = self._now.get(client_id)
        if now is None:
            return None
        return now.pop((action, topic), None)


# ------------------------------------------------------------------ JWT


class JwtAuth(_Grants):
    """Authentication by a JSON Web Token in the CONNECT password; see the module docstring.

    ``key_file``: an HS* secret (the file's bytes, a trailing newline stripped) or a PEM public
    key; ``jwks_file``: a JWKS (one of the two); ``algorithms``: accepted ``alg`` values;
    ``audience``/``issuer``: required ``aud``/``iss`` when given; ``username_claim``: the claim
    the user name must equal (``sub`` when the token lacks it); ``acl_claim``: the rules;
    ``superuser_claim``; ``leeway``: seconds of clock skew allowed for ``exp``/``nbf``;
    ``pool``: a :class:`~broker.auth.CheckPool` to verify on instead of the event loop;
    ``watch_interval``: seconds between two looks at the key or JWKS file while the broker
    runs (0: not watched).

    Keys are read again by :meth:`reload`: by ``Broker.reload`` (SIGHUP to ``siftmq serve``,
    ``siftmq reload``) and, when the file's modification time, size or inode changed, by the
    watch (one ``stat`` per ``watch_interval``, on the loop).  A file that does not parse
    keeps the keys in use (a reload fails; the watch logs one warning per change of the
    file); the swap is one reference, so a verification on a pool thread sees the old or
    the new keys, whole."""

    _watcher: asyncio.Task[None] | None

    async def start(self) -> None:
        if self.watch_interval > 0 and self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if self.pool is not None:
            self.pool.close()

    def __init__(
        self,
        key_file: str | os.PathLike[str] | None = None,
        jwks_file: str | os.PathLike[str] | None = None,
        *,
        algorithms: Sequence[str] = ("HS256",),
        audience: str | None = None,
        issuer: str | None = None,
        username_claim: str = "username",
        acl_claim: str = "acl",
        superuser_claim: str = "is_superuser",
        leeway: float = 0.0,
        pool: CheckPool | None = None,
        watch_interval: float = 5.0,
    ) -> None:
        require(Extra.AUTH, "JwtAuth")
        import jwt  # at build time: an import on the event loop would stall it

        if (key_file is None) == (jwks_file is None):
            raise ValueError("JwtAuth: give exactly one of key_file and jwks_file")
        algs = tuple(algorithms)
        if not algs or any(a.lower() == "none" for a in algs):
            raise ValueError("JwtAuth: algorithms must name signing algorithms ('none' is refused)")
        unknown = set(algs) - set(jwt.algorithms.get_default_algorithms())
        if unknown:
            raise ValueError(f"JwtAuth: unknown algorithms {sorted(unknown)}")
        super().__init__()
        self.algorithms = list(algs)
        self.audience = audience
        self.issuer = issuer
        self.username_claim = username_claim
        self.acl_claim = acl_claim
        self.superuser_claim = superuser_claim
        self.leeway = leeway
        #: threads to verify on (None: on the event loop; see the module docstring)
        self.pool = pool
        self._jwt = jwt
        self.key: Any = None
        self.jwks: jwt.PyJWKSet | None = None
        self.failures = 0  # tokens refused (tests)
        if watch_interval < 0:
            raise ValueError("JwtAuth: watch_interval >= 0")
        #: the key file or the JWKS file (the other is None)
        self.key_file = None if key_file is None else Path(key_file)
        self.jwks_file = None if jwks_file is None else Path(jwks_file)
        self.watch_interval = watch_interval
        self.reloads = 0  # keys read again and swapped in (tests, the reload's log line)
        self._stamp: tuple[int, int, int] | None = None
        self._watcher = None
        self.reload()
        self.reloads = 0

    @property
    def path(self) -> Path:
        """The file the keys come from."""
        path = self.key_file or self.jwks_file
        assert path is not None
        return path

    def reload(self) -> None:
        """Read the key or JWKS file again and use it from the next token on; a file that
        cannot be read or parsed raises ValueError (OSError) naming it and changes nothing.
        O(file size)."""
        jwt = self._jwt
        path = self.path
        stamp = _file_stamp(path)
        try:
            if self.key_file is not None:
                data = path.read_bytes()
                key: Any = (
                    data.rstrip(b"\r\n")
                    if all(a.startswith("HS") for a in self.algorithms)
                    else data.decode("ascii")
                )
                # a PEM that does not parse fails here, not per token: some algorithm accepts it
                # (with HS and RS algorithms both allowed, HS refuses a PEM and RS takes it)
                algorithms = jwt.algorithms.get_default_algorithms()
                refusals: list[str] = []
                for alg in self.algorithms:
                    try:
                        algorithms[alg].prepare_key(key)
                        break
                    except (jwt.PyJWTError, ValueError, TypeError) as exc:
                        refusals.append(f"{alg}: {exc}")
                else:
                    raise ValueError("; ".join(refusals))
                self.key = key
            else:
                self.jwks = jwt.PyJWKSet.from_json(path.read_text())
        except (jwt.PyJWTError, UnicodeDecodeError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        self._stamp = stamp
        self.reloads += 1

    def keys(self) -> int:
        """How many keys are in use (1 for a key file)."""
        return 1 if self.jwks is None else len(self.jwks.keys)

    async def _watch(self) -> None:
        """Reload when the file changed (modification time, size or inode), every
        ``watch_interval`` seconds; a bad file is logged once per change and keeps the keys."""
        while True:
            await asyncio.sleep(self.watch_interval)
            try:
                stamp = _file_stamp(self.path)
            except OSError:
                continue  # being replaced: look again at the next turn
            if stamp == self._stamp:
                continue
            try:
                self.reload()
            except (OSError, ValueError) as exc:
                self._stamp = stamp  # said once for this version of the file
                log.warning("JwtAuth: %s: keys not reloaded, the previous ones stay in use", exc)
                continue
            log.info("JwtAuth: %d key(s) reloaded from %s (the file changed)", self.keys(), self.path)

    def _key_for(self, token: str) -> Any:
        jwt = self._jwt
        jwks = self.jwks
        if jwks is None:
            return self.key
        kid = jwt.get_unverified_header(token).get("kid")
        keys = jwks.keys
        if kid is None:
            if len(keys) != 1:
                raise jwt.InvalidTokenError("no kid and several keys in the JWKS")
            return keys[0].key
        for k in keys:
            if k.key_id == kid:
                return k.key
        raise jwt.InvalidTokenError(f"unknown kid {kid!r}")

    def authenticate_request(self, request: AuthRequest) -> AuthVerdict:
        """Verify the token on the loop (tens of microseconds), or with ``pool`` given on its
        threads (an awaitable; :class:`AuthUnavailable` when the pool is full)."""
        if request.password is None:
            return None  # no token: no opinion (anonymous rules apply)
        pool = self.pool
        if pool is None:
            return self._decided(request, self._verify(request))
        return self._offloaded(request, pool.submit(self._verify, request))

    async def _offloaded(self, request: AuthRequest, check: asyncio.Future[Grant | str]) -> bool:
        return self._decided(request, await check)

    def _decided(self, request: AuthRequest, outcome: Grant | str) -> bool:
        """Record the outcome on the loop: the client's grant, or the refusal (a reason)."""
        if isinstance(outcome, str):
            self.failures += 1
            log.debug("JWT of %s refused: %s", shown(request.client_id), cut(outcome))
            self._denied(request.client_id)
            return False
        self._granted(request.client_id, outcome)
        return True

    def _verify(self, request: AuthRequest) -> Grant | str:
        """The grant of a valid token, or why it is refused; touches no state (thread-safe)."""
        jwt = self._jwt
        try:
            token = (request.password or b"").decode("ascii")
            claims = jwt.decode(
                token,
                self._key_for(token),
                algorithms=self.algorithms,
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp"], "verify_aud": self.audience is not None},
            )
            name = claims.get(self.username_claim, claims.get("sub"))
            if name is not None and not isinstance(name, str):
                return f"claim {self.username_claim!r} is not a string"
            if request.username is not None and name != request.username:
                return "the user name is not the token's"
            acl = claims.get(self.acl_claim)
            return _grant(claims.get(self.superuser_claim), acl, name, request.client_id)
        except (jwt.InvalidTokenError, UnicodeDecodeError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"


def _file_stamp(path: Path) -> tuple[int, int, int]:
    """What tells a changed file: modification time (ns), size, inode (a file replaced by a
    rename has another). One ``stat``."""
    st = path.stat()
    return st.st_mtime_ns, st.st_size, st.st_ino


# ------------------------------------------------------------------ siftmq serve


def hooks_from_serve_options(options: Mapping[str, object]) -> list[Hooks]:
    """The hooks the ``auth_http_*`` / ``auth_jwt_*`` keys of ``[serve]`` configure (none
    without ``auth_http_url`` / a JWT key); ValueError for a bad value."""
    hooks: list[Hooks] = []

    def num(key: str, default: float) -> float:
        value = options.get(key, default)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValueError(f"[serve] {key} must be a number")
        return float(value)

    def text(key: str) -> str | None:
        value = options.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"[serve] {key} must be a string")
        return value

    def http(kind: type[_HttpService], url: str) -> Hooks:
        """``kind`` (HttpAuth or HttpAuthz) with the ``auth_http_*`` keys both share."""
        headers = options.get("auth_http_headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise ValueError("[serve] auth_http_headers must be a table of strings")
        return kind(
            url,
            timeout=num("auth_http_timeout", 5.0),
            retries=int(num("auth_http_retries", 1)),
            cache_ttl=num("auth_http_cache_ttl", 60.0),
            negative_ttl=num("auth_http_negative_ttl", 5.0),
            cache_size=int(num("auth_http_cache_size", 10_000)),
            headers=headers,
        )

    url = text("auth_http_url")
    if url is not None:
        hooks.append(http(HttpAuth, url))
    key_file, jwks_file = text("auth_jwt_key_file"), text("auth_jwt_jwks_file")
    if key_file is not None or jwks_file is not None:
        algorithms = options.get("auth_jwt_algorithms", ["HS256"])
        if isinstance(algorithms, str):
            algorithms = [algorithms]
        if not isinstance(algorithms, list | tuple) or not all(isinstance(a, str) for a in algorithms):
            raise ValueError("[serve] auth_jwt_algorithms must be a list of names")
        hooks.append(
            JwtAuth(
                key_file,
                jwks_file,
                algorithms=list(algorithms),
                audience=text("auth_jwt_audience"),
                issuer=text("auth_jwt_issuer"),
                username_claim=text("auth_jwt_username_claim") or "username",
                acl_claim=text("auth_jwt_acl_claim") or "acl",
                leeway=num("auth_jwt_leeway", 0.0),
                watch_interval=num("auth_jwt_watch_interval", 5.0),
            )
        )
    # last: the rules a client's identity carries (above) decide before the service
    authz_url = text("auth_http_authz_url")
    if authz_url is not None:
        hooks.append(http(HttpAuthz, authz_url))
    return hooks
