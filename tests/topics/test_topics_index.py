"""SubscriptionIndex and RetainedTree: the docs/reference.md rules on worked examples."""

from __future__ import annotations

import pytest

from topics import (
    Entry,
    InvalidTopic,
    RetainedTree,
    SubscribeOutcome,
    Subscription,
    SubscriptionIndex,
    UnsubscribeOutcome,
)

REMOVED = UnsubscribeOutcome.REMOVED
PARTIAL = UnsubscribeOutcome.PARTIAL
NONE = UnsubscribeOutcome.NO_SUBSCRIPTION


def subs(ix: SubscriptionIndex[str], topic: str) -> dict[str, list[tuple[str, str]]]:
    return {c: [(s.topic_filter, s.options) for s in lst] for c, lst in ix.match(topic).clients.items()}


def test_partial_unsubscribe_walk_newest_first() -> None:
    ix: SubscriptionIndex[str] = SubscriptionIndex()
    assert ix.subscribe("c", "a/#", "q1") == SubscribeOutcome(False, 0)
    assert ix.unsubscribe("c", "a/b/#") is PARTIAL
    assert ix.subscribe("c", "a/+/c", "q2") == SubscribeOutcome(False, 0)
    ix._check()
    assert subs(ix, "a/x") == {"c": [("a/#", "q1")]}
    assert subs(ix, "a/b/d") == {}
    assert subs(ix, "a/b/c") == {"c": [("a/+/c", "q2")]}  # the newer subscription, not a/#
    assert subs(ix, "a/x/c") == {"c": [("a/+/c", "q2"), ("a/#", "q1")]}  # newest first
    assert [(e.topic_filter, e.positive) for e in ix.entries("c")] == [
        ("a/#", True),
        ("a/b/#", False),
        ("a/+/c", True),
    ]
    # subscribing a filter that includes the negative entry removes it
    assert ix.subscribe("c", "a/b/#", "q3") == SubscribeOutcome(False, 1)
    assert subs(ix, "a/b/d") == {"c": [("a/b/#", "q3"), ("a/#", "q1")]}
    ix._check()


def test_identical_subscribe_replaces_and_moves_to_newest() -> None:
    ix: SubscriptionIndex[str] = SubscriptionIndex()
    ix.subscribe("c", "a/+", "old")
    ix.subscribe("c", "a/b", "x")
    assert ix.subscribe("c", "a/+", "new") == SubscribeOutcome(True, 0)
    assert ix.entries("c") == [Entry("a/b", True, "x"), Entry("a/+", True, "new")]
    assert subs(ix, "a/b") == {"c": [("a/+", "new"), ("a/b", "x")]}
    assert len(ix) == 2 and ix.client_count == 1 and ix.entry_count("c") == 2


def test_unsubscribe_outcomes_and_leading_negatives() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    assert ix.unsubscribe("nobody", "a") is NONE
    ix.subscribe("c", "a/+", 1)
    assert ix.unsubscribe("c", "b/#") is NONE  # overlaps nothing: 0x11
    assert ix.unsubscribe("c", "+/b") is PARTIAL
    assert ix.unsubscribe("c", "a/+") is REMOVED
    # the negative entry +/b has no older subscription left: dropped
    assert ix.entries("c") == [] and len(ix) == 0 and ix.client_count == 0
    ix._check()


def test_unsubscribe_removes_included_negatives() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    ix.subscribe("c", "#", 1)
    assert ix.unsubscribe("c", "a/b") is PARTIAL
    assert ix.unsubscribe("c", "a/c") is PARTIAL
    assert ix.unsubscribe("c", "a/+") is PARTIAL  # replaces both negatives
    assert [e.topic_filter for e in ix.entries("c")] == ["#", "a/+"]
    ix._check()


def test_pure_mqtt_mode() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex(partial_unsubscribe=False)
    ix.subscribe("c", "a/#", 1)
    assert ix.unsubscribe("c", "a/b") is NONE
    assert subs(ix, "a/b") == {"c": [("a/#", 1)]}  # type: ignore[dict-item]
    assert ix.unsubscribe("c", "a/#") is REMOVED
    ix._check()


def test_dollar_topics() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    ix.subscribe("c", "#", 1)
    ix.subscribe("c", "+/x", 2)
    ix.subscribe("d", "$SYS/#", 3)
    ix.subscribe("e", "$share/g/#", 4)
    res = ix.match("$SYS/x")
    assert list(res.clients) == ["d"] and res.shared == {}
    assert set(ix.match("a/x").clients) == {"c"}
    assert subs(ix, "$SYS") == {"d": [("$SYS/#", 3)]}  # type: ignore[dict-item]


