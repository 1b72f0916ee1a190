"""Calling the admin API from tests over real HTTP (tests/dashboard/httpclient.py sends the
bytes): ``await call(port, "POST", "/api/v1/bans", {...})`` fetches the X-CSRF-Token of
``/api/v1/session`` first for a state-changing call, as ``siftmq ctl`` does."""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import urlencode

from tests.dashboard import httpclient as http

__all__ = ["call", "token"]


async def token(port: int, headers: Mapping[str, str] | None = None) -> str:
    r = await http.get(port, "/api/v1/session", headers)
    assert r.status == 200, r.body
    csrf: str = r.json()["csrf"]
    return csrf


async def call(
    port: int,
    method: str,
    path: str,
    body: object = None,
    query: Mapping[str, object] | None = None,
    headers: Mapping[str, str] | None = None,
    csrf: bool = True,
) -> http.Reply:
    h = {"Host": "127.0.0.1", "Connection": "close", **(headers or {})}
    target = path + ("?" + urlencode(query) if query else "")
    data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    if method != "GET":
        h.setdefault("Content-Type", "application/json")
        if csrf:
            h["X-CSRF-Token"] = await token(port, headers)
        h["Content-Length"] = str(len(data))
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in h.items())]
    return await http.raw(port, ("\r\n".join(lines) + "\r\n\r\n").encode() + data)
