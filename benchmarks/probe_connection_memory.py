"""Where an idle connection's memory goes: tracemalloc by allocation site in the broker.

A broker (embedded ``Broker``, port 0, ``$SYS`` off, no store, no bridge) runs in a
subprocess with ``tracemalloc`` on; this process opens N idle MQTT 3.1.1 connections (clean
session, keep-alive 600, one SUBSCRIBE each to its own topic) and asks the broker for the
allocation difference, per allocation site and per connection, and for its RSS delta.
Compiled (mypyc) code has no frames: its allocations are charged to the nearest Python line
(an asyncio line for what the transport callbacks allocate).

    .venv/bin/python benchmarks/probe_connection_memory.py --connections 5000 [--uvloop]

Results: docs/performance-connections.md ("Where the memory goes").
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys

from broker.packets import Connack, Connect, Decoder, Suback, Subscribe, SubscriptionRequest, encode

BROKER = """
import asyncio, gc, logging, sys, tracemalloc
logging.basicConfig(level=logging.INFO)
import psutil
from broker import Broker

def rss() -> int:
    return psutil.Process().memory_info().rss

async def main() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        print(b.port, flush=True)
        loop = asyncio.get_running_loop()
        tracemalloc.start(4)
        gc.collect()
        before, rss0 = tracemalloc.take_snapshot(), rss()
        print("ready", flush=True)
        n = int(await loop.run_in_executor(None, sys.stdin.readline))
        gc.collect()
        after, rss1 = tracemalloc.take_snapshot(), rss()
        stats = after.compare_to(before, "lineno")
        total = sum(s.size_diff for s in stats)
        per = (rss1 - rss0) / n
        print(f"traced: {total / n:,.0f} B per connection; RSS delta {per:,.0f} B per connection")
        for s in stats[:25]:
            fr = s.traceback[0]
            where = f"{fr.filename.split('site-packages/')[-1]}:{fr.lineno}"
            print(f"  {s.size_diff / n:8.1f} B {s.count_diff / n:6.2f} blocks  {where}")
        print("done", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)

if "--uvloop" in sys.argv:
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""


async def _idle(port: int, i: int) -> asyncio.StreamWriter:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode(Connect(f"idle{i}", 4, keep_alive=600), 4))
    writer.write(encode(Subscribe(1, (SubscriptionRequest(f"fleet/{i}/cmd", 1),)), 4))
    dec = Decoder(4, server=False)
    got: list[object] = []
    while len(got) < 2:
        data = await reader.read(64)
        if not data:
            raise ConnectionError(f"connection {i} closed")
        got.extend(dec.feed(data))
    assert isinstance(got[0], Connack) and isinstance(got[1], Suback), got
    return writer


async def run(n: int, uvloop: bool) -> None:
    args = [sys.executable, "-c", BROKER] + (["--uvloop"] if uvloop else [])
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220 (before the measured part)
    assert proc.stdout is not None and proc.stdin is not None
    port = int(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "ready"
    writers: list[asyncio.StreamWriter] = []
    for start in range(0, n, 500):
        writers += await asyncio.gather(*(_idle(port, i) for i in range(start, min(n, start + 500))))
    proc.stdin.write(f"{n}\n")
    proc.stdin.flush()
    while (line := proc.stdout.readline()).strip() != "done":
        print(line, end="")
    for w in writers:
        w.close()
    proc.stdin.close()
    proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=5000)
    ap.add_argument("--uvloop", action="store_true")
    a = ap.parse_args()
    loop = "uvloop" if a.uvloop else "asyncio"
    print(f"loop: {loop}; {a.connections} idle connections, one subscription each")
    asyncio.run(run(a.connections, a.uvloop))


if __name__ == "__main__":
    main()
