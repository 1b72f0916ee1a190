"""The dashboard's two targets (issue 28, item 2): pages load in <= 1 s with 10,000 clients
connected, and the dashboard costs the broker <= 2 % throughput while one browser watches it.

A broker runs in a subprocess (``Broker`` with ``metrics_listen``, uvloop when installed).

**Pages** (``--clients N``, default 10,000): this process opens N raw MQTT 3.1.1 connections,
each subscribing to ``c/<i>/#`` (N clients, N subscriptions), and publishes 2,000 retained
messages; then every JSON request of every tab is timed over HTTP (keep-alive, ``--repeat``
times each: median and max), and, when Chromium is installed, a real headless Chromium
(DevTools protocol) loads each tab: the time from navigation to the tab's data on screen.

**Cost** (``--seconds S`` per phase): 2 publishers flood QoS 0 messages to 4 subscribers of
``bench/#`` (fan-out 4) as fast as the broker takes them; the delivered messages/s are counted
at the subscribers in alternating phases *without* and *with* a watcher (an SSE client of
``/api/events``, as the open overview tab is, plus a ``/api/clients`` poll every 5 s, as the
clients tab does; without it only the history recorder runs, a point every 5 s (its cost:
benchmarks/bench_history.py); the live sampler starts with a page
and stops when the last one closes) -- same run, same broker, phases interleaved against drift. The broker's
and this load generator's CPU are reported for each phase. On a shared machine the broker
gets whatever share of a core the others leave, so the wall-clock rate swings with it; the
cost is therefore also given as the broker's CPU time per delivery (saturated throughput is
the CPU available divided by it), with vs without the watcher.

    .venv/bin/python benchmarks/bench_dashboard.py [--clients 10000] [--seconds 4] [--rounds 6]

Results: docs/dashboard.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib

from broker.packets import Connack, Connect, Decoder, Publish, Subscribe, SubscriptionRequest, encode

BROKER = """
import asyncio, sys
from broker import Broker

