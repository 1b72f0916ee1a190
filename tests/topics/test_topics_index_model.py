"""Model-based tests: SubscriptionIndex, RetainedTree and TopicSet against brute-force references.

The reference index keeps, per client, a plain list of entries and applies docs/reference.md
("Negative entries inside the MQTT broker") literally, with inclusion decided by brute force
over every topic of up to 5 levels (exact for filters of up to 3 levels, see
test_topics_match.py); matching walks each client's list newest first.  After every step the
structures' ``_check()`` invariants hold and their answers equal the reference's.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from tests.budget import examples
from tests.topics.reference import Universe, all_filters, all_topics, ref_match
from topics import Entry, RetainedTree, SubscriptionIndex, TopicSet, UnsubscribeOutcome

U = Universe(5)
MQTT_FILTERS = all_filters(3, extended=False)
EXT_FILTERS = all_filters(3, extended=True)
TOPICS = [*all_topics(4), "/", "a//a", "/a", "a/", "$b//"]  # plus empty levels
SHARED = [f"$share/{g}/{f}" for g in ("g1", "g2") for f in ("a/#", "+/a", "$b/+", "#")]
CLIENTS = st.sampled_from(["c0", "c1", "c2"])
# mostly short filters, so that the same client's filters include and overlap each other often
FILTER = st.one_of(
    st.sampled_from(all_filters(2, extended=False)), st.sampled_from(MQTT_FILTERS), st.sampled_from(SHARED)
)
TOPIC = st.sampled_from(TOPICS)


@dataclass
class RefEntry:
    key: str  # full filter as given
    positive: bool
    options: int | None

    @property
    def shared(self) -> bool:
        return self.key.startswith("$share/")

    @property
    def group_filter(self) -> tuple[str, str]:
        _, g, f = self.key.split("/", 2)
        return g, f


class RefIndex:
    def __init__(self, partial: bool) -> None:
        self.partial = partial
        self.lists: dict[str, list[RefEntry]] = {}

    def _tidy(self, cid: str) -> None:
        lst = self.lists[cid]
        while True:
            plain = [e for e in lst if not e.shared]
            if plain and not plain[0].positive:
                lst.remove(plain[0])
            else:
                break
        if not lst:
            del self.lists[cid]

    def subscribe(self, cid: str, f: str, o: int) -> tuple[bool, int]:
        lst = self.lists.setdefault(cid, [])
        replaced = any(e.key == f and e.positive for e in lst)
        if f.startswith("$share/"):
            removed = 0
        else:
            victims = [e for e in lst if not e.positive and U.includes(f, e.key)]
            removed = len(victims)
            for e in victims:
                lst.remove(e)
        lst[:] = [e for e in lst if e.key != f]
        lst.append(RefEntry(f, True, o))
        self._tidy(cid)
        return replaced, removed

    def unsubscribe(self, cid: str, f: str) -> UnsubscribeOutcome:
        lst = self.lists.get(cid, [])
        if f.startswith("$share/"):
            if any(e.key == f for e in lst):
                lst[:] = [e for e in lst if e.key != f]
                self._tidy(cid)
                return UnsubscribeOutcome.REMOVED
            return UnsubscribeOutcome.NO_SUBSCRIPTION
        if cid not in self.lists:
            return UnsubscribeOutcome.NO_SUBSCRIPTION
        removed = any(e.key == f and e.positive for e in lst)
        lst[:] = [
            e
            for e in lst
            if not (e.key == f and e.positive) and not (not e.positive and U.includes(f, e.key))
        ]
        out = UnsubscribeOutcome.REMOVED if removed else UnsubscribeOutcome.NO_SUBSCRIPTION
        if (
            not removed
            and self.partial
            and any(e.positive and not e.shared and U.overlaps(e.key, f) for e in lst)
        ):
            lst.append(RefEntry(f, False, None))
            out = UnsubscribeOutcome.PARTIAL
        self._tidy(cid)
        return out

    def remove_client(self, cid: str) -> int:
        return len(self.lists.pop(cid, []))

    def match(
        self, topic: str
    ) -> tuple[dict[str, list[tuple[str, int | None]]], dict[tuple[str, str], list[tuple[str, int | None]]]]:
        clients: dict[str, list[tuple[str, int | None]]] = {}
        shared: dict[tuple[str, str], list[tuple[str, int | None]]] = {}
        for cid, lst in self.lists.items():
            got = []
            for e in reversed(lst):
                if e.shared or not ref_match(e.key, topic):
                    continue
                if not e.positive:
                    break
                got.append((e.key, e.options))
            if got:
                clients[cid] = got
            for e in lst:
                if e.shared and ref_match(e.group_filter[1], topic):
                    shared.setdefault(e.group_filter, []).append((cid, e.options))
        return clients, shared


def index_machine(partial: bool) -> type[RuleBasedStateMachine]:
    class IndexVsReference(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.ix: SubscriptionIndex[int] = SubscriptionIndex(partial_unsubscribe=partial)
            self.ref = RefIndex(partial)
            self.n = 0

        @rule(cid=CLIENTS, f=FILTER)
        def subscribe(self, cid: str, f: str) -> None:
            self.n += 1
            got = self.ix.subscribe(cid, f, self.n)
            assert (got.replaced, got.negatives_removed) == self.ref.subscribe(cid, f, self.n)

        @rule(cid=CLIENTS, f=FILTER)
        def unsubscribe(self, cid: str, f: str) -> None:
            assert self.ix.unsubscribe(cid, f) is self.ref.unsubscribe(cid, f)

        @rule(cid=CLIENTS, data=st.data())
        def partial_unsubscribe(self, cid: str, data: st.DataObject) -> None:
            """Unsubscribe a filter that overlaps one of the client's subscriptions (but differs)."""
            plain = [e.key for e in self.ref.lists.get(cid, []) if e.positive and not e.shared]
            if not plain:
                return
            key = data.draw(st.sampled_from(plain))
            f = data.draw(st.sampled_from([g for g in MQTT_FILTERS if g != key and U.overlaps(g, key)]))
            assert self.ix.unsubscribe(cid, f) is self.ref.unsubscribe(cid, f)

        @rule(cid=st.sampled_from(["c0", "c1", "c2", "c3"]), data=st.data())
        def replay(self, cid: str, data: st.DataObject) -> None:
            """A saved list applied in one call (a store's restore): the same as one
            subscribe / unsubscribe per entry, on a new client (the fast path) or not."""
            few = st.sampled_from(["a/a", "a/+", "#", "+/a", SHARED[0]])  # repeats in one list
            drawn = data.draw(st.lists(st.tuples(st.one_of(few, FILTER), st.booleans()), max_size=8))
            entries = []
            for f, positive in drawn:
                self.n += 1
                entries.append(Entry(f, positive, self.n if positive else None))
            assert self.ix.replay(cid, entries) == len(entries)
            for e in entries:
                if e.positive:
                    assert e.options is not None
                    self.ref.subscribe(cid, e.topic_filter, e.options)
                else:
                    self.ref.unsubscribe(cid, e.topic_filter)

        @rule(src=CLIENTS, dst=st.sampled_from(["c1", "c3"]))
        def replay_entries_of(self, src: str, dst: str) -> None:
            """Another client's entries, as ``entries`` lists them, replayed onto ``dst``."""
            entries = self.ix.entries(src)
            assert self.ix.replay(dst, entries) == len(entries)
            for e in entries:
                if e.positive:
                    assert e.options is not None
                    self.ref.subscribe(dst, e.topic_filter, e.options)
                else:
                    self.ref.unsubscribe(dst, e.topic_filter)

        @rule(cid=CLIENTS)
        def remove_client(self, cid: str) -> None:
            assert self.ix.remove_client(cid) == self.ref.remove_client(cid)

        @rule(topic=TOPIC)
        def match(self, topic: str) -> None:
            res = self.ix.match(topic)
            clients, shared = self.ref.match(topic)
            assert {
                c: [(s.topic_filter, s.options) for s in subs] for c, subs in res.clients.items()
            } == clients
            assert {k: sorted(v) for k, v in res.shared.items()} == {k: sorted(v) for k, v in shared.items()}

        @invariant()
        def consistent(self) -> None:
            self.ix._check()
            assert len(self.ix) == sum(len(v) for v in self.ref.lists.values())
            assert self.ix.client_count == len(self.ref.lists)
            for cid in ("c0", "c1", "c2"):
                want = [(e.key, e.positive, e.options) for e in self.ref.lists.get(cid, [])]
                assert [(e.topic_filter, e.positive, e.options) for e in self.ix.entries(cid)] == want
                assert self.ix.entry_count(cid) == len(want)

    return IndexVsReference


