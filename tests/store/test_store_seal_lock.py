"""The writer's seal costs no acquisition of the connection lock of its own.

The seal of a round (``broker/durability/_store.py``, ``Store._seal``) took the connection lock
once more per round only so that a test holding that lock could act between the take and the
seal.  The seal is made under the lock of the round's first transaction now: one acquisition
per transaction, and the tests that hold the lock still act before the seal (the check kept:
an acknowledgement made then cancels the insert).  A real store on a real SQLite file; the
lock is wrapped to count its acquisitions (it still locks).
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType

from broker.store import MessageRecord, MessageState, OutgoingRecord, Store
from tests.waiting import until

MSG = MessageRecord("t", b"payload", 1, False)


class _CountedLock:
    """A real lock that counts how often the writer thread acquires it."""

    def __init__(self, writer: threading.Thread) -> None:
        self.lock = threading.Lock()
        self.writer = writer
        self.by_writer = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if threading.current_thread() is self.writer:
            self.by_writer += 1
        return self.lock.acquire(blocking, timeout)

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _writer_took(store: Store, n: int) -> None:
    """Until the writer thread has taken ``n`` operations (it then waits for ``store._lock``)."""
    until(lambda: store.taken >= n, 30, "the writer to take its round")


def test_the_writer_takes_the_connection_lock_once_per_transaction(tmp_path: Path) -> None:
    """Rounds of inserts and deletes, and rounds with nothing to write (a ``sync`` that came
    while the writer was busy): the writer acquires the connection lock exactly once per
    transaction it commits (on main: once more per round, for the seal)."""
    with Store(tmp_path / "broker.db") as store:
        store.sync().result(timeout=60)  # the writer is idle, waiting for a token
        counted = _CountedLock(store._writer)
        store._lock = counted  # type: ignore[assignment]
        commits = store.commits
        for i in range(1, 11):
            store.add_outgoing(OutgoingRecord("a", i, MessageState.PUBLISH_SENT, i, MSG, 1, False))
            store.sync()
        store.sync().result(timeout=60)
        for i in range(1, 11):
            store.complete("a", i)
        store.sync().result(timeout=60)
        store.sync().result(timeout=60)  # a round with nothing to write
        assert store.counts()["outgoing"] == 0
        assert store.commits > commits
        assert counted.by_writer == store.commits - commits


def test_holding_the_connection_lock_still_lets_an_acknowledgement_cancel_the_taken_insert(
    tmp_path: Path,
) -> None:
    with Store(tmp_path / "broker.db") as store:
        with store._lock:  # the writer takes the round, then waits for the lock before the seal
            store.add_outgoing(OutgoingRecord("a", 1, MessageState.PUBLISH_SENT, 7, MSG, 1, False))
            store.sync()
            _writer_took(store, 1)
            store.complete("a", 7)  # before the seal: cancels the insert, queues no DELETE
            assert store.backlog == 0 and store.cancelled_late == 1
        store.sync().result(timeout=60)
        assert store.counts()["outgoing"] == 0 and store.inserts == 0
