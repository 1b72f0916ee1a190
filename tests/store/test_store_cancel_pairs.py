"""The store's in-place cancellation against the plain operations: same database after.

While an ``outgoing`` insert waits for the writer, later operations on its row are applied to
it in place (sent, PUBREC) or cancel it (PUBACK/PUBCOMP, discarded): docs in
``broker/durability/_store.py``, "Group commit".  Operation sequences follow the broker core's
rule (a packet id is reused only after its completion was submitted); each sequence runs
through a real :class:`Store` (its writer thread racing the calls, with ``sync()`` at random
points forcing rounds) and, as plain SQL, on a second database; the ``outgoing`` tables must
be equal.
"""

from __future__ import annotations

import sqlite3
import time
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.durability._store import _SQL, MIGRATIONS, _outgoing_row, migrate
from broker.store import MessageRecord, MessageState, OutgoingRecord, Store

MSG = MessageRecord("t", b"x", 1, False)

# one call: (Store method, its arguments, the plain operation it stands for) or ("sync",)
_Call = tuple[Any, ...]


def _plain(calls: list[_Call]) -> list[tuple[Any, ...]]:
    ops = [(c[2], c[3]) for c in calls if c[0] != "sync"]
    db = sqlite3.connect(":memory:", isolation_level=None)
    migrate(db, MIGRATIONS)
    db.execute("BEGIN")
    for name, group in groupby(ops, itemgetter(0)):
        db.executemany(_SQL[name], [args for _, args in group])
    db.execute("COMMIT")
    return _rows(db)


def _rows(db: sqlite3.Connection) -> list[tuple[Any, ...]]:
    rows = db.execute("SELECT * FROM outgoing ORDER BY client_id, seq").fetchall()
    db.close()
    return rows


def _through_store(path: Path, calls: list[_Call]) -> list[tuple[Any, ...]]:
    with Store(path) as store:
        for c in calls:
            if c[0] == "sync":
                store.sync().result()
            else:
                getattr(store, c[0])(*c[1])
    return _rows(sqlite3.connect(path))


def _writer_took(store: Store, n: int) -> None:
    """Until the writer thread has taken ``n`` operations (no sleep: it needs only the GIL)."""
    deadline = time.monotonic() + 10
    while store.taken < n:
        assert time.monotonic() < deadline, "the writer never took its round"
        time.sleep(0)


@st.composite
def _calls(draw: st.DrawFn) -> list[_Call]:
    calls: list[_Call] = []
    inflight: dict[str, dict[int, int]] = {"a": {}, "b": {}}  # client -> pid -> qos
    queued: dict[str, list[int]] = {"a": [], "b": []}
    seq = 0
    for _ in range(draw(st.integers(0, 40))):
        cid = draw(st.sampled_from(["a", "b"]))
        kind = draw(
            st.sampled_from(["send", "send", "queue", "drain", "drop", "pubrec", "ack", "ack", "end", "sync"])
        )
        free = [p for p in (1, 2, 3) if p not in inflight[cid]]
        if kind == "sync":
            calls.append(("sync",))
        elif kind == "queue" or (kind == "send" and free):
            seq += 1
            qos = draw(st.sampled_from([1, 2]))
            pid = None if kind == "queue" else draw(st.sampled_from(free))
            state = MessageState.QUEUED if pid is None else MessageState.PUBLISH_SENT
            r = OutgoingRecord(cid, seq, state, pid, MSG, qos, False)
            calls.append(("add_outgoing", (r,), "outgoing", _outgoing_row(r)))
            if pid is None:
                queued[cid].append(seq)
            else:
                inflight[cid][pid] = qos
        elif kind == "drain" and queued[cid] and free:
            pid = draw(st.sampled_from(free))
            s = queued[cid].pop(0)
            calls.append(("mark_sent", (cid, s, pid), "sent", (pid, cid, s)))
            inflight[cid][pid] = 2
        elif kind == "drop" and queued[cid]:
            s = queued[cid].pop(draw(st.integers(0, len(queued[cid]) - 1)))
            calls.append(("drop_outgoing", (cid, s), "dropped", (cid, s)))
        elif kind == "pubrec" and inflight[cid]:
            pid = draw(st.sampled_from(sorted(inflight[cid])))
            if inflight[cid][pid] == 2:
                calls.append(("mark_pubrec", (cid, pid), "pubrec", (cid, pid)))
        elif kind == "ack" and inflight[cid]:
            pid = draw(st.sampled_from(sorted(inflight[cid])))
            del inflight[cid][pid]
            calls.append(("complete", (cid, pid), "acked", (cid, pid)))
        elif kind == "end":
            calls.append(("delete_session", (cid,), "del_outgoing", (cid,)))
            inflight[cid].clear()
            queued[cid].clear()
    return calls


@settings(max_examples=120, deadline=None)
@given(_calls())
def test_in_place_cancellation_leaves_the_same_database(tmp_path_factory: Any, calls: list[_Call]) -> None:
    path = tmp_path_factory.mktemp("store") / "broker.db"
    assert _through_store(path, calls) == _plain(calls)


def test_sent_and_acknowledged_before_the_writer_takes_them_writes_nothing(tmp_path: Path) -> None:
    """The writer is held in a commit (its connection lock taken here): an insert made
    meanwhile, moved to PUBREC and completed, is cancelled; nothing of it is written."""
    with Store(tmp_path / "broker.db") as store:
        with store._lock:  # the writer takes the first operation, then waits for the lock
            store.set_expiry("x", 10)
            _writer_took(store, 1)  # and now waits for the lock
            r = OutgoingRecord("a", 1, MessageState.PUBLISH_SENT, 7, MSG, 2, False)
            store.add_outgoing(r)
            store.mark_pubrec("a", 7)
            store.complete("a", 7)
            q = OutgoingRecord("a", 2, MessageState.QUEUED, None, MSG, 1, False)
            store.add_outgoing(q)
            store.mark_sent("a", 2, 7)  # the packet id is free again
            assert store.backlog == 2 and store.cancelled == 1
        store.sync().result()
        assert store.counts()["outgoing"] == 1
        assert store.operations == 2  # the session update and the second insert


def test_a_packet_id_freed_after_a_pending_insert_is_not_moved_before_its_delete(tmp_path: Path) -> None:
    """Found by the model test above: a queued insert is pending, the older row with packet
    id 3 is completed (its DELETE queued after the insert), then the queued message is sent
    with id 3. Applied in place, the insert would carry id 3 before that DELETE (the unique
    index refuses it, or the DELETE removes the new row); it must stay an update after it."""
    with Store(tmp_path / "broker.db") as store:
        store.add_outgoing(OutgoingRecord("a", 1, MessageState.PUBLISH_SENT, 3, MSG, 1, False))
        store.sync().result()
        with store._lock:
            store.set_expiry("x", 10)
            _writer_took(store, 2)  # and now waits for the lock
            store.add_outgoing(OutgoingRecord("a", 2, MessageState.QUEUED, None, MSG, 1, False))
            store.complete("a", 3)
            store.mark_sent("a", 2, 3)
        store.sync().result()
        with store._lock:
            rows = store._db.execute("SELECT seq, state, packet_id FROM outgoing").fetchall()
        assert rows == [(2, 1, 3)]
