"""A minimal HTTP/1.1 client over asyncio streams for the dashboard tests (real sockets).

It sends exactly the bytes a test asks for (bad requests included) and reads one response;
``events`` reads server-sent events from ``/api/events``.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["Reply", "basic", "events", "get", "post", "raw"]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.lower()] = v.strip()
    return status, headers


async def raw(port: int, data: bytes, timeout: float = 10.0) -> Reply:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(timeout):
            writer.write(data)
            await writer.drain()
            status, headers = await _read_head(reader)
            n = int(headers.get("content-length", "0"))
            body = await reader.readexactly(n)
            return Reply(status, headers, body)
    finally:
        writer.close()


def _request(method: str, path: str, headers: Mapping[str, str], body: bytes = b"") -> bytes:
    h = {"Host": "127.0.0.1", "Connection": "close", **headers}
    if body or method == "POST":
        h["Content-Length"] = str(len(body))
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in h.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def get(port: int, path: str, headers: Mapping[str, str] | None = None) -> Reply:
    return await raw(port, _request("GET", path, headers or {}))


async def post(port: int, path: str, body: bytes | object, headers: Mapping[str, str] | None = None) -> Reply:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    h = {"Content-Type": "application/json", **(headers or {})}
    return await raw(port, _request("POST", path, h, data))


async def events(port: int, headers: Mapping[str, str] | None = None) -> AsyncIterator[tuple[str, Any]]:
    """(event name, decoded data) of the server-sent events of ``/api/events``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_request("GET", "/api/events", headers or {}))
        status, hdrs = await _read_head(reader)
        assert status == 200 and hdrs["content-type"] == "text/event-stream", (status, hdrs)
        name = "message"
        while True:
            raw_line = await reader.readline()
            if not raw_line:
                return  # the server closed the stream
            line = raw_line.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                yield name, orjson.loads(line[6:])
                name = "message"
    finally:
        writer.close()
