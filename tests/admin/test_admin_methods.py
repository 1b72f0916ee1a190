"""Every admin API path answers a method it does not have with 405, an ``Allow`` header
naming the methods it has, and a JSON error; a path of no endpoint is a 404.

Before, ``GET /api/v1/bridges/x/reconnect`` was taken by ``GET /bridges/{name}`` (the name
``x/reconnect``) and answered 404 "no bridge"; the API's 405s had no ``Allow`` header, and a
PUT or PATCH got the dashboard's generic ``Allow: GET, HEAD, POST`` whatever the path.  Real
HTTP against an embedded broker's listener, CSRF token and JSON content type sent (a wrong
method is refused before the CSRF rules, which only a change passes through).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from broker import Broker
from broker._admin_routes import ROUTES
from tests.admin.api import call

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
SAMPLE = {"client_id": "c", "name": "x"}


def _paths() -> dict[str, set[str]]:
    """Each endpoint's path with its parameter filled in -> the methods declared for it."""
    out: dict[str, set[str]] = {}
    for ep in ROUTES:
        path = ep.path if ep.tail is None else ep.prefix + SAMPLE[ep.tail] + ep.suffix
        out.setdefault(path, set()).add(ep.method)
    return out


@pytest_asyncio.fixture
async def b() -> AsyncIterator[Broker]:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0") as broker:
        yield broker


async def test_a_method_a_path_does_not_have_is_405_with_allow(b: Broker) -> None:
    assert b.metrics_port is not None
    checked = 0
    for path, declared in _paths().items():
        allow = {"HEAD", *declared} if "GET" in declared else declared
        for method in METHODS:
            if method in declared:
                continue
            r = await call(b.metrics_port, method, path)
            assert r.status == 405, (method, path, r.status, r.body)
            assert r.headers["content-type"] == "application/json"
            assert set(r.headers["allow"].split(", ")) == allow, (method, path, r.headers)
            assert method in r.json()["error"] and path in r.json()["error"]
            checked += 1
    assert checked == 51  # 15 paths, 5 methods, 24 endpoints


async def test_get_on_the_reconnect_path_is_405_not_a_missing_bridge(b: Broker) -> None:
    assert b.metrics_port is not None
    r = await call(b.metrics_port, "GET", "/api/v1/bridges/x/reconnect")
    assert r.status == 405, r.body
    assert r.headers["allow"] == "POST"
    r = await call(b.metrics_port, "GET", "/api/v1/bridges/x")  # the bridge itself: still its GET
    assert r.status == 404 and r.json()["error"] == "no bridge 'x'", r.body


@pytest.mark.parametrize("method", METHODS)
async def test_a_path_of_no_endpoint_is_404(b: Broker, method: str) -> None:
    assert b.metrics_port is not None
    r = await call(b.metrics_port, method, "/api/v1/nothing/here")
    assert r.status == 404, r.body
    assert r.json()["error"] == "no API '/api/v1/nothing/here'"
