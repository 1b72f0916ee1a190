"""SubscriptionIndex's storage (issue 42 item 3): buckets that grow from one record to a tuple to
a dict and back, per-client sequence numbers that are renumbered, and wildcard shapes at every
length, each checked against brute force (``topics.matches`` over every entry)."""

from __future__ import annotations

import itertools

from topics import SubscriptionIndex, matches


def brute(ix: SubscriptionIndex[int], topic: str) -> dict[str, list[tuple[str, int]]]:
    """What ``match`` must answer, from the entries alone (the newest matching negative entry
    hides every older subscription of its client)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for cid in {c for c, _ in ix._clients.items()}:
        got = []
        for e in reversed(ix.entries(cid)):
            if e.topic_filter.startswith("$share/") or not matches(e.topic_filter, topic):
                continue
            if not e.positive:
                break
            assert e.options is not None
            got.append((e.topic_filter, e.options))
        if got:
            out[cid] = got
    return out


def answer(ix: SubscriptionIndex[int], topic: str) -> dict[str, list[tuple[str, int]]]:
    return {c: [(s.topic_filter, s.options) for s in lst] for c, lst in ix.match(topic).clients.items()}


TOPICS = ["a/b", "a/c", "a", "a/b/c", "x/b", "$SYS/b", "$SYS/b/c", "a/b/c/d"]


def test_one_filter_from_one_subscriber_to_many_and_back() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    n = 20  # past the tuple's 8 records: a dict, then a tuple again, then one record
    for i in range(n):
        for f in ("a/b", "a/+", "a/#"):
            ix.subscribe(f"c{i}", f, i)
        ix._check()
        for t in TOPICS:
            assert answer(ix, t) == brute(ix, t), (i, t)
    assert len(answer(ix, "a/b")) == n and all(len(v) == 3 for v in answer(ix, "a/b").values())
    for i in range(0, n, 2):  # negative entries on the same filters, beside the subscriptions
        ix.unsubscribe(f"c{i}", "a/b")
        ix.unsubscribe(f"c{i}", "a/b/#")
        ix._check()
    for t in TOPICS:
        assert answer(ix, t) == brute(ix, t), t
    for i in range(n):
        ix.remove_client(f"c{i}")
        ix._check()
        for t in TOPICS:
            assert answer(ix, t) == brute(ix, t), (i, t)
    assert len(ix) == 0 and ix._empty()


def test_a_long_lived_client_keeps_small_sequence_numbers_and_its_order() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    ix.subscribe("c", "x/#", 0)
    for i in range(1, 1_000):
        ix.subscribe("c", "x/y", i)  # replaced: the newest entry each time
        ix.unsubscribe("c", "x/z")  # a negative entry ...
        ix.subscribe("c", "x/+", i)  # ... that this one removes (it includes it)
        if i % 97 == 0:
            ix._check()
            assert answer(ix, "x/y") == {"c": [("x/+", i), ("x/y", i), ("x/#", 0)]}
            assert answer(ix, "x/z") == {"c": [("x/+", i), ("x/#", 0)]}
    ix.unsubscribe("c", "x/q/#")  # newest: hides every older subscription at and below x/q
    ix._check()
    assert answer(ix, "x/q/r") == brute(ix, "x/q/r") == {}
    assert answer(ix, "x/q") == brute(ix, "x/q") == {}
    assert answer(ix, "x/y") == brute(ix, "x/y") == {"c": [("x/+", 999), ("x/y", 999), ("x/#", 0)]}
    seqs = [r.seq for r in ix._clients["c"].values()]  # type: ignore[union-attr]
    assert seqs == sorted(seqs) and max(seqs) < 256, seqs  # cached small ints, in order


def test_every_wildcard_shape_up_to_four_levels() -> None:
    levels = ["a", "b", "$s", "+"]
    filters: list[str] = []
    for n in range(1, 4):
        for combo in itertools.product(levels, repeat=n):
            if combo[0] == "$s" or "$s" not in combo:  # '$' only as a first level
                filters.append("/".join(combo))
                filters.append("/".join((*combo, "#")))
    filters.append("#")
    topics_ = ["/".join(c) for n in range(1, 5) for c in itertools.product(["a", "b", "z"], repeat=n)]
    topics_ += ["$s", "$s/a", "$s/a/b", "$s/z/z/z"]
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    for i, f in enumerate(filters):
        ix.subscribe(f"c{i % 7}", f, i)
    ix._check()
    for t in topics_:
        assert answer(ix, t) == brute(ix, t), t
    for i, f in enumerate(filters[::3]):  # some shapes go away again
        ix.unsubscribe(f"c{(3 * i) % 7}", f)
    ix._check()
    for t in topics_:
        assert answer(ix, t) == brute(ix, t), t


def test_topics_of_many_lengths_keep_the_shape_cache_bounded() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    ix.subscribe("c1", "a/#", 1)
    ix.subscribe("c2", "a/+/#", 2)
    ix.subscribe("c3", "+/b", 3)
    for n in range(1, 300):  # a publisher that sends topics of every length
        topic = "/".join(["a"] + ["b"] * (n - 1))
        assert answer(ix, topic) == brute(ix, topic), n
        assert len(ix._subs.shapes._by_len) <= 64
    ix._check()


def test_many_shapes_at_one_length_walk_the_tree() -> None:
    """A client with thousands of wildcard filters, '+' at different positions of 12 levels:
    more shapes than one lookup each would afford, so matching walks the filters' tree."""
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    for mask in range(1, 3_000):
        f = "/".join("+" if mask >> i & 1 else "a" for i in range(12))
        ix.subscribe("c", f, mask)
    ix.subscribe("d", "a/" * 11 + "a", 0)  # the exact one beside them
    every, _, many = ix._subs.shapes.for_length(12)[:3]
    assert len(every) > 8 and many
    every_a = "/".join(["a"] * 12)
    for t in [
        every_a,
        "/".join(["b"] * 12),
        "/".join(["a", "b"] * 6),
        "$a/" + "/".join(["a"] * 11),
    ]:
        got = answer(ix, t)
        assert got == brute(ix, t), t
        if t == every_a:
            assert len(got["c"]) == 2_999 and got["d"] == [("a/" * 11 + "a", 0)]
    ix._check()
    for mask in range(1, 3_000, 2):
        ix.unsubscribe("c", "/".join("+" if mask >> i & 1 else "a" for i in range(12)))
    ix._check()
    t = "/".join(["a", "b"] * 6)
    assert answer(ix, t) == brute(ix, t)
