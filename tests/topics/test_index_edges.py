"""Edge cases of ``topics.SubscriptionIndex`` (topics/_index.py) against the brute-force
definition of matching (tests/topics/reference.py, ``ref_match``).

The model tests (test_topics_index_model.py) draw filters of up to 3 levels over a small
alphabet.  These add what they reach rarely or never: empty levels ("a//b", "/", a topic of
empty levels only), '$' topics against wildcard-first filters on both lookup paths (one key
per shape, and the tree walked when more than 8 shapes fit a topic's length), '+' as the last
level, deep topics (up to 40 levels: the tree, and more topic lengths than the per-length
cache keeps), shared subscriptions' filter stripping and malformed ``$share`` filters,
unsubscribing what was never subscribed, and a client's sequence numbers renumbered past 256
entries.  After every change the index's own invariants (``_check``) hold.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.budget import examples
from tests.topics.reference import ref_match
from topics import InvalidTopic, SubscriptionIndex, UnsubscribeOutcome, includes, overlaps

#: topic levels: literals, an empty level, a '$' level (the '$' rule applies when it is first)
LEVELS = ("a", "b", "", "$s")


def _matched(ix: SubscriptionIndex[int], topic: str) -> set[tuple[str, str]]:
    return {(cid, s.topic_filter) for cid, subs in ix.match(topic).clients.items() for s in subs}


def _brute(subs: set[tuple[str, str]], topic: str) -> set[tuple[str, str]]:
    return {(cid, f) for cid, f in subs if ref_match(f, topic)}


def _filter(levels: list[str], pluses: list[bool], tail: bool) -> str:
    parts = ["+" if p else lv for lv, p in zip(levels, pluses, strict=True)]
    return "/".join([*parts, "#"]) if tail else "/".join(parts) or "#"


@st.composite
def filters(draw: st.DrawFn, max_levels: int) -> str:
    n = draw(st.integers(0, max_levels))
    levels = draw(st.lists(st.sampled_from(LEVELS), min_size=n, max_size=n))
    pluses = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return _filter(levels, pluses, draw(st.booleans()) or n == 0)


def topics_of(max_levels: int) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(LEVELS), min_size=1, max_size=max_levels).map("/".join)


@settings(max_examples=examples(150))
@given(
    subs=st.lists(st.tuples(st.sampled_from(["c0", "c1", "c2"]), filters(12)), max_size=60),
    probes=st.lists(topics_of(12), min_size=1, max_size=20),
)
def test_match_equals_brute_force_on_deep_and_empty_levels(
    subs: list[tuple[str, str]], probes: list[str]
) -> None:
    """Many shapes per length (up to 12 levels, '+' anywhere): both lookup paths."""
    ix: SubscriptionIndex[int] = SubscriptionIndex(partial_unsubscribe=False)
    for cid, f in subs:
        ix.subscribe(cid, f, 0)
    ix._check()
    held = set(subs)
    for topic in probes:
        assert _matched(ix, topic) == _brute(held, topic), topic
    for cid, f in subs[::2]:  # and after half of them go
        ix.unsubscribe(cid, f)
        held.discard((cid, f))
    ix._check()
    for topic in probes:
        assert _matched(ix, topic) == _brute(held, topic), topic


def _many_shapes(n: int) -> list[str]:
    """``n``-level filters, each with '+' at other positions (more than 8 shapes for a topic of
    ``n`` levels: matched by walking the tree), '+' first and '#' among them."""
    out = []
    for i in range(n):
        out.append("/".join("+" if j in (i, (i + 3) % n) else "a" for j in range(n)))
        out.append("/".join(["a"] * i + ["#"]))
    out += ["#", "+/#", "/".join(["+"] * n), "$s/" + "/".join(["+"] * (n - 1))]
    return out


@pytest.mark.parametrize("n", [3, 12, 40])
def test_dollar_topics_never_match_wildcard_first_filters_on_either_path(n: int) -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    fs = _many_shapes(n)
    for k, f in enumerate(fs):
        ix.subscribe(f"c{k}", f, 0)
    ix._check()
    held = {(f"c{k}", f) for k, f in enumerate(fs)}
    for topic in ("$s/" + "/".join(["a"] * (n - 1)), "/".join(["a"] * n), "$s", "a", "$s/" * (n - 1) + "$s"):
        got = _matched(ix, topic)
        assert got == _brute(held, topic), topic
        if topic.startswith("$"):
            assert not any(f.startswith(("+", "#")) for _, f in got), topic


def test_plus_last_matches_an_empty_last_level_and_nothing_shorter_or_longer() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    for f in ("a/+", "+", "+/+", "/+", "a/+/#", "+/#"):
        ix.subscribe(f, f, 0)
    want = {
        "a": {"+", "+/#"},
        "a/": {"a/+", "+/+", "a/+/#", "+/#"},
        "a/b": {"a/+", "+/+", "a/+/#", "+/#"},
        "a/b/c": {"a/+/#", "+/#"},
        "/": {"+/+", "/+", "+/#"},
        "": {"+", "+/#"},
        "//": {"+/#"},
    }
    for topic, filters_ in want.items():
        assert {f for _, f in _matched(ix, topic)} == filters_, topic
        assert filters_ == {f for f in ("a/+", "+", "+/+", "/+", "a/+/#", "+/#") if ref_match(f, topic)}


def test_topics_of_more_lengths_than_the_shape_cache_holds() -> None:
    """'#'-ended filters of every length from 1 to 80 and topics of 1 to 100 levels, in an
    order that refills the per-length cache (64 lengths) several times."""
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    fs = ["/".join(["a"] * k + ["#"]) for k in range(0, 80, 3)] + [
        "/".join(["+"] * k) for k in range(1, 80, 7)
    ]
    for f in fs:
        ix.subscribe("c", f, 0)
    for rnd in range(3):
        for n in range(1, 101):
            topic = "/".join(["a"] * n)
            assert {f for _, f in _matched(ix, topic)} == {f for f in fs if ref_match(f, topic)}, (rnd, n)
    ix._check()


def test_shared_filters_match_by_their_inner_filter() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    for k, f in enumerate(("$share/g/a/+", "$share/g/#", "$share/h/#", "$share/g/$s/#", "$share/g/+/")):
        ix.subscribe(f"m{k}", f, k)
    ix._check()
    for topic in ("a/b", "a/", "$s/x", "$s", "x/", "a"):
        got = ix.match(topic).shared
        want = {("g", "a/+"), ("g", "#"), ("h", "#"), ("g", "$s/#"), ("g", "+/")}
        assert set(got) == {k for k in want if ref_match(k[1], topic)}, topic
        assert not ix.match(topic).clients  # a shared subscription is never a plain one
    # one group, several members, each once; another group on the same filter apart
    ix.subscribe("m9", "$share/g/#", 9)
    assert sorted(ix.match("x").shared[("g", "#")]) == [("m1", 1), ("m9", 9)]
    assert ix.match("x").shared[("h", "#")] == [("m2", 2)]


@pytest.mark.parametrize(
    "bad", ["$share/g", "$share/", "$share//a", "$share/g+/a", "$share/g#/a", "$share/g/a/#/b", "$share/g/a+"]
)
def test_malformed_shared_filters_are_refused_and_change_nothing(bad: str) -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    ix.subscribe("c", "a/b", 0)
    with pytest.raises(InvalidTopic):
        ix.subscribe("c", bad, 1)
    with pytest.raises(InvalidTopic):
        ix.unsubscribe("c", bad)
    ix._check()
    assert len(ix) == 1 and [e.topic_filter for e in ix.entries("c")] == ["a/b"]


def test_empty_filters_are_refused_plain_and_shared() -> None:
    """``$share/g/`` holds an empty filter: refused like the empty filter (MQTT 4.7.3: a
    filter is at least one character); ``$share/g//`` holds "/", a valid filter."""
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    for bad in ("", "$share/g/"):
        with pytest.raises(InvalidTopic):
            ix.subscribe("c", bad, 0)
    ix.subscribe("c", "$share/g//", 0)
    assert ix.match("/").shared == {("g", "/"): [("c", 0)]}
    assert not ix.match("a").shared
    ix._check()


