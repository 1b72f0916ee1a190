"""What h11 costs the HTTP listener (issue 37, item 5): ``/metrics`` and a dashboard API call
served by the h11-based listener (``broker/net/_http.py``) against the hand-written parser it
replaced (``benchmarks/_http_legacy.py``, main at 3443128), same run, same broker, same
handler.

A broker runs in a subprocess (uvloop when installed) with ``metrics_listen`` (the h11
listener) and a second listener of the legacy server on the same :class:`Dashboard` handler;
it holds ``--clients`` MQTT sessions so that ``/metrics`` and ``/api/overview`` read a
populated core. This process runs ``--connections`` keep-alive HTTP connections, each
sending one request after the other (closed loop) for ``--seconds`` per phase; phases
alternate legacy / h11 for ``--rounds`` rounds against the machine's drift. Reported per
server and endpoint: requests/s, latency p50 / p99, and the broker process's CPU time per
request (the cost that does not depend on the share of a core the machine leaves it). Then
(``--attacks``, on by default) the findings against both listeners at once: 260 partial
heads then ``/metrics``; 260 event streams then ``/metrics`` and ``/api/overview``;
``Content-Length: ²``, ``//[x/``, a good request pipelined before a bad one; a slowloris head
(one byte per 0.5 s, watched for 30 s). Last, in this process, the parser alone: parse one
request and write its response (sans-IO, no socket), old vs new.

    .venv/bin/python benchmarks/bench_http.py [--seconds 3] [--rounds 4] [--connections 4]

Results: docs/security.md, "HTTP listener".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SERVER = """
import asyncio, sys
sys.path.insert(0, {bench!r})
from broker import Broker
import _http_legacy

