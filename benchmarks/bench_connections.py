"""Concurrent idle connections: broker memory per connection and latency under load.

A broker runs in a subprocess (an embedded ``Broker`` on port 0, default asyncio loop or
uvloop); this process opens N raw asyncio connections (CONNECT, MQTT 3.1.1, keep-alive 600),
waits for every CONNACK and measures the broker's RSS before and after (psutil) -> bytes per
connection. The QoS 1 round-trip latency of one more client (publish to itself) is measured
before the idle connections are opened and while they are open (the peer, same run); then
all connections are closed and the broker must count zero connected clients again.

    .venv/bin/python benchmarks/bench_connections.py --connections 10000 [--uvloop]

Results: docs/performance-connections.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import time

import psutil

from broker.packets import (
    Connack,
    Connect,
    Decoder,
    Puback,
    Publish,
    Subscribe,
    SubscriptionRequest,
    encode,
)

BROKER = """
import asyncio, json, sys, tracemalloc
from broker import Broker

async def main() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        print(b.port, flush=True)
        loop = asyncio.get_running_loop()
        before = None
        while True:  # one command a line; the end of stdin stops the broker
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if not line:
                return
            if line == "open":  # network connections the broker still holds, and sessions
                print(len(b._protocols()) + len(b.core.connections) + len(b.core.sessions), flush=True)
            elif line == "mark":  # --trace: what is allocated from here on is traced
                tracemalloc.start(6)
                before = tracemalloc.take_snapshot()
            elif line == "diff":  # --trace: the traced blocks still alive, the largest first
                diff = tracemalloc.take_snapshot().compare_to(before, "lineno")
                print(json.dumps([str(d) for d in diff[:15]]), flush=True)
            elif line == "heap":  # --trace: pymalloc's arenas and glibc's heap, on stderr
                tracemalloc.stop()  # pymalloc reports nothing while tracemalloc wraps it
                sys._debugmallocstats()
                import ctypes
                ctypes.CDLL(None).malloc_stats()
                print("", flush=True)

if "--uvloop" in sys.argv:
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""


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
            return writer


async def _latency(port: int, rounds: int) -> list[float]:
    """QoS 1 publish -> own delivery round trips (seconds) of one MQTT 5 client."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    dec = Decoder(5, server=False)
    pending: list[object] = []

    async def recv() -> object:
        while not pending:
            data = await asyncio.wait_for(reader.read(65536), 30)
            if not data:
                raise ConnectionError("probe closed")
            pending.extend(dec.feed(data))
        return pending.pop(0)

    writer.write(encode(Connect("probe", 5), 5))
    assert isinstance(await recv(), Connack)
    writer.write(encode(Subscribe(1, (SubscriptionRequest("probe/t", 1),)), 5))
    await recv()
    out: list[float] = []
    for i in range(rounds):
        pid = i % 60000 + 1
        t0 = time.perf_counter()
        writer.write(encode(Publish("probe/t", b"ping", 1, packet_id=pid), 5))
        while True:
            p = await recv()
            if isinstance(p, Publish):
                assert p.packet_id is not None
                writer.write(encode(Puback(p.packet_id), 5))
                break
        out.append(time.perf_counter() - t0)
        while pending:  # the PUBACK of our publish
            pending.pop(0)
    writer.close()
    return out


def _ms(xs: list[float], q: float) -> float:
    return sorted(xs)[int(q * (len(xs) - 1))] * 1000


def _ask(proc: subprocess.Popen[str], command: str) -> str:
    """One command to the broker process (``BROKER``), its one-line answer."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    return proc.stdout.readline() if command in {"open", "diff", "heap"} else ""


async def run(n: int, rounds: int, uvloop: bool, trace: bool = False) -> None:
    args = [sys.executable, "-c", BROKER] + (["--uvloop"] if uvloop else [])
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220 (started before the measured part)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port = int(proc.stdout.readline())
        ps = psutil.Process(proc.pid)
        base = await _latency(port, rounds)  # also warms the broker up
        gc.collect()
        if trace:
            _ask(proc, "mark")
        rss0 = ps.memory_info().rss
        t0 = time.perf_counter()
        writers: list[asyncio.StreamWriter] = []
        batch = 500
        for start in range(0, n, batch):
            writers += await asyncio.gather(*(_idle(port, i) for i in range(start, min(n, start + batch))))
        t_open = time.perf_counter() - t0
        rss1 = ps.memory_info().rss
        loaded = await _latency(port, rounds)
        t0 = time.perf_counter()
        for w in writers:
            w.close()
        # the broker has ended every connection and session before its RSS is read again (a
        # fixed second read it mid-teardown when the machine was loaded); at most 60 s
        while int(_ask(proc, "open")) and time.perf_counter() - t0 < 60:  # noqa: ASYNC110 (another process's state)
            await asyncio.sleep(0.05)
        t_close = time.perf_counter() - t0
        rss2 = ps.memory_info().rss
        per = (rss1 - rss0) / n
        print(f"loop: {'uvloop' if uvloop else 'asyncio'}; connections: {n} opened in {t_open:.2f} s")
        print(f"broker RSS: {rss0 / 2**20:.1f} MiB -> {rss1 / 2**20:.1f} MiB with {n} idle connections")
        print(
            f"  = {per:,.0f} bytes ({per / 1024:.1f} KiB) per connection; "
            f"{rss2 / 2**20:.1f} MiB after closing (all ended {t_close:.2f} s after the closes)"
        )
        if trace:
            for line in json.loads(_ask(proc, "diff")):
                print(f"  traced, still allocated since before the connections: {line}")
            sys.stdout.flush()
            _ask(proc, "heap")  # the allocators' own accounts, on stderr
        for name, xs in (("without idle connections", base), (f"with {n} idle connections", loaded)):
            print(
                f"QoS 1 round trip {name}: p50 {_ms(xs, 0.5):.3f} ms, p99 {_ms(xs, 0.99):.3f} ms, "
                f"mean {statistics.fmean(xs) * 1000:.3f} ms"
            )
        print(f"ratio loaded/unloaded p50: {_ms(loaded, 0.5) / _ms(base, 0.5):.2f}")
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--uvloop", action="store_true")
    ap.add_argument(
        "--trace",
        action="store_true",
        help="tracemalloc in the broker from before the connections open; after they closed, "
        "the allocations still alive (slower: not for the timings)",
    )
    a = ap.parse_args()
    asyncio.run(run(a.connections, a.rounds, a.uvloop, a.trace))


if __name__ == "__main__":
    main()
