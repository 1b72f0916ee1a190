"""A store written by an older siftmq opens with the same sessions (issue 41, item 2).

The QoS 1/2 flow state has one encoding since issue 41 (``broker.values._flow``); before, the
core counted 0/1 and translated to the store's 1/2.  ``data/store-main-b166b29.db`` was written
by the broker of main at b166b29, the last commit before issue 41 item 2
(``python -m tests.store.old_store OUT`` in that checkout; its sessions never expire, so the file
does not age):
today's broker must resume its sessions exactly (a PUBLISH sent again with DUP, a PUBREL sent
again, the queue after them, the publisher's QoS 2 id still known), and today's broker must
write the same numbers for the same state.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path

from broker import Broker
from broker.packets import Properties, Puback, Pubcomp, Publish, Pubrec, Pubrel
from tests.rawclient import RawClient
from tests.store.old_store import write_store

OLD = Path(__file__).parent / "data" / "store-main-b166b29.db"
EXPIRY = Properties(session_expiry_interval=0xFFFFFFFF)  # never expires: the file has no age


def _rows(path: Path) -> list[tuple[object, ...]]:
    """The outgoing rows as (client, state, packet id, topic), in sequence order."""
    with sqlite3.connect(path) as db:
        return db.execute("SELECT client_id, state, packet_id, topic FROM outgoing ORDER BY seq").fetchall()


def test_the_fixture_holds_every_state() -> None:
    """What the old broker wrote (the store's numbers: 0 queued, 1 PUBLISH sent, 2 PUBREL sent)."""
    assert _rows(OLD) == [
        ("sub", 1, 1, "t/1"),
        ("sub", 2, 2, "t/2"),
        ("sub", 0, None, "t/3"),
        ("sub", 0, None, "t/4"),
    ]


async def test_a_store_of_the_old_broker_resumes_its_sessions(tmp_path: Path) -> None:
    db = tmp_path / "data" / "broker.db"
    db.parent.mkdir()
    shutil.copy(OLD, db)
    # the sessions' expiry (3,600 s) counts from their disconnection, which the fixture recorded
    # in wall-clock time when it was made: an hour later they had expired and the test failed.
    # The copy's sessions are disconnected now; the flow-state rows under test are untouched
    with sqlite3.connect(db) as con:
        con.execute(
            "UPDATE sessions SET disconnected_at = ? WHERE disconnected_at IS NOT NULL", (time.time(),)
        )
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=str(db), max_inflight=2) as b:
        try:
            sub, ack = await RawClient.connect(b.port, "sub", 5, clean_start=False, properties=EXPIRY)
            assert ack.session_present
            first = await sub.barrier()
            assert [
                (type(p).__name__, getattr(p, "topic", None), p.packet_id, getattr(p, "dup", None))
                for p in first
            ] == [  # type: ignore[attr-defined]
                ("Publish", "t/1", 1, True),  # PUBLISH_SENT: sent again with DUP
                ("Pubrel", None, 2, None),  # PUBREL_SENT: continued with PUBREL, not resent
            ]
            sub.send(Puback(1))
            sub.send(Pubcomp(2))
            rest = [p for p in await sub.barrier() if isinstance(p, Publish)]
            assert [(p.topic, p.payload, p.dup) for p in rest] == [
                ("t/3", b"three", False),
                ("t/4", b"routed once", False),
            ]
            pub, ack = await RawClient.connect(b.port, "pub", 5, clean_start=False, properties=EXPIRY)
            assert ack.session_present
            pub.send(Publish("t/4", b"routed once", 2, packet_id=9, dup=True))  # the publisher retries
            assert isinstance(await pub.recv(), Pubrec)
            assert not [p for p in await sub.barrier() if isinstance(p, Publish)]  # not routed twice
            pub.send(Pubrel(9))
            assert isinstance(await pub.recv(), Pubcomp)
        finally:
            await RawClient.close_all()


async def test_todays_broker_writes_the_same_numbers(tmp_path: Path) -> None:
    db = tmp_path / "data" / "broker.db"
    await write_store(str(db))
    assert _rows(db) == _rows(OLD)
