"""Round trips of every record through a reopened store, expiry on load and sweep, conversions."""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from pathlib import Path

import pytest

from broker.packets import NO_PROPERTIES, Properties, Will
from broker.store import (
    DB_NAME,
    EntryRecord,
    MessageRecord,
    MessageState,
    OutgoingRecord,
    SessionRecord,
    Store,
    StoreClosed,
    StoreError,
    message_record,
)
from broker.values import Message, SubOptions

NEVER = 0xFFFFFFFF


def _msg(topic: str = "t/1", payload: bytes = b"x", qos: int = 1, **kw: object) -> MessageRecord:
    return MessageRecord(topic, payload, qos, False, **kw)  # type: ignore[arg-type]


def test_everything_survives_reopen(data_dir: Path) -> None:
    will = Will("w/c1", b"gone", 1, True, Properties(will_delay_interval=30, content_type="text/plain"))
    sess = SessionRecord("c1", 5, 3600, 1000.0, "alice", 17, will, 1030.0)
    entries = [
        EntryRecord("a/#", SubOptions(2, True, True, 1, 42, "temp > 20", "a/#")),
        EntryRecord("$share/g/b/+", SubOptions(1, False, False, 0, None, None, "b/+")),
        EntryRecord("a/x", None),
    ]
    props = Properties(
        message_expiry_interval=100,
        correlation_data=b"\x00\xff",
        user_properties=(("k", "v"), ("k", "w")),
        response_topic="r",
    )
    queued = OutgoingRecord(
        "c1",
        3,
        MessageState.QUEUED,
        None,
        _msg(properties=props, expires_at=2e9),
        1,
        False,
        (42,),
        "a/#",
        "temp > 20",
    )
    sent = OutgoingRecord(
        "c1", 1, MessageState.PUBLISH_SENT, 10, _msg("a/y", b"", 2, publisher_id="p"), 2, True
    )
    with Store.in_data_dir(data_dir) as s:
        s.put_session(sess)
        s.put_entries("c1", entries)
        s.add_outgoing(queued)
        s.add_outgoing(sent)
        s.qos2_received("c1", 5)
        s.qos2_received("c1", 6)
        s.qos2_released("c1", 5)
        s.set_retained(MessageRecord("r/1", b"kept", 1, True, props, "p", 2e9))
        s.set_retained(MessageRecord("r/2", b"cleared", 0, True))
        s.set_retained(MessageRecord("r/2", b"", 0, True))  # empty payload deletes
        s.mark_pubrec("c1", 10)
        s._check()
    with Store.in_data_dir(data_dir) as s:
        st = s.load(wall=1100.0)
        s._check()
    assert st.sessions == {"c1": sess}
    assert st.entries == {"c1": entries}
    assert st.entries["c1"][2].positive is False
    assert st.outgoing == {"c1": [dataclasses.replace(sent, state=MessageState.PUBREC_RECEIVED), queued]}
    assert st.qos2_in == {"c1": {6}}
    assert st.retained == {"r/1": MessageRecord("r/1", b"kept", 1, True, props, "p", 2e9)}
    assert st.expired == []


def test_outgoing_flow(store: Store) -> None:
    seqs = [store.next_seq() for _ in range(4)]
    assert seqs == sorted(set(seqs))
    for i, seq in enumerate(seqs):
        store.add_outgoing(
            OutgoingRecord("c", seq, MessageState.QUEUED, None, _msg(f"t/{i}", qos=2), 2, False)
        )
    store.mark_sent("c", seqs[0], 1)
    store.mark_sent("c", seqs[1], 2)
    store.mark_pubrec("c", 1)
    store.complete("c", 2)  # PUBACK / failing PUBREC
    store.drop_outgoing("c", seqs[3])  # expired in the queue
    st = store.load()
    got = [(r.seq, r.state, r.packet_id, r.message.topic) for r in st.outgoing["c"]]
    assert got == [
        (seqs[0], MessageState.PUBREC_RECEIVED, 1, "t/0"),
        (seqs[2], MessageState.QUEUED, None, "t/2"),
    ]
    store.complete("c", 1)  # PUBCOMP
    assert [r.seq for r in store.load().outgoing["c"]] == [seqs[2]]


def test_next_seq_continues_after_reopen(data_dir: Path) -> None:
    with Store.in_data_dir(data_dir) as s:
        for _ in range(3):
            s.add_outgoing(OutgoingRecord("c", s.next_seq(), MessageState.QUEUED, None, _msg(), 1, False))
        last = s.next_seq()
    with Store.in_data_dir(data_dir) as s:
        assert s.next_seq() > 3
        assert s.next_seq() <= last + 1


