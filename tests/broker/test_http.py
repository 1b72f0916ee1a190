"""The sans-IO HTTP/1.1 request parser of broker.net._http (issue 28, item 2): requests split
across reads or pipelined in one, and every refusal with its status."""

from __future__ import annotations

import pytest

from broker.net._http import HttpError, RequestParser, Response, encode_head


def test_requests_split_and_pipelined() -> None:
    p = RequestParser()
    raw = (
        b"POST /api/kick?x=1&y=%20z HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nX-A: 1\r\nx-a: 2\r\n\r\nbody"
    )
    assert p.feed(raw[:10]) == []
    assert p.feed(raw[10:-2]) == []
    (req,) = p.feed(raw[-2:] + b"GET /a%2Fb HTTP/1.0\r\n\r\n")[:1]
    assert (req.method, req.path, dict(req.query), req.body) == (
        "POST",
        "/api/kick",
        {"x": "1", "y": " z"},
        b"body",
    )
    assert req.headers["x-a"] == "1, 2" and req.keep_alive
    p2 = RequestParser()
    reqs = p2.feed(raw + b"GET /a%2Fb HTTP/1.0\r\n\r\n")
    assert [r.path for r in reqs] == ["/api/kick", "/a/b"] and not reqs[1].keep_alive


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 9000, 431),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", 431),
        (b"POST / HTTP/1.1\r\nContent-Length: 70000\r\n\r\n", 413),
        (b"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
        (b"GET / HTTP/3\r\n\r\n", 505),
        (b"GET http://x/ HTTP/1.1\r\n\r\n", 400),
        (b"G(T / HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", 400),
        (b"GET /\r\n\r\n", 400),
    ],
)
def test_refusals(data: bytes, status: int) -> None:
    with pytest.raises(HttpError) as err:
        RequestParser().feed(data)
    assert err.value.status == status and err.value.reason


def test_response_head() -> None:
    head = encode_head(Response.text(404, "no"), keep_alive=True).decode()
    assert head.startswith("HTTP/1.1 404 Not Found\r\n") and "Content-Length: 3\r\n" in head
    assert "Connection: keep-alive" in head and "X-Content-Type-Options: nosniff" in head
    own = Response(200, b"", headers=(("Cache-Control", "max-age=5"),))
    assert encode_head(own, False).decode().count("Cache-Control") == 1
