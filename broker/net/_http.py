"""A small HTTP/1.1 server for the broker's own endpoints (``/metrics``, the dashboard).

Issue 28, item 2; issue 37, item 5 (a listener that cannot be starved). Two halves, as for
MQTT:

* **sans-IO** -- :class:`HttpConnection` parses with `h11 <https://h11.readthedocs.io>`_
  (the well-kept sans-IO HTTP/1.1 parser; this module used to carry its own, which raised on
  ``Content-Length: ²`` and on a target like ``//[x/``): bytes in, :class:`Request` records
  out, one at a time and in order (a pipelined request is parsed once the one before it is
  answered; each keep-alive cycle gets a fresh ``h11.Connection`` fed with the bytes left
  over), a :class:`Response` out as bytes written by :func:`encode_head` (always
  ``Content-Length`` framing: h11's validation of our own response headers cost 2-3 times
  the parse, benchmarks/bench_http.py). What it does not accept raises :class:`HttpError`
  carrying the status to answer:
  a malformed request line, header, target or length (400), a target over ``max_target``
  bytes (414), a request head over ``max_head`` bytes (431), a body over ``max_body`` bytes
  (413, decided from ``Content-Length`` before the body is read), ``Transfer-Encoding``
  (501: no chunked uploads), another version than HTTP/1.x (505), each answered with a JSON
  body ``{"error": reason}`` (:meth:`Response.error`, as the dashboard and the admin API
  answer their own refusals). A request that is fine
  but comes before a bad one in the same read is answered first. Every response carries
  :data:`SECURITY_HEADERS` (``X-Content-Type-Options: nosniff``, ``Cache-Control:
  no-store``, a strict ``Content-Security-Policy``: no inline script, nothing fetched from
  elsewhere) unless it sets the same header itself.
* **asyncio adapter** -- :func:`serve_http` runs one ``asyncio.start_server`` on the broker's
  loop and calls an async handler per request (keep-alive connections, requests answered in
  order). A :class:`Response` with a ``stream`` (server-sent events) is written chunk by
  chunk and ends the connection when the stream ends; :meth:`HttpServer.close` ends open
  streams too.

**Nobody can starve the listener** (:class:`HttpLimits`, ``BrokerConfig.http_*``,
docs/security.md "HTTP listener"). A connection is in one of three pools:

* *unauthenticated* -- it has not yet sent a request the handler marked
  :attr:`Response.authenticated` (valid credentials), or its first request is still
  incomplete. At most ``max_unauthenticated`` (64); a new connection beyond that (or beyond
  ``max_connections``) closes the one of this pool that has waited longest since its last
  complete request (a slowloris head is always older than a scraper that just connected, so
  partial heads cannot keep ``/metrics`` out: they are what goes).
* *streams* -- an event stream (``/api/events``) is running. At most ``max_streams`` (32);
  one more is answered 503 (the connection serves on), so streams never take the slots of
  ``/metrics`` or the JSON API.
* *authenticated* -- the rest, up to ``max_connections`` (256) in all; only a holder of valid
  credentials gets here.

Time limits: a request (head and body) must arrive within ``request_timeout`` (10 s) of its
first byte (a new connection: of its accept), else 408 and close, however slowly it trickles;
a keep-alive connection idle for ``idle_timeout`` (30 s) between requests is closed; a
response (or a stream's chunk) that the peer does not read within ``write_timeout`` (30 s)
closes the connection. Every refusal is counted in :class:`HttpStats` (``siftmq_http_*`` in
``/metrics``) and logged at most once per 10 s per kind, without a traceback.

Nothing here knows the dashboard: handlers are plain callables (``broker._dashboard``).
Cost per request: O(size of the request and response); h11's parse adds about 50-60 µs of
CPU per request over the old parser (docs/security.md, "HTTP listener"). The pools are
dicts: O(1) per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qsl, unquote

import h11

from broker._logging import LogLimiter

__all__ = [
    "SECURITY_HEADERS",
    "HttpConnection",
    "HttpError",
    "HttpLimits",
    "HttpServer",
    "HttpStats",
    "Request",
    "Response",
    "encode_head",
    "parse_listen",
    "serve_http",
]

log = logging.getLogger("broker.http")

#: headers every response gets unless it sets the same name itself
SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    ("X-Content-Type-Options", "nosniff"),
    ("Cache-Control", "no-store"),
    (
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'; "
        "form-action 'self'; base-uri 'none'",
    ),
    ("Referrer-Policy", "same-origin"),
    ("X-Frame-Options", "DENY"),
)

#: the blank line ending a request head (h11 accepts a bare LF too)
_HEAD_END = re.compile(rb"\n\r?\n")

#: seconds a refused connection's remaining input is read and dropped before the close
LINGER = 2.0

#: seconds between two log lines of the same kind of refusal (as ``Core.log_limit``)
LOG_INTERVAL = 10.0


class HttpError(Exception):
    """A request refused before it reached a handler: ``status`` and a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed request. ``headers``: lower-case names (a repeated header: the values
    joined with ``", "``); ``path`` percent-decoded; ``query`` the last value per key."""

    method: str
    target: str
    path: str
    query: Mapping[str, str]
    version: str
    headers: Mapping[str, str]
    body: bytes = b""

    @property
    def keep_alive(self) -> bool:
        conn = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn


@dataclass(frozen=True, slots=True)
class Response:
    """A response: a ``body``, or a ``stream`` of chunks written as they come (the
    connection closes after it). ``authenticated``: the request carried valid credentials,
    so its connection leaves the unauthenticated pool (see the module docstring)."""

    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    stream: AsyncIterator[bytes] | None = field(default=None, compare=False)
    authenticated: bool = False

    @classmethod
    def text(cls, status: int, text: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
        return cls(status, (text.rstrip("\n") + "\n").encode(), headers=headers)

    @classmethod
    def error(cls, status: int, reason: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
        """A JSON error ``{"error": reason}``, the shape of every refusal of the dashboard and
        the admin API (docs/admin.md, "Errors"): the listener's own refusals (413, 501, 503,
        ...) look the same to a client. O(len(reason))."""
        return cls(status, json.dumps({"error": reason}).encode(), "application/json", headers)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def encode_head(resp: Response, keep_alive: bool, head_only: bool = False) -> bytes:
    """The status line and headers of ``resp`` (``Content-Length`` unless it streams),
    written directly: for the heads h11 does not frame (an error after which the connection
    closes, an event stream delimited by the close)."""
    lines = [f"HTTP/1.1 {resp.status} {_phrase(resp.status)}", f"Content-Type: {resp.content_type}"]
    if resp.stream is None:
        lines.append(f"Content-Length: {len(resp.body)}")
    own = {name.lower() for name, _ in resp.headers}
    lines.extend(f"{k}: {v}" for k, v in resp.headers)
    lines.extend(f"{k}: {v}" for k, v in SECURITY_HEADERS if k.lower() not in own)
    lines.append("Connection: " + ("keep-alive" if keep_alive and resp.stream is None else "close"))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def error_bytes(status: int, reason: str) -> bytes:
    """A complete JSON error response (:meth:`Response.error`) that closes the connection."""
    resp = Response.error(status, reason)
    return encode_head(resp, False) + resp.body


class HttpConnection:
    """One server-side HTTP/1.1 connection (sans-IO, over ``h11.Connection``).

    :meth:`feed` bytes (``b""``: the peer closed), take requests with :meth:`next_request`
    (None: more bytes needed), answer each with :meth:`respond` before asking for the next
    one, then :meth:`next_cycle` says whether the connection stays open. After an
    :class:`HttpError` the connection must be answered (:func:`error_bytes`) and closed."""

    __slots__ = ("_body", "_h", "_head", "_keep", "_last", "eof", "max_body", "max_head", "max_target")

    def __init__(self, max_head: int = 8192, max_body: int = 65536, max_target: int = 4096) -> None:
        self._h = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head)
        self.max_head = max_head
        self._head: Request | None = None  # head parsed, body still coming
        self._last: Request | None = None  # the request being answered
        self._keep = False
        self._body = bytearray()
        self.max_body = max_body
        self.max_target = max_target
        self.eof = False

    def feed(self, data: bytes) -> None:
        if not data:
            self.eof = True
        self._h.receive_data(data)

    @property
    def in_request(self) -> bool:
        """Whether part of a request has arrived (a head or body incomplete)."""
        return self._head is not None or bool(self._h.trailing_data[0])

    def next_request(self) -> Request | None:
        """The next complete request, or None until more bytes come (raises
        :class:`HttpError`). O(bytes parsed)."""
        while True:
            if self._head is None and self._h.their_state is h11.IDLE:
                self._check_head_size()
            try:
                event = self._h.next_event()
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                raise HttpError(
                    status if 400 <= status < 600 else 400, str(exc)[:200] or "bad request"
                ) from None
            match event:
                case h11.Request():
                    self._head = self._parse_head(event)
                    self._body.clear()
                case h11.Data():
                    self._body += event.data
                    if len(self._body) > self.max_body:  # pragma: no cover - Content-Length is checked first
                        raise HttpError(413, f"request body over {self.max_body} bytes")
                case h11.EndOfMessage():
                    head, self._head = self._head, None
                    assert head is not None
                    if self._body:
                        body = bytes(self._body)
                        self._body.clear()
                        head = Request(
                            head.method, head.target, head.path, head.query, head.version, head.headers, body
                        )
                    self._last = head
                    return head
                case _:  # NEED_DATA, PAUSED (the answer is owed first), ConnectionClosed
                    return None

    def _check_head_size(self) -> None:
        """431 for a head over ``max_head`` bytes even when it arrived whole in one read (h11
        bounds only what it buffers incomplete). O(buffered bytes)."""
        buf = self._h.trailing_data[0]
        if len(buf) > self.max_head and _HEAD_END.search(buf, 0, self.max_head + 4) is None:
            raise HttpError(431, f"request head over {self.max_head} bytes")

    def _parse_head(self, event: h11.Request) -> Request:
        version = event.http_version.decode("ascii", "replace")
        if version not in ("1.1", "1.0"):
            raise HttpError(505, f"unsupported version HTTP/{version[:20]}")
        headers: dict[str, str] = {}
        for name, value in event.headers:
            key = name.decode("latin-1")
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        if "transfer-encoding" in headers:
            raise HttpError(501, "Transfer-Encoding is not supported (send Content-Length)")
        length = int(headers.get("content-length", "0") or 0)  # h11 checked: ASCII digits, one value
        if length > self.max_body:
            raise HttpError(413, f"request body over {self.max_body} bytes")
        target = event.target.decode("latin-1")  # h11 checked: visible ASCII
        if len(target) > self.max_target:
            raise HttpError(414, f"request target over {self.max_target} bytes")
        if not target.startswith("/"):
            raise HttpError(400, "request target must be a path")
        path, _, query = target.partition("#")[0].partition("?")
        return Request(
            event.method.decode("latin-1"),
            target,
            unquote(path, errors="replace"),
            dict(parse_qsl(query, keep_blank_values=True, errors="replace")),
            "HTTP/" + version,
            headers,
        )

    def respond(self, resp: Response, head_only: bool = False) -> bytes:
        """The bytes of ``resp`` (not a stream: :func:`encode_head` writes those) to the last
        request; ``head_only`` for a HEAD request (the headers of the GET, no body). The head
        is written by :func:`encode_head`, not by h11: the framing is always
        ``Content-Length`` and h11's validation of the response's own headers cost 2 to 3
        times the parse (benchmarks/bench_http.py); keep-alive as the request asks
        (HTTP/1.1 unless ``Connection: close``, HTTP/1.0 only with ``keep-alive``)."""
        last = self._last
        self._keep = last is not None and last.keep_alive
        head = encode_head(resp, self._keep)
        return head if head_only else head + resp.body

    def next_cycle(self) -> bool:
        """After :meth:`respond`: True when the connection stays open for the next request
        (keep-alive), False when it must close. The next request is parsed by a fresh h11
        connection fed with what is buffered after the last one (pipelined bytes): O(1) plus
        the buffered bytes."""
        if not self._keep:
            return False
        rest, closed = self._h.trailing_data
        self._h = h11.Connection(h11.SERVER, max_incomplete_event_size=self.max_head)
        if rest:
            self._h.receive_data(rest)
        if closed:
            self._h.receive_data(b"")
        self._last = None
        self._keep = False
        return True


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); ValueError when malformed."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics listen address must be HOST:PORT, not {value!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The caps and time limits of the listener (module docstring; ``BrokerConfig.http_*``)."""

    max_connections: int = 256
    max_unauthenticated: int = 64
    max_streams: int = 32
    request_timeout: float = 10.0
    idle_timeout: float = 30.0
    write_timeout: float = 30.0
    max_head: int = 8192
    max_body: int = 65536
    max_target: int = 4096

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_unauthenticated", "max_streams", "max_head", "max_target"):
            if getattr(self, name) < 1:
                raise ValueError(f"http {name} must be at least 1")
        for name in ("request_timeout", "idle_timeout", "write_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"http {name} must be positive (seconds)")
        if self.max_body < 0:
            raise ValueError("http max_body must not be negative")
        if self.max_unauthenticated > self.max_connections or self.max_streams > self.max_connections:
            raise ValueError("http max_unauthenticated and max_streams must not exceed max_connections")


@dataclass(slots=True)
class HttpStats:
    """What the listener refused (``siftmq_http_<field>_total`` in ``/metrics``)."""

    #: new connections answered 503: every slot taken and none of them unauthenticated
    connections_refused: int = 0
    #: unauthenticated connections closed (the longest waiting) to admit a new one
    connections_evicted: int = 0
    #: event streams answered 503 (``max_streams`` open)
    streams_refused: int = 0
    #: requests not complete ``request_timeout`` seconds after their first byte (408)
    request_timeouts: int = 0
    #: keep-alive connections closed after ``idle_timeout`` seconds without a request
    idle_timeouts: int = 0
    #: connections closed because the peer did not read a response for ``write_timeout``
    write_timeouts: int = 0
    #: malformed or refused requests (4xx, 501, 505 before a handler)
    bad_requests: int = 0


class _Slot:
    """One open connection's place in the pools."""

    __slots__ = ("task", "trusted", "writer")

    def __init__(self, task: asyncio.Task[None], writer: asyncio.StreamWriter) -> None:
        self.task = task
        self.writer = writer
        self.trusted = False


Handler = Callable[[Request, str], Awaitable[Response]]
LogLimit = Callable[[str, str], None]


class _Closed(Exception):
    """The connection is over (a timeout or the peer gone): nothing more to write."""


class HttpServer:
    """The listening socket and its open connections (:func:`serve_http`)."""

    def __init__(self, handler: Handler, limits: HttpLimits | None = None) -> None:
        self.handler = handler
        self.limits = limits or HttpLimits()
        self.stats = HttpStats()
        self.server: asyncio.Server | None = None
        self.slots: dict[_Slot, None] = {}
        #: unauthenticated connections, the longest waiting first (LRU of complete requests)
        self.unauthenticated: dict[_Slot, None] = {}
        self.streams = 0
        self._logged = LogLimiter(LOG_INTERVAL)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    @property
    def max_connections(self) -> int:
        return self.limits.max_connections

    @property
    def writers(self) -> list[asyncio.StreamWriter]:
        return [s.writer for s in self.slots]

    def log_limit(self, kind: str, what: str) -> None:
        """Log ``what`` at most once per :data:`LOG_INTERVAL` seconds per ``kind`` (no traceback)."""
        if self._logged.due(kind, time.monotonic()):
            log.info("http: %s (further %s not logged for %g s)", what, kind, LOG_INTERVAL)

    async def close(self) -> None:
        """Stop listening, close every connection (streams included) and wait for them."""
        if self.server is not None:
            self.server.close()
        tasks = [s.task for s in self.slots]
        for s in list(self.slots):
            s.writer.close()
            s.task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2.0)
            self.server = None

    # ------------------------------------------------------------ admission
    def _admit(self, slot: _Slot) -> bool:
        """Take a slot for a new connection, closing the longest-waiting unauthenticated one
        while a cap is reached; False when every slot is authenticated or streaming. O(1)
        amortised."""
        lim = self.limits
        while len(self.slots) >= lim.max_connections or len(self.unauthenticated) >= lim.max_unauthenticated:
            if not self.unauthenticated:
                return False
            oldest = next(iter(self.unauthenticated))
            self._drop(oldest)
            self.stats.connections_evicted += 1
            self.log_limit(
                "evictions", "unauthenticated connections over the cap: closing the longest waiting"
            )
            oldest.writer.close()
            oldest.task.cancel()
        self.slots[slot] = None
        self.unauthenticated[slot] = None
        return True

    def _drop(self, slot: _Slot) -> None:
        self.slots.pop(slot, None)
        self.unauthenticated.pop(slot, None)

    def _touch(self, slot: _Slot) -> None:
        """A complete request: the connection goes to the young end of the eviction order."""
        if slot in self.unauthenticated:
            del self.unauthenticated[slot]
            self.unauthenticated[slot] = None

    # ------------------------------------------------------------ connections
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        slot = _Slot(task, writer)
        try:
            if not self._admit(slot):
                self.stats.connections_refused += 1
                self.log_limit("refusals", f"{self.limits.max_connections} connections open: 503")
                writer.write(error_bytes(503, "too many connections"))
                return
            await self._serve(slot, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, _Closed):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("http connection failed")
        finally:
            self._drop(slot)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        if not writer.transport.get_write_buffer_size():
            return  # all in the kernel's buffer: nothing to wait for (the common case)
        try:
            async with asyncio.timeout(self.limits.write_timeout):
                await writer.drain()
        except TimeoutError:
            self.stats.write_timeouts += 1
            self.log_limit(
                "write timeouts", f"a peer read nothing for {self.limits.write_timeout:g} s: closed"
            )
            raise _Closed from None

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> None:
        """Write a final error answer and close gently: our side first (FIN), then what the
        peer still sends is read and dropped for at most :data:`LINGER` seconds, so that
        closing with unread bytes (a reset) does not destroy the answer before the peer reads
        it (a slowloris still trickling, a body not read after 413)."""
        await self._write(writer, data)
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):
            if writer.can_write_eof():
                writer.write_eof()
            async with asyncio.timeout(LINGER):
                while await reader.read(65536):
                    pass

    async def _read(self, reader: asyncio.StreamReader, hc: HttpConnection, deadline: float | None) -> None:
        """Feed ``hc`` the next bytes: ``deadline`` (loop time) ends a request, else the
        idle timeout ends the wait (raises :class:`_Closed` after answering 408 or not)."""
        loop = asyncio.get_running_loop()
        lim = self.limits
        until = deadline if deadline is not None else loop.time() + lim.idle_timeout
        try:
            async with asyncio.timeout_at(until):
                data = await reader.read(65536)
        except TimeoutError:
            if deadline is None:
                self.stats.idle_timeouts += 1
                raise _Closed from None
            self.stats.request_timeouts += 1
            self.log_limit("request timeouts", f"a request took over {lim.request_timeout:g} s: 408")
            raise _Closed from None
        hc.feed(data)

    async def _serve(self, slot: _Slot, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lim = self.limits
        loop = asyncio.get_running_loop()
        hc = HttpConnection(lim.max_head, lim.max_body, lim.max_target)
        peername = writer.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if isinstance(peername, tuple) else ""
        deadline: float | None = loop.time() + lim.request_timeout  # the first request: from accept
        while True:
            try:
                req = hc.next_request()
            except HttpError as exc:
                if hc.eof:  # the peer left halfway: nobody to answer
                    return
                self.stats.bad_requests += 1
                self.log_limit("bad requests", f"{exc.status} to {peer}: {exc.reason}")
                await self._refuse(reader, writer, error_bytes(exc.status, exc.reason))
                return
            if req is None:
                if hc.eof:
                    return
                if deadline is None and hc.in_request:
                    deadline = loop.time() + lim.request_timeout
                try:
                    await self._read(reader, hc, deadline)
                except _Closed:
                    if deadline is not None and not hc.eof:
                        reason = f"request not complete within {lim.request_timeout:g} s"
                        await self._refuse(reader, writer, error_bytes(408, reason))
                    raise
                continue
            deadline = None
            self._touch(slot)
            try:
                resp = await self.handler(req, peer)
            except Exception:
                log.exception("http handler failed for %s %s", req.method, req.path)
                resp = Response.error(500, "internal error (logged)")
            if resp.authenticated and not slot.trusted:
                slot.trusted = True
                self.unauthenticated.pop(slot, None)
            head_only = req.method == "HEAD"
            if resp.stream is not None:
                refusal = await self._stream_response(slot, resp, head_only, reader, writer)
                if refusal is None:
                    return  # a stream (or its head) ends the connection
                resp = refusal
            await self._write(writer, hc.respond(resp, head_only))
            if not hc.next_cycle():
                return

    async def _stream_response(
        self,
        slot: _Slot,
        resp: Response,
        head_only: bool,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> Response | None:
        """Run the event stream of ``resp`` (None: the connection ends with it), or the 503
        to answer instead when ``max_streams`` are open."""
        assert resp.stream is not None
        lim = self.limits
        if head_only or self.streams >= lim.max_streams:
            closer = getattr(resp.stream, "aclose", None)
            if closer is not None:
                await closer()
            if not head_only:
                self.stats.streams_refused += 1
                self.log_limit("stream refusals", f"{lim.max_streams} event streams open: 503")
                return Response.error(
                    503, f"too many event streams ({lim.max_streams} open)", (("Retry-After", "10"),)
                )
            await self._write(writer, encode_head(resp, False))  # HEAD of a stream: the head only
            return None
        self.streams += 1
        self.unauthenticated.pop(slot, None)  # in the streams' pool now
        try:
            await self._write(writer, encode_head(resp, False))
            await self._stream(resp.stream, reader, writer)
        finally:
            self.streams -= 1
        return None

    async def _stream(
        self, stream: AsyncIterator[bytes], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Write the chunks of ``stream`` until it ends or the peer closes its side (watched
        by a read, so a closed browser tab ends its stream at once, not at the next write);
        a peer that reads nothing for ``write_timeout`` loses its stream."""
        it = aiter(stream)
        eof = asyncio.ensure_future(reader.read(65536))
        nxt: asyncio.Future[bytes] | None = None
        try:
            while True:
                nxt = asyncio.ensure_future(anext(it))
                done, _ = await asyncio.wait({nxt, eof}, return_when=asyncio.FIRST_COMPLETED)
                if nxt not in done:
                    return  # the peer sent EOF (or data it should not send on a stream)
                try:
                    chunk = nxt.result()
                except StopAsyncIteration:
                    nxt = None
                    return
                nxt = None
                await self._write(writer, chunk)
        finally:
            for fut in (nxt, eof):
                if fut is not None and not fut.done():
                    fut.cancel()
            await asyncio.gather(*(f for f in (nxt, eof) if f is not None), return_exceptions=True)
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                await closer()


async def serve_http(host: str, port: int, handler: Handler, limits: HttpLimits | None = None) -> HttpServer:
    """Listen on ``host``:``port`` (0: a free port, :attr:`HttpServer.port`) and answer every
    request with ``await handler(request, peer)`` within ``limits``."""
    srv = HttpServer(handler, limits)
    lim = srv.limits
    srv.server = await asyncio.start_server(srv._connection, host, port, limit=lim.max_head + lim.max_body)
    return srv
