"""The writer's batch filter (``_cancel_pairs``) against the plain batch: same database after.

Operation sequences follow the broker core's rule (a packet id is reused only after the
DELETE of its previous row was queued); each sequence runs as one batch on two in-memory
databases, once as queued and once filtered, and the ``outgoing`` tables must be equal.
"""

from __future__ import annotations

import sqlite3
from itertools import groupby
from operator import itemgetter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.durability._store import _SQL, MIGRATIONS, _cancel_pairs, _Op, _outgoing_row, migrate
from broker.store import MessageRecord, MessageState, OutgoingRecord

MSG = MessageRecord("t", b"x", 1, False)


def _run(ops: list[_Op]) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(":memory:", isolation_level=None)
    migrate(db, MIGRATIONS)
    db.execute("BEGIN")
    for name, group in groupby(ops, itemgetter(0)):
        db.executemany(_SQL[name], [args for _, args in group])
    db.execute("COMMIT")
    rows = db.execute("SELECT * FROM outgoing ORDER BY client_id, seq").fetchall()
    db.close()
    return rows


@st.composite
def _batches(draw: st.DrawFn) -> list[_Op]:
    ops: list[_Op] = []
    inflight: dict[str, dict[int, int]] = {"a": {}, "b": {}}  # client -> pid -> qos
    queued: dict[str, list[int]] = {"a": [], "b": []}
    seq = 0
    for _ in range(draw(st.integers(0, 40))):
        cid = draw(st.sampled_from(["a", "b"]))
        kind = draw(st.sampled_from(["send", "send", "queue", "drain", "pubrec", "ack", "ack", "end"]))
        free = [p for p in (1, 2, 3) if p not in inflight[cid]]
        if kind in ("send", "queue", "drain") and (kind == "queue" or free):
            seq += 1
            if kind == "queue":
                queued[cid].append(seq)
                r = OutgoingRecord(cid, seq, MessageState.QUEUED, None, MSG, 2, False)
                ops.append(("outgoing", _outgoing_row(r)))
                continue
            pid = draw(st.sampled_from(free))
            if kind == "drain" and queued[cid]:
                ops.append(("sent", (pid, cid, queued[cid].pop(0))))
                inflight[cid][pid] = 2
                continue
            qos = draw(st.sampled_from([1, 2]))
            r = OutgoingRecord(cid, seq, MessageState.PUBLISH_SENT, pid, MSG, qos, False)
            ops.append(("outgoing", _outgoing_row(r)))
            inflight[cid][pid] = qos
        elif kind == "pubrec" and inflight[cid]:
            pid = draw(st.sampled_from(sorted(inflight[cid])))
            if inflight[cid][pid] == 2:
                ops.append(("pubrec", (cid, pid)))
        elif kind == "ack" and inflight[cid]:
            pid = draw(st.sampled_from(sorted(inflight[cid])))
            del inflight[cid][pid]
            ops.append(("acked", (cid, pid)))
        elif kind == "end":
            ops.append(("del_outgoing", (cid,)))
            inflight[cid].clear()
            queued[cid].clear()
    return ops


@settings(max_examples=150, deadline=None)
@given(_batches())
def test_filtered_batch_leaves_the_same_database(ops: list[_Op]) -> None:
    filtered = _cancel_pairs(list(ops))
    assert len(filtered) <= len(ops)
    assert _run(filtered) == _run(ops)


def test_sent_and_acknowledged_in_one_batch_writes_nothing() -> None:
    r = OutgoingRecord("a", 1, MessageState.PUBLISH_SENT, 7, MSG, 2, False)
    ops: list[_Op] = [("outgoing", _outgoing_row(r)), ("pubrec", ("a", 7)), ("acked", ("a", 7))]
    assert _cancel_pairs(ops) == []
