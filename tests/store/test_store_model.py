"""Model-based tests: the store against plain dictionaries, and saved entry lists against
``topics.SubscriptionIndex`` (a replayed list routes exactly like the original)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import topics
from broker.packets import Properties, Will
from broker.store import (
    EntryRecord,
    MessageRecord,
    MessageState,
    OutgoingRecord,
    SessionRecord,
    Store,
    replay_entries,
)
from broker.values import SubOptions

CLIENTS = st.sampled_from(["c1", "c2", "c3"])
PIDS = st.integers(1, 6)
WALL = 10_000.0  # every session is disconnected well before and expires well after

_options = st.builds(
    SubOptions,
    qos=st.integers(0, 2),
    no_local=st.booleans(),
    retain_as_published=st.booleans(),
    retain_handling=st.integers(0, 2),
    subscription_id=st.none() | st.integers(1, 268_435_455),
    selector=st.none() | st.sampled_from(["a > 1", "b = 'x'"]),
    topic_filter=st.sampled_from(["a/#", "+/b"]),
)
_entries = st.lists(
    st.builds(EntryRecord, st.sampled_from(["a/#", "+/b", "a/b", "$share/g/a"]), st.none() | _options),
    max_size=4,
    unique_by=lambda e: e.topic_filter,
)
_message = st.builds(
    MessageRecord,
    topic=st.sampled_from(["a/b", "x"]),
    payload=st.binary(max_size=8),
    qos=st.integers(1, 2),
    retain=st.booleans(),
    properties=st.sampled_from(
        [Properties(), Properties(user_properties=(("k", "v"),), correlation_data=b"\x01")]
    ),
    publisher_id=st.none() | st.just("p"),
    expires_at=st.none() | st.just(WALL + 1e6),
)
_WILL = Will("w", b"bye", 1, True, Properties(will_delay_interval=5))
_session = st.builds(
    lambda cid, level, expiry, user, pid, will: SessionRecord(
        cid, level, expiry, WALL - 5, user, pid, will[0], will[1]
    ),
    CLIENTS,
    st.sampled_from([3, 4, 5]),
    st.sampled_from([10**6, 0xFFFFFFFF]),
    st.none() | st.just("u"),
    PIDS,
    st.sampled_from([(None, None), (_WILL, None), (_WILL, WALL + 5)]),
)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="siftmq-store-"))
        self.store = Store.in_data_dir(self.dir, synchronous="NORMAL")
        self.sessions: dict[str, SessionRecord] = {}
        self.entries: dict[str, list[EntryRecord]] = {}
        self.out: dict[tuple[str, int], OutgoingRecord] = {}
        self.qos2: dict[str, set[int]] = {}
        self.retained: dict[str, MessageRecord] = {}

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _pids(self, cid: str) -> set[int]:
        return {r.packet_id for (c, _), r in self.out.items() if c == cid and r.packet_id is not None}

    @rule(s=_session)
    def put_session(self, s: SessionRecord) -> None:
        self.store.put_session(s)
        self.sessions[s.client_id] = s

    @rule(cid=CLIENTS)
    def delete_session(self, cid: str) -> None:
        self.store.delete_session(cid)
        self.sessions.pop(cid, None)
        self.entries.pop(cid, None)
        self.qos2.pop(cid, None)
        self.out = {k: v for k, v in self.out.items() if k[0] != cid}

    @rule(cid=CLIENTS, entries=_entries)
    def put_entries(self, cid: str, entries: list[EntryRecord]) -> None:
        self.store.put_entries(cid, entries)
        if entries:
            self.entries[cid] = entries
        else:
            self.entries.pop(cid, None)

    @rule(cid=CLIENTS, m=_message, pid=st.none() | PIDS, ids=st.lists(st.integers(1, 9), max_size=2))
    def add_outgoing(self, cid: str, m: MessageRecord, pid: int | None, ids: list[int]) -> None:
        if pid is not None and pid in self._pids(cid):
            return
        state = MessageState.QUEUED if pid is None else MessageState.PUBLISH_SENT
        r = OutgoingRecord(
            cid, self.store.next_seq(), state, pid, m, m.qos, m.retain, tuple(ids), "a/#", None
        )
        self.store.add_outgoing(r)
        self.out[cid, r.seq] = r

    @precondition(lambda self: any(r.state is MessageState.QUEUED for r in self.out.values()))
    @rule(data=st.data(), pid=PIDS)
    def mark_sent(self, data: st.DataObject, pid: int) -> None:
        key = data.draw(
            st.sampled_from(sorted(k for k, r in self.out.items() if r.state is MessageState.QUEUED))
        )
        if pid in self._pids(key[0]):
            return
        self.store.mark_sent(key[0], key[1], pid)
        self.out[key] = _replace(self.out[key], state=MessageState.PUBLISH_SENT, packet_id=pid)

    @precondition(lambda self: any(r.packet_id is not None for r in self.out.values()))
    @rule(data=st.data(), ack=st.booleans())
    def ack(self, data: st.DataObject, ack: bool) -> None:
        key = data.draw(st.sampled_from(sorted(k for k, r in self.out.items() if r.packet_id is not None)))
        r = self.out[key]
        assert r.packet_id is not None
        if r.qos == 2 and r.state is MessageState.PUBLISH_SENT and not ack:
            self.store.mark_pubrec(key[0], r.packet_id)
            self.out[key] = _replace(r, state=MessageState.PUBREC_RECEIVED)
        else:
            self.store.complete(key[0], r.packet_id)
            del self.out[key]

    @precondition(lambda self: bool(self.out))
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.out)))
        self.store.drop_outgoing(*key)
        del self.out[key]

    @rule(cid=CLIENTS, pid=PIDS, add=st.booleans())
    def qos2_in(self, cid: str, pid: int, add: bool) -> None:
        ids = self.qos2.setdefault(cid, set())
        if add:
            self.store.qos2_received(cid, pid)
            ids.add(pid)
        else:
            self.store.qos2_released(cid, pid)
            ids.discard(pid)
        if not ids:
            del self.qos2[cid]

    @rule(topic=st.sampled_from(["r/1", "r/2"]), m=_message)
    def retain(self, topic: str, m: MessageRecord) -> None:
        rec = MessageRecord(topic, m.payload, m.qos, True, m.properties, m.publisher_id, m.expires_at)
        self.store.set_retained(rec)
        if rec.payload:
            self.retained[topic] = rec
        else:
            self.retained.pop(topic, None)

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = Store.in_data_dir(self.dir, synchronous="NORMAL")

    @invariant()
    def agrees(self) -> None:
        got = self.store.load(wall=WALL)
        self.store._check()
        assert got.expired == []
        assert got.crashed == set()
        assert got.sessions == self.sessions
        assert got.entries == self.entries
        assert got.qos2_in == self.qos2
        assert got.retained == self.retained
        want: dict[str, list[OutgoingRecord]] = {}
        for (cid, _), r in sorted(self.out.items()):
            want.setdefault(cid, []).append(r)
        assert got.outgoing == want


def _replace(r: OutgoingRecord, **kw: object) -> OutgoingRecord:
    import dataclasses

    return dataclasses.replace(r, **kw)  # type: ignore[arg-type]


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=50, stateful_step_count=25, deadline=None)


# ---------------------------------------------------------------------------- entries vs the index
FILTERS = ["a/#", "a/+", "+/b", "a/b", "#", "+/+", "a", "$share/g/a/#", "$share/h/+/b"]
TOPICS = ["a", "a/b", "a/c", "x/b", "a/b/c", "x", "x/y/z"]
_ops = st.lists(
    st.tuples(st.sampled_from(["sub", "unsub"]), st.sampled_from(FILTERS), st.integers(0, 2)), max_size=14
)


def _routing(index: topics.SubscriptionIndex[SubOptions], topic: str) -> tuple[object, object]:
    r = index.match(topic)
    return (
        {c: sorted((s.topic_filter, s.options.qos) for s in subs) for c, subs in r.clients.items()},
        {k: sorted((c, o.qos) for c, o in members) for k, members in r.shared.items()},
    )


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_saved_entries_replay_into_an_equivalent_index(ops: list[tuple[str, str, int]]) -> None:
    original: topics.SubscriptionIndex[SubOptions] = topics.SubscriptionIndex()
    for op, f, qos in ops:
        if op == "sub":
            original.subscribe("c", f, SubOptions(qos, topic_filter=f))
        else:
            original.unsubscribe("c", f)
    saved = [EntryRecord(e.topic_filter, e.options) for e in original.entries("c")]
    with Store(":memory:") as store:
        store.put_entries("c", saved)
        loaded = store.load().entries.get("c", [])
    assert loaded == saved
    rebuilt: topics.SubscriptionIndex[SubOptions] = topics.SubscriptionIndex()
    replay_entries(rebuilt, "c", loaded)
    rebuilt._check()
    for t in TOPICS:
        assert _routing(rebuilt, t) == _routing(original, t)
    # the rebuilt list is the saved one without dead negative entries
    it = iter(original.entries("c"))
    assert all(any(e == o for o in it) for e in rebuilt.entries("c"))
    assert [e for e in original.entries("c") if e.positive] == [e for e in rebuilt.entries("c") if e.positive]
