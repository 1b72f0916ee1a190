"""BE-Tree specifics: partitioning, clustering and pruning keep ``_check()`` true and answers exact.

The shared model test (test_engines_model.py) runs BE-Tree with its default l-node capacity,
which a dozen subscriptions rarely overflow; here a tiny capacity forces space partitioning,
bucket splits and, on deletion, pruning at every step.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from content import BruteForce, Filter, Op, Predicate
from content.baselines._betree import BETree
from tests.budget import examples
from tests.content.strategies import events, events_sparse, selector_texts


class TinyBETree(BETree):
    capacity = 2
    min_partition = 1


class TinyVsBruteForce(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engine = TinyBETree()
        self.oracle = BruteForce()

    @rule(sid=st.integers(0, 40), text=selector_texts(4))
    def add(self, sid: int, text: str) -> None:
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


def test_tiny_betree_agrees_with_brute_force() -> None:
    run_state_machine_as_test(
        TinyVsBruteForce,
        settings=settings(
            max_examples=examples(80),
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def _range(attr: str, lo: float, hi: float) -> Filter:
    clause = (Predicate.of(attr, Op.GE, lo), Predicate.of(attr, Op.LE, hi))
    return Filter(f"{attr} BETWEEN {lo} AND {hi}", (clause,))


def test_splits_then_deletes_prune_back_to_an_empty_root() -> None:
    e = TinyBETree()
    n = 200
    for i in range(n):
        lo = float(i % 50)
        e.add(i, _range("x", lo, lo + 0.5) if i % 2 else _range("y", lo, lo + 2.0))
        e._check()
    stats = e.stats
    assert stats["pnodes"] >= 2 and stats["buckets"] > 10 and stats["depth"] >= 1
    assert e.match({"x": 10.25}) == {i for i in range(n) if i % 2 and i % 50 == 10}
    assert e.match({"y": 11.0}) == {i for i in range(n) if i % 2 == 0 and 9 <= i % 50 <= 11}
    for i in range(0, n, 3):
        e.remove(i)
        e._check()
    for i in range(n):
        if i % 3:
            e.remove(i)
    e._check()
    assert e.stats == {"cnodes": 1, "pnodes": 0, "buckets": 0, "root_exprs": 0, "depth": 0}
    assert e.match({"x": 10.25, "y": 11.0}) == set()


def test_equal_intervals_are_atomic_and_partitioned_on_another_attribute() -> None:
    e = TinyBETree()
    for i in range(20):
        e.add(i, f"x = 5 AND y = {i}")
    e._check()
    assert e.match({"x": 5, "y": 7}) == {7}
    assert e.match({"x": 5.0, "y": 7.0}) == {7}
    assert e.match({"x": 6, "y": 7}) == set()
    assert e.stats["pnodes"] >= 2  # x could not be cut, y was


def test_strings_booleans_and_residuals() -> None:
    e = TinyBETree()
    e.add("p", "s LIKE 'ab%' AND n <> 3")
    e.add("q", "s BETWEEN 'b' AND 'c' AND flag = TRUE")
    e.add("r", "s IN ('a', 'abc') AND flag <> FALSE")
    e.add("t", "s NOT LIKE '%z'")
    for i in range(10):
        e.add(i, f"s = 'k{i}'")
    e._check()
    assert e.match({"s": "abc", "n": 4, "flag": True}) == {"p", "r", "t"}
    assert e.match({"s": "abc", "n": 3, "flag": 1}) == {"t"}
    assert e.match({"s": "bz", "flag": True}) == {"q"}
    assert e.match({"s": "k3"}) == {3, "t"}
