"""The documented merging semantics on worked examples (docs/composite.md, "Semantics")."""

from __future__ import annotations

import base64
from dataclasses import replace

import orjson
import pytest

from composite import Component, CompositeEngine, CompositeEvent, CompositeSyntaxError


class Feed:
    """An engine plus helpers: offer by atom text, read the events' components."""

    def __init__(self, **kw: object) -> None:
        self.eng = CompositeEngine(**kw)  # type: ignore[arg-type]

    def ids(self) -> dict[str, int]:
        return {a.element: a.id for a in self.eng.atoms()}

    def offer(
        self, atom: str, now: float, payload: bytes | None = None, qos: int = 2
    ) -> list[CompositeEvent]:
        comp = Component(atom, payload if payload is not None else f"{atom}@{now}".encode(), qos)
        out = self.eng.offer(self.ids()[atom], comp, now)
        self.eng._check()
        return out


def parts(ev: CompositeEvent) -> list[tuple[str, float]]:
    return [(p.element, p.arrival) for p in ev.components]


def test_paper_example_a_or_b_and_c() -> None:
    f = Feed()
    f.eng.subscribe("manager", "(A|B)&C")
    assert f.offer("A", 1.0) == []
    [ev] = f.offer("C", 2.0)
    assert parts(ev) == [("A", 1.0), ("C", 2.0)]
    assert (ev.expression, ev.begin, ev.end) == ("(A | B) & C", 1.0, 2.0)
    assert ev.deliveries == (("manager", 2),)
    assert f.offer("C", 3.0) == []  # the A was consumed
    [ev] = f.offer("B", 4.0)
    assert parts(ev) == [("C", 3.0), ("B", 4.0)]


def test_or_consumes_every_satisfied_branch_and_keeps_the_others() -> None:
    f = Feed()
    f.eng.subscribe(1, "(A|B)&C")
    f.offer("A", 1)
    f.offer("B", 2)
    [ev] = f.offer("C", 3)
    assert parts(ev) == [("A", 1), ("B", 2), ("C", 3)]  # both satisfied branches
    f.eng.subscribe(2, "(A&B)|C")
    f.offer("A", 4)
    [ev] = [e for e in f.offer("C", 5) if e.expression == "(A & B) | C"]
    assert parts(ev) == [("C", 5)]
    bufs = f.eng.buffers(2)
    assert bufs is not None and [p.arrival for p in bufs["A"]] == [4]  # unsatisfied branch kept


def test_oldest_instances_pair_first() -> None:
    f = Feed()
    f.eng.subscribe(1, "A&B")
    for t in (1, 2, 3):
        f.offer("A", t)
    [ev] = f.offer("B", 4)
    assert parts(ev) == [("A", 1), ("B", 4)]
    [ev] = f.offer("B", 5)
    assert parts(ev) == [("A", 2), ("B", 5)]


def test_window_expiry_is_exact_at_the_edge() -> None:
    f = Feed(window=10)
    f.eng.subscribe(1, "A&B")
    f.offer("A", 0)
    [ev] = f.offer("B", 10)  # arrival >= now - window: still live
    assert parts(ev) == [("A", 0), ("B", 10)]
    f.offer("A", 20)
    assert f.offer("B", 30.5) == []  # A expired
    s = f.eng.subscription(1)
    assert s is not None and (s.expired, s.dropped, s.buffered, s.events) == (1, 0, 1, 1)
    assert f.offer("B", 100) == []
    s = f.eng.subscription(1)
    assert s is not None and (s.expired, s.buffered) == (2, 1)


def test_bounded_buffer_drops_the_oldest_and_counts() -> None:
    f = Feed(max_buffer=2)
    f.eng.subscribe(1, "A&B")
    for t in (1, 2, 3, 4):
        f.offer("A", t)
    s = f.eng.subscription(1)
    assert s is not None and (s.dropped, s.buffered) == (2, 2)
    bufs = f.eng.buffers(1)
    assert bufs is not None and [p.arrival for p in bufs["A"]] == [3, 4]
    [ev] = f.offer("B", 5)
    assert parts(ev) == [("A", 3), ("B", 5)]
    st = f.eng.stats()
    assert (st.dropped, st.events, st.buffered) == (2, 1, 1)


