"""TopicSet: the patent's Fig. 5, 6 and 7 verbatim, and set-algebra semantics (property)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.topics.reference import Universe, all_filters, ref_match
from topics import InvalidTopic, TopicSet


def run(ops: list[tuple[str, str]]) -> list[list[tuple[str, bool]]]:
    ts = TopicSet()
    out = []
    for op, f in ops:
        if op == "+":
            ts.subscribe(f)
        else:
            ts.unsubscribe(f)
        ts._check()
        out.append(ts.entries)
    return out


def test_fig5() -> None:
    assert run([("+", "a/#"), ("+", "#/a"), ("+", "a/b"), ("+", "#")]) == [
        [("a/#", True)],
        [("a/#", True), ("#/a", True)],
        [("a/#", True), ("#/a", True)],  # (iii) a/b is inside a/#: discarded
        [("#", True)],  # (iv) '#' includes everything listed
    ]


def test_fig6() -> None:
    assert run([("+", "a/+"), ("-", "a/b"), ("-", "c"), ("-", "a/#")]) == [
        [("a/+", True)],
        [("a/+", True), ("a/b", False)],
        [("a/+", True), ("a/b", False)],  # (iii) c overlaps nothing: discarded
        [],  # (iv) a/# includes both entries
    ]


def test_fig7() -> None:
    ts = TopicSet()
    steps = run([("+", "a/#"), ("-", "a/b/#"), ("+", "a/c"), ("+", "a/+/c")])
    assert steps == [
        [("a/#", True)],
        [("a/#", True), ("a/b/#", False)],
        [("a/#", True), ("a/b/#", False)],  # (iii) a/c inside a/#, no overlap with -a/b/#
        [("a/#", True), ("a/b/#", False), ("a/+/c", True)],  # (iv) overlaps -a/b/#: kept
    ]
    for op, f in [("+", "a/#"), ("-", "a/b/#"), ("+", "a/c"), ("+", "a/+/c")]:
        (ts.subscribe if op == "+" else ts.unsubscribe)(f)
    # Fig. 8: newest first; +a/+/c overrides -a/b/#, which overrides +a/#
    assert ts.matches("a/b/c")
    assert not ts.matches("a/b/d")
    assert ts.matches("a/x/y")
    assert ts.matches("a")
    assert not ts.matches("b")


def test_leading_negatives_are_dropped() -> None:
    ts = TopicSet()
    ts.subscribe("a/+")
    ts.unsubscribe("a/b")
    ts.unsubscribe("a/+")  # removes +a/+ (included), -a/b (included)
    assert ts.entries == []
    ts.subscribe("a/b")
    ts.subscribe("x")
    ts.unsubscribe("a/b")
    assert ts.entries == [("x", True)]


def test_invalid_filter_raises() -> None:
    ts = TopicSet()
    with pytest.raises(InvalidTopic):
        ts.subscribe("a/b+")
    ts.subscribe("#/a")  # extended syntax
    assert ts.matches("x/y/a")
    assert repr(ts) == "TopicSet([+#/a])"


U = Universe(4)
FILTERS = all_filters(3, extended=True)
ops_st = st.lists(st.tuples(st.booleans(), st.sampled_from(FILTERS)), max_size=12)


@given(ops_st)
def test_set_algebra(ops: list[tuple[bool, str]]) -> None:
    """matches(t) is true iff the last operation whose filter matches t was a subscribe."""
    ts = TopicSet()
    for positive, f in ops:
        if positive:
            ts.subscribe(f)
        else:
            ts.unsubscribe(f)
        ts._check()
    for t in U.topics:
        want = False
        for positive, f in reversed(ops):
            if ref_match(f, t):
                want = positive
                break
        assert ts.matches(t) == want, (ops, t, ts.entries)
    assert len(ts) == len(ts.entries)
