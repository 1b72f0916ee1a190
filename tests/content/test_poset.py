"""Siena poset specifics: the covering test is sound, the graph stays a Hasse-like DAG of coverings.

The shared model test (test_engines_model.py) compares answers with brute force; here the
covering test itself is checked (soundness against random events, and the cases it must
recognise), and larger random populations exercise insertion between predecessors and
successors and deletion that reconnects children, with ``_check()`` after every step.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from content import BruteForce, compile
from content.baselines._poset import Poset, covers
from tests.budget import examples
from tests.content.strategies import events, events_sparse, selector_texts

_SETTINGS = settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@_SETTINGS
@given(selector_texts(3), selector_texts(3), st.lists(events(), min_size=1, max_size=20))
def test_covering_is_sound(a: str, b: str, evs: list[dict[str, object]]) -> None:
    """Whenever ``covers(f1, f2)`` says yes, every event matching f2 matches f1."""
    for f1, f2 in (
        (compile(a), compile(b)),
        (compile(f"({a}) OR ({b})"), compile(b)),
        (compile(a), compile(f"({a}) AND ({b})")),
    ):
        if covers(f1, f2):
            for ev in evs:
                assert not f2.matches(ev) or f1.matches(ev)


@_SETTINGS
@given(selector_texts(3), selector_texts(3))
def test_covering_recognises_weakening(a: str, b: str) -> None:
    fa = compile(a)
    assert covers(fa, fa)
    assert covers(compile(f"({a}) OR ({b})"), fa)


def test_covering_cases() -> None:
    yes = [
        ("x > 1", "x > 5"),
        ("x >= 5", "x > 5"),
        ("x > 1", "x = 3"),
        ("x < 10", "x BETWEEN 2 AND 9.5"),
        ("x <> 7", "x < 5"),
        ("x NOT IN (7, 8)", "x BETWEEN 1 AND 6"),
        ("x IN (1, 2, 3)", "x IN (1, 3)"),
        ("x IN (1, 2, 3)", "x = 2.0"),
        ("s LIKE 'ab%'", "s LIKE 'abc%'"),
        ("s LIKE '%b%'", "s LIKE 'abc%'"),
        ("s LIKE '%bc'", "s = 'abc'"),
        ("s NOT LIKE 'a%'", "s NOT LIKE 'a%'"),
        ("s NOT LIKE 'ab%'", "s NOT LIKE 'a%'"),
        ("f = FALSE", "f <> TRUE"),
        ("x > 1", "x > 5 AND y = 2"),
        ("x > 1 OR y = 1", "x > 5 OR y = 1"),
        ("x > 1", "x > 5 OR x = 3"),
    ]
    no = [
        ("x > 5", "x > 1"),
        ("x > 5", "x >= 5"),
        ("x > 1 AND y = 2", "x > 5"),
        ("x <> 7", "x <> 8"),
        ("x > 1", "y > 1"),
        ("x > 1", "x > 5 OR y = 3"),
        ("s LIKE 'abc%'", "s LIKE 'ab%'"),
        ("x NOT IN (7, 'a')", "x BETWEEN 1 AND 6"),
        ("x > 1", "x > 'a'"),
    ]
    for a, b in yes:
        assert covers(compile(a), compile(b)), (a, b)
    for a, b in no:
        assert not covers(compile(a), compile(b)), (a, b)


class PosetVsBruteForce(RuleBasedStateMachine):
    """More subscriptions than the shared model test, over few attributes: many coverings."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = Poset()
        self.oracle = BruteForce()

    @rule(sid=st.integers(0, 40), text=selector_texts(3))
    def add(self, sid: int, text: str) -> None:
        self.engine.add(sid, text)
        self.oracle.add(sid, text)

    @rule(
        sid=st.integers(0, 40),
        attr=st.sampled_from(["a", "b"]),
        op=st.sampled_from(["<", ">", "="]),
        v=st.integers(0, 6),
    )
    def add_range(self, sid: int, attr: str, op: str, v: int) -> None:
        text = f"{attr} {op} {v}" if v % 3 else f"{attr} {op} {v} AND c > {v - 3}"
        self.engine.add(sid, text)
        self.oracle.add(sid, text)

    @rule(sid=st.integers(0, 40))
    def remove(self, sid: int) -> None:
        if sid in self.oracle:
            self.engine.remove(sid)
            self.oracle.remove(sid)

    @rule(event=st.one_of(events(), events_sparse()))
    def match(self, event: dict[str, object]) -> None:
        assert self.engine.match(event) == self.oracle.match(event)

    @invariant()
    def consistent(self) -> None:
        self.engine._check()
        assert len(self.engine) == len(self.oracle)


def test_poset_agrees_with_brute_force() -> None:
    run_state_machine_as_test(
        PosetVsBruteForce,
        settings=settings(
            max_examples=examples(60),
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def test_chain_insert_between_and_delete_reconnects() -> None:
    p = Poset()
    p.add("loose", "x > 1")
    p.add("tight", "x > 9")
    p.add("mid", "x > 5")  # goes between: loose -> mid -> tight
    p.add("twin", "x > 5.0")  # the same filter: shares mid's node
    p._check()
    assert p.stats == {"nodes": 3, "roots": 1, "edges": 2}
    assert p.match({"x": 6}) == {"loose", "mid", "twin"}
    assert p.match({"x": 0}) == set()
    p.remove("mid")
    p._check()
    assert p.stats["nodes"] == 3  # twin still holds the node
    p.remove("twin")
    p._check()
    assert p.stats == {"nodes": 2, "roots": 1, "edges": 1}  # loose -> tight reconnected
    assert p.match({"x": 10}) == {"loose", "tight"}
    p.remove("loose")
    p._check()
    assert p.stats == {"nodes": 1, "roots": 1, "edges": 0}
    assert p.match({"x": 10}) == {"tight"}


def test_many_roots_use_the_vectorised_root_test() -> None:
    p = Poset()
    for i in range(100):
        p.add(i, f"a{i % 10} > {i}")  # 10 attributes: chains of 10 under 10 roots ...
        p.add(1000 + i, f"b{i} < {i}")  # ... and 100 unrelated roots
    p._check()
    assert p.stats["roots"] == 110
    ev = {f"a{k}": 50 for k in range(10)} | {f"b{k}": 50 for k in range(100)}
    assert p.match(ev) == {i for i in range(50)} | {1000 + i for i in range(51, 100)}
    assert p.match(ev | {"a3": 2**60 + 1}) == {i for i in range(100) if i < 50 or i % 10 == 3} | {
        1000 + i for i in range(51, 100)
    }


def test_insertion_keeps_the_hasse_diagram() -> None:
    p = Poset()
    p.add("a", "x > 1")
    p.add("b", "y > 1")
    p.add("c", "x > 5 AND y > 5")  # below a and b
    p.add("d", "x > 3")  # between a and c: a -> c becomes redundant and is dropped
    p.add("e", "x > 0")  # above everything on x: becomes the root over a
    p._check()
    assert p.redundant_edges() == 0
    assert p.stats == {"nodes": 5, "roots": 2, "edges": 4}  # e->a->d->c, b->c
    assert p.explain({"x": 4, "y": 9}) == {"evaluated": 5, "edges_followed": 4, "matching_nodes": 4}
    p.remove("d")
    p._check()
    assert p.redundant_edges() == 0 and p.stats["edges"] == 3  # a -> c reconnected
