"""The HTTP listener of ``/metrics`` and the dashboard cannot be starved, and every malformed
request gets a clear answer (issue 37, item 5 and finding 6; broker.net._http,
docs/security.md "HTTP listener").

Raw sockets against a real embedded :class:`Broker` with ``metrics_listen`` on port 0: a
slowloris head is closed by the request deadline, hundreds of partial heads or event streams
do not stop ``/metrics`` and the dashboard's API from answering 200, malformed requests (a
list, and Hypothesis' own) get a 4xx without a traceback in the log, and a good request
pipelined before a bad one is answered first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import Broker
from broker.auth import FileAuth
from tests.auth.helpers import FAST, write_passwords
from tests.dashboard import httpclient as http

HOST = b"Host: 127.0.0.1\r\n"
PARTIAL = b"GET /metrics HTTP/1.1\r\n" + HOST + b"X-Slow: "  # a head that never ends
STREAM = b"GET /api/events HTTP/1.1\r\n" + HOST + b"\r\n"


def port(b: Broker) -> int:
    assert b.metrics_port is not None
    return b.metrics_port


def metric(text: bytes, name: str) -> float:
    m = re.search(rb"^" + re.escape(name.encode()) + rb" (\S+)$", text, re.MULTILINE)
    assert m is not None, f"{name} not in /metrics"
    return float(m.group(1))


async def scrape(p: int) -> bytes:
    r = await http.get(p, "/metrics")
    assert r.status == 200, r.body
    return r.body


async def read_status(reader: asyncio.StreamReader, timeout: float = 10.0) -> int:
    """The status of the next response on a connection (its body read too)."""
    async with asyncio.timeout(timeout):
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        if length is not None:
            await reader.readexactly(int(length.group(1)))
    return int(head.split(b" ", 2)[1])


@contextlib.asynccontextmanager
async def connections() -> AsyncIterator[list[asyncio.StreamWriter]]:
    """Writers opened by a test, all closed when it ends."""
    writers: list[asyncio.StreamWriter] = []
    try:
        yield writers
    finally:
        for w in writers:
            w.close()


@pytest_asyncio.fixture
async def b() -> AsyncIterator[Broker]:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0") as broker:
        yield broker


@pytest_asyncio.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Broker]:
    pw = write_passwords(tmp_path / "passwd", {"admin": "s3cret"})
    auth = FileAuth(password_file=pw, allow_anonymous=True, params=FAST)
    async with Broker(
        host="127.0.0.1",
        port=0,
        hooks=[auth],
        sys_interval=0,
        metrics_listen="127.0.0.1:0",
        dashboard_admins=("admin",),
    ) as broker:
        yield broker


ADMIN = http.basic("admin", "s3cret")


# ---------------------------------------------------------------- time limits
async def test_a_slowloris_head_is_closed_by_the_request_deadline() -> None:
    """One byte every 50 ms kept a head open forever (the timeout was per read); the whole
    request now has ``http_request_timeout`` seconds from its first byte: 408 and close."""
    async with Broker(
        host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0", http_request_timeout=1.0
    ) as b:
        reader, writer = await asyncio.open_connection("127.0.0.1", port(b))
        head = PARTIAL + b"a" * 2000

        async def trickle() -> None:
            for i in range(len(head)):
                writer.write(head[i : i + 1])
                await asyncio.sleep(0.05)  # the attacker's pace (1000 bytes would take 100 s)

        task = asyncio.create_task(trickle())
        try:
            async with asyncio.timeout(20):  # generous: the deadline is 1 s
                answer = await reader.read()  # until the broker closes the connection
            assert not task.done()  # closed while the head was still trickling in
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
        finally:
            task.cancel()
            writer.close()
        assert metric(await scrape(port(b)), "siftmq_http_request_timeouts_total") == 1


async def test_an_idle_keep_alive_connection_is_closed() -> None:
    async with Broker(
        host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0", http_idle_timeout=0.5
    ) as b:
        reader, writer = await asyncio.open_connection("127.0.0.1", port(b))
        try:
            writer.write(b"GET /api/session HTTP/1.1\r\n" + HOST + b"\r\n")
            assert await read_status(reader) == 200
            async with asyncio.timeout(20):
                assert await reader.read() == b""  # closed by the broker, nothing more sent
        finally:
            writer.close()
        assert metric(await scrape(port(b)), "siftmq_http_idle_timeouts_total") == 1


# ---------------------------------------------------------------- exhaustion
async def test_partial_heads_do_not_lock_out_metrics(b: Broker) -> None:
    """260 unauthenticated partial heads made /metrics answer 503 (one 256-connection cap for
    everything); now the longest-waiting of them are closed for newcomers."""
    p = port(b)
    async with connections() as writers:
        for _ in range(260):
            _, w = await asyncio.open_connection("127.0.0.1", p)
            w.write(PARTIAL)
            writers.append(w)
        body = await scrape(p)  # 200 (asserted by scrape)
        assert (await http.get(p, "/api/overview")).status == 200
        assert metric(body, "siftmq_http_connections_evicted_total") >= 260 - 64
        assert metric(body, "siftmq_http_unauthenticated_connections") <= 64


async def test_partial_heads_do_not_lock_out_an_authenticated_user(secured: Broker) -> None:
    p = port(secured)
    async with connections() as writers:
        # a logged-in dashboard keeps its connection across the flood
        reader, kept = await asyncio.open_connection("127.0.0.1", p)
        writers.append(kept)
        auth = "".join(f"{k}: {v}\r\n" for k, v in ADMIN.items()).encode()
        overview = b"GET /api/overview HTTP/1.1\r\n" + HOST + auth + b"\r\n"
        kept.write(overview)
        assert await read_status(reader) == 200
        for _ in range(300):
            _, w = await asyncio.open_connection("127.0.0.1", p)
            w.write(PARTIAL)
            writers.append(w)
        assert (await http.get(p, "/api/overview", ADMIN)).status == 200  # a new connection
        kept.write(overview)
        assert await read_status(reader) == 200  # the authenticated one was not closed
        await scrape(p)


async def test_event_streams_beyond_their_cap_do_not_take_the_listener(b: Broker) -> None:
    """255 event streams took every slot, after which /metrics and the API answered 503; now
    32 streams run and the rest are answered 503 themselves."""
    p = port(b)
    statuses = []
    async with connections() as writers:
        for _ in range(260):
            reader, w = await asyncio.open_connection("127.0.0.1", p)
            writers.append(w)
            w.write(STREAM)
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
            statuses.append(int(head.split(b" ", 2)[1]))
        assert statuses.count(200) == 32 and statuses.count(503) == 228
        assert b.dashboard is not None and b.dashboard.watchers == 32
        body = await scrape(p)
        assert (await http.get(p, "/api/overview")).status == 200
        assert metric(body, "siftmq_http_streams") == 32
        assert metric(body, "siftmq_http_streams_refused_total") == 228


# ---------------------------------------------------------------- malformed requests
BAD = [
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \xb2\r\n\r\n", 400),  # latin-1 superscript 2
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \xc2\xb2\r\n\r\n", 400),
    (b"GET //[x/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 404),  # a path like any (no page)
    (b"GET //[x/?q=[ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 404),
    (b"GET /api/clients?offset=%ff&limit=\xc2\xb2 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400),
    (b"GET /api/clients?limit=%C2%B2 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400),
    (b"GET /\xff HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -1\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX: a\x00b\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Name: a\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\n\r\n", 400),
    (b"GET * HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400),
    (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 431),
    (b"POST /api/kick HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 70000\r\n\r\n", 413),
    (b"DELETE / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 405),
    (b"G\x01T / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40 + b"\r\n\r\n", 400),  # TLS hello
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),  # an HTTP/2 preface: the version
]


async def test_malformed_requests_get_a_4xx_and_no_traceback(
    b: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    p = port(b)
    for data, status in BAD:
        r = await http.raw(p, data)
        assert r.status == status, (data[:60], r.status, r.body)
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged for bad input"
    http_lines = [r for r in caplog.records if r.name == "broker.http"]
    assert len(http_lines) <= 1  # one rate-limited line at most
    # the listener refused all but the four the dashboard answered (404, 404, 400 of the
    # limit, 405)
    assert metric(await scrape(p), "siftmq_http_bad_requests_total") == len(BAD) - 4


async def test_a_good_request_pipelined_before_a_bad_one_is_answered(b: Broker) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port(b))
    try:
        writer.write(
            b"GET /metrics HTTP/1.1\r\n"
            + HOST
            + b"\r\nGET /api/session HTTP/1.1\r\n"
            + HOST
            + b"\r\nGET / HTTP/1.1\r\n"
            + HOST
            + b"Content-Length: \xb2\r\n\r\n"
        )
        assert [await read_status(reader) for _ in range(3)] == [200, 200, 400]
        async with asyncio.timeout(10):
            assert await reader.read() == b""  # then the connection closes
    finally:
        writer.close()


# ---------------------------------------------------------------- fuzzing
@pytest.fixture(scope="module")
def threaded() -> Iterator[int]:
    """A broker on its own loop in a thread (Hypothesis runs the test body many times, each a
    plain function): yields the HTTP listener's port."""
    ready = threading.Event()
    box: dict[str, object] = {}

    async def serve() -> None:
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0") as b:
            stop = asyncio.Event()
            box["port"], box["stop"], box["loop"] = b.metrics_port, stop, asyncio.get_running_loop()
            ready.set()
            await stop.wait()

    t = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    t.start()
    assert ready.wait(30)
    try:
        yield int(box["port"])  # type: ignore[call-overload]
    finally:
        loop = box["loop"]
        assert isinstance(loop, asyncio.AbstractEventLoop)
        loop.call_soon_threadsafe(box["stop"].set)  # type: ignore[attr-defined]
        t.join(30)


