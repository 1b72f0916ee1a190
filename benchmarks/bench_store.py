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

``--statements`` measures instead how the writer writes one round (``--rows`` deliveries:
their ``outgoing`` inserts in one transaction, then their deletes in another), on a thread
while the main thread runs Python without pause (as a busy event loop does; ``--idle``: while
it sleeps), four ways, interleaved per round:

* ``executemany`` (peer): one step per row, each releasing and taking back the GIL (the
  writer before 2026-11-29);
* ``VALUES inserts, view deletes``: the store's way (``Store._bulk``): ``INSERT INTO outgoing
  SELECT ... FROM (VALUES (..),(..))``, then ``INSERT INTO bulk_acked VALUES (..),(..)`` into a
  TEMP view whose ``INSTEAD OF`` trigger runs the DELETE per row;
* ``a view for inserts too``: the inserts through such a view as well;
* ``VALUES, per-client IN deletes``: the inserts as the store, and one ``DELETE ... WHERE
  client_id = ? AND packet_id IN (..)`` per client;
* ``json_each``: one bound JSON text per statement (``INSERT ... SELECT value->>0, ... FROM
  json_each(?)``, deletes through the bulk view); the payload crosses as text, so this one
  cannot store arbitrary BLOBs (SQLite's ``unhex`` comes with 3.41): measured for comparison.

Printed per way: wall milliseconds per round (inserts + deletes, median) and the writer
thread's CPU milliseconds per round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from broker.durability._store import _BULK_SCHEMA, _SQL, _bulk_schema, _outgoing_row
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


# ------------------------------------------------------------------ --statements
_Rows = list[tuple[object, ...]]
_COLS = 16  # parameters of an ``outgoing`` row


def _write_executemany(db: sqlite3.Connection, rows: _Rows, keys: _Rows) -> None:
    db.executemany(_SQL["outgoing"], rows)
    db.execute("COMMIT")
    db.execute("BEGIN")
    db.executemany(_SQL["acked"], keys)


def _padded(rows: _Rows, ncols: int) -> tuple[int, list[object]]:
    size = 1 << (len(rows) - 1).bit_length()
    params: list[object] = [x for r in rows for x in r]
    params.extend([None] * ((size - len(rows)) * ncols))
    return size, params


def _write_bulk_view(db: sqlite3.Connection, rows: _Rows, keys: _Rows) -> None:
    for name, data, ncols in (("outgoing", rows, _COLS), ("acked", keys, 2)):
        size, params = _padded(data, ncols)
        one = "(" + ",".join("?" * ncols) + ")"
        db.execute(f"INSERT INTO bulk_{name} VALUES " + ",".join([one] * size), params)
        if name == "outgoing":
            db.execute("COMMIT")
            db.execute("BEGIN")


_SELECT = "column1,column2,0," + ",".join(f"column{i}" for i in range(3, _COLS + 1))


def _insert_values(db: sqlite3.Connection, rows: _Rows) -> None:
    """The round's inserts in one ``INSERT ... SELECT FROM (VALUES ...)``, padded to a power of
    two, committed (the deletes follow in a transaction of their own)."""
    size, params = _padded(rows, _COLS)
    one = "(" + ",".join("?" * _COLS) + ")"
    values = ",".join([one] * size)
    db.execute(
        f"INSERT INTO outgoing SELECT {_SELECT} FROM (VALUES {values}) WHERE column1 IS NOT NULL", params
    )
    db.execute("COMMIT")
    db.execute("BEGIN")


def _write_values(db: sqlite3.Connection, rows: _Rows, keys: _Rows) -> None:
    _insert_values(db, rows)
    by_client: dict[object, list[object]] = {}
    for cid, pid in keys:
        by_client.setdefault(cid, []).append(pid)
    for cid, pids in by_client.items():
        size = 1 << (len(pids) - 1).bit_length()
        marks = ",".join("?" * size)
        pad = [None] * (size - len(pids))
        db.execute(f"DELETE FROM outgoing WHERE client_id = ? AND packet_id IN ({marks})", [cid, *pids, *pad])


def _write_values_view(db: sqlite3.Connection, rows: _Rows, keys: _Rows) -> None:
    _insert_values(db, rows)
    size, params = _padded(keys, 2)
    db.execute("INSERT INTO bulk_acked VALUES " + ",".join(["(?,?)"] * size), params)


_JSON_COLS = ",".join(["value->>0", "value->>1", "0"] + [f"value->>{i}" for i in range(2, _COLS)])


def _write_json(db: sqlite3.Connection, rows: _Rows, keys: _Rows) -> None:
    text = json.dumps([[x.decode() if isinstance(x, bytes) else x for x in r] for r in rows])
    db.execute(f"INSERT INTO outgoing SELECT {_JSON_COLS} FROM json_each(?)", (text,))
    db.execute("COMMIT")
    db.execute("BEGIN")
    db.execute("INSERT INTO bulk_acked SELECT value->>0, value->>1 FROM json_each(?)", (json.dumps(keys),))


_Write = Callable[[sqlite3.Connection, _Rows, _Rows], None]
SENT = MessageState.PUBLISH_SENT
_WAYS: dict[str, _Write] = {
    "executemany (peer)": _write_executemany,
    "VALUES inserts, view deletes (the store)": _write_values_view,
    "a view for inserts too": _write_bulk_view,
    "VALUES, per-client IN deletes": _write_values,
    "json_each": _write_json,
}


def _round(db: sqlite3.Connection, write: _Write, rows: _Rows, busy: bool) -> tuple[float, float]:
    """One round written by ``write`` on a thread while this thread is busy (or sleeps): its
    wall and thread CPU seconds."""
    keys: _Rows = [(row[0], row[3]) for row in rows]
    stop = threading.Event()
    out: list[tuple[float, float]] = []

    def writer() -> None:
        try:
            t0, c0 = time.perf_counter(), time.thread_time()
            db.execute("BEGIN")
            write(db, rows, keys)
            db.execute("COMMIT")
            out.append((time.perf_counter() - t0, time.thread_time() - c0))
        finally:
            stop.set()  # also when it failed (else the busy loop never ends)

    th = threading.Thread(target=writer)
    th.start()
    x = 0
    while not stop.is_set():
        if busy:
            x += 1  # a busy event loop: Python bytecode, never blocking
        else:
            stop.wait(0.01)
    th.join()
    assert out, "the writer failed"
    left = db.execute("SELECT COUNT(*) FROM outgoing").fetchone()[0]
    assert left == 0, f"{left} rows left"
    return out[0]


def statements(base: Path, n_rows: int, rounds: int, busy: bool) -> str:
    """The table of ``--statements`` (module doc): one database per way, a first round not
    counted (it prepares the statements, which the store keeps cached), then ``rounds``
    rounds interleaved between the ways."""
    dbs: dict[str, sqlite3.Connection] = {}
    for way in _WAYS:
        path = base / f"stmt-{way.split()[0]}.db"
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        db = dbs[way] = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, cached_statements=512
        )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # the fsync is the same for every way: left out
        for stmt in MIGRATIONS[0].split(";"):
            if stmt.strip():
                db.execute(stmt)
        for stmt in [*_BULK_SCHEMA, *_bulk_schema("outgoing", _SQL["outgoing"])]:
            db.execute(stmt)
    msg = MessageRecord("sensors/b7/f3/r12/temperature", PAYLOAD, 1, False)
    seq = 0
    results: dict[str, list[tuple[float, float]]] = {w: [] for w in _WAYS}
    for r in range(rounds + 1):
        for way, write in _WAYS.items():
            rows: _Rows = []
            for i in range(n_rows):
                seq += 1
                pid = i // 2 + 1
                rows.append(_outgoing_row(OutgoingRecord(f"c{i % 2}", seq, SENT, pid, msg, 1, False)))
            res = _round(dbs[way], write, rows, busy)
            if r:
                results[way].append(res)
            print(f"round {r}: {way:24} {res[0] * 1000:9.1f} ms wall {res[1] * 1000:8.1f} ms CPU", flush=True)
    for db in dbs.values():
        db.close()
    peer = statistics.median(w for w, _ in results["executemany (peer)"])
    lines = [
        f"| way ({n_rows} rows: inserts, then deletes) | wall ms per round | vs peer | writer CPU ms |",
        "|---|---:|---:|---:|",
    ]
    for way, runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        lines.append(f"| {way} | {wall * 1000:,.1f} | {wall / peer:.2f}x | {cpu * 1000:,.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=3000)
    ap.add_argument("--statements", action="store_true", help="how a round is written (module doc)")
    ap.add_argument("--rows", type=int, default=1000, help="--statements: deliveries per round")
    ap.add_argument("--idle", action="store_true", help="--statements: the main thread sleeps instead")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--waiters", default="1,8,64,256")
    ap.add_argument("--dir", default=None, help="directory of the databases (default: a temp dir)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="siftmq-bench-store-"))
    base.mkdir(parents=True, exist_ok=True)
    if args.statements:
        table = statements(base, args.rows, args.rounds, busy=not args.idle)
        print(table)
        if args.out:
            Path(args.out).write_text(table + "\n")
        return
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
