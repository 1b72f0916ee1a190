"""``SubscriptionIndex.replay``: edge cases of its fast path (a client without entries) that
the model test (test_topics_index_model.py, short lists) reaches rarely."""

from __future__ import annotations

import pytest

from topics import Entry, InvalidTopic, SubscriptionIndex


def one_by_one(entries: list[Entry[int]], cid: str = "c") -> SubscriptionIndex[int]:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    for e in entries:
        if e.positive:
            assert e.options is not None
            ix.subscribe(cid, e.topic_filter, e.options)
        else:
            ix.unsubscribe(cid, e.topic_filter)
    return ix


def test_a_long_list_with_repeats_keeps_small_ordered_sequence_numbers() -> None:
    """300 entries over 40 filters (each repeated, so replaced and moved to the newest
    place): the same entries, order and matches as one subscribe each; the sequence
    numbers were renumbered below CPython's cached ints."""
    entries = [Entry(f"a/{i % 40}", True, i) for i in range(300)]
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    assert ix.replay("c", entries) == 300
    ix._check()
    ref = one_by_one(entries)
    assert ix.entries("c") == ref.entries("c")
    assert len(ix) == 40
    for topic in ("a/0", "a/39", "a/7"):
        assert ix.match(topic).clients == ref.match(topic).clients
    stored = ix._clients["c"]
    assert isinstance(stored, dict)
    assert [r.seq for r in stored.values()] == list(range(40))  # renumbered: cached ints


def test_an_invalid_filter_keeps_the_entries_before_it() -> None:
    entries = [Entry("a/b", True, 1), Entry("a/+", True, 2), Entry("a/#/b", True, 3), Entry("c", True, 4)]
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    with pytest.raises(InvalidTopic):
        ix.replay("c", entries)
    ix._check()
    assert [(e.topic_filter, e.options) for e in ix.entries("c")] == [("a/b", 1), ("a/+", 2)]
    assert len(ix) == 2
    assert sorted(s.topic_filter for s in ix.match("a/b").clients["c"]) == ["a/+", "a/b"]


def test_negative_and_shared_entries_and_an_existing_client() -> None:
    """The fast path hands over at the first negative or shared entry; a client with
    entries already takes one call per entry.  Both as one call each."""
    entries = [
        Entry("s/#", True, 1),
        Entry("s/x", False, None),
        Entry("$share/g/s/+", True, 2),
        Entry("t", True, 3),
        Entry("s/x/#", True, 4),
    ]
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    ix.subscribe("other", "s/x", 9)
    assert ix.replay("c", entries) == len(entries)
    assert ix.replay("other", entries) == len(entries)
    ix._check()
    ref = one_by_one([Entry("s/x", True, 9)], "other")
    for e in entries:
        for cid in ("c", "other"):
            if e.positive:
                assert e.options is not None
                ref.subscribe(cid, e.topic_filter, e.options)
            else:
                ref.unsubscribe(cid, e.topic_filter)
    for cid in ("c", "other"):
        assert ix.entries(cid) == ref.entries(cid)
    for topic in ("s/x", "s/y", "t", "s/x/z"):
        got, want = ix.match(topic), ref.match(topic)
        assert got.clients == want.clients and got.shared == want.shared, topic
