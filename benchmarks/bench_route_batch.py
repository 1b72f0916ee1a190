"""Micro-batched content matching in the router (issue 8): ``Router.route_batch`` vs one
``Router.route`` per message, on the subscriptions of the broker benchmark's ``content``
scenario (benchmarks/loadgen/_scenarios.py: 1,000 subscribers x 10 topics = 10,000 selector
subscriptions, ``id = c AND temp > 10``, 100 topic candidates per message).

    .venv/bin/python benchmarks/bench_route_batch.py [--messages 20000] [--engines hema,hcem,rabased]

Prints routes/s per engine, per message and in batches of 8, 16, 32 and 128, and the ratios, all
measured in one process, alternating (per message, batch, per message, ...) so that drift of a
noisy machine hits both.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen._scenarios import _CF_GROUPS, _CF_PER_GROUP, _CF_TOPICS

import content
from broker.core._router import Router
from broker.values import Message, SubOptions

BATCHES = (8, 16, 32, 128)


def build(engine: str) -> Router:
    router = Router(engine=engine, batch_min=1)
    for g in range(_CF_GROUPS):
        for m in range(_CF_PER_GROUP):
            c = g + _CF_GROUPS * m
            sel = f"id = {c} AND temp > 10"
            for k in range(_CF_TOPICS):
                router.add_selector(sel, content.compile(sel))
                router.index.subscribe(
                    f"s{c}", f"cf/{g}/{k}", SubOptions(0, selector=sel, topic_filter=f"cf/{g}/{k}")
                )
    return router


def messages(n: int) -> list[Message]:
    rnd = random.Random(1)
    out = []
    for _ in range(n):
        g, m, k = rnd.randrange(_CF_GROUPS), rnd.randrange(_CF_PER_GROUP), rnd.randrange(_CF_TOPICS)
        c = g + _CF_GROUPS * m
        payload = orjson.dumps({"id": c, "temp": 20 + c % 7, "pad": "x" * 40})
        out.append(Message(f"cf/{g}/{k}", payload, 0, publisher_id="p"))
    return out


def run(router: Router, msgs: list[Message], batch: int) -> float:
    t = time.perf_counter()
    if batch == 1:
        for m in msgs:
            router.route(m)
    else:
        for i in range(0, len(msgs), batch):
            router.route_batch(msgs[i : i + batch])
    return len(msgs) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--engines", default="hema,hcem,rabased,iccounting")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    msgs = messages(args.messages)
    print("| engine | per message (routes/s) | " + " | ".join(f"batch {b}" for b in BATCHES) + " |")
    print("|---|---:|" + "---:|" * len(BATCHES))
    for name in args.engines.split(","):
        router = build(name)
        # check: same deliveries either way
        assert router.route_batch(msgs[:64]) == [router.route(m) for m in msgs[:64]]
        run(router, msgs[:2000], 1)  # warm the plan cache and the engine
        best: dict[int, float] = {}
        for _ in range(args.rounds):
            for b in (1, *BATCHES):
                best[b] = max(best.get(b, 0.0), run(router, msgs, b))
        cells = " | ".join(f"{best[b]:,.0f} ({best[b] / best[1]:.2f}x)" for b in BATCHES)
        print(f"| {name} | {best[1]:,.0f} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