def test_per_subscription_window_and_cap() -> None:
    f = Feed(window=100, max_buffer=10)
    f.eng.subscribe("short", "A&B", window=5, max_buffer=1)
    f.eng.subscribe("long", "A&B")
    f.offer("A", 0)
    f.offer("A", 1)
    evs = f.offer("B", 8)
    assert [(e.deliveries[0][0], parts(e)) for e in evs] == [("long", [("A", 0), ("B", 8)])]
    s, lg = f.eng.subscription("short"), f.eng.subscription("long")
    assert s is not None and (s.dropped, s.expired, s.buffered) == (1, 1, 1)
    assert lg is not None and (lg.dropped, lg.expired, lg.buffered) == (0, 0, 1)


def test_single_atom_expression_fires_on_every_offer() -> None:
    f = Feed()
    f.eng.subscribe(1, "s/#[v > 1]")
    [ev] = f.offer("s/#[v > 1]", 1.0)
    assert parts(ev) == [("s/#[v > 1]", 1.0)]


def test_qos_is_the_minimum_of_subscriber_and_components() -> None:
    f = Feed()
    f.eng.subscribe("q0", "A&B", qos=0)
    f.eng.subscribe("q1", "A&B", qos=1)
    f.eng.subscribe("q2", "A&B", qos=2)
    f.offer("A", 1, qos=2)
    [ev] = f.offer("B", 2, qos=2)
    assert sorted(ev.deliveries) == [("q0", 0), ("q1", 1), ("q2", 2)]
    f.offer("A", 3, qos=1)
    [ev] = f.offer("B", 4, qos=2)
    assert sorted(ev.deliveries) == [("q0", 0), ("q1", 1), ("q2", 1)]
    assert ev.qos == 1


def test_later_subscriber_shares_the_buffers() -> None:
    f = Feed()
    f.eng.subscribe("x", "A&B")
    f.offer("A", 1)
    f.eng.subscribe("y", "A&B")
    [ev] = f.offer("B", 2)
    assert sorted(k for k, _ in ev.deliveries) == ["x", "y"]


def test_new_subscription_sees_only_later_components() -> None:
    f = Feed()
    f.eng.subscribe("x", "A&B")
    f.offer("A", 1)
    f.eng.subscribe("y", "A&C")
    f.offer("C", 2)
    assert f.eng.subscription("y").events == 0  # type: ignore[union-attr]


def test_one_publication_matching_two_atoms() -> None:
    f = Feed()
    f.eng.subscribe(1, "a/# & a/b")
    ids = f.ids()
    [ev] = f.eng.offer_many([ids["a/b"], ids["a/#"]], Component("a/b", b"x", 1), 5.0)
    assert [p.element for p in ev.components] == ["a/#", "a/b"]
    assert ev.components[0].component is ev.components[1].component


def test_unknown_atom_and_clock_going_back() -> None:
    f = Feed(window=10)
    f.eng.subscribe(1, "A&B")
    assert f.eng.offer(999, Component("t", b""), 1.0) == []
    f.offer("A", 50)
    [ev] = f.offer("B", 3)  # an earlier time is read as the current clock
    assert parts(ev) == [("A", 50), ("B", 50)]
    assert f.eng.clock == 50


def test_payload_document() -> None:
    f = Feed()
    f.eng.subscribe(1, "(t/a | t/b) & t/c", qos=1)
    f.offer("t/a", 1.5, payload='{"v": "é"}'.encode(), qos=1)
    [ev] = f.offer("t/c", 2.25, payload=b"\xff\x00", qos=0)
    doc = orjson.loads(ev.payload())
    assert doc == {
        "expression": "(t/a | t/b) & t/c",
        "begin": 1.5,
        "end": 2.25,
        "components": [
            {
                "element": "t/a",
                "topic": "t/a",
                "payload": '{"v": "é"}',
                "encoding": "text",
                "qos": 1,
                "arrival": 1.5,
            },
            {
                "element": "t/c",
                "topic": "t/c",
                "payload": base64.b64encode(b"\xff\x00").decode(),
                "encoding": "base64",
                "qos": 0,
                "arrival": 2.25,
            },
        ],
    }
    assert ev.payload() is ev.payload()  # built once, shared by every subscriber
    assert ev.deliveries == ((1, 0),)


