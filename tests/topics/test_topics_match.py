"""matches / includes / overlaps against brute force.

Exhaustive: every filter of up to 3 levels over the literals {"a", "$b"} and '+', '#' (84
extended filters, '#' anywhere), every pair, against match sets computed by a naive recursive
matcher over every topic of up to 5 levels over {"a", "$b"} plus the fresh levels "q", "$q"
(which stand for every level no filter mentions).  5 levels suffice for 3-level filters: the
same comparison at 6 and 7 levels found no difference when the bound was chosen.
Hypothesis: longer filters and topics over a larger alphabet, matches vs the reference, and
includes/overlaps checked for consistency with matches on sampled topics (sound directions).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.topics.reference import Universe, all_filters, all_topics, ref_match
from topics import includes, matches, overlaps

U5 = Universe(5)
EXT = all_filters(3, extended=True)


def test_matches_exhaustive() -> None:
    for f in EXT:
        for t in U5.topics:
            assert matches(f, t) == ref_match(f, t), (f, t)


def test_includes_and_overlaps_exhaustive() -> None:
    for x in EXT:
        for y in EXT:
            assert includes(x, y) == U5.includes(x, y), (x, y)
            assert overlaps(x, y) == U5.overlaps(x, y), (x, y)
            assert overlaps(x, y) == overlaps(y, x)


def test_includes_and_overlaps_exhaustive_4_levels() -> None:
    """Every extended filter of up to 4 levels over the literal "a" (120 filters), every pair,
    against match sets over every topic of up to 6 levels over "a", "q", "$q" (5 levels are too
    few for some pairs; 6, 7 and 8 levels gave identical answers when the bound was chosen)."""
    fs = all_filters(4, extended=True, literals=("a",))
    ts = all_topics(6, levels=("a", "q", "$q"))
    m = {f: frozenset(i for i, t in enumerate(ts) if ref_match(f, t)) for f in fs}
    for x in fs:
        for y in fs:
            assert includes(x, y) == (m[y] <= m[x]), (x, y)
            assert overlaps(x, y) == bool(m[x] & m[y]), (x, y)


def test_plain_topics_as_y() -> None:
    for x in EXT:
        for t in U5.topics[::7]:
            assert includes(x, t) == matches(x, t), (x, t)
            assert overlaps(x, t) == matches(x, t), (x, t)


# Patent Fig. 2: topicIncludes(x, y) with x = "a/#"
@pytest.mark.parametrize(
    ("y", "expected"), [("a/+", True), ("a/#", True), ("b", False), ("#/a", False), ("#", False)]
)
def test_patent_fig2(y: str, expected: bool) -> None:
    assert includes("a/#", y) is expected


# Patent Fig. 3: topicOverlaps(x, y) with x = "a/+"
@pytest.mark.parametrize(("y", "expected"), [("+/a", True), ("a/b", True), ("a/#", True), ("b/#", False)])
def test_patent_fig3(y: str, expected: bool) -> None:
    assert overlaps("a/+", y) is expected


@pytest.mark.parametrize(
    ("x", "y", "inc", "ovl"),
    [
        ("#/a/#", "a/#/a", True, True),  # a middle '#' defeats a level-by-level walk
        ("#", "+/#", True, True),
        ("+/#", "#", True, True),  # topics have at least one level
        ("#", "$SYS/a", False, False),
        ("+/#", "$SYS/#", False, False),
        ("$SYS/#", "$SYS", True, True),
        ("#/b", "a/#", False, True),
        ("a/+/+", "a/#", False, True),
        ("#/x/+/+", "#/x/#", False, True),
    ],
)
def test_known_pairs(x: str, y: str, inc: bool, ovl: bool) -> None:
    assert includes(x, y) is inc
    assert overlaps(x, y) is ovl


def test_patent_hash_prefix_example() -> None:
    assert matches("#/a", "a")
    assert matches("#/a", "x/a")
    assert matches("#/a", "x/y/a")
    assert not matches("#/a", "a/x")
    assert matches("employees/#", "employees")


LEVEL = st.sampled_from(["a", "b", "$c", "", "q", "$q"])
PLEVEL = st.sampled_from(["a", "b", "$c", "", "+", "#"])
topic_st = st.lists(LEVEL, min_size=1, max_size=7).map("/".join)
filter_st = st.lists(PLEVEL, min_size=1, max_size=6).map("/".join)


@given(filter_st, topic_st)
def test_matches_property(f: str, t: str) -> None:
    assert matches(f, t) == ref_match(f, t)


@given(filter_st, filter_st, st.lists(topic_st, max_size=30))
def test_includes_overlaps_sound_on_samples(x: str, y: str, ts: list[str]) -> None:
    inc = includes(x, y)
    ovl = overlaps(x, y)
    assert ovl == overlaps(y, x)
    assert includes(x, x) and overlaps(x, x)
    for t in ts:
        mx, my = ref_match(x, t), ref_match(y, t)
        if inc and my:
            assert mx, (x, y, t)
        if mx and my:
            assert ovl, (x, y, t)