@pytest.mark.parametrize("partial", [True, False])
def test_unsubscribing_what_was_never_subscribed(partial: bool) -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex(partial_unsubscribe=partial)
    nothing = UnsubscribeOutcome.NO_SUBSCRIPTION
    assert ix.unsubscribe("ghost", "a/b") is nothing
    assert ix.unsubscribe("ghost", "$share/g/a") is nothing
    assert ix.client_count == 0 and len(ix) == 0
    ix.subscribe("c", "x/y", 0)
    ix.subscribe("d", "$share/g/a/#", 0)
    assert ix.unsubscribe("c", "a/b") is nothing  # no overlap: never a negative entry
    assert ix.unsubscribe("c", "$share/g/a/#") is nothing  # another client's membership
    assert ix.unsubscribe("c", "$share/g/x/y") is nothing  # the plain filter is not shared
    assert ix.unsubscribe("d", "a/b") is nothing  # a shared subscription never makes it partial
    assert ix.unsubscribe("d", "$share/h/a/#") is nothing  # another group
    ix._check()
    assert [e.topic_filter for e in ix.entries("c")] == ["x/y"]
    assert [e.topic_filter for e in ix.entries("d")] == ["$share/g/a/#"]
    assert ix.client_count == 2 and len(ix) == 2
    assert _matched(ix, "x/y") == {("c", "x/y")}
    assert ix.match("a/b").shared == {("g", "a/#"): [("d", 0)]}