def test_index_with_partial_unsubscribe() -> None:
    run_state_machine_as_test(
        index_machine(True), settings=settings(max_examples=examples(120), stateful_step_count=40)
    )


def test_index_pure_mqtt() -> None:
    run_state_machine_as_test(
        index_machine(False), settings=settings(max_examples=40, stateful_step_count=30)
    )


class RetainedVsDict(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tree: RetainedTree[int] = RetainedTree()
        self.ref: dict[str, int] = {}

    @rule(topic=TOPIC, v=st.integers(0, 9))
    def set(self, topic: str, v: int) -> None:
        self.tree.set(topic, v)
        self.ref[topic] = v

    @rule(topic=TOPIC)
    def delete(self, topic: str) -> None:
        assert self.tree.delete(topic) == (self.ref.pop(topic, None) is not None)

    @rule(f=st.sampled_from(MQTT_FILTERS))
    def match(self, f: str) -> None:
        got = sorted(self.tree.match(f))
        assert got == sorted((t, v) for t, v in self.ref.items() if ref_match(f, t))

    @rule(topic=TOPIC)
    def get(self, topic: str) -> None:
        assert self.tree.get(topic) == self.ref.get(topic)

    @invariant()
    def consistent(self) -> None:
        self.tree._check()
        assert len(self.tree) == len(self.ref)


TestRetained = RetainedVsDict.TestCase
TestRetained.settings = settings(max_examples=60, stateful_step_count=40)


class TopicSetVsHistory(RuleBasedStateMachine):
    """TopicSet against its meaning: the last operation whose filter matches t decides."""

    def __init__(self) -> None:
        super().__init__()
        self.ts = TopicSet()
        self.ops: list[tuple[bool, str]] = []

    @rule(positive=st.booleans(), f=st.sampled_from(EXT_FILTERS))
    def op(self, positive: bool, f: str) -> None:
        (self.ts.subscribe if positive else self.ts.unsubscribe)(f)
        self.ops.append((positive, f))

    @rule(topic=st.sampled_from(U.topics))
    def match(self, topic: str) -> None:
        want = next((p for p, f in reversed(self.ops) if ref_match(f, topic)), False)
        assert self.ts.matches(topic) == want

    @invariant()
    def consistent(self) -> None:
        self.ts._check()


TestTopicSet = TopicSetVsHistory.TestCase
TestTopicSet.settings = settings(max_examples=60, stateful_step_count=30)
