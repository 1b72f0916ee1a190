"""An HTTP auth or authorization service that answers garbage does not flood the log.

Its "bad answer" warnings (the request denied) were logged once per request: a broken
service behind a busy broker wrote one line per CONNECT or PUBLISH.  They go through
``Core.log_limit`` now, as the broker's other per-request refusals: at most one line per
``LIMIT_LOG_INTERVAL`` (10 s), every one counted (``bad_answers``).  Real brokers on port 0,
a real HTTP service on loopback (asyncio, keep-alive), raw MQTT clients.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from broker import Broker
from broker.authn import HttpAuth, HttpAuthz
from broker.core._core import LIMIT_LOG_INTERVAL
from broker.packets import Pingreq, Pingresp, Publish, ReasonCode
from tests.auth.authservice import keep_alive
from tests.rawclient import RawClient

BAD = 1000


async def _garbage(_request: bytes) -> bytes:
    return b"[not json"


@pytest_asyncio.fixture
async def url() -> AsyncIterator[str]:
    server = await asyncio.start_server(lambda r, w: keep_alive(r, w, _garbage), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/auth"
    finally:
        server.close()
        await server.wait_closed()


def _most_lines(started: float) -> int:
    """The lines the rate limit allows since ``started``: one, then one per interval."""
    return 1 + int((time.monotonic() - started) / LIMIT_LOG_INTERVAL)


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "bad answer" in r.getMessage()]


async def test_a_thousand_bad_authorization_answers_log_a_bounded_number_of_lines(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="broker")
    authz = HttpAuthz(url, timeout=10.0, negative_ttl=0)
    started = time.monotonic()
    async with Broker(host="127.0.0.1", port=0, hooks=[authz], sys_interval=0) as b:
        c, ack = await RawClient.connect(b.port, "pub")
        try:
            assert ack.reason_code is ReasonCode.SUCCESS
            for i in range(BAD):  # QoS 0 on a new topic each: one request, one bad answer each
                c.send(Publish(f"t/{i}", b"x", 0))
            c.send(Pingreq())  # answered after the publishes before it were decided
            assert isinstance(await c.recv_where(lambda p: isinstance(p, Pingresp), timeout=60.0), Pingresp)
        finally:
            await c.close()
    lines = _lines(caplog)
    assert 1 <= len(lines) <= _most_lines(started), len(lines)  # one per 10 s (was one per answer)
    assert authz.bad_answers == BAD  # every one counted
    assert "authorization service" in lines[0] and "not logged for 10 s" in lines[0]


async def test_bad_authentication_answers_log_a_bounded_number_of_lines(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="broker")
    n = BAD
    auth = HttpAuth(url, timeout=10.0, negative_ttl=0)
    started = time.monotonic()
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=0) as b:
        for i in range(n):
            c, ack = await RawClient.connect(b.port, f"c{i}", username="u", password=b"p")
            await c.close()
            assert ack.reason_code is ReasonCode.NOT_AUTHORIZED
    lines = _lines(caplog)
    assert 1 <= len(lines) <= _most_lines(started), len(lines)
    assert auth.bad_answers == n
    assert "auth service" in lines[0]