def test_unsubscribe_shared_after_remove_client_and_resubscribe() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    ix.subscribe("c", "$share/g/a/#", 0)
    ix.subscribe("c", "a/#", 1)
    assert ix.remove_client("c") == 2
    ix._check()
    assert not ix.match("a/b").shared and not ix.match("a/b").clients
    assert ix.unsubscribe("c", "$share/g/a/#") is UnsubscribeOutcome.NO_SUBSCRIPTION
    ix.subscribe("c", "$share/g/a/#", 2)
    assert ix.match("a/b").shared == {("g", "a/#"): [("c", 2)]}
    ix._check()


def test_negative_entries_on_deep_topics_with_many_shapes() -> None:
    """Partial unsubscribes of 12-level filters with '+' at many positions (more than 8
    negative shapes: their tree) hide exactly the older subscriptions they match."""
    n = 12
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    ix.subscribe("c", "#", 0)
    negs = ["/".join("+" if j == i else "a" for j in range(n)) for i in range(n)]
    for f in negs:
        assert ix.unsubscribe("c", f) is UnsubscribeOutcome.PARTIAL
    ix._check()
    for topic in (
        "/".join(["a"] * n),
        "/".join(["b"] + ["a"] * (n - 1)),
        "/".join(["b", "b"] + ["a"] * (n - 2)),
    ):
        hidden = any(ref_match(f, topic) for f in negs)
        assert (_matched(ix, topic) == set()) is hidden, topic
    ix.subscribe("c", "a/#", 1)  # newer than the negative entries: applies again under a/
    assert _matched(ix, "/".join(["a"] * n)) == {("c", "a/#")}
    ix._check()


def test_sequence_numbers_renumbered_past_256_keep_the_order() -> None:
    """One client, hundreds of re-subscriptions and partial unsubscribes (its sequence numbers
    pass 256 and are renumbered): the newest entry still decides."""
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    for i in range(600):
        ix.subscribe("c", f"t/{i % 5}/#", i)
        if i % 7 == 0:
            ix.unsubscribe("c", f"t/{i % 5}/x")  # hides t/<k>/x until that filter is subscribed again
    ix._check()
    for k in range(5):
        got = ix.match(f"t/{k}/y").clients["c"]
        assert [s.topic_filter for s in got] == [f"t/{k}/#"]
    # the last partial unsubscribe (i = 595, k = 0) came before the last subscribe of t/0/#
    # (i = 595 too: subscribe first): t/0/x is hidden
    assert "c" not in ix.match("t/0/x").clients
    assert ix.match("t/1/x").clients["c"][0].options == 596


