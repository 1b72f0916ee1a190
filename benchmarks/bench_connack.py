"""Latency of CONNACK and SUBACK for persisted sessions (they wait for the store's commit).

    .venv/bin/python benchmarks/bench_connack.py [--n 200]

An embedded broker with a SQLite file store (``store_path``) and one without; a raw client
connects ``--n`` times as a new persistent session (clean start, session expiry 3600 s),
subscribes once, and disconnects; printed: median and p90 of CONNECT -> CONNACK and SUBSCRIBE ->
SUBACK in milliseconds, for both brokers, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker import Broker
from broker.packets import Connack, Connect, Properties, Suback, Subscribe, SubscriptionRequest
from tests.rawclient import RawClient

EXPIRY = Properties(session_expiry_interval=3600)


async def measure(store: str | None, n: int) -> tuple[list[float], list[float]]:
    connack, suback = [], []
    async with Broker(port=0, sys_interval=0, store_path=store) as b:
        for i in range(n):
            c = await RawClient.open(b.port)
            t = time.perf_counter()
            c.send(Connect(f"c{i}", 5, clean_start=True, properties=EXPIRY))
            assert isinstance(await c.recv(), Connack)
            connack.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            c.send(Subscribe(1, (SubscriptionRequest(f"t/{i}", 1),)))
            assert isinstance(await c.recv(), Suback)
            suback.append((time.perf_counter() - t) * 1e3)
            await c.close()
    return connack, suback


def q(xs: list[float], p: float) -> float:
    return sorted(xs)[int(p * (len(xs) - 1))]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    print("| store | CONNACK median | CONNACK p90 | SUBACK median | SUBACK p90 |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for label, store in (("none", None), ("SQLite file", str(Path(tmp) / "b.db"))):
            ca, sa = await measure(store, args.n)
            print(
                f"| {label} | {statistics.median(ca):.3f} ms | {q(ca, 0.9):.3f} ms "
                f"| {statistics.median(sa):.3f} ms | {q(sa, 0.9):.3f} ms |",
                flush=True,
            )


if __name__ == "__main__":
    asyncio.run(main())
