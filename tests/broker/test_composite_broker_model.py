"""Model-based test of composite subscriptions through the broker core: the composite events
the broker delivers equal those of the brute-force reference of docs/composite.md
(tests/composite/reference.py) fed by a brute-force atom matcher (``topics.matches`` and a
brute-force content engine per atom), so that matching atoms through the router's index and
content engine is checked along with the engine.

Random composite subscriptions (client, name) over a small pool of atoms with wildcards and a
selector, re-subscriptions, unsubscriptions, session ends, publications (each offered to its
matching atoms in ascending atom id, as ``offer_many`` does) and time moving past windows
(``ManualClock``).  ``Composites._check()`` runs after every step.

The sessions are persisted, with a real store (SQLite in a temporary directory), so every
composite subscription is journalled (broker/core/_composite_log.py): ``checkpoint`` takes a
snapshot and trims the journal as the broker's compaction does, and ``crash`` throws the core
away and builds a new one from the last snapshot plus the committed journal
(``Composites.load``, as after ``kill -9``); the run goes on against the same reference, so the
recovered state must be the one the calls produced.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import composite
import content
import topics
from broker._config import BrokerConfig
from broker.core._clock import ManualClock
from broker.core._core import Core
from broker.core._session import Session
from broker.durability._store import Store
from broker.packets import NO_PROPERTIES
from broker.values import Message, Route
from tests.budget import examples
from tests.composite.reference import Reference

POOL = ["a", "b", "c[v > 1]", "e/+", "e/#"]
TOPICS = ["a", "b", "c", "e", "e/x", "z"]
CLIENTS = ["p", "q", "r"]
NAMES = ["n", "m"]
WINDOW, CAP = 5.0, 3


@st.composite
def expressions(draw: st.DrawFn, depth: int = 2) -> str:
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        return draw(st.sampled_from(POOL))
    op = draw(st.sampled_from(["&", "|"]))
    parts = [draw(expressions(depth - 1)) for _ in range(draw(st.integers(2, 3)))]
    return "(" + f" {op} ".join(parts) + ")"


def matches(atom: composite.Atom, topic: str, payload: bytes) -> bool:
    """Brute force: the atom's topic filter and selector, evaluated directly."""
    if not topics.matches(atom.topic, topic):
        return False
    if atom.filter is None:
        return True
    engine = content.ENGINES["brute-force"]()
    engine.add(0, atom.filter)
    return bool(engine.match(content.attributes(payload)))