# ------------------------------------------------------------ deep filters, stateful
# Filters of up to 6 levels with empty and '$' levels, plain and shared, with partial
# unsubscribes: the model tests' reference (docs/reference.md applied literally), with
# ``topics.includes`` / ``overlaps`` (checked against brute force in test_topics_match.py) in
# place of its 5-level universe, which is exact for 3-level filters only.
class DeepReference:
    def __init__(self) -> None:
        self.lists: dict[str, list[tuple[str, bool, int | None]]] = {}

    def _tidy(self, cid: str) -> None:
        lst = self.lists[cid]
        while True:
            plain = [e for e in lst if not e[0].startswith("$share/")]
            if plain and not plain[0][1]:
                lst.remove(plain[0])
            else:
                break
        if not lst:
            del self.lists[cid]

    def subscribe(self, cid: str, f: str, o: int) -> None:
        lst = self.lists.setdefault(cid, [])
        if not f.startswith("$share/"):
            lst[:] = [e for e in lst if e[1] or not includes(f, e[0])]
        lst[:] = [e for e in lst if e[0] != f]
        lst.append((f, True, o))
        self._tidy(cid)

    def unsubscribe(self, cid: str, f: str) -> UnsubscribeOutcome:
        if cid not in self.lists:
            return UnsubscribeOutcome.NO_SUBSCRIPTION
        lst = self.lists[cid]
        if f.startswith("$share/"):
            found = any(e[0] == f for e in lst)
            lst[:] = [e for e in lst if e[0] != f]
            self._tidy(cid)
            return UnsubscribeOutcome.REMOVED if found else UnsubscribeOutcome.NO_SUBSCRIPTION
        removed = any(e[0] == f and e[1] for e in lst)
        lst[:] = [e for e in lst if not (e[0] == f and e[1]) and (e[1] or not includes(f, e[0]))]
        out = UnsubscribeOutcome.REMOVED if removed else UnsubscribeOutcome.NO_SUBSCRIPTION
        if not removed and any(e[1] and not e[0].startswith("$share/") and overlaps(e[0], f) for e in lst):
            lst.append((f, False, None))
            out = UnsubscribeOutcome.PARTIAL
        self._tidy(cid)
        return out

    def match(self, topic: str) -> tuple[dict[str, list[tuple[str, int | None]]], set[tuple[str, str, str]]]:
        clients: dict[str, list[tuple[str, int | None]]] = {}
        shared: set[tuple[str, str, str]] = set()
        for cid, lst in self.lists.items():
            for f, _, _ in lst:  # negative entries never apply to shared subscriptions
                if f.startswith("$share/"):
                    _, g, inner = f.split("/", 2)
                    if ref_match(inner, topic):
                        shared.add((g, inner, cid))
            got = []
            for f, positive, o in reversed(lst):
                if f.startswith("$share/") or not ref_match(f, topic):
                    continue
                if not positive:
                    break
                got.append((f, o))
            if got:
                clients[cid] = got
        return clients, shared


DEEP_FILTER = st.one_of(filters(6), filters(6).map(lambda f: "$share/" + ("g/" if len(f) % 2 else "h/") + f))


