"""The live web dashboard and ``/metrics`` on the broker's HTTP listener (issue 28, item 2).

``siftmq serve --metrics-listen HOST:PORT`` (``BrokerConfig.metrics_listen``) opens one
HTTP/1.1 listener (:mod:`broker.net._http`) on the broker's loop. :class:`Dashboard` answers
its requests:

* ``GET /metrics`` -- Prometheus text (``prometheus_client.exposition.generate_latest`` over
  :func:`broker._metrics.registry_for`); 501 naming ``siftmq[metrics]`` when
  prometheus-client is not installed. Not behind the dashboard's login (scrapers).
* ``GET /`` (``/app.js``, ``/app.css``) -- the single-page dashboard, files shipped in the
  package (``broker/_static``), nothing fetched from elsewhere (the CSP says ``'self'``).
* ``GET /api/session|overview|history|clients|clients/<id>|subscriptions|topics|cluster|bridges``
  -- JSON (``broker._dashboard_data``; ``bridges``: the outbound bridges' snapshots of
  ``broker._admin_bridges``, as ``GET /api/v1/bridges``); lists paginated (``offset``,
  ``limit`` <= 500, ``q``).
* ``GET /api/events`` -- server-sent events: first a ``history`` event (the server-side
  history and the live points), then one ``overview`` event per sample (``interval``
  seconds) with the rates of messages in and out, built once per sample for every watcher.
  The live sampler runs only while a page is open (or for ``LINGER`` seconds after an
  overview request).
* **Server-side history** (:mod:`broker._history`): a recorder task, from ``start`` to
  ``stop``, appends a point every ``dashboard_history_interval`` seconds (5) to a ring per
  series of ``dashboard_history_points`` (180: 15 minutes), page open or not, so a page opened
  now draws the last 15 minutes at once. A point reads a few counters and ``/proc`` (about
  30 us every 5 s: benchmarks/bench_history.py, docs/dashboard.md). ``GET /api/history``
  returns it as ``history``.
* ``POST /api/kick`` -- ``{"client_id": ...}``: disconnects the client (MQTT 5: DISCONNECT
  0x98 Administrative action).
* ``/api/v1/...`` -- the admin API (``broker._admin``, docs/admin.md), behind the same login,
  admin role and CSRF rules (GET, POST and DELETE).

**Who may look.** Without a password file on a loopback listener the dashboard is open (as
the loopback MQTT listener is to anonymous clients), and requests must name a loopback or
IP-literal ``Host`` (no DNS rebinding). With a password file (a :class:`broker.auth.FileAuth`
hook), or on any other listener, every dashboard request needs HTTP Basic credentials of the
password file (401 without or with wrong ones; scrypt runs in a worker thread, at most two
at once, and a verified password is remembered as an HMAC) and the user must be in
``BrokerConfig.dashboard_admins`` (403 otherwise). Retained payloads are shown only for
topics the user's ACL lets it read (``authorize(..., "receive", topic)`` of the broker's
hooks); nothing shows a password.

**State-changing requests** (``POST /api/kick``) need a JSON body, a same-origin request
(``Origin`` equal to the ``Host``, ``Sec-Fetch-Site`` same-origin when the browser sends
them) and the ``X-CSRF-Token`` header from ``/api/session`` (an HMAC of the user under a
per-process key): a cross-site form cannot send it, and a cross-origin script cannot read it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import hashlib
import hmac
import ipaddress
import logging
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

import orjson

from broker import _dashboard_data as data
from broker._admin import Admin
from broker._admin_bridges import list_bridges
from broker._extras import Extra, MissingExtra, require
from broker._history import History
from broker._logging import bounded
from broker.auth import FileAuth
from broker.net import HttpServer, Request, Response
from broker.packets import ReasonCode

if TYPE_CHECKING:
    from broker._broker import Broker

__all__ = ["ASSETS", "Dashboard", "DashboardProvider"]

log = logging.getLogger("broker.dashboard")

#: a package's section of the dashboard (the cluster's): a callable returning JSON-ready data
DashboardProvider = Callable[[], Mapping[str, Any]]

#: the files of the single-page dashboard: URL path -> (file in broker/_static, content type)
ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/app.css": ("app.css", "text/css; charset=utf-8"),
}

_JSON = "application/json"
_REALM = (("WWW-Authenticate", 'Basic realm="siftmq dashboard", charset="UTF-8"'),)
#: samples kept for the charts (one per ``interval``)
HISTORY = 300
#: seconds the sampler keeps running after the last overview request with no page open
LINGER = 10.0


def _json(status: int, body: object) -> Response:
    return Response(status, orjson.dumps(body), _JSON)


def _error(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, orjson.dumps({"error": message}), _JSON, headers)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8080`` -> ``::1``)."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class Dashboard:
    """Request handler of the broker's HTTP listener (see the module docstring)."""

    def __init__(self, broker: Broker, listen_host: str, interval: float = 1.0) -> None:
        self.broker = broker
        self.core = broker.core
        self.interval = interval
        self.admins = frozenset(broker.config.dashboard_admins)
        self.enabled = broker.config.dashboard
        self.auth = next((h for h in broker.hooks if isinstance(h, FileAuth)), None)
        self.auth_required = (self.auth is not None and self.auth.passwords is not None) or not _loopback(
            listen_host
        )
        self._key = secrets.token_bytes(32)
        self._verified: dict[str, bytes] = {}
        self._verified_for: object = None  # the PasswordFile those logins were verified against
        self._scrypt = asyncio.Semaphore(2)
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._event = asyncio.Event()
        self._latest = b""
        self._sampler: asyncio.Task[None] | None = None
        cfg = broker.config
        #: the server-side history (a ring per series), recorded while the broker runs
        self.recorded = History(cfg.dashboard_history_points, cfg.dashboard_history_interval)
        self._recorder: asyncio.Task[None] | None = None
        self._counted: tuple[float, int, int, int] | None = None  # the recorder's last counters
        self._seen = 0.0  # monotonic time of the last request that needs the sampler
        self._last: tuple[float, int, int] | None = None
        self.watchers = 0
        #: the listener serving this dashboard (its counters go to /metrics; set by the broker)
        self.http: HttpServer | None = None
        #: CPU time (this thread) spent sampling and answering requests: the dashboard's own
        #: cost, read by benchmarks/bench_dashboard.py
        self.cpu_seconds = 0.0
        #: the admin API under /api/v1/ (same login, admin role and CSRF rules)
        self.admin = Admin(broker, self.may_read)
        self.assets = {
            path: (resources.files("broker").joinpath("_static", name).read_bytes(), ctype)
            for path, (name, ctype) in ASSETS.items()
        }

    # ------------------------------------------------------------ life cycle
    def start(self) -> None:
        """The history recorder starts (one point every ``dashboard_history_interval``); the
        live sampler waits for the first page (:meth:`wake`)."""
        if self.enabled and self._recorder is None:
            self.record()  # the counters' baseline: the first point comes one interval later
            self._recorder = asyncio.get_running_loop().create_task(self._record_loop())

    async def stop(self) -> None:
        for task in (self._sampler, self._recorder):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._sampler = self._recorder = None

    async def _record_loop(self) -> None:
        while True:
            await asyncio.sleep(self.recorded.interval)
            try:
                self.record()
            except Exception:
                log.exception("dashboard history sample failed")

    def record(self) -> None:
        """One point of the server-side history: rates since the previous call, gauges now
        (the first call only takes the counters' baseline). O(series): no per-client work."""
        t0 = time.thread_time()
        core = self.core
        now = core.clock.monotonic()
        st = core.stats
        counters = (now, st.messages_received, st.messages_sent, st.messages_internal)
        last, self._counted = self._counted, counters
        if last is not None and now > last[0]:
            dt = now - last[0]
            ring_t = self.recorded.rings["t"].last()
            wall = core.clock.wall()
            self.recorded.record(
                {
                    "t": round(wall if ring_t is None else max(wall, ring_t), 3),
                    "rate_in": round((counters[1] - last[1]) / dt, 1),
                    "rate_out": round((counters[2] - last[2]) / dt, 1),
                    "rate_internal": round((counters[3] - last[3]) / dt, 1),
                    "connections": core.connected,
                    "memory_rss": data.memory_rss(),
                    "publishers_paused": st.publishers_paused,
                    "slow_consumers": st.slow_consumers,
                }
            )
        self.cpu_seconds += time.thread_time() - t0

    @property
    def sampling(self) -> bool:
        """Whether the sampler runs (a page is open, or an overview was asked for lately)."""
        return self._sampler is not None and not self._sampler.done()

    def wake(self) -> None:
        """Someone looks (an event stream, an overview or history request): sample now and
        every ``interval`` while a page is open or for :data:`LINGER` seconds after the last
        such request. The live points (one a second) start when a page opens; the charts
        begin with the server-side history (:attr:`recorded`, one point every 5 s)."""
        self._seen = self.core.clock.monotonic()
        if self._sampler is None or self._sampler.done():
            self.history.clear()
            self._last = None
            self.sample()
            self._sampler = asyncio.get_running_loop().create_task(self._sample_loop())

    async def _sample_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if self.watchers == 0 and self.core.clock.monotonic() - self._seen > LINGER:
                return
            try:
                self.sample()
            except Exception:
                log.exception("dashboard sample failed")

    def sample(self) -> None:
        """Read the counters once: rates since the previous sample, the overview JSON every
        watcher is sent, and one point of the charts' history. O(connections) (the
        ``$SYS`` count of connected clients)."""
        t0 = time.thread_time()
        core = self.core
        now = core.clock.monotonic()
        st = core.stats
        rx, tx = st.messages_received, st.messages_sent
        last = self._last
        dt = now - last[0] if last is not None else 0.0
        rate_in = (rx - last[1]) / dt if last is not None and dt > 0 else 0.0
        rate_out = (tx - last[2]) / dt if last is not None and dt > 0 else 0.0
        self._last = (now, rx, tx)
        ov = data.overview(core, now, data.memory_rss())
        point = {
            "t": round(core.clock.wall(), 3),
            "rate_in": round(rate_in, 1),
            "rate_out": round(rate_out, 1),
            "connections": ov["clients_connected"],
            "memory_rss": ov["memory_rss"],
            "publishers_paused": ov["publishers_paused"],
            "slow_consumers": ov["slow_consumers"],
        }
        self.history.append(point)
        ov["rate_in"], ov["rate_out"], ov["t"] = point["rate_in"], point["rate_out"], point["t"]
        ov["dashboard"] = {"watchers": self.watchers, "cpu_seconds": round(self.cpu_seconds, 6)}
        self._latest = orjson.dumps(ov)
        event, self._event = self._event, asyncio.Event()
        event.set()
        self.cpu_seconds += time.thread_time() - t0

    # ------------------------------------------------------------ requests
    async def handle(self, req: Request, peer: str) -> Response:
        """Answer one request; its CPU time is added to :attr:`cpu_seconds` (with whatever
        else the loop ran while it awaited: an upper bound)."""
        t0 = time.thread_time()
        try:
            return await self._handle(req)
        finally:
            self.cpu_seconds += time.thread_time() - t0

    async def _handle(self, req: Request) -> Response:
        path = req.path
        if path == "/metrics":
            return self._metrics(req)
        if not self.enabled:
            return _error(404, "the dashboard is off (dashboard = false)")
        api = path.startswith("/api/v1/")  # the admin API (broker/_admin.py): its own 405s
        if req.method not in ("GET", "HEAD", "POST") and not api:
            return _error(405, f"method {req.method} not allowed", (("Allow", "GET, HEAD, POST"),))
        refused, user = await self._login(req)
        if refused is not None:
            return refused
        if api:  # 404 / 405 with the path's methods first, then the CSRF rules of a change
            resp = await self.admin.handle(req, user, self.csrf(user), lambda: self._same_origin(req, user))
        else:
            resp = await self._answer(req, user)
        # valid credentials: the connection leaves the HTTP listener's unauthenticated pool
        return dataclasses.replace(resp, authenticated=True) if self.auth_required else resp

    async def _answer(self, req: Request, user: str | None) -> Response:
        path = req.path
        asset = self.assets.get(path)
        if asset is not None:
            if req.method == "POST":
                return _error(405, "POST not allowed here", (("Allow", "GET, HEAD"),))
            return Response(200, asset[0], asset[1])
        if not path.startswith("/api/"):
            return _error(404, f"no page {path[:100]!r}")
        if req.method == "POST":
            return self._post(req, user)
        return await self._get(req, user)

    def _metrics(self, req: Request) -> Response:
        if req.method not in ("GET", "HEAD"):
            return _error(405, "GET /metrics", (("Allow", "GET, HEAD"),))
        try:
            require(Extra.METRICS, "/metrics")
            from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

            from broker._metrics import registry_for
        except MissingExtra as exc:
            return _error(501, str(exc))
        except ImportError:
            why = "/metrics: prometheus-client cannot be imported: pip install 'siftmq[metrics]'"
            return _error(501, why)
        return Response(200, generate_latest(registry_for(self.core, self.http)), CONTENT_TYPE_LATEST)

    async def _login(self, req: Request) -> tuple[Response | None, str | None]:
        """(a refusal, or None and the user name: None when no login is required)."""
        if not self.auth_required:
            if not _loopback(_host_name(req.headers.get("host", ""))) and not self._ip_literal(req):
                return _error(403, "Host must be a loopback address (no login on this listener)"), None
            return None, None
        passwords = self.auth.passwords if self.auth is not None else None
        if passwords is None:
            return _error(401, "no password file configured: nobody can log in here", _REALM), None
        creds = _basic(req.headers.get("authorization"))
        if creds is None:
            return _error(401, "credentials required (HTTP Basic, a user of the password file)", _REALM), None
        user, password = creds
        if passwords is not self._verified_for:  # FileAuth.reload(): forget what was verified
            self._verified, self._verified_for = {}, passwords
        mac = hmac.new(self._key, user.encode() + b"\0" + password, hashlib.sha256).digest()
        known = self._verified.get(user)
        if known is None or not hmac.compare_digest(known, mac):
            # scrypt off the loop, two at a time; the slot is held until the thread ends even
            # when the request is cancelled (the listener closed its connection)
            await self._scrypt.acquire()
            check = asyncio.ensure_future(asyncio.to_thread(passwords.verify, user, password))
            check.add_done_callback(self._scrypt_done)
            ok = await asyncio.shield(check)
            if not ok:
                return _error(401, "wrong user name or password", _REALM), None
            self._verified[user] = mac
        if user not in self.admins:
            return _error(403, f"user {user!r} is not a dashboard admin (dashboard_admins)"), user
        return None, user

    def _scrypt_done(self, check: asyncio.Future[bool]) -> None:
        self._scrypt.release()
        if not check.cancelled():
            check.exception()  # retrieved: a cancelled request's failed check is not "never retrieved"

    @staticmethod
    def _ip_literal(req: Request) -> bool:
        try:
            ipaddress.ip_address(_host_name(req.headers.get("host", "")).strip("[]"))
        except ValueError:
            return False
        return True

    def csrf(self, user: str | None) -> str:
        return hmac.new(self._key, b"csrf\0" + (user or "").encode(), hashlib.sha256).hexdigest()

    def may_read(self, user: str | None) -> Callable[[str], bool]:
        """Whether ``user`` may read a topic's payload: the broker's authorize hooks for
        ``receive`` (the first with an opinion decides; none: allowed)."""
        hooks = self.core.obs.authorize

        def check(topic: str) -> bool:
            for h in hooks:
                try:
                    answer = h.authorize("$dashboard", user, "receive", topic)
                except Exception:
                    log.exception("authorize hook failed")
                    return False
                if answer is not None:
                    return bool(answer)
            return True

        return check

    async def _get(self, req: Request, user: str | None) -> Response:
        path, q = req.path, req.query
        core = self.core
        now = core.clock.monotonic()
        try:
            if path == "/api/session":
                return _json(
                    200,
                    {
                        "user": user,
                        "admin": True,
                        "login": self.auth_required,
                        "csrf": self.csrf(user),
                        "node": core.node,
                    },
                )
            if path == "/api/overview":
                self.wake()
                ov = data.overview(core, now, data.memory_rss())
                last = self.history[-1] if self.history else {}
                ov["rate_in"], ov["rate_out"] = last.get("rate_in", 0.0), last.get("rate_out", 0.0)
                ov["dashboard"] = {"watchers": self.watchers, "cpu_seconds": round(self.cpu_seconds, 6)}
                return _json(200, ov)
            if path == "/api/history":
                self.wake()
                return _json(200, self._history_json())
            if path == "/api/events":
                return Response(
                    200,
                    content_type="text/event-stream",
                    headers=(("X-Accel-Buffering", "no"),),
                    stream=self._events(),
                )
            if path == "/api/clients":
                off, lim = data.page_bounds(q.get("offset"), q.get("limit"))
                return _json(200, await _run_steps(data.client_page(core, q.get("q", "")[:200], off, lim)))
            if path.startswith("/api/clients/"):
                cid = path[len("/api/clients/") :]
                detail = data.client_detail(core, cid, now)
                if detail is None:
                    return _error(404, f"no client {cid[:100]!r}")
                return _json(200, detail)
            if path == "/api/subscriptions":
                off, lim = data.page_bounds(q.get("offset"), q.get("limit"))
                return _json(
                    200, await _run_steps(data.subscription_page(core, q.get("q", "")[:200], off, lim))
                )
            if path == "/api/topics":
                off, lim = data.page_bounds(q.get("offset"), q.get("limit"), 200)
                prefix = q.get("prefix")
                return _json(200, data.topic_level(core, prefix, off, lim, self.may_read(user)))
            if path == "/api/bridges":  # outbound bridges (broker._admin_bridges): the admin API's rows
                return _json(200, {"bridges": [st.to_json() for st in list_bridges(self.broker)]})
            if path == "/api/cluster":
                providers = self.broker.dashboard_providers
                if not providers:
                    return _json(200, {"clustered": False})
                return _json(200, {"clustered": True, **{name: p() for name, p in providers.items()}})
        except ValueError as exc:
            return _error(400, str(exc))
        return _error(404, f"no API {path[:100]!r}")

    async def _events(self) -> AsyncIterator[bytes]:
        self.watchers += 1
        self.wake()
        try:
            history = orjson.dumps(self._history_json())
            yield (
                b"retry: 2000\nevent: history\ndata: "
                + history
                + b"\n\nevent: overview\ndata: "
                + self._latest
                + b"\n\n"
            )
            while True:
                await self._event.wait()
                yield b"event: overview\ndata: " + self._latest + b"\n\n"
        finally:
            self.watchers -= 1

    def _history_json(self) -> dict[str, Any]:
        """The live points (``interval`` s, since a page opened) and the server-side history
        (``history``: ``dashboard_history_interval`` s, the last ``dashboard_history_points``)."""
        return {"interval": self.interval, "points": list(self.history), "history": self.recorded.as_json()}

    def _post(self, req: Request, user: str | None) -> Response:
        refused = self._same_origin(req, user)
        if refused is not None:
            return refused
        if req.path != "/api/kick":
            return _error(404, f"no API {req.path[:100]!r}")
        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError as exc:
            return _error(400, f"bad JSON: {exc}")
        if not isinstance(body, dict) or not isinstance(body.get("client_id"), str):
            return _error(400, 'expected {"client_id": "<id>"}')
        cid: str = body["client_id"]
        session = self.core.sessions.get(cid)
        if session is None:
            return _error(404, f"no client {cid[:100]!r}")
        conn = session.conn
        if conn is None:
            return _error(409, f"client {cid[:100]!r} is not connected")
        who = user or "local"
        conn.disconnect(ReasonCode.ADMINISTRATIVE_ACTION, f"disconnected by dashboard user {who}")
        self.core.flush()
        log.info("client %s disconnected by dashboard user %s", bounded(cid), bounded(who))
        return _json(200, {"kicked": cid})

    def _same_origin(self, req: Request, user: str | None) -> Response | None:
        h = req.headers
        if not h.get("content-type", "").startswith(_JSON):
            return _error(415, "send application/json")
        site = h.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return _error(403, f"cross-site request refused (Sec-Fetch-Site: {site[:40]})")
        origin = h.get("origin")
        host = h.get("host", "")
        if origin is not None and origin not in (f"http://{host}", f"https://{host}"):
            return _error(403, "cross-origin request refused (Origin does not match Host)")
        token = h.get("x-csrf-token", "")
        if not hmac.compare_digest(token.encode(), self.csrf(user).encode()):
            return _error(403, "missing or wrong X-CSRF-Token (GET /api/session gives it)")
        return None


async def _run_steps(steps: data.Steps) -> dict[str, Any]:
    """Run a chunked scan (``broker._dashboard_data.Steps``), yielding to the loop between steps."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            result: dict[str, Any] = stop.value
            return result
        await asyncio.sleep(0)


def _basic(header: str | None) -> tuple[str, bytes] | None:
    """``Authorization: Basic ...`` -> (user, password); None when absent or malformed."""
    if header is None:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None
