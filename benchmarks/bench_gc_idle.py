"""What a content fleet leaves for the garbage collector after its first messages (issue 42 item 2).

Usage (from the repository root; the installed build, in-process, a few seconds):

    .venv/bin/python benchmarks/bench_gc_idle.py --sessions 3000 --filters 10

An embedded :class:`broker.Broker` (iccounting, tick every 50 ms) gets ``--sessions``
in-process sessions of ``--filters`` content subscriptions each (the selectors of
``bench_content_fleet``), added 500 sessions at a time with idle ticks between (a fleet
connecting); then the five warm-up messages of that benchmark, each followed by 0.3 s idle.
After the fleet and after each message it prints the broker's idle collections so far
(``Broker.idle_collections``, the last one's pause; "-" on a tree without them), the objects not frozen per
generation and their most common types; at the end the time of one full collection
(``gc.collect()``: what the next automatic full collection would walk).  Results:
docs/performance-content.md, "The collector's pause before a fleet's first fan-out".
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_content_fleet import TOPIC, TOPIC_FILTERS, payload, selector

from broker import Broker


def _unfrozen() -> str:
    counts: dict[str, int] = {}
    for g in range(3):
        for o in gc.get_objects(g):
            k = type(o).__name__
            counts[k] = counts.get(k, 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:3]
    return f"{[len(gc.get_objects(g)) for g in range(3)]} {top}"


async def run(sessions: int, filters: int) -> None:
    async with Broker(
        host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05, content_engine="iccounting"
    ) as b:
        for c in range(sessions):
            for k in range(filters):
                b.core.local_subscribe(
                    f"sub{c}", TOPIC_FILTERS[k], selector(c, k)[0], 0, lambda m, r: None, 0.0
                )
            if c % 500 == 499:
                await asyncio.sleep(0.07)  # ticks run between the fleet's slices
        await asyncio.sleep(0.3)

        def idle() -> str:
            if not hasattr(b, "idle_collections"):
                return "-"
            return f"{b.idle_collections} (the last {b.idle_collection_s * 1e3:.1f} ms)"

        print(f"after the fleet: idle collections {idle()}, not frozen {_unfrozen()}")
        for s in range(-5, 0):
            n = await b.publish(TOPIC, payload(s, 1))
            await asyncio.sleep(0.3)
            print(f"after message {s} ({n} deliveries): idle collections {idle()}, not frozen {_unfrozen()}")
        t = time.perf_counter()
        gc.collect()
        print(f"one full collection now: {(time.perf_counter() - t) * 1e3:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=3000)
    ap.add_argument("--filters", type=int, default=10)
    args = ap.parse_args()
    if args.sessions < 1 or args.filters < 1:
        ap.error("--sessions and --filters: at least 1")
    asyncio.run(run(args.sessions, args.filters))


if __name__ == "__main__":
    main()
