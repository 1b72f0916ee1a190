"""The sans-IO side of broker.net._http (issue 28, item 2; issue 37, item 5): requests split
across reads or pipelined in one (each parsed once the one before it is answered), every
refusal with its status, and the response bytes."""

from __future__ import annotations

import pytest

from broker.net._http import HttpConnection, HttpError, HttpLimits, Request, Response, encode_head


def _all(hc: HttpConnection) -> list[Request]:
    """Every complete request, answering each (as the server does) so the next is parsed."""
    out = []
    while (req := hc.next_request()) is not None:
        out.append(req)
        hc.respond(Response.text(200, "ok"))
        if not hc.next_cycle():
            break
    return out


def test_requests_split_and_pipelined() -> None:
    hc = HttpConnection()
    raw = (
        b"POST /api/kick?x=1&y=%20z HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nX-A: 1\r\nx-a: 2\r\n\r\nbody"
    )
    hc.feed(raw[:10])
    assert hc.next_request() is None and hc.in_request
    hc.feed(raw[10:-2])
    assert hc.next_request() is None and hc.in_request
    hc.feed(raw[-2:] + b"GET /a%2Fb HTTP/1.0\r\n\r\n")
    req = hc.next_request()
    assert req is not None
    assert (req.method, req.path, dict(req.query), req.body) == (
        "POST",
        "/api/kick",
        {"x": "1", "y": " z"},
        b"body",
    )
    assert req.headers["x-a"] == "1, 2" and req.keep_alive
    hc2 = HttpConnection()
    hc2.feed(raw + b"GET /a%2Fb HTTP/1.0\r\n\r\n")
    reqs = _all(hc2)
    assert [r.path for r in reqs] == ["/api/kick", "/a/b"] and not reqs[1].keep_alive


def test_a_good_request_before_a_bad_one_is_parsed_first() -> None:
    hc = HttpConnection()
    hc.feed(b"GET /metrics HTTP/1.1\r\nHost: h\r\n\r\nGET / HTTP/1.1\r\nContent-Length: \xc2\xb2\r\n\r\n")
    req = hc.next_request()
    assert req is not None and req.path == "/metrics"
    out = hc.respond(Response.text(200, "ok"))
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and out.endswith(b"\r\n\r\nok\n")
    assert hc.next_cycle()
    with pytest.raises(HttpError) as err:
        hc.next_request()
    assert err.value.status == 400


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 9000, 431),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", 431),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 70000\r\n\r\n", 413),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1x\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: \xc2\xb2\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: \xb2\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
        (b"GET / HTTP/3\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505),
        (b"GET http://x/ HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: h\r\n\r\n", 414),
        (b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: h\r\nno colon\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
        (b"GET /\r\n\r\n", 400),
    ],
)
def test_refusals(data: bytes, status: int) -> None:
    hc = HttpConnection()
    hc.feed(data)
    with pytest.raises(HttpError) as err:
        hc.next_request()
    assert err.value.status == status and err.value.reason


def test_odd_targets_are_paths() -> None:
    hc = HttpConnection()
    hc.feed(b"GET //[x/?a=%zz&b HTTP/1.1\r\nHost: h\r\n\r\n")
    req = hc.next_request()
    assert req is not None and req.path == "//[x/" and dict(req.query) == {"a": "%zz", "b": ""}


def test_response_head() -> None:
    head = encode_head(Response.text(404, "no"), keep_alive=True).decode()
    assert head.startswith("HTTP/1.1 404 Not Found\r\n") and "Content-Length: 3\r\n" in head
    assert "Connection: keep-alive" in head and "X-Content-Type-Options: nosniff" in head
    own = Response(200, b"", headers=(("Cache-Control", "max-age=5"),))
    assert encode_head(own, False).decode().count("Cache-Control") == 1


def test_h11_response_carries_the_security_headers_once() -> None:
    hc = HttpConnection()
    hc.feed(b"HEAD /x HTTP/1.1\r\nHost: h\r\n\r\n")
    assert hc.next_request() is not None
    out = hc.respond(Response(200, b"body", headers=(("Cache-Control", "max-age=5"),)), head_only=True)
    text = out.decode().lower()
    assert text.count("cache-control") == 1 and "x-content-type-options: nosniff" in text
    assert "content-length: 4" in text and text.endswith("\r\n\r\n")  # HEAD: no body


@pytest.mark.parametrize(
    "bad",
    [
        {"max_streams": 0},
        {"max_unauthenticated": 300},
        {"request_timeout": 0},
        {"idle_timeout": -1.0},
        {"max_connections": 0},
    ],
)
def test_limits_are_checked(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="http"):
        HttpLimits(**bad)  # type: ignore[arg-type]
