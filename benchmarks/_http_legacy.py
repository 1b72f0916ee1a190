"""The hand-written HTTP/1.1 parser and server that ``broker/net/_http.py`` carried before h11
(main at 3443128), kept verbatim below this note as the same-run peer of
``benchmarks/bench_http.py`` only: nothing in the broker imports it.

It has the bugs issue 37 item 5 fixed (no deadline for a whole head, one connection cap for
everything, ``Content-Length: ²`` and ``//[x/`` raise, a good request pipelined before a bad
one is dropped); do not use it for anything but the comparison.
"""

# ruff: noqa
# mypy: ignore-errors

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = [
    "SECURITY_HEADERS",
    "HttpError",
    "HttpServer",
    "Request",
    "RequestParser",
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
    connection closes after it)."""

    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    stream: AsyncIterator[bytes] | None = field(default=None, compare=False)

    @classmethod
    def text(cls, status: int, text: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
        return cls(status, (text.rstrip("\n") + "\n").encode(), headers=headers)


def encode_head(resp: Response, keep_alive: bool, head_only: bool = False) -> bytes:
    """The status line and headers of ``resp`` (``Content-Length`` unless it streams)."""
    try:
        phrase = HTTPStatus(resp.status).phrase
    except ValueError:
        phrase = "Unknown"
    lines = [f"HTTP/1.1 {resp.status} {phrase}", f"Content-Type: {resp.content_type}"]
    if resp.stream is None:
        lines.append(f"Content-Length: {len(resp.body)}")
    own = {name.lower() for name, _ in resp.headers}
    lines.extend(f"{k}: {v}" for k, v in resp.headers)
    lines.extend(f"{k}: {v}" for k, v in SECURITY_HEADERS if k.lower() not in own)
    lines.append("Connection: " + ("keep-alive" if keep_alive and resp.stream is None else "close"))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class RequestParser:
    """Bytes in, :class:`Request` records out (sans-IO). After an :class:`HttpError` the
    connection must be answered and closed: the parser does not resynchronise."""

    def __init__(self, max_head: int = 8192, max_body: int = 65536) -> None:
        self.max_head = max_head
        self.max_body = max_body
        self._buf = bytearray()
        self._head: Request | None = None  # parsed head waiting for its body
        self._need = 0

    def feed(self, data: bytes) -> list[Request]:
        """Requests completed by ``data`` (raises :class:`HttpError`)."""
        self._buf += data
        out: list[Request] = []
        while True:
            if self._head is None:
                end = self._buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buf) > self.max_head:
                        raise HttpError(431, "request head too large")
                    return out
                if end > self.max_head:
                    raise HttpError(431, "request head too large")
                head = bytes(self._buf[:end])
                del self._buf[: end + 4]
                self._head, self._need = self._parse_head(head)
            if len(self._buf) < self._need:
                return out
            body = bytes(self._buf[: self._need])
            del self._buf[: self._need]
            req = self._head
            self._head = None
            out.append(Request(req.method, req.target, req.path, req.query, req.version, req.headers, body))

    def _parse_head(self, head: bytes) -> tuple[Request, int]:
        try:
            text = head.decode("latin-1")
        except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
            raise HttpError(400, "undecodable request head") from None
        lines = text.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[0] or not set(parts[0]) <= _TOKEN:
            raise HttpError(400, "malformed request line")
        method, target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise HttpError(505, f"unsupported version {version[:20]!r}")
        if not target.startswith("/"):
            raise HttpError(400, "request target must be a path")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or not set(name) <= _TOKEN:
                raise HttpError(400, "malformed header line")
            key = name.lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if "transfer-encoding" in headers:
            raise HttpError(501, "Transfer-Encoding is not supported (send Content-Length)")
        length = headers.get("content-length", "0")
        if not length.isdigit() or len(length) > 12:
            raise HttpError(400, "malformed Content-Length")
        need = int(length)
        if need > self.max_body:
            raise HttpError(413, f"request body over {self.max_body} bytes")
        split = urlsplit(target)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        return Request(method, target, unquote(split.path), query, version, headers), need


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); ValueError when malformed."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics listen address must be HOST:PORT, not {value!r}")
    return host.strip("[]"), int(port)


Handler = Callable[[Request, str], Awaitable[Response]]


class HttpServer:
    """The listening socket and its open connections (:func:`serve_http`)."""

    def __init__(self, handler: Handler, max_connections: int, idle_timeout: float, parser: RequestParser):
        self.handler = handler
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self._limits = (parser.max_head, parser.max_body)
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening, close every connection (streams included) and wait for them."""
        if self.server is not None:
            self.server.close()
        for w in list(self.writers):
            w.close()
        for t in list(self.tasks):
            t.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=2.0)
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2.0)
            self.server = None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.writers.add(writer)
        try:
            if len(self.writers) > self.max_connections:
                writer.write(encode_head(Response.text(503, "too many connections"), False))
                writer.write(b"too many connections\n")
                return
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("http connection failed")
        finally:
            self.writers.discard(writer)
            self.tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        parser = RequestParser(*self._limits)
        peername = writer.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if isinstance(peername, tuple) else ""
        while True:
            async with asyncio.timeout(self.idle_timeout):
                data = await reader.read(65536)
            if not data:
                return
            try:
                requests = parser.feed(data)
            except HttpError as exc:
                resp = Response.text(exc.status, exc.reason)
                writer.write(encode_head(resp, False) + resp.body)
                await writer.drain()
                return
            for req in requests:
                try:
                    resp = await self.handler(req, peer)
                except Exception:
                    log.exception("http handler failed for %s %s", req.method, req.path)
                    resp = Response.text(500, "internal error (logged)")
                keep = req.keep_alive and resp.stream is None
                head_only = req.method == "HEAD"
                writer.write(encode_head(resp, keep) + (b"" if head_only else resp.body))
                await writer.drain()
                if resp.stream is not None:
                    if head_only:  # HEAD of a stream: the head only
                        closer = getattr(resp.stream, "aclose", None)
                        if closer is not None:
                            await closer()
                    else:
                        await self._stream(resp.stream, reader, writer)
                    return
                if not keep:
                    return

    @staticmethod
    async def _stream(
        stream: AsyncIterator[bytes], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Write the chunks of ``stream`` until it ends or the peer closes its side (watched
        by a read, so a closed browser tab ends its stream at once, not at the next write)."""
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
                writer.write(chunk)
                await writer.drain()
        finally:
            for fut in (nxt, eof):
                if fut is not None and not fut.done():
                    fut.cancel()
            await asyncio.gather(*(f for f in (nxt, eof) if f is not None), return_exceptions=True)
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                await closer()


async def serve_http(  # noqa: PLR0917
    host: str,
    port: int,
    handler: Handler,
    max_head: int = 8192,
    max_body: int = 65536,
    max_connections: int = 256,
    idle_timeout: float = 60.0,
) -> HttpServer:
    """Listen on ``host``:``port`` (0: a free port, :attr:`HttpServer.port`) and answer every
    request with ``await handler(request, peer)``."""
    srv = HttpServer(handler, max_connections, idle_timeout, RequestParser(max_head, max_body))
    srv.server = await asyncio.start_server(srv._connection, host, port, limit=max_head + max_body)
    return srv