async def main() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=10, metrics_listen="127.0.0.1:0") as b:
        print(b.port, b.metrics_port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
"""

PAGES = {
    "overview": ["/", "/app.js", "/app.css", "/api/session", "/api/history", "/api/overview"],
    "clients": ["/api/clients?q=&offset=0&limit=100"],
    "clients (search)": ["/api/clients?q=idle{half}&offset=0&limit=100"],
    "client detail": ["/api/clients/idle{half}"],
    "subscriptions": ["/api/subscriptions?q=&offset=0&limit=100"],
    "subscriptions (search)": ["/api/subscriptions?q=c/{half}/&offset=0&limit=100"],
    "topics": ["/api/topics?offset=0&limit=200", "/api/topics?prefix=r&offset=0&limit=200"],
}


# ------------------------------------------------------------------ clients
async def _idle(port: int, i: int) -> asyncio.StreamWriter:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode(Connect(f"idle{i}", 4, keep_alive=600), 4))
    dec = Decoder(4, server=False)
    while True:
        data = await reader.read(64)
        if not data:
            raise ConnectionError(f"connection {i} closed before CONNACK")
        got = dec.feed(data)
        if got:
            assert isinstance(got[0], Connack) and got[0].reason_code == 0, got
            break
    writer.write(encode(Subscribe(1, (SubscriptionRequest(f"c/{i}/#", 0),)), 4))
    return writer


class Http:
    """One keep-alive HTTP/1.1 connection (what a browser tab uses)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Http:
        return cls(*await asyncio.open_connection("127.0.0.1", port, limit=2**24))

    async def get(self, path: str) -> tuple[int, bytes]:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def _wait_for(http: Http, key: str, value: int) -> None:
    import json

    async with asyncio.timeout(120):
        while True:
            _, body = await http.get("/api/overview")
            if json.loads(body)[key] >= value:
                return
            await asyncio.sleep(0.2)


async def pages(port: int, hport: int, n: int, repeat: int) -> None:
    writers: list[asyncio.StreamWriter] = []
    t0 = time.perf_counter()
    for start in range(0, n, 500):
        writers += await asyncio.gather(*(_idle(port, i) for i in range(start, min(n, start + 500))))
    pub = writers[0]
    for i in range(2000):
        pub.write(encode(Publish(f"r/{i % 40}/{i}", b'{"v": %d}' % i, 0, retain=True), 4))
    http = await Http.open(hport)
    await _wait_for(http, "clients_connected", n)
    await _wait_for(http, "subscriptions", n)
    await _wait_for(http, "retained", 2000)
    print(f"{n} clients connected and subscribed, 2000 retained messages ({time.perf_counter() - t0:.1f} s)")
    print(f"{'page':<24} {'requests':>8} {'median ms':>10} {'max ms':>8} {'bytes':>9}")
    for page, paths in PAGES.items():
        times = []
        size = 0
        for _ in range(repeat):
            t = time.perf_counter()
            size = 0
            for path in paths:
                status, body = await http.get(path.format(half=n // 2))
                assert status == 200, (path, status, body[:200])
                size += len(body)
            times.append(time.perf_counter() - t)
        print(
            f"{page:<24} {len(paths):>8} {statistics.median(times) * 1000:>10.1f} "
            f"{max(times) * 1000:>8.1f} {size:>9}"
        )
    await browser(hport, n)
    http.close()
    for w in writers:
        w.close()


async def browser(hport: int, n: int) -> None:
    from tests.dashboard.cdp import Chromium, Page, find_chromium

    binary = find_chromium()
    if binary is None:
        print("Chromium not installed: no browser page loads measured")
        return
    chrome = await asyncio.to_thread(Chromium, binary)
    try:
        page = await Page.open(await asyncio.to_thread(chrome.page_url))
        base = f"http://127.0.0.1:{hport}/"
        shown = f"{n / 1000:.1f} k" if n >= 10_000 else str(n)  # app.js fmt()
        checks = {
            "overview": f"document.getElementById('clients_connected').textContent === '{shown}'",
            "clients": "document.querySelectorAll('#client_rows tr').length === 100",
            "subscriptions": "document.querySelectorAll('#sub_rows tr').length === 100",
            "topics": "document.querySelectorAll('#topic_rows tr').length >= 1",
        }
        print(f"{'Chromium: tab':<24} {'load ms (5 runs)':>40} {'median':>7}")
        for tab, ready in checks.items():
            runs = []
            for _ in range(5):
                await page.navigate("about:blank")
                await page.wait_for("document.readyState === 'complete'")
                t = time.perf_counter()
                await page.navigate(base + "#" + tab)
                await page.wait_for(f"document.body && document.body.dataset.ready === '1' && ({ready})", 30)
                runs.append((time.perf_counter() - t) * 1000)
            print(f"{tab:<24} {' '.join(f'{x:7.0f}' for x in runs):>40} {statistics.median(runs):7.0f}")
        assert not page.errors, page.errors
        await page.close()
    finally:
        await asyncio.to_thread(chrome.close)


# ------------------------------------------------------------------ throughput cost
class Counter(asyncio.Protocol):
    def __init__(self) -> None:
        self.bytes = 0

    def data_received(self, data: bytes) -> None:
        self.bytes += len(data)


async def _client(
    port: int, ident: str, topic_filter: str | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode(Connect(ident, 4, keep_alive=600), 4))
    await reader.readexactly(4)  # CONNACK
    if topic_filter is not None:
        writer.write(encode(Subscribe(1, (SubscriptionRequest(topic_filter, 0),)), 4))
        await reader.readexactly(5)  # SUBACK
    return reader, writer


async def _flood(writer: asyncio.StreamWriter, block: bytes, stop: asyncio.Event) -> None:
    while not stop.is_set():
        writer.write(block)
        await writer.drain()


async def _watch(hport: int, stop: asyncio.Event) -> None:
    """A browser's overview tab (SSE) plus the clients tab's poll every 5 s."""
    reader, writer = await asyncio.open_connection("127.0.0.1", hport)
    writer.write(b"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    poll = await Http.open(hport)

    async def read_events() -> None:
        while await reader.read(65536):
            pass

    events = asyncio.create_task(read_events())
    try:
        while not stop.is_set():
            await poll.get("/api/clients?q=&offset=0&limit=100")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 5)
    finally:
        events.cancel()
        writer.close()
        poll.close()


async def cost(port: int, hport: int, broker: psutil.Process, seconds: float, rounds: int) -> None:
    frame = encode(Publish("bench/t", b"x" * 64, 0), 4)
    block = frame * 200
    subs = []
    for i in range(4):
        _reader, writer = await _client(port, f"sub{i}", "bench/#")
        counter = Counter()
        writer.transport.set_protocol(counter)  # count bytes from now on
        subs.append((writer, counter))
    pubs = [(await _client(port, f"pub{i}", None))[1] for i in range(2)]
    me = psutil.Process()
    stop = asyncio.Event()
    floods = [asyncio.create_task(_flood(w, block, stop)) for w in pubs]
    await asyncio.sleep(2.0)  # warm-up
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    broker_cpu = {False: 0.0, True: 0.0}
    for r in range(rounds):
        for watched in (False, True) if r % 2 == 0 else (True, False):
            wstop = asyncio.Event()
            watcher = asyncio.create_task(_watch(hport, wstop)) if watched else None
            await asyncio.sleep(0.5)  # the watcher's first requests out of the window
            b0, m0, t0 = (
                sum(c.bytes for _, c in subs),
                (broker.cpu_times(), me.cpu_times()),
                time.perf_counter(),
            )
            await asyncio.sleep(seconds)
            b1, m1, t1 = (
                sum(c.bytes for _, c in subs),
                (broker.cpu_times(), me.cpu_times()),
                time.perf_counter(),
            )
            wstop.set()
            if watcher is not None:
                await watcher
            dt = t1 - t0
            n = (b1 - b0) / len(frame)
            bsec = m1[0].user + m1[0].system - m0[0].user - m0[0].system
            lsec = m1[1].user + m1[1].system - m0[1].user - m0[1].system
            results[watched].append((n / dt, bsec / n * 1e6))
            broker_cpu[watched] += bsec
            print(
                f"round {r + 1} {'with' if watched else 'without':>7} watcher: "
                f"{n / dt:>10,.0f} deliveries/s, "
                f"broker CPU {bsec / dt * 100:5.1f} % = {bsec / n * 1e6:.3f} us per delivery, "
                f"load generator CPU {lsec / dt * 100:5.1f} %"
            )
    stop.set()
    await asyncio.gather(*floods, return_exceptions=True)
    rate = {k: statistics.fmean(x[0] for x in v) for k, v in results.items()}
    per = {k: statistics.fmean(x[1] for x in v) for k, v in results.items()}
    pairs = [w[1] / wo[1] for w, wo in zip(results[True], results[False], strict=True)]
    print(
        f"deliveries/s without: {rate[False]:,.0f}, with: {rate[True]:,.0f} "
        f"(ratio {rate[True] / rate[False]:.4f}; the wall-clock rate follows the CPU share "
        "the shared machine gives)"
    )
    print(
        f"broker CPU per delivery without: {per[False]:.4f} us, with: {per[True]:.4f} us; "
        f"per-round ratios {' '.join(f'{x:.4f}' for x in pairs)}, median {statistics.median(pairs):.4f}"
    )
    print(
        f"dashboard cost (CPU per delivery, mean): {(per[True] / per[False] - 1) * 100:+.2f} % "
        "(saturated throughput = CPU / CPU per delivery; target <= 2 %)"
    )
    import json

    probe = await Http.open(hport)
    _, body = await probe.get("/api/overview")
    probe.close()
    own = json.loads(body)["dashboard"]["cpu_seconds"]
    print(
        f"the dashboard's own CPU time (sampling + requests, its counter): {own * 1000:.1f} ms = "
        f"{own / broker_cpu[True] * 100:.3f} % of the broker's {broker_cpu[True]:.1f} s of CPU in the "
        "watched phases"
    )
    for w in pubs + [w for w, _ in subs]:
        w.close()


async def run(args: argparse.Namespace) -> None:
    proc = subprocess.Popen(  # noqa: ASYNC220 (started before the measured part)
        [sys.executable, "-c", BROKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port, hport = map(int, proc.stdout.readline().split())
        broker = psutil.Process(proc.pid)
        if not args.no_cost:
            await cost(port, hport, broker, args.seconds, args.rounds)
        if not args.no_pages:
            await pages(port, hport, args.clients, args.repeat)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--no-cost", action="store_true")
    ap.add_argument("--no-pages", action="store_true")
    args = ap.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(run(args))
    else:
        uvloop.run(run(args))


if __name__ == "__main__":
    main()
