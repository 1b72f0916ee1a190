"""The records fit the broker core: a sans-IO ``Core`` is saved into a store following the wiring
plan of docs/persistence.md, restored into a fresh ``Core`` from a reopened store, and both cores
must then answer the same client traffic with the same packets (differential test)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import content
from broker._config import BrokerConfig
from broker.core._connection import Callbacks, Connection
from broker.core._core import Core
from broker.core._session import Outgoing, Session
from broker.packets import (
    Connect,
    Decoder,
    Packet,
    Properties,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    SubscriptionRequest,
    Unsubscribe,
    Will,
)
from broker.store import (
    EntryRecord,
    MessageState,
    OutgoingRecord,
    SessionRecord,
    Store,
    message_record,
    replay_entries,
)

NOW = 100.0  # the cores' monotonic clock


class Wire:
    def __init__(self, core: Core, now: float) -> None:
        self.core = core
        self.decoder = Decoder(5, server=False)
        self.out: list[Packet] = []
        self.conn = Connection(core, Callbacks(self.out_bytes, lambda: None), now, "test")

    def out_bytes(self, data: bytes) -> None:
        self.out.extend(self.decoder.feed(data))

    def feed(self, *packets: Packet, now: float = NOW) -> list[Packet]:
        self.conn.received(packets, now)
        self.core.flush()
        got, self.out = self.out, []
        return got


def _connect(core: Core, cid: str, **kw: object) -> tuple[Wire, list[Packet]]:
    w = Wire(core, NOW)
    got = w.feed(Connect(cid, protocol_level=5, keep_alive=0, **kw))  # type: ignore[arg-type]
    return w, got


def save(core: Core, store: Store, now: float, wall: float) -> None:
    """What the wiring plan writes, done at once for every persisted session."""
    for cid, s in core.sessions.items():
        if s.expiry_interval == 0 or s.sink is not None:
            continue
        exp = None if s.expires_at is None else wall + (s.expires_at - now)
        disc = None if exp is None else exp - s.expiry_interval
        due = None if s.will_due is None else wall + (s.will_due - now)
        store.put_session(SessionRecord(cid, 5, s.expiry_interval, disc, s.username, s.next_pid, s.will, due))
        store.put_entries(
            cid, [EntryRecord(e.topic_filter, e.options) for e in core.router.index.entries(cid)]
        )
        for pid, out in s.inflight.items():
            state = MessageState(out.state)  # one encoding: the core's state is the store's
            store.add_outgoing(_outgoing(store, cid, state, pid, out, now, wall))
        for out in s.queue:
            store.add_outgoing(_outgoing(store, cid, MessageState.QUEUED, None, out, now, wall))
        for pid in s.qos2_received:
            store.qos2_received(cid, pid)
    for _topic, msg in core.router.retained.match("#"):
        store.set_retained(message_record(msg, now, wall))


def _outgoing(
    store: Store, cid: str, state: MessageState, pid: int | None, out: Outgoing, now: float, wall: float
) -> OutgoingRecord:
    rec = message_record(out.msg, now, wall)
    return OutgoingRecord(
        cid,
        store.next_seq(),
        state,
        pid,
        rec,
        out.qos,
        out.retain,
        out.sub_ids,
        out.topic_filter,
        out.selector,
    )


def restore(store: Store, config: BrokerConfig, now: float, wall: float) -> Core:
    """Start steps 1-6 of the wiring plan."""
    core = Core(config)
    st = store.load(wall)
    router = core.router
    for rec in st.retained.values():
        router.store_retained(rec.to_message(now, wall))
    for cid, r in st.sessions.items():
        s = Session(cid, r.expiry_interval)
        s.next_pid, s.username, s.will = r.next_pid, r.username, r.will
        exp = r.expires_at()
        if exp is not None:
            s.expires_at = now + (exp - wall)
            core.expiring.add(s)
        if r.will_due is not None:
            s.will_due = now + (r.will_due - wall)
            core.pending_wills.add(s)
        core.sessions[cid] = s
        entries = st.entries.get(cid, [])
        for e in entries:
            if e.options is not None and e.options.selector is not None:
                router.add_selector(e.options.selector, content.compile(e.options.selector))
                s.selectors[e.topic_filter] = e.options.selector
        replay_entries(router.index, cid, entries)
        for o in st.outgoing.get(cid, []):
            out = Outgoing(
                o.message.to_message(now, wall), o.qos, o.retain, o.sub_ids, o.topic_filter, o.selector
            )
            if o.packet_id is None:
                s.queue.append(out)
            else:
                out.state = int(o.state)
                s.inflight[o.packet_id] = out
        s.qos2_received = set(st.qos2_in.get(cid, set()))
    return core


def _normal(packets: list[Packet]) -> list[Packet]:
    """Message expiry intervals are recomputed on restore: compare them rounded down."""
    return [
        p.replace(properties=dataclasses.replace(p.properties, message_expiry_interval=0))
        if isinstance(p, Publish) and p.properties.message_expiry_interval is not None
        else p
        for p in packets
    ]


def test_restored_core_answers_like_the_original(data_dir: Path) -> None:
    cfg = BrokerConfig(sys_interval=0)
    core = Core(cfg)
    expiry = Properties(session_expiry_interval=3600)
    will = Will("status/sub", b"gone", 1, False, Properties(will_delay_interval=600))
    sub, _ = _connect(core, "sub", clean_start=True, properties=expiry, will=will)
    sub.feed(
        Subscribe(
            1,
            (SubscriptionRequest("a/#", 2),),
            Properties(subscription_identifiers=(7,), user_properties=(("filter", "t > 1"),)),
        ),
        Subscribe(2, (SubscriptionRequest("b/+", 1, no_local=True, retain_as_published=True),)),
        Unsubscribe(3, ("b/x",)),  # partial unsubscribe: a negative entry
    )
    pub, _ = _connect(core, "pub", clean_start=True, properties=expiry)
    pub.feed(
        Publish("a/1", b'{"t": 5}', 1, packet_id=1),  # in flight to sub (never acknowledged)
        Publish("a/3", b'{"t": 9}', 2, packet_id=2),
    )
    sub.feed(Pubrec(2))  # a/3: PUBREC received, PUBREL sent
    sub.conn.lost(NOW)  # sub goes away: session kept, will delayed
    pub.feed(
        Publish("b/y", b"queued", 2, packet_id=3, properties=Properties(message_expiry_interval=500)),
        Publish("b/x", b"excluded", 1, packet_id=4),
        Publish("a/2", b'{"t": 0}', 1, packet_id=5),  # filtered out by the selector
        Publish("r/1", b"kept", 1, retain=True, packet_id=6),
        Publish("a/4", b'{"t": 2}', 2, packet_id=9),  # QoS 2 from pub awaiting PUBREL
    )
    pub.conn.lost(NOW)
    wall = time.time()
    with Store.in_data_dir(data_dir) as store:
        save(core, store, NOW, wall)
    with Store.in_data_dir(data_dir) as store:
        restored = restore(store, cfg, NOW + 1, wall + 1)
    restored._check()
    for cid in ("sub", "pub"):
        assert restored.router.index.entries(cid) == core.router.index.entries(cid)
        assert restored.sessions[cid].qos2_received == core.sessions[cid].qos2_received
    assert [s.client_id for s in restored.pending_wills] == ["sub"]
    assert [m.payload for _, m in restored.router.retained.match("#")] == [b"kept"]
    # both cores now see the same traffic
    answers = []
    for c in (core, restored):
        s2, got = _connect(c, "sub", clean_start=False, properties=expiry)
        p2, got_pub = _connect(c, "pub", clean_start=False, properties=expiry)
        later = p2.feed(
            Publish("a/4", b'{"t": 2}', 2, packet_id=9, dup=True),  # duplicate: not routed again
            Publish("b/z", b"live", 1, packet_id=10),
            Publish("b/x", b"still excluded", 1, packet_id=11),
        )
        answers.append((_normal(got), got_pub, later, _normal(s2.out), set(c.pending_wills)))
    assert answers[0] == answers[1]
    got, _, _, _, wills = answers[1]
    assert got[0].session_present  # type: ignore[union-attr]
    assert not wills
    sent = [(p.topic, p.payload) for p in got[1:] if isinstance(p, Publish)]
    assert sent == [("a/1", b'{"t": 5}'), ("b/y", b"queued"), ("a/4", b'{"t": 2}')]
    assert any(isinstance(p, Pubrel) for p in got)  # a/3 resumes at PUBREL