class BrokerVsReference(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(wall=1000.0)
        self.dir = tempfile.mkdtemp(prefix="composite-model-")
        self.store = Store(Path(self.dir) / "broker.db")
        self.snapshot: bytes | None = None  # the last checkpoint
        self.core = self.new_core()
        self.ref = Reference(WINDOW, CAP)
        self.got: list[tuple[str, str, int, bytes]] = []  # (client, topic, qos, payload)
        self.serial = 0

    def new_core(self) -> Core:
        core = Core(BrokerConfig(sys_interval=0), clock=self.clock)
        core.composite.engine = composite.CompositeEngine(window=WINDOW, max_buffer=CAP)
        core.journal.store = self.store
        return core

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def session(self, client: str, core: Core | None = None) -> None:
        core = self.core if core is None else core
        if client not in core.sessions:
            s = Session(client, 3600)
            s.persisted = True  # journalled (deliveries to a sink are never stored)

            def sink(msg: Message, route: Route) -> None:
                self.got.append((client, msg.topic, route.qos, msg.payload))

            s.sink = sink
            core.sessions[client] = s

    @rule(
        client=st.sampled_from(CLIENTS),
        name=st.sampled_from(NAMES),
        text=expressions(),
        qos=st.integers(0, 2),
    )
    def subscribe(self, client: str, name: str, text: str, qos: int) -> None:
        self.session(client)
        self.core.composite.add(client, name, text, qos)
        self.ref.subscribe((client, name), text, qos, None, None)

    @rule(client=st.sampled_from(CLIENTS), name=st.sampled_from(NAMES))
    def unsubscribe(self, client: str, name: str) -> None:
        assert self.core.composite.remove(client, name) == self.ref.unsubscribe((client, name))

    @rule(client=st.sampled_from(CLIENTS))
    def end_session(self, client: str) -> None:
        s = self.core.sessions.get(client)
        if s is not None:
            self.core.end_session(s, self.clock.monotonic())
        for name in NAMES:
            self.ref.unsubscribe((client, name))

    @rule(seconds=st.sampled_from([0.0, 1.0, 2.0, 6.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(topic=st.sampled_from(TOPICS), v=st.integers(0, 3), qos=st.integers(0, 2))
    def publish(self, topic: str, v: int, qos: int) -> None:
        self.serial += 1
        payload = json.dumps({"v": v, "n": self.serial}).encode()
        now = self.clock.wall()
        # the reference: atoms matched by brute force, offered in ascending atom id
        eng = self.core.composite.engine
        atoms = {a.text: a for sub in self.ref.subs.values() for a in sub.expr.atoms()}
        hit = sorted((eng.atom_id(text), text) for text, a in atoms.items() if matches(a, topic, payload))
        comp = composite.Component(topic, payload, qos)
        expected = []
        if hit:
            for _, text in hit:
                expected += self.ref.offer(text, comp, now)
        else:
            self.ref.advance(now)
        self.got.clear()
        self.core.publish(Message.create(topic, payload, qos, False, NO_PROPERTIES, None, 0.0), 0.0)
        keys = {repr(k): k for k in self.ref.by_key}  # the reference reports keys by repr
        want = sorted(
            (repr(keys[key]), f"$composite/{keys[key][1]}", q, json.dumps(_doc(ev), sort_keys=True))
            for ev in expected
            for key, q in ev[1]  # type: ignore[attr-defined]
        )
        have = sorted(
            (
                repr((client, topic_[len("$composite/") :])),
                topic_,
                q,
                json.dumps(json.loads(body), sort_keys=True),
            )
            for client, topic_, q, body in self.got
        )
        assert have == want

    @rule()
    def checkpoint(self) -> None:
        """Compaction: a snapshot (``CompositeSaver`` writes it to a file), the journal rows it
        holds deleted."""
        log = self.core.composite.log
        log.flush()  # as the broker's compaction does first
        self.snapshot = self.core.composite.dump()
        self.store.composite_trim(log.seq)
        log.rows = 0

    @rule()
    def crash(self) -> None:
        """kill -9 after a tick (a tick writes the pending QoS 0 offers; those of the last tick
        are the only ones a kill -9 may lose): a new core from the last snapshot and the
        committed journal."""
        self.core.composite.tick()
        core = self.new_core()
        for client in self.core.sessions:
            self.session(client, core)
        core.composite.load(self.snapshot, self.store.composite_journal(), core.sessions.__contains__)
        old, new = self.core.composite.engine, core.composite.engine
        new.advance(old.clock)
        for key in self.ref.by_key:  # the same subscriptions, buffers and counters
            assert new.subscription(key) == old.subscription(key)
            assert _plain(new.buffers(key)) == _plain(old.buffers(key))
        self.core = core

    @invariant()
    def checked(self) -> None:
        self.core.composite._check()
        keys = {(c, n) for c, names in self.core.composite.clients.items() for n in names}
        assert keys == set(self.ref.by_key)


def _plain(buffers: dict[str, list[composite.Part]] | None) -> object:
    """Buffers as plain values (the live engine holds the broker's messages, a replayed one
    ``Component`` records of them)."""
    if buffers is None:
        return None
    return {
        a: [(p.arrival, p.component.topic, p.component.payload, p.component.qos) for p in parts]
        for a, parts in buffers.items()
    }


def _doc(ev: tuple[object, ...]) -> dict[str, object]:
    """The payload document the reference event stands for (docs/composite.md)."""
    expression, _, parts, begin, end = ev
    return {
        "expression": expression,
        "begin": begin,
        "end": end,
        "components": [
            {
                "element": a,
                "topic": t,
                "payload": p.decode(),
                "encoding": "text",
                "qos": q,
                "arrival": arr,
            }
            for a, t, p, q, arr in parts  # type: ignore[attr-defined]
        ],
    }


TestBrokerVsReference = BrokerVsReference.TestCase
TestBrokerVsReference.settings = settings(
    max_examples=examples(100),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
