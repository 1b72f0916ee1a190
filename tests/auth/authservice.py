"""A real HTTP auth service for the tests of ``broker.authn.HttpAuth``: ``http.server`` on a
thread, bound to 127.0.0.1 port 0, answering each POST as the test scripted it.

``answer`` is (status, JSON body or None); ``hang`` (a ``threading.Event``) makes every request
wait until it is set (a service that does not answer); ``bodies`` are the JSON bodies received,
in order.  The thread never touches the broker's event loop: a hanging service blocks only its
own thread, as a remote one would.

:func:`keep_alive` is the other kind, for asyncio servers (``asyncio.start_server``) that must
hold thousands of waiting requests without a thread each, or count connections: it answers
the POSTs of one HTTP/1.1 keep-alive connection, each with what a coroutine makes of its body.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["AuthService", "auth_service", "keep_alive"]


class AuthService:
    def __init__(self) -> None:
        self.answer: tuple[int, object] = (200, {"result": "allow"})
        self.hang: threading.Event | None = None
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.url = ""

    @property
    def requests(self) -> int:
        with self.lock:
            return len(self.bodies)


@contextmanager
def auth_service() -> Iterator[AuthService]:
    service = AuthService()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            with service.lock:
                service.bodies.append(body)
                status, answer = service.answer
                hang = service.hang
            if hang is not None:
                hang.wait(30.0)
            data = b"" if answer is None else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    service.url = f"http://127.0.0.1:{server.server_address[1]}/mqtt/auth"
    try:
        yield service
    finally:
        if service.hang is not None:
            service.hang.set()
        server.shutdown()
        server.server_close()
        thread.join(10.0)


async def keep_alive(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: Callable[[bytes], Awaitable[bytes]]
) -> None:
    """Answer every request of one keep-alive connection ``200`` with the JSON body
    ``await answer(request body)``, until the client closes it (then close it too). O(request)
    per request; requests are answered one at a time, in order, as HTTP/1.1 wants."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = await answer(await reader.readexactly(length))
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()