def test_tick_frees_expired_log_entries() -> None:
    f = Feed(window=10)
    f.eng.subscribe(1, "A&B")
    for t in range(5):
        f.offer("A", t)
    assert f.eng.stats().logged == 5
    f.eng.tick(100)
    f.eng._check()
    st = f.eng.stats()
    assert (st.logged, st.buffered, st.expired) == (0, 0, 5)


def test_snapshot_restore_round_trip() -> None:
    f = Feed(window=30, max_buffer=4)
    f.eng.subscribe(("c1", "$composite/x"), "(A|B)&C", qos=1)
    f.eng.subscribe(("c2", "$composite/x"), "(A|B)&C", qos=0)
    f.eng.subscribe("k", "A & D", window=5, max_buffer=2)
    for t, a in enumerate(["A", "A", "B", "D", "A", "A", "A"]):
        f.offer(a, float(t), payload=bytes([t, 255]))
    before = f.eng.stats()
    data = f.eng.snapshot()
    again = CompositeEngine.restore(data)
    again._check()
    after = again.stats()
    assert replace(after, logged=0) == replace(before, logged=0)  # the log keeps only what is needed
    assert after.logged <= before.logged
    for key in [("c1", "$composite/x"), "k"]:
        b1, b2 = f.eng.buffers(key), again.buffers(key)
        assert b1 == b2
    assert [a.element for a in again.atoms()] == [a.element for a in f.eng.atoms()]
    # both continue identically
    ids1 = f.ids()
    ids2 = {a.element: a.id for a in again.atoms()}
    comp = Component("C", b"c", 2)
    ev1 = f.eng.offer(ids1["C"], comp, 10.0)
    ev2 = again.offer(ids2["C"], comp, 10.0)
    assert [e.payload() for e in ev1] == [e.payload() for e in ev2]
    assert sorted(ev1[0].deliveries) == sorted(ev2[0].deliveries)


def test_bad_arguments() -> None:
    eng = CompositeEngine()
    with pytest.raises(CompositeSyntaxError):
        eng.subscribe(1, "a &")
    with pytest.raises(ValueError, match="window"):
        eng.subscribe(1, "a", window=0)
    with pytest.raises(ValueError, match="window"):
        eng.subscribe(1, "a", window=float("inf"))
    with pytest.raises(ValueError, match="max_buffer"):
        eng.subscribe(1, "a", max_buffer=0)
    with pytest.raises(ValueError, match="qos"):
        eng.subscribe(1, "a", qos=3)
    with pytest.raises(ValueError, match="window"):
        CompositeEngine(window=-1)
    with pytest.raises(ValueError, match="format"):
        CompositeEngine.restore({"format": 99})
    assert eng.stats().subscriptions == 0


def test_losses_are_drained_once_and_idle_expiry_waits_for_a_settle() -> None:
    """``track_losses``/``drain_losses`` (what the broker's loss hook reports): counting is lazy,
    so an idle subscription's expiries appear once something settles it (``settle_some``, the
    broker's sweep), and each loss is drained once."""
    eng = CompositeEngine(window=5, max_buffer=2)
    eng.track_losses(True)
    eng.subscribe("k", "a & b")
    a = eng.atom_id("a")
    assert a is not None
    for i in range(4):
        eng.offer(a, Component("a", b"%d" % i), 0.0)
    assert eng.drain_losses() == []  # nothing counted yet
    assert eng.settle_some(10.0, 1) == 1
    assert eng.drain_losses() == [("a & b", 5.0, 2, "a", 2, 2)]  # 2 expired, 2 dropped by the cap
    assert eng.drain_losses() == []
    sub = eng.subscription("k")
    assert sub is not None and (sub.expired, sub.dropped) == (2, 2)


def test_occupancy_is_the_firing_subscriptions_buffer_after_the_offer() -> None:
    eng = CompositeEngine()
    eng.subscribe("k", "(a | b) & c", window=30)
    ids = {x.element: x.id for x in eng.atoms()}
    eng.offer(ids["a"], Component("a", b"1"), 1.0)
    eng.offer(ids["a"], Component("a", b"2"), 2.0)
    (ev,) = eng.offer(ids["c"], Component("c", b"3"), 3.0)
    assert eng.occupancy(ev) == (30.0, 64, 1)  # the second a is still buffered
    assert eng.occupancy(CompositeEvent("x", (), (), 0.0, 0.0)) is None  # not from this engine