def test_shared_subscriptions() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    ix.subscribe("c1", "$share/g/a/+", 1)
    ix.subscribe("c2", "$share/g/a/+", 2)
    ix.subscribe("c3", "$share/h/a/#", 3)
    ix.subscribe("c1", "a/#", 4)
    # a negative entry does not apply to shared subscriptions
    assert ix.unsubscribe("c1", "a/b") is PARTIAL
    res = ix.match("a/b")
    assert res.clients == {}
    assert {k: sorted(v) for k, v in res.shared.items()} == {
        ("g", "a/+"): [("c1", 1), ("c2", 2)],
        ("h", "a/#"): [("c3", 3)],
    }
    # a plain unsubscribe never becomes partial because of a shared subscription
    assert ix.unsubscribe("c2", "a/+") is NONE
    assert ix.unsubscribe("c2", "$share/g/a/#") is NONE
    assert ix.unsubscribe("c2", "$share/g/a/+") is REMOVED
    assert ix.subscribe("c1", "$share/g/a/+", 5) == SubscribeOutcome(True, 0)
    assert ix.match("a/c").shared == {("g", "a/+"): [("c1", 5)], ("h", "a/#"): [("c3", 3)]}
    assert ix.entries("c1")[-1] == Entry("$share/g/a/+", True, 5)
    assert ix.remove_client("c1") == 3
    ix._check()


@pytest.mark.parametrize("bad", ["a/#/b", "a+", "$share/g", "$share//a", "$share/g+/a", "$share/g/a/#/b", ""])
def test_invalid_filters(bad: str) -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    with pytest.raises(InvalidTopic):
        ix.subscribe("c", bad, 1)
    with pytest.raises(InvalidTopic):
        ix.unsubscribe("c", bad)
    assert len(ix) == 0


def test_remove_client_prunes_the_tree() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    for i in range(50):
        ix.subscribe(f"c{i % 5}", f"t/{i}/+/m", i)
        ix.subscribe(f"c{i % 5}", f"t/{i}/#", i)
    ix.unsubscribe("c0", "t/0/x/m")
    assert sum(ix.remove_client(f"c{i}") for i in range(5)) == 101
    assert len(ix) == 0
    assert ix._empty()
    ix._check()


def test_subscription_equality() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    ix.subscribe("c", "a", 1)
    (got,) = ix.match("a").clients["c"]
    assert got == Subscription("a", 1)
    assert hash(got) == hash(Subscription("a", 1))
    assert repr(got) == "Subscription(topic_filter='a', options=1)"


def test_retained_tree() -> None:
    rt: RetainedTree[str] = RetainedTree()
    for t in ["a", "a/b", "a/b/c", "a/x/c", "$SYS/up", "/a", "b"]:
        rt.set(t, t.upper())
    rt.set("a/b", "AB2")
    assert len(rt) == 7 and rt.get("a/b") == "AB2" and rt.get("zz") is None
    assert sorted(t for t, _ in rt.match("a/#")) == ["a", "a/b", "a/b/c", "a/x/c"]
    assert sorted(t for t, _ in rt.match("a/+/c")) == ["a/b/c", "a/x/c"]
    assert sorted(t for t, _ in rt.match("#")) == ["/a", "a", "a/b", "a/b/c", "a/x/c", "b"]
    assert sorted(t for t, _ in rt.match("+/a")) == ["/a"]
    assert [t for t, _ in rt.match("$SYS/#")] == ["$SYS/up"]
    for t, _ in rt.match("a/#"):
        rt.delete(t)  # deleting while iterating is allowed
    assert rt.delete("a/b") is False
    assert sorted(t for t, _ in rt.match("#")) == ["/a", "b"]
    rt._check()
    with pytest.raises(InvalidTopic):
        list(rt.match("#/a"))


def test_retained_tree_children_lists_one_level() -> None:
    rt: RetainedTree[str] = RetainedTree()
    for t in ("a/b/c", "a/b", "a/x", "/lead", "$SYS/up"):
        rt.set(t, t)
    assert rt.children(None) == [("", False, True), ("$SYS", False, True), ("a", False, True)]
    assert rt.children("a") == [("b", True, True), ("x", True, False)]
    assert rt.children("a/b") == [("c", True, False)]
    assert rt.children("") == [("lead", True, False)]
    assert rt.children("a/x") == [] and rt.children("nothing/here") == []
    rt.delete("a/b/c")
    assert rt.children("a") == [("b", True, False), ("x", True, False)]
    rt._check()