def exchange(p: int, data: bytes) -> bytes:
    """Send ``data``, close our side, read everything the broker answers until it closes."""
    with socket.create_connection(("127.0.0.1", p), timeout=20) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


_TOKENS = st.sampled_from(
    [b"GET", b"POST", b"HEAD", b" ", b"/", b"//", b"[", b"%", b"%zz", b"?", b"#", b":", b"\r\n", b"\n",
     b"\r", b"\x00", b"\xc2\xb2", b"\xb2", b"\xff", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/9.9", b"Host: 127.0.0.1",
     b"Content-Length: ", b"Transfer-Encoding: chunked", b"Connection: close", b"0", b"-1", b"1",
     b"99999999999", b"/metrics", b"/api/clients?limit=", b"/api/events", b"a"]
)  # fmt: skip
_REQUEST = st.one_of(
    st.lists(_TOKENS, max_size=30).map(b"".join),
    st.tuples(
        st.sampled_from([b"GET ", b"POST ", b"HEAD ", b"OPTIONS "]),
        st.binary(max_size=40),
        st.sampled_from([b" HTTP/1.1\r\n", b" HTTP/1.0\r\n"]),
        st.lists(st.tuples(st.binary(min_size=1, max_size=20), st.binary(max_size=40)), max_size=4),
    ).map(lambda t: t[0] + t[1] + t[2] + HOST + b"".join(k + b": " + v + b"\r\n" for k, v in t[3]) + b"\r\n"),
)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_REQUEST)
def test_fuzzed_requests_are_answered_without_a_traceback(threaded: int, data: bytes) -> None:
    seen = _Records()
    logging.getLogger("broker").addHandler(seen)
    try:
        answer = exchange(threaded, data)
    finally:
        logging.getLogger("broker").removeHandler(seen)
    assert not [r for r in seen.records if r.exc_info or r.levelno >= logging.ERROR], data
    for status in re.findall(rb"(?m)^HTTP/1\.1 (\d{3}) ", answer):
        assert int(status) < 500 or int(status) in (501, 503, 505), (data, answer[:200])
    # and the listener serves on
    assert exchange(threaded, b"GET /metrics HTTP/1.1\r\n" + HOST + b"\r\n").startswith(b"HTTP/1.1 200 ")
