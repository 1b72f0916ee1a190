"""Issue 39: ``HttpAuth`` keeps its connections to the auth service during a CONNECT storm.

The event loop's cost of an HTTP auth request must not grow with the requests in flight.  With
one pooled ``httpx.AsyncClient``, httpcore 1.0 did O(connections x queued requests) work per
request on the loop and closed every idle connection past ``max_keepalive_connections``, so a
storm of more than 32 concurrent CONNECTs opened a new TCP connection for most requests (and
the loop's per-request work grew with the storm: benchmarks/bench_auth_backends.py, docs/
security.md); and httpcore imported sniffio (not installed) for each lock, a search of the
import path on the loop.  The client is aiohttp now.  The observable contract tested here: a
second wave of concurrent CONNECTs reuses the first wave's connections, none is opened again,
and no module is imported on the loop meanwhile.

The service is an asyncio HTTP/1.1 keep-alive server on 127.0.0.1 port 0 (in the test's
loop), which holds every request until the test releases the wave: the concurrency does not
depend on timing.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.machinery import ModuleSpec
from types import ModuleType

from broker import Broker
from broker.authn import HttpAuth
from broker.packets import Connack, Connect, ReasonCode
from tests.auth.authservice import keep_alive
from tests.rawclient import RawClient
from tests.waiting import eventually

WAVE = 60  # concurrent CONNECTs: more than the 32 keep-alive connections of the old pool


class Service:
    """Counts connections and requests; answers allow once ``release`` is set."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0
        self.release = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await keep_alive(reader, writer, self._answer)

    async def _answer(self, body: bytes) -> bytes:
        json.loads(body)
        self.requests += 1
        await self.release.wait()
        return b'{"result": "allow"}'


class ImportSpy:
    """A meta path finder first in ``sys.meta_path`` that records every module looked up (an
    import of a module not yet in ``sys.modules``; a failed one searches all of ``sys.path``
    again each time) and finds nothing itself."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        self.names.append(name)
        return None


@contextmanager
def imports_looked_up() -> Iterator[list[str]]:
    spy = ImportSpy()
    sys.meta_path.insert(0, spy)
    try:
        yield spy.names
    finally:
        sys.meta_path.remove(spy)


async def wave(port: int, svc: Service, prefix: str) -> None:
    """WAVE concurrent CONNECTs, all held by the service until all are there; all accepted."""
    svc.release.clear()
    before = svc.requests
    clients = [await RawClient.open(port) for _ in range(WAVE)]
    try:
        for i, c in enumerate(clients):
            c.send(Connect(f"{prefix}-{i}", 5, username="u", password=b"p"))
        await eventually(lambda: svc.requests == before + WAVE, timeout=30.0)
        svc.release.set()
        acks = await asyncio.gather(*(c.recv(timeout=30.0) for c in clients))
        assert all(isinstance(a, Connack) and a.reason_code is ReasonCode.SUCCESS for a in acks), acks
    finally:
        for c in clients:
            await c.close()


async def test_a_storm_reuses_the_connections_to_the_auth_service() -> None:
    svc = Service()
    server = await asyncio.start_server(svc.handle, "127.0.0.1", 0, backlog=1024)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/auth"
    auth = HttpAuth(url, timeout=30.0, cache_ttl=0, negative_ttl=0)
    try:
        async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=0) as b:
            await wave(b.port, svc, "first")
            assert svc.connections == WAVE  # one per request in flight
            with imports_looked_up() as names:
                await wave(b.port, svc, "second")
            # no import on the event loop per request (httpcore imported sniffio per lock, a
            # search of sys.path each time when it is not installed)
            assert names == []
            # every request of the second wave went over a kept connection
            assert svc.connections == WAVE, f"{svc.connections - WAVE} connections opened again"
            assert auth.requests == 2 * WAVE and auth.unavailable == 0
    finally:
        svc.release.set()
        server.close()
        await server.wait_closed()