async def main() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0") as b:
        legacy = await _http_legacy.serve_http("127.0.0.1", 0, b.dashboard.handle)
        clients = []
        for i in range({clients}):
            r, w = await asyncio.open_connection("127.0.0.1", b.port)
            cid = f"c{{i}}".encode()
            w.write(bytes([0x10, 12 + len(cid), 0, 4]) + b"MQTT" + bytes([4, 2, 0, 60, 0, len(cid)]) + cid)
            await r.readexactly(4)
            clients.append(w)
        print(b.metrics_port, legacy.port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await legacy.close()

try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
"""

PATHS = ("/metrics", "/api/overview")


async def _one_connection(port: int, path: str, until: float, lat: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    try:
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            low = head.lower()
            i = low.index(b"content-length:") + 15
            n = int(low[i : low.index(b"\r\n", i)])
            await reader.readexactly(n)
            assert head.startswith(b"HTTP/1.1 200"), head[:40]
            lat.append(time.perf_counter() - t0)
    finally:
        writer.close()


async def phase(
    port: int, path: str, seconds: float, conns: int, proc: psutil.Process
) -> tuple[int, list[float], float]:
    lat: list[float] = []
    cpu0 = sum(proc.cpu_times()[:2])
    t0 = time.perf_counter()
    until = t0 + seconds
    await asyncio.gather(*(_one_connection(port, path, until, lat) for _ in range(conns)))
    wall = time.perf_counter() - t0
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    return len(lat), lat, cpu / max(len(lat), 1) / 1e-6 if wall else 0.0


HOST = b"Host: 127.0.0.1\r\n"


async def _status(port: int, data: bytes) -> tuple[str, float]:
    """(the status of the answer to ``data`` on a new connection or what happened, ms)."""
    t0 = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        return f"connect: {exc.strerror}", 0.0
    try:
        writer.write(data)
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
        return head.split(b" ", 2)[1].decode(), (time.perf_counter() - t0) * 1e3
    except TimeoutError:
        return "no answer", (time.perf_counter() - t0) * 1e3
    except (asyncio.IncompleteReadError, ConnectionError):
        return "closed", (time.perf_counter() - t0) * 1e3
    finally:
        writer.close()


async def attacks(port: int, slow_for: float) -> list[tuple[str, str]]:
    """The findings of issue 37 item 5 against one listener: (case, outcome)."""
    out: list[tuple[str, str]] = []
    metrics = b"GET /metrics HTTP/1.1\r\n" + HOST + b"\r\n"
    overview = b"GET /api/overview HTTP/1.1\r\n" + HOST + b"\r\n"
    writers: list[asyncio.StreamWriter] = []
    # 260 partial heads, then /metrics
    for _ in range(260):
        _, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /metrics HTTP/1.1\r\n" + HOST + b"X-Slow: ")
        writers.append(w)
    st, ms = await _status(port, metrics)
    out.append(("260 partial heads, then GET /metrics", f"{st} in {ms:.1f} ms"))
    for w in writers:
        w.close()
    writers.clear()
    await asyncio.sleep(1)  # let the listener see the closes before the next case
    # 260 event streams, one after the other, then /metrics and the API
    codes: dict[str, int] = {}
    for _ in range(260):
        try:
            reader, w = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            codes["connect refused"] = codes.get("connect refused", 0) + 1
            continue
        writers.append(w)
        w.write(b"GET /api/events HTTP/1.1\r\n" + HOST + b"\r\n")
        try:
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
            code = head.split(b" ", 2)[1].decode()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            code = "closed"
        codes[code] = codes.get(code, 0) + 1
    out.append(("260 event streams", ", ".join(f"{n} x {c}" for c, n in sorted(codes.items()))))
    st, ms = await _status(port, metrics)
    st2, ms2 = await _status(port, overview)
    out.append(("... then GET /metrics, GET /api/overview", f"{st} in {ms:.1f} ms, {st2} in {ms2:.1f} ms"))
    for w in writers:
        w.close()
    writers.clear()
    await asyncio.sleep(1)
    # malformed requests
    for name, data in (
        (
            "Content-Length: \u00b2 (latin-1 byte B2)",
            b"GET / HTTP/1.1\r\n" + HOST + b"Content-Length: \xb2\r\n\r\n",
        ),
        (
            "Content-Length: \u00b2 (UTF-8)",
            b"GET / HTTP/1.1\r\n" + HOST + b"Content-Length: \xc2\xb2\r\n\r\n",
        ),
        ("GET //[x/", b"GET //[x/ HTTP/1.1\r\n" + HOST + b"\r\n"),
    ):
        st, _ = await _status(port, data)
        out.append((name, st))
    reader, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(metrics + b"GET / HTTP/1.1\r\n" + HOST + b"Content-Length: \xb2\r\n\r\n")
    seen = []
    with contextlib.suppress(TimeoutError, asyncio.IncompleteReadError, ConnectionError):
        async with asyncio.timeout(10):
            while len(seen) < 2:
                head = await reader.readuntil(b"\r\n\r\n")
                seen.append(head.split(b" ", 2)[1].decode())
                low = head.lower()
                if b"content-length:" in low:
                    i = low.index(b"content-length:") + 15
                    await reader.readexactly(int(low[i : low.index(b"\r\n", i)]))
    w.close()
    out.append(("GET /metrics pipelined before a bad request", " then ".join(seen) or "nothing"))
    # slowloris: one byte every 0.5 s
    reader, w = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.perf_counter()
    verdict = f"still open after {slow_for:g} s"
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(slow_for):
            for ch in b"GET /metrics HTTP/1.1\r\n" + HOST + b"X-Slow: " + b"a" * 1000:
                w.write(bytes([ch]))
                try:
                    async with asyncio.timeout(0.5):
                        got = await reader.read(100)
                except TimeoutError:
                    continue
                first = got.split(b"\r\n", 1)[0].decode(errors="replace")
                verdict = f"closed after {time.perf_counter() - t0:.1f} s ({first or 'no answer'})"
                break
    w.close()
    out.append(("slowloris head, 1 byte / 0.5 s", verdict))
    return out


def parser_only(n: int) -> dict[str, float]:
    """µs to parse one request and write its response, sans-IO (no socket, no handler)."""
    import _http_legacy as old

    from broker.net import _http as new

    raw = (
        b"GET /api/clients?offset=0&limit=50&q=sensor HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n"
        b"User-Agent: Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0\r\nAccept: application/json\r\n"
        b"Accept-Language: en\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n"
        b"Authorization: Basic YWRtaW46czNjcmV0\r\nReferer: http://127.0.0.1:9464/\r\n\r\n"
    )
    body = b"x" * 2000

    def legacy() -> None:
        p = old.RequestParser()
        (req,) = p.feed(raw)
        old.encode_head(old.Response(200, body, "application/json"), req.keep_alive) + body

    def h11() -> None:
        hc = new.HttpConnection()
        hc.feed(raw)
        req = hc.next_request()
        assert req is not None
        hc.respond(new.Response(200, body, "application/json"))
        hc.next_cycle()

    out = {}
    for name, fn in (("legacy", legacy), ("h11", h11), ("legacy ", legacy), ("h11 ", h11)):
        out[name.strip()] = min(timeit.repeat(fn, number=n, repeat=5)) / n / 1e-6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument(
        "--attacks",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the findings (partial heads, streams, malformed, slowloris) against both",
    )
    args = ap.parse_args()
    code = SERVER.format(bench=str(ROOT / "benchmarks"), clients=args.clients)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        h11_port, legacy_port = map(int, proc.stdout.readline().split())
        ps = psutil.Process(proc.pid)
        results: dict[tuple[str, str], list[tuple[int, list[float], float]]] = {}

        async def run() -> None:
            for path in PATHS:  # warm up both
                for port in (legacy_port, h11_port):
                    await phase(port, path, 0.5, args.connections, ps)
            for _ in range(args.rounds):
                for path in PATHS:
                    for name, port in (("legacy", legacy_port), ("h11", h11_port)):
                        r = await phase(port, path, args.seconds, args.connections, ps)
                        results.setdefault((name, path), []).append(r)

        asyncio.run(run())
        print(
            f"{args.connections} keep-alive connections, {args.seconds:g} s x {args.rounds} rounds, "
            f"{args.clients} MQTT clients"
        )
        print(f"{'server':8} {'path':14} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>11}")
        summary: dict[tuple[str, str], tuple[float, float, float, float]] = {}
        for path in PATHS:
            for name in ("legacy", "h11"):
                rs = results[(name, path)]
                rate = statistics.median(n / args.seconds for n, _, _ in rs)
                lat = sorted(x for _, ls, _ in rs for x in ls)
                p50 = lat[len(lat) // 2] * 1e3
                p99 = lat[int(len(lat) * 0.99)] * 1e3
                cpu = statistics.median(c for _, _, c in rs)
                summary[(name, path)] = (rate, p50, p99, cpu)
                print(f"{name:8} {path:14} {rate:8.0f} {p50:8.2f} {p99:8.2f} {cpu:11.1f}")
        for path in PATHS:
            lo, hi = summary[("legacy", path)], summary[("h11", path)]
            print(
                f"h11 / legacy {path}: req/s x{hi[0] / lo[0]:.2f}, p50 x{hi[1] / lo[1]:.2f}, "
                f"CPU per request x{hi[3] / lo[3]:.2f}"
            )
        if args.attacks:

            async def both() -> list[list[tuple[str, str]]]:
                return list(await asyncio.gather(attacks(legacy_port, 30), attacks(h11_port, 30)))

            old_out, new_out = asyncio.run(both())
            print(f"\n{'attack':44} | {'legacy parser (main)':34} | h11 listener")
            for (case, a), (_, b) in zip(old_out, new_out, strict=True):
                print(f"{case:44} | {a:34} | {b}")
        po = parser_only(2000)
        print(
            f"parser only (parse one request + write a 2 kB response): legacy {po['legacy']:.1f} us, "
            f"h11 {po['h11']:.1f} us (x{po['h11'] / po['legacy']:.2f})"
        )
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(10)


if __name__ == "__main__":
    main()