class DeepIndexVsReference(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ix: SubscriptionIndex[int] = SubscriptionIndex()
        self.ref = DeepReference()
        self.n = 0

    @rule(cid=st.sampled_from(["c0", "c1", "c2"]), f=DEEP_FILTER)
    def subscribe(self, cid: str, f: str) -> None:
        self.n += 1
        self.ix.subscribe(cid, f, self.n)
        self.ref.subscribe(cid, f, self.n)

    @rule(cid=st.sampled_from(["c0", "c1", "c2"]), f=DEEP_FILTER)
    def unsubscribe(self, cid: str, f: str) -> None:
        assert self.ix.unsubscribe(cid, f) is self.ref.unsubscribe(cid, f)

    @rule(cid=st.sampled_from(["c0", "c1", "c2"]), data=st.data())
    def unsubscribe_held(self, cid: str, data: st.DataObject) -> None:
        """Unsubscribe a filter the client holds (or one level longer or shorter)."""
        held = [e[0] for e in self.ref.lists.get(cid, [])]
        if held:
            f = data.draw(st.sampled_from(held))
            longer = f if f.endswith("#") else f + "/a"
            inner = f.removeprefix("$share/g/").removeprefix("$share/h/")
            shorter = f.rsplit("/", 1)[0] if "/" in inner and not inner.startswith("/") else f
            f = data.draw(st.sampled_from([f, longer, shorter]))
            assert self.ix.unsubscribe(cid, f) is self.ref.unsubscribe(cid, f)

    @rule(cid=st.sampled_from(["c0", "c1", "c2"]))
    def remove_client(self, cid: str) -> None:
        assert self.ix.remove_client(cid) == len(self.ref.lists.pop(cid, []))

    @rule(topic=topics_of(7))
    def match(self, topic: str) -> None:
        res = self.ix.match(topic)
        clients, shared = self.ref.match(topic)
        assert {c: [(s.topic_filter, s.options) for s in subs] for c, subs in res.clients.items()} == clients
        assert {(g, f, cid) for (g, f), members in res.shared.items() for cid, _ in members} == shared

    @invariant()
    def consistent(self) -> None:
        self.ix._check()
        assert len(self.ix) == sum(len(v) for v in self.ref.lists.values())
        for cid in ("c0", "c1", "c2"):
            want = [(f, p, o) for f, p, o in self.ref.lists.get(cid, [])]
            assert [(e.topic_filter, e.positive, e.options) for e in self.ix.entries(cid)] == want


TestDeepIndex = DeepIndexVsReference.TestCase
TestDeepIndex.settings = settings(max_examples=examples(150), stateful_step_count=50)


def test_sequence_numbers_stay_small() -> None:
    """The renumbering's promise (module docstring): a client's sequence numbers stay below
    256 (CPython's cached ints) while it has at most 128 entries, whatever it did before."""
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    for i in range(2_000):
        ix.subscribe("c", f"t/{i % 40}/#", i)
        if i % 3 == 0:
            ix.unsubscribe("c", f"t/{i % 40}/x")
        if i % 11 == 0:
            ix.subscribe("c", f"$share/g/s/{i % 7}", i)
    ix._check()
    seqs = [s.seq for k in range(40) for s in ix.match(f"t/{k}/y").clients["c"]]  # type: ignore[attr-defined]
    seqs += [s.seq for k in range(40) for s in ix.match(f"t/{k}/x").clients.get("c", [])]  # type: ignore[attr-defined]
    assert seqs and max(seqs) < 256, max(seqs)


def test_a_negative_wildcard_entry_keeps_the_dollar_rule() -> None:
    """UNSUBSCRIBE '#' next to '$s/#' and 'a' leaves a negative entry '#', which (like the
    filter '#') does not match '$' topics: '$s/x' is still delivered, 'a' no longer is."""
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    ix.subscribe("c", "$s/#", 0)
    ix.subscribe("c", "a", 1)
    assert ix.unsubscribe("c", "#") is UnsubscribeOutcome.PARTIAL
    ix._check()
    assert _matched(ix, "$s/x") == {("c", "$s/#")}
    assert _matched(ix, "a") == set()


def test_unsubscribing_a_shared_filter_leaves_the_same_plain_filter() -> None:
    ix: SubscriptionIndex[int] = SubscriptionIndex()
    ix.subscribe("c", "a/+", 0)
    ix.subscribe("c", "$share/g/a/+", 1)
    assert ix.unsubscribe("c", "$share/g/a/+") is UnsubscribeOutcome.REMOVED
    ix._check()
    assert _matched(ix, "a/b") == {("c", "a/+")} and not ix.match("a/b").shared
    assert ix.unsubscribe("c", "$share/g/a/+") is UnsubscribeOutcome.NO_SUBSCRIPTION
