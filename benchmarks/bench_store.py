"""Durable-acknowledgement throughput of broker.store: group commit against one commit per op.

    .venv/bin/python benchmarks/bench_store.py [--ops 3000] [--rounds 3] [--out docs/performance-store.md]

One "operation" is what the broker does for a QoS 1 PUBLISH routed to one offline persistent
session: queue an ``OutgoingRecord`` (64-byte payload) and wait until it is durable before the
PUBACK.  Every configuration runs in each round, interleaved, on a fresh database in the same
directory (the shared machine is noisy: read the ratios, and the median of the rounds).

* ``sqlite3 commit/op`` (peer): plain ``sqlite3`` on the caller's thread, one INSERT + COMMIT per
  operation (what a store without group commit does).
* ``Store, 1 waiter``: our writer thread, one publisher that waits for each commit (no batching
  possible: the price of the thread hand-off).
* ``Store, N waiters``: N asyncio publishers, each queueing its record and awaiting
  ``store.durable()``; records queued while a commit runs share the next one (group commit).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from broker.store import MIGRATIONS, MessageRecord, MessageState, OutgoingRecord, Store

PAYLOAD = b"x" * 64


def _record(store: Store, i: int) -> OutgoingRecord:
    msg = MessageRecord("sensors/b7/f3/r12/temperature", PAYLOAD, 1, False)
    return OutgoingRecord(f"client-{i % 100}", store.next_seq(), MessageState.QUEUED, None, msg, 1, False)


def peer_commit_per_op(path: Path, ops: int, sync: str) -> tuple[float, int]:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={sync}")
    for stmt in MIGRATIONS[0].split(";"):
        if stmt.strip():
            db.execute(stmt)
    sql = "INSERT INTO outgoing VALUES (?,?,0,0,NULL,?,?,1,0,NULL,NULL,NULL,1,0,NULL,'',NULL)"
    t0 = time.perf_counter()
    for i in range(ops):
        db.execute("BEGIN")
        db.execute(sql, (f"client-{i % 100}", i, "sensors/b7/f3/r12/temperature", PAYLOAD))
        db.execute("COMMIT")
    dt = time.perf_counter() - t0
    db.close()
    return ops / dt, ops


def store_waiters(path: Path, ops: int, sync: str, waiters: int) -> tuple[float, int]:
    store = Store(path, synchronous=sync)

    async def publisher(k: int) -> None:
        for i in range(k, ops, waiters):
            store.add_outgoing(_record(store, i))
            await store.durable()

    async def run() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(publisher(k) for k in range(waiters)))
        return time.perf_counter() - t0

    dt = asyncio.run(run())
    commits = store.commits
    store.close()
    return ops / dt, commits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--waiters", default="1,8,64,256")
    ap.add_argument("--dir", default=None, help="directory of the databases (default: a temp dir)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="siftmq-bench-store-"))
    base.mkdir(parents=True, exist_ok=True)
    configs: list[tuple[str, str, Callable[[Path], tuple[float, int]]]] = []
    for sync in ("FULL", "NORMAL"):
        configs.append(
            ("sqlite3 commit/op (peer)", sync, partial(peer_commit_per_op, ops=args.ops, sync=sync))
        )
        for w in map(int, args.waiters.split(",")):
            run = partial(store_waiters, ops=args.ops, sync=sync, waiters=w)
            configs.append((f"Store, {w} waiters", sync, run))
    results: dict[tuple[str, str], list[tuple[float, int]]] = {(n, s): [] for n, s, _ in configs}
    for r in range(args.rounds):
        for name, sync, fn in configs:
            path = base / f"r{r}-{sync}-{name.split(',')[0].split()[0]}-{len(results[name, sync])}.db"
            results[name, sync].append(fn(path))
            for suffix in ("", "-wal", "-shm"):
                Path(str(path) + suffix).unlink(missing_ok=True)
            print(f"round {r}: {sync:6} {name:28} {results[name, sync][-1][0]:10.0f} ops/s", flush=True)
    lines = [
        "| synchronous | configuration | durable ops/s (median) | vs peer | commits | ops per commit |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for sync in ("FULL", "NORMAL"):
        peer = statistics.median(x for x, _ in results["sqlite3 commit/op (peer)", sync])
        for name, s, _ in configs:
            if s != sync:
                continue
            runs = results[name, s]
            med = statistics.median(x for x, _ in runs)
            commits = statistics.median(c for _, c in runs)
            per = args.ops / commits
            lines.append(f"| {sync} | {name} | {med:,.0f} | {med / peer:.2f}x | {commits:,.0f} | {per:.1f} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        note = (
            f"Machine: {platform.machine()}, {os.cpu_count()} cores shared with other jobs, Python "
            f"{platform.python_version()}, SQLite {sqlite3.sqlite_version}, databases under {base}.\n"
            f"Ops per configuration and round: {args.ops}; rounds: {args.rounds} (median shown).\n"
        )
        Path(args.out).write_text(table + "\n\n" + note)


if __name__ == "__main__":
    main()
