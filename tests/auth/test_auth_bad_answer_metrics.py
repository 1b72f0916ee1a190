"""An HTTP auth or authorization service's bad answers are on ``/metrics``.

``HttpAuth.bad_answers`` / ``HttpAuthz.bad_answers`` counted every answer that could not be read
(the request denied) but only the log said so, rate-limited: a scrape showed nothing.  They are
``siftmq_auth_bad_answers_total{reason="authentication"|"authorization"}`` now (one family for
both hooks).  A real broker on port 0 with both hooks, two real HTTP services on loopback that
answer garbage to what names ``bad``, raw MQTT clients, a real HTTP scrape.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest_asyncio

from broker import Broker
from broker.authn import HttpAuth, HttpAuthz
from broker.packets import Pingreq, Pingresp, Publish, ReasonCode
from tests.auth.authservice import keep_alive
from tests.rawclient import RawClient
from tests.waiting import eventually

ALLOW = b'{"result": "allow"}'


def _answers(bad: bytes) -> Callable[[bytes], Awaitable[bytes]]:
    async def answer(body: bytes) -> bytes:
        return b"[not json" if bad in body else ALLOW

    return answer


def _url(server: asyncio.Server) -> str:
    return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/mqtt"


@pytest_asyncio.fixture
async def urls() -> AsyncIterator[tuple[str, str]]:
    auth = await asyncio.start_server(lambda r, w: keep_alive(r, w, _answers(b'"bad-')), "127.0.0.1", 0)
    authz = await asyncio.start_server(lambda r, w: keep_alive(r, w, _answers(b'"bad/')), "127.0.0.1", 0)
    try:
        yield _url(auth), _url(authz)
    finally:
        for s in (auth, authz):
            s.close()
            await s.wait_closed()


def _scrape(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.status == 200
        return r.read().decode().splitlines()


async def test_bad_answers_of_both_http_services_are_exported(urls: tuple[str, str]) -> None:
    auth = HttpAuth(urls[0], timeout=10.0, negative_ttl=0)
    authz = HttpAuthz(urls[1], timeout=10.0, negative_ttl=0)
    async with Broker(
        host="127.0.0.1",
        port=0,
        hooks=[auth, authz],
        sys_interval=0,
        auth_failures=0,
        metrics_listen="127.0.0.1:0",
    ) as b:
        assert b.metrics_port is not None
        for i in range(2):  # the auth service answers garbage: refused, a bad answer each
            c, ack = await RawClient.connect(b.port, f"bad-{i}", username="u", password=b"p")
            await c.close()
            assert ack.reason_code is ReasonCode.NOT_AUTHORIZED
        c, ack = await RawClient.connect(b.port, "ok", username="u", password=b"p")
        try:
            assert ack.reason_code is ReasonCode.SUCCESS
            for i in range(3):  # the authorization service answers garbage: denied, one each
                c.send(Publish(f"bad/{i}", b"x", 0))
            c.send(Pingreq())  # answered after the publishes before it were decided
            assert isinstance(await c.recv_where(lambda p: isinstance(p, Pingresp), timeout=30.0), Pingresp)
        finally:
            await c.close()
        await eventually(lambda: authz.bad_answers == 3 and auth.bad_answers == 2, timeout=30.0)
        lines = await asyncio.to_thread(_scrape, b.metrics_port)
    exported = [line for line in lines if line.startswith("siftmq_auth_bad_answers_total")]
    assert sorted(exported) == [
        'siftmq_auth_bad_answers_total{reason="authentication"} 2.0',
        'siftmq_auth_bad_answers_total{reason="authorization"} 3.0',
    ]
    assert sum(line.startswith("# TYPE siftmq_auth_bad_answers_total ") for line in lines) == 1  # one family
