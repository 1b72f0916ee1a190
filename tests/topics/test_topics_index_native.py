"""SubscriptionIndex with its C module (issue 42 item 3, topics/_gather.c): ``match``'s loop in
C gives what the Python loop gives, record for record and in the same order, on every path
(negative entries, shared subscriptions, '$' topics, topics it leaves to Python); the records
and the buckets it builds are off the cyclic collector's lists and are still freed.

Each test compares the index against itself with the C module switched off (the module's
``_native_match`` / ``_gather`` / ``_new_sub`` / ``_append`` / ``_untrack`` hooks), or against brute
force; they are skipped in a pure-Python build (SIFTMQ_PURE=1), where there is no C to check."""

from __future__ import annotations

import gc
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import topics._index as index_module
from tests.topics.test_topics_index_buckets import brute
from topics import SubscriptionIndex

native = pytest.importorskip("topics._gather")


@contextmanager
def python_loop() -> Iterator[None]:
    """``match`` with its loop in Python (as in a pure build), for the duration."""
    saved = index_module._native_match, index_module._gather
    index_module._native_match = index_module._gather = None
    try:
        yield
    finally:
        index_module._native_match, index_module._gather = saved


def snapshot(ix: SubscriptionIndex[int], topic: str) -> tuple[dict[str, list[int]], dict[object, object]]:
    """``match(topic)``: per client the ids of its records in order (the same objects, the same
    order), and the shared members."""
    res = ix.match(topic)
    assert all(res.clients.values()), "a client without subscriptions in the result"
    return {c: [id(s) for s in lst] for c, lst in res.clients.items()}, dict(res.shared)


LEVELS = ["a", "b", "c", "é", "$SYS", ""]


def random_filter(rnd: random.Random) -> str:
    n = rnd.randint(1, 5)
    lv = [rnd.choice([*LEVELS, "+", "+"]) for _ in range(n)]
    if rnd.random() < 0.3:
        lv.append("#")
    return "/".join(lv) or "a"  # an empty filter is invalid


def random_topic(rnd: random.Random) -> str:
    return "/".join(rnd.choice(LEVELS) for _ in range(rnd.randint(1, 6))) or "a"


@pytest.mark.parametrize("seed", range(6))
def test_the_c_loop_answers_as_the_python_loop(seed: int) -> None:
    """Random subscriptions, partial unsubscribes, shared subscriptions and removals over a few
    levels (wildcards, '$' levels, empty levels, a non-ASCII level): every topic gets the same
    records in the same order from both loops, and what brute force says."""
    rnd = random.Random(seed)
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    for step in range(1_500):
        cid = f"c{rnd.randrange(40)}"
        r = rnd.random()
        f = random_filter(rnd)
        if r < 0.6:
            ix.subscribe(cid, f, step)
        elif r < 0.7:
            ix.subscribe(cid, f"$share/g{rnd.randrange(3)}/{f}", step)
        elif r < 0.9:
            ix.unsubscribe(cid, f)
        elif r < 0.92:
            ix.remove_client(cid)
        if step % 100 == 0:
            ix._check()
    ix._check()
    for _ in range(400):
        topic = random_topic(rnd)
        native_result = snapshot(ix, topic)
        with python_loop():
            assert snapshot(ix, topic) == native_result, topic
        got = {c: [(s.topic_filter, s.options) for s in lst] for c, lst in ix.match(topic).clients.items()}
        assert got == brute(ix, topic), topic
        native.set_dict_prefetch(False)  # the lookups not prefetched: only slower
        try:
            assert snapshot(ix, topic) == native_result, topic
        finally:
            native.set_dict_prefetch(True)


class Name(str):
    """A topic given as a subclass of str (the C loop takes exact ``str`` only)."""


def test_topics_left_to_python_and_many_shapes() -> None:
    """A topic deeper than the C loop's 64 levels, one given as a subclass of str, and a length
    with more wildcard shapes than one lookup each (the filters' tree): the same answers as
    brute force."""
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    deep = "/".join(["x"] * 70)
    ix.subscribe("d", deep, 1)
    ix.subscribe("h", "x/#", 2)
    ix.subscribe("p", "/".join(["x"] * 69 + ["+"]), 3)
    for mask in range(1, 40):
        ix.subscribe("m", "/".join("+" if mask >> i & 1 else "a" for i in range(6)), mask)
    ix._check()
    for topic in (deep, "x", "a/a/a/a/a/a", "a/b/a/a/a/a", "x/" * 63 + "x", Name("x/x"), Name(deep)):
        got = {c: [(s.topic_filter, s.options) for s in lst] for c, lst in ix.match(topic).clients.items()}
        assert got == brute(ix, topic), topic
        native_result = snapshot(ix, topic)
        with python_loop():
            assert snapshot(ix, topic) == native_result, topic


def test_subscriptions_are_off_the_collectors_lists() -> None:
    """Subscribing one at a time leaves the records, the buckets' tuples and the clients'
    dicts untracked by the cyclic collector (its full passes over a million subscriptions were
    half of the build's time, docs/performance-topics.md): the objects the collector tracks
    grow by far less than one per subscription."""
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    gc.collect()
    before = len(gc.get_objects())
    for c in range(2_000):
        for k in range(10):
            ix.subscribe(f"client-{c}", f"t/{(c * 7 + k) % 300}/{k % 4}", k)
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert grown < 200, f"{grown} more objects tracked by the collector for 20,000 subscriptions"
    res = ix.match("t/7/0")
    assert res.clients
    for lst in res.clients.values():
        assert not any(gc.is_tracked(s) for s in lst)
    ix._check()


def test_untracked_records_are_freed() -> None:
    """Records off the collector's lists still go with their last reference: the options
    object's reference count comes back to where it was once the subscriptions are gone, and
    a full collection while they live frees nothing the index holds."""
    options = object()
    base = sys.getrefcount(options)
    ix: SubscriptionIndex[object] = SubscriptionIndex()
    for c in range(50):
        ix.subscribe(f"c{c}", "a/b", options)  # one bucket: a tuple, then a dict
        ix.subscribe(f"c{c}", f"a/{c}", options)
    assert sys.getrefcount(options) == base + 100
    gc.collect()
    assert len(ix.match("a/b").clients) == 50
    ix._check()
    for c in range(0, 50, 2):
        ix.remove_client(f"c{c}")
    for c in range(1, 50, 2):
        ix.unsubscribe(f"c{c}", "a/b")
        ix.unsubscribe(f"c{c}", f"a/{c}")
    assert len(ix) == 0
    gc.collect()
    assert sys.getrefcount(options) == base


def test_check_finds_a_record_the_collector_tracks() -> None:
    """``_check``'s invariant: every plain record was made by ``_new_sub`` (with the C module:
    untracked); one made by the class itself (tracked) is reported."""
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    ix.subscribe("c", "a/b", 1)
    ix._check()
    rogue = index_module._Sub("a/b", 1, "c", 0)
    assert gc.is_tracked(rogue)
    ix._subs.buckets["a/b"] = rogue
    ix._clients["c"] = rogue
    with pytest.raises(AssertionError, match="tracked record"):
        ix._check()
