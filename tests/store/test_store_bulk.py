"""The writer's rounds: one statement per table (not one ``executemany`` step per row), the
same database as the plain statements, and inserts still cancellable until the round is sealed
(``broker/durability/_store.py``, "Group commit" and "One statement per table and round")."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import urllib.request
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker import Broker
from broker.durability._store import _LIMIT_VARIABLE_NUMBER, _SQL, MIGRATIONS, _entry_row, migrate
from broker.packets import Properties, Puback, Publish
from broker.store import EntryRecord, MessageRecord, MessageState, OutgoingRecord, SessionRecord, Store
from broker.values import SubOptions
from tests.rawclient import RawClient
from tests.waiting import until

MSG = MessageRecord("t", b"\x00\xffpayload", 1, False)
TABLES = ("sessions", "entries", "outgoing", "qos2_in", "retained")


def _writer_took(store: Store, n: int) -> None:
    """Until the writer thread has taken ``n`` operations (it then waits for ``store._lock``)."""
    until(lambda: store.taken >= n, 30, "the writer to take its round")


def _one_round(store: Store, calls: list[tuple[str, tuple[Any, ...]]]) -> None:
    """Make ``calls`` while the writer is held, so that they are written in one round."""
    with store._lock:  # the writer takes the first operation, then waits for the lock
        store.set_expiry("held", 1)
        _writer_took(store, store.taken + 1)
        for name, args in calls:
            getattr(store, name)(*args)
    store.sync().result(timeout=60)


def test_a_round_is_one_insert_statement_and_one_delete_statement(tmp_path: Path) -> None:
    """500 deliveries in one round are ONE insert statement (on main: 500 steps of an
    ``executemany``, each taking the GIL back from the event loop), then their 500 deletes one."""
    with Store(tmp_path / "broker.db") as store:
        traced: list[str] = []
        lock = threading.Lock()

        def trace(sql: str) -> None:
            with lock:
                traced.append(sql)

        store._db.set_trace_callback(trace)
        n = 500
        _one_round(
            store,
            [
                ("add_outgoing", (OutgoingRecord("a", i, MessageState.PUBLISH_SENT, i, MSG, 1, False),))
                for i in range(1, n + 1)
            ],
        )
        assert store.counts()["outgoing"] == n
        # distinct texts: Python's trace callback reports a trigger's run as its outer statement
        inserts = {s for s in traced if s.startswith(("INSERT INTO outgoing", "INSERT INTO bulk_outgoing"))}
        assert len(inserts) == 1, f"{len(inserts)} insert statements for one round"
        traced.clear()
        _one_round(store, [("complete", ("a", i)) for i in range(1, n + 1)])
        assert store.counts()["outgoing"] == 0
        deletes = {s for s in traced if s.startswith(("DELETE FROM outgoing", "INSERT INTO bulk_acked"))}
        assert len(deletes) == 1, f"{len(deletes)} delete statements for one round"
        store._db.set_trace_callback(None)


def test_a_delivery_acknowledged_after_the_writer_took_it_is_not_written(tmp_path: Path) -> None:
    """The writer took the round (and waits for the connection, held here, to seal it): the
    acknowledgements of its 100 deliveries cancel their inserts instead of queueing 100
    DELETEs; nothing of them reaches SQLite."""
    with Store(tmp_path / "broker.db") as store:
        with store._lock:
            for i in range(1, 101):
                store.add_outgoing(OutgoingRecord("a", i, MessageState.PUBLISH_SENT, i, MSG, 1, False))
            store.add_outgoing(OutgoingRecord("a", 101, MessageState.QUEUED, None, MSG, 1, False))
            store.sync()  # a round is due
            _writer_took(store, 101)
            for i in range(1, 101):
                store.complete("a", i)
            store.drop_outgoing("a", 101)  # a queued one, discarded
            assert store.backlog == 0  # no DELETE queued
            assert store.cancelled_late == 101
        store.sync().result(timeout=60)
        assert store.counts()["outgoing"] == 0
        assert store.inserts == 0


def test_acknowledged_after_the_seal_is_deleted(tmp_path: Path) -> None:
    """After the seal the insert is written: its acknowledgement is a DELETE of the next round."""
    with Store(tmp_path / "broker.db") as store:
        store.add_outgoing(OutgoingRecord("a", 1, MessageState.PUBLISH_SENT, 5, MSG, 1, False))
        store.sync().result(timeout=60)
        store.complete("a", 5)
        assert store.backlog == 1
        store.sync().result(timeout=60)
        assert store.counts()["outgoing"] == 0
        assert store.inserts == 1 and store.cancelled == 0


def _store_counters(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in text.splitlines())
        if name.startswith("siftmq_store_inserts")
    }


async def test_every_delivery_to_a_persisted_session_is_written_or_cancelled(tmp_path: Path) -> None:
    """Through the broker: each of 300 QoS 1 deliveries to a persisted subscriber that
    acknowledges them is counted once, written or cancelled (``/metrics``), and none stays."""
    n = 300
    db = tmp_path / "data" / "broker.db"
    async with Broker(
        host="127.0.0.1", port=0, sys_interval=0, store_path=str(db), metrics_listen="127.0.0.1:0"
    ) as b:
        assert b.metrics_port is not None
        try:
            expiry = Properties(session_expiry_interval=600)
            sub, _ = await RawClient.connect(b.port, "s", 5, clean_start=False, properties=expiry)
            await sub.subscribe("m/#")
            pub, _ = await RawClient.connect(b.port, "p", 5)
            for i in range(1, n + 1):
                pub.send(Publish("m/t", b"%d" % i, 1, packet_id=i))
            got = 0
            while got < n:
                p = await sub.recv()
                if isinstance(p, Publish):
                    sub.send(Puback(p.packet_id))
                    got += 1
            acks = 0
            while acks < n:
                acks += isinstance(await pub.recv(), Puback)
            await sub.barrier()  # the broker read every PUBACK of the subscriber
            store = b.core.journal.store
            assert store is not None
            await asyncio.wrap_future(store.sync())
            counters = await asyncio.to_thread(_store_counters, b.metrics_port)
            assert (
                counters["siftmq_store_inserts_total"] + counters["siftmq_store_inserts_cancelled_total"] == n
            )
            assert store.counts()["outgoing"] == 0
        finally:
            await RawClient.close_all()


# --------------------------------------------------------------- same database as the plain SQL
_clients = st.sampled_from(["a", "b", "c"])
_topics = st.sampled_from(["t/1", "t/2", "t/3"])


@st.composite
def _calls(draw: st.DrawFn) -> list[tuple[str, tuple[Any, ...], list[tuple[str, tuple[Any, ...]]]]]:
    """Store calls with duplicates inside one round (the later must win), and their plain SQL."""
    calls: list[tuple[str, tuple[Any, ...], list[tuple[str, tuple[Any, ...]]]]] = []
    for _ in range(draw(st.integers(1, 60))):
        cid = draw(_clients)
        kind = draw(
            st.sampled_from(["session", "disconnected", "expiry", "entries", "retain", "qos2", "del", "end"])
        )
        if kind == "session":
            s = SessionRecord(cid, 5, draw(st.integers(0, 100)), None, draw(st.sampled_from([None, "u"])), 3)
            row = (s.client_id, 5, s.expiry_interval, None, s.username, 3, None, None, None, None, None, None)
            calls.append(("put_session", (s,), [("session", row)]))
        elif kind == "disconnected":
            at = float(draw(st.integers(1, 9)))
            calls.append(("session_disconnected", (cid, at, 7), [("disconnected", (at, None, 7, cid))]))
        elif kind == "expiry":
            e = draw(st.integers(0, 100))
            calls.append(("set_expiry", (cid, e), [("expiry", (e, cid))]))
        elif kind == "entries":
            filters = draw(st.lists(_topics, max_size=3, unique=True))
            entries = [EntryRecord(f, SubOptions(1)) for f in filters]
            plain = [("del_entries", (cid,))] + [
                ("entry", _entry_row(cid, i, e)) for i, e in enumerate(entries)
            ]
            calls.append(("put_entries", (cid, entries), plain))
        elif kind == "retain":
            topic = draw(_topics)
            payload = draw(st.sampled_from([b"", b"1", b"22"]))
            m = MessageRecord(topic, payload, 1, True)
            plain = (
                [("unretain", (topic,))]
                if not payload
                else [("retain", (topic, payload, 1, None, None, None))]
            )
            calls.append(("set_retained", (m,), plain))
        elif kind == "qos2":
            pid = draw(st.integers(1, 4))
            if draw(st.booleans()):
                calls.append(("qos2_received", (cid, pid), [("qos2_add", (cid, pid))]))
            else:
                calls.append(("qos2_released", (cid, pid), [("qos2_del", (cid, pid))]))
        elif kind == "del":
            topic = draw(_topics)
            calls.append(("delete_retained", (topic,), [("unretain", (topic,))]))
        else:
            plain = [(op, (cid,)) for op in ("del_session", "del_entries", "del_outgoing", "del_qos2")]
            calls.append(("delete_session", (cid,), plain))
    return calls


def _tables(db: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {t: sorted(db.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in TABLES}


@settings(max_examples=60, deadline=None)
@given(_calls())
def test_one_round_leaves_the_database_the_plain_statements_leave(
    tmp_path_factory: Any, calls: list[tuple[str, tuple[Any, ...], list[tuple[str, tuple[Any, ...]]]]]
) -> None:
    plain = sqlite3.connect(":memory:", isolation_level=None)
    migrate(plain, MIGRATIONS)
    for _, _, ops in calls:
        for name, args in ops:
            plain.execute(_SQL[name], args)
    path = tmp_path_factory.mktemp("store") / "broker.db"
    with Store(path) as store:
        _one_round(store, [(name, args) for name, args, _ in calls])
    with sqlite3.connect(path) as db:
        assert _tables(db) == _tables(plain)
    plain.close()


def test_a_round_fits_an_older_sqlites_limit_of_999_variables(tmp_path: Path) -> None:
    """SQLite before 3.32 (Ubuntu 20.04, RHEL 8) binds at most 999 variables per statement: a
    round of 100 deliveries (16 parameters each) in one statement failed there, and failed again
    on every retry ("too many SQL variables"); the writer splits a round to fit the limit."""
    with Store(tmp_path / "broker.db") as store:
        store._db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
        n = 100
        _one_round(
            store,
            [
                ("add_outgoing", (OutgoingRecord("a", i, MessageState.PUBLISH_SENT, i, MSG, 1, False),))
                for i in range(1, n + 1)
            ],
        )
        assert store.counts()["outgoing"] == n
        assert store.failed_commits == 0
    assert _LIMIT_VARIABLE_NUMBER == sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER
