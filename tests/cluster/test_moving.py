"""What a moving session carries (cluster/_moving.py): the diversion table against a
brute-force reference (Hypothesis state machine, its ``_check`` after every step), and entries
that keep a message's properties, delivery and packet state."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from broker._config import BrokerConfig
from broker.core._core import Core
from broker.core._session import PUBLISH_SENT, PUBREL_SENT, Outgoing, Session
from broker.packets import Properties, SubscriptionRequest
from broker.values import Message, Route
from cluster._moving import Diversions, decode_entry, session_entries

PEERS = ["p0", "p1", "p2"]
CLIENTS = ["c0", "c1", "c2"]
FILTERS = ["s", "t"]  # c1 has "$share/g/s": its copies for "s" are never diverted


class DiversionsVsReference(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = Core(BrokerConfig(sys_interval=0))
        self.core.router.subscribe("c1", {}, SubscriptionRequest("$share/g/s", 1), None, None)
        self.core.router.subscribe("c1", {}, SubscriptionRequest("t", 1), None, None)
        self.d = Diversions(self.core)
        self.ref: dict[tuple[str, str], str] = {}  # (peer, client) -> handler tag
        self.calls: list[tuple[str, str]] = []  # (tag, client) as the handlers were called

    def _handler(self, tag: str) -> object:
        return lambda _m, r: self.calls.append((tag, r.client_id))

    @rule(peer=st.sampled_from(PEERS), client=st.sampled_from(CLIENTS), tag=st.sampled_from("abc"))
    def set(self, peer: str, client: str, tag: str) -> None:
        self.d.set(peer, client, self._handler(tag))  # type: ignore[arg-type]
        self.ref[(peer, client)] = tag

    @rule(peer=st.sampled_from(PEERS), client=st.sampled_from(CLIENTS))
    def clear(self, peer: str, client: str) -> None:
        self.d.clear(peer, client)
        self.ref.pop((peer, client), None)

    @rule(client=st.sampled_from(CLIENTS))
    def clear_client(self, client: str) -> None:
        self.d.clear_client(client)
        self.ref = {k: v for k, v in self.ref.items() if k[1] != client}

    @rule(
        peer=st.sampled_from(PEERS),
        routes=st.lists(
            st.tuples(st.sampled_from(CLIENTS), st.integers(0, 2), st.sampled_from(FILTERS)), max_size=6
        ),
    )
    def route(self, peer: str, routes: list[tuple[str, int, str]]) -> None:
        msg = Message.create("x", b"", 1, False, Properties(), None, 0.0)
        rs = [Route(c, q, False, (), f, None) for c, q, f in routes]
        self.calls.clear()
        kept = self.d.routes_from(peer, msg, rs) if self.d.by_peer else rs
        want_kept, want_calls = [], []
        for r in rs:
            tag = self.ref.get((peer, r.client_id))
            if tag is None or r.qos == 0 or (r.client_id == "c1" and r.topic_filter == "s"):
                want_kept.append(r)
            else:
                want_calls.append((tag, r.client_id))
        assert kept == want_kept
        assert self.calls == want_calls

    @invariant()
    def consistent(self) -> None:
        self.d._check()
        assert {(p, c) for p, h in self.d.by_peer.items() for c in h} == set(self.ref)


def test_diversions_against_a_reference() -> None:
    run_state_machine_as_test(DiversionsVsReference, settings=settings(max_examples=150, deadline=None))


def test_entries_keep_the_message_and_its_state() -> None:
    """Properties, the expiry left, the delivery and the packet state survive the round trip."""
    props = Properties(
        user_properties=(("k", "v"),),
        content_type="text/plain",
        message_expiry_interval=100,
        correlation_data=b"\x00\x01",
    )
    s = Session("c", 300)
    sent = Outgoing(Message.create("a/b", b"one", 2, False, props, "pub", 10.0), 2, False, (3,), "a/+", None)
    sent.state = PUBREL_SENT
    s.inflight[7] = sent
    s.queue.append(
        Outgoing(
            Message.create("a/c", b"two", 1, True, Properties(), None, 10.0), 1, True, (), "a/#", "x > 1"
        )
    )
    entries = session_entries(s, now=40.0)  # 60 s of the 100 left
    (m1, r1, pid1, st1), (m2, r2, pid2, st2) = (decode_entry(e, now=0.0) for e in entries)
    assert (m1.topic, m1.payload, m1.qos) == ("a/b", b"one", 2)
    assert m1.properties.user_properties == (("k", "v"),)
    assert m1.properties.content_type == "text/plain" and m1.properties.correlation_data == b"\x00\x01"
    assert m1.properties.message_expiry_interval == 70 and m1.expires_at == 70.0
    assert (r1.qos, r1.retain, r1.subscription_ids, r1.topic_filter, pid1, st1) == (
        2,
        False,
        (3,),
        "a/+",
        7,
        PUBREL_SENT,
    )
    assert (m2.topic, m2.payload, m2.retain) == ("a/c", b"two", True)
    assert (r2.qos, r2.retain, r2.topic_filter, r2.selector, pid2, st2) == (
        1,
        True,
        "a/#",
        "x > 1",
        None,
        PUBLISH_SENT,
    )