def test_session_updates_and_delete(store: Store) -> None:
    will = Will("w", b"bye")
    store.put_session(SessionRecord("a", 4, NEVER, None, None, 1, will))
    store.put_session(SessionRecord("b", 5, NEVER))
    store.put_entries("a", [EntryRecord("x", SubOptions(1, topic_filter="x"))])
    store.add_outgoing(OutgoingRecord("a", store.next_seq(), MessageState.QUEUED, None, _msg(), 1, False))
    store.qos2_received("a", 3)
    store.set_expiry("b", 60)
    store.session_disconnected("b", 500.0, next_pid=9, will_due=None)
    store.set_will("a", None)
    st = store.load(wall=510.0)
    assert st.sessions["a"].will is None
    assert st.sessions["a"].disconnected_at == 510.0  # connected at "crash": disconnected at load
    assert st.crashed == {"a"}
    assert st.sessions["b"] == SessionRecord("b", 5, 60, 500.0, None, 9)
    store.delete_session("a")
    assert store.counts() == {"sessions": 1, "entries": 0, "outgoing": 0, "qos2_in": 0, "retained": 0}


def test_put_entries_replaces_the_list(store: Store) -> None:
    store.put_entries("c", [EntryRecord("a", SubOptions(0, topic_filter="a")), EntryRecord("b", None)])
    new = [
        EntryRecord("b", SubOptions(1, topic_filter="b")),
        EntryRecord("a", SubOptions(2, topic_filter="a")),
    ]
    store.put_entries("c", new)
    assert store.load().entries == {"c": new}
    store.put_entries("c", [])
    assert store.load().entries == {}


def test_expired_sessions_and_retained_removed_on_load_and_sweep(store: Store) -> None:
    will = Will("w/late", b"x", 0, False, Properties(will_delay_interval=100))
    store.put_session(SessionRecord("short", 5, 10, 100.0, will=will, will_due=200.0))
    store.put_session(SessionRecord("long", 5, 1000, 100.0))
    store.put_session(SessionRecord("never", 5, NEVER, 100.0))
    store.put_session(SessionRecord("online", 5, 1000))
    store.put_entries("short", [EntryRecord("a", SubOptions(topic_filter="a"))])
    store.set_retained(
        MessageRecord("r/old", b"x", 0, True, Properties(message_expiry_interval=5), None, 105.0)
    )
    store.set_retained(MessageRecord("r/new", b"x", 0, True, NO_PROPERTIES, None, None))
    st = store.load(wall=150.0)
    assert st.crashed == {"online"}
    assert store.load(wall=150.0).crashed == set()
    assert [s.client_id for s in st.expired] == ["short"]
    assert st.expired[0].will == will  # due: the broker publishes it
    assert set(st.sessions) == {"long", "never", "online"}
    assert st.sessions["online"].disconnected_at == 150.0
    assert st.entries == {}
    assert set(st.retained) == {"r/new"}
    assert [s.client_id for s in store.sweep(wall=1100.0)] == ["long"]
    assert [s.client_id for s in store.sweep(wall=1152.0)] == ["online"]
    assert store.sweep(wall=1e12) == []
    assert set(store.load(wall=1e12).sessions) == {"never"}


def test_message_conversion() -> None:
    now, wall = time.monotonic(), time.time()
    m = Message.create(
        "t", b"p", 2, True, Properties(message_expiry_interval=60, content_type="c"), "pub", now
    )
    rec = message_record(m, now, wall)
    assert rec.expires_at == pytest.approx(wall + 60)
    later = now + 1000
    back = rec.to_message(later, wall + 20)
    assert (back.topic, back.payload, back.qos, back.retain, back.publisher_id) == ("t", b"p", 2, True, "pub")
    assert back.properties.message_expiry_interval == 40
    assert back.properties.content_type == "c"
    assert back.expires_at == pytest.approx(later + 40)
    plain = message_record(Message.create("t", b"", 1, False, NO_PROPERTIES, None, now), now)
    assert plain.expires_at is None
    assert plain.to_message(now).expires_at is None


def test_closed_store_refuses(data_dir: Path) -> None:
    s = Store.in_data_dir(data_dir)
    s.close()
    s.close()
    with pytest.raises(StoreClosed):
        s.qos2_received("c", 1)
    with pytest.raises(StoreClosed):
        s.sync().result()


def test_failed_commit_fails_the_signal_and_later_ones(data_dir: Path) -> None:
    """Two in-flight messages of one client with the same packet id violate the schema."""
    with Store.in_data_dir(data_dir) as s:
        s.qos2_received("c", 1)
        s.sync().result()
        s.add_outgoing(OutgoingRecord("c", s.next_seq(), MessageState.PUBLISH_SENT, 7, _msg(), 1, False))
        s.add_outgoing(OutgoingRecord("c", s.next_seq(), MessageState.PUBLISH_SENT, 7, _msg(), 1, False))
        with pytest.raises(StoreError, match="UNIQUE"):
            s.sync().result(timeout=10)
        s.qos2_received("c", 2)
        with pytest.raises(StoreError):
            s.sync().result(timeout=10)
    with sqlite3.connect(data_dir / DB_NAME) as db:  # the failed batch was rolled back
        assert db.execute("SELECT COUNT(*) FROM outgoing").fetchone()[0] == 0
        assert db.execute("SELECT packet_id FROM qos2_in").fetchall() == [(1,)]
