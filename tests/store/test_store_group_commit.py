"""The durable signal: a future / callback / awaitable that fires only after the commit, and
group commit (operations queued while a commit is under way share the next transaction)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

from broker.store import DB_NAME, MessageRecord, MessageState, OutgoingRecord, Store


def _committed_rows(data_dir: Path) -> int:
    """Rows another connection sees: only committed data."""
    with sqlite3.connect(data_dir / DB_NAME) as db:
        return int(db.execute("SELECT COUNT(*) FROM outgoing").fetchone()[0])


def _record(store: Store, i: int) -> OutgoingRecord:
    return OutgoingRecord(
        f"c{i % 7}",
        store.next_seq(),
        MessageState.QUEUED,
        None,
        MessageRecord(f"t/{i}", b"p", 1, False),
        1,
        False,
    )


async def test_await_durable_means_committed(store: Store, data_dir: Path) -> None:
    async def publisher(i: int) -> int:
        store.add_outgoing(_record(store, i))
        await store.durable()
        return _committed_rows(data_dir)

    seen = await asyncio.gather(*(publisher(i) for i in range(200)))
    assert all(n >= 1 for n in seen)
    assert _committed_rows(data_dir) == 200
    assert store.operations == 200


def test_operations_queued_during_a_commit_share_one_transaction(store: Store, data_dir: Path) -> None:
    store.add_outgoing(_record(store, 0))
    store.sync().result()
    before = store.commits
    with store._lock:  # the writer cannot commit while we hold the connection
        futures = []
        for i in range(1, 301):
            store.add_outgoing(_record(store, i))
            futures.append(store.sync())
        assert not any(f.done() for f in futures)
    for f in futures:
        f.result(timeout=30)
    assert store.commits - before <= 2  # at most the batch taken before we held the lock + the rest
    assert _committed_rows(data_dir) == 301


async def test_when_durable_callback_runs_after_the_commit(store: Store, data_dir: Path) -> None:
    loop = asyncio.get_running_loop()
    acked = asyncio.Event()
    visible: list[int] = []

    def on_durable() -> None:  # writer thread, like a PUBACK scheduled with call_soon_threadsafe
        visible.append(_committed_rows(data_dir))
        loop.call_soon_threadsafe(acked.set)

    with store._lock:
        store.add_outgoing(_record(store, 1))
        store.when_durable(on_durable)
        assert not acked.is_set()
    await asyncio.wait_for(acked.wait(), 30)
    assert visible == [1]


def test_sync_from_many_threads(store: Store, data_dir: Path) -> None:
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(50):
                store.add_outgoing(_record(store, k * 1000 + i))
                store.sync().result(timeout=30)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _committed_rows(data_dir) == 200
    assert store.commits <= store.operations
    store._check()


def test_close_commits_what_is_queued(data_dir: Path) -> None:
    s = Store.in_data_dir(data_dir)
    for i in range(100):
        s.add_outgoing(_record(s, i))
    s.close()
    assert _committed_rows(data_dir) == 100
