"""The topic tree that ``topics/_index.py`` carried before issue 42 item 3 (main at 741a4d4),
kept verbatim below this note (its design note is that commit's module docstring) as the
same-run peer of ``benchmarks/bench_topics.py`` only ("today's index"): nothing in the broker
imports it.  Its public classes are its own copies (a record it returns is not a
``topics.Subscription``); do not use it for anything but the comparison.
"""

# ruff: noqa
# mypy: ignore-errors

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, Union

from topics._match import includes, overlaps
from topics._validate import InvalidTopic, validate_filter

__all__ = [
    "Entry",
    "MatchResult",
    "SubscribeOutcome",
    "Subscription",
    "SubscriptionIndex",
    "UnsubscribeOutcome",
]

O = TypeVar("O")  # noqa: E741  (the name the broker code and docs use)

SHARE_PREFIX = "$share/"


@dataclass(frozen=True, slots=True)
class SubscribeOutcome:
    """Result of :meth:`SubscriptionIndex.subscribe`.

    ``replaced``: an identical subscription existed and was replaced (MQTT "retain handling 1"
    needs this).  ``negatives_removed``: how many negative entries the new filter included.
    """

    replaced: bool
    negatives_removed: int


class UnsubscribeOutcome(enum.Enum):
    """Result of :meth:`SubscriptionIndex.unsubscribe`."""

    REMOVED = "removed"  # an identical subscription was removed (MQTT 5 reason 0x00)
    PARTIAL = "partial"  # a negative entry was appended (partial unsubscribe, reason 0x00)
    NO_SUBSCRIPTION = "no_subscription"  # nothing to remove or exclude (reason 0x11)


@dataclass(frozen=True, slots=True)
class Entry(Generic[O]):
    """One entry of a client's list: a subscription (``positive``, with its options) or a
    negative entry (``positive`` false, ``options`` None)."""

    topic_filter: str
    positive: bool
    options: O | None


@dataclass(frozen=True, slots=True, eq=False)
class Subscription(Generic[O]):
    """A subscription that applies to a published topic: its filter and its options.

    Equality and hashing use ``(topic_filter, options)``.  Objects returned by ``match`` are
    the index's own records (a subclass): treat them as read-only values.
    """

    topic_filter: str
    options: O

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Subscription):
            return NotImplemented
        return self.topic_filter == other.topic_filter and bool(self.options == other.options)

    def __hash__(self) -> int:
        return hash((self.topic_filter, self.options))

    def __repr__(self) -> str:
        return f"Subscription(topic_filter={self.topic_filter!r}, options={self.options!r})"


@dataclass(frozen=True, slots=True)
class MatchResult(Generic[O]):
    """What :meth:`SubscriptionIndex.match` found for one topic.

    ``clients``: client id -> the subscriptions that apply, newest first (never empty).
    ``shared``: (group, filter) -> the members ``(client id, options)`` whose shared
    subscription ``$share/<group>/<filter>`` matches (never empty).
    """

    clients: dict[str, list[Subscription[O]]]
    shared: dict[tuple[str, str], list[tuple[str, O]]]


_set = object.__setattr__


class _Sub(Subscription[O]):
    """A plain subscription record (what ``match`` returns)."""

    __slots__ = ("client_id", "seq")
    client_id: str
    seq: int

    def __init__(self, topic_filter: str, options: O, client_id: str, seq: int) -> None:
        _set(self, "topic_filter", topic_filter)
        _set(self, "options", options)
        _set(self, "client_id", client_id)
        _set(self, "seq", seq)


class _Shared(Subscription[O]):
    """A shared subscription record; ``topic_filter`` is the full ``$share/g/f``."""

    __slots__ = ("client_id", "group", "inner", "seq")
    client_id: str
    group: str
    inner: str
    seq: int

    def __init__(self, topic_filter: str, options: O, client_id: str, seq: int, at: tuple[str, str]) -> None:
        _set(self, "topic_filter", topic_filter)
        _set(self, "options", options)
        _set(self, "client_id", client_id)
        _set(self, "seq", seq)
        _set(self, "group", at[0])
        _set(self, "inner", at[1])


class _Neg:
    """A negative entry record."""

    __slots__ = ("client_id", "seq", "topic_filter")

    def __init__(self, topic_filter: str, client_id: str, seq: int) -> None:
        self.topic_filter = topic_filter
        self.client_id = client_id
        self.seq = seq


_Leaf = Union["_Sub[Any]", _Neg]
_Rec = Union["_Sub[Any]", _Neg, "_Shared[Any]"]


class _Node:
    """A topic-tree node.  ``subs``: None, one record, or a dict client id -> record (>= 2)."""

    __slots__ = ("children", "hash", "level", "plus", "shared", "subs")

    def __init__(self, level: str = "") -> None:
        self.level = level  # its level name under its parent (literal children only)
        # None, the one literal child, or a dict level -> child (two or more)
        self.children: _Node | dict[str, _Node] | None = None
        self.plus: _Node | None = None
        self.hash: _Node | None = None
        self.subs: _Leaf | dict[str, _Leaf] | None = None
        self.shared: dict[str, dict[str, _Shared[Any]]] | None = None

    def empty(self) -> bool:
        return (
            self.children is None
            and self.plus is None
            and self.hash is None
            and self.subs is None
            and self.shared is None
        )


def _split_shared(topic_filter: str) -> tuple[str, str]:
    parts = topic_filter.split("/", 2)
    if len(parts) < 3 or not parts[1]:
        raise InvalidTopic(
            f"shared subscription {topic_filter!r} must be $share/<group>/<filter> (position 7)", 7
        )
    group = parts[1]
    for ch in ("+", "#"):
        k = group.find(ch)
        if k >= 0:
            raise InvalidTopic(
                f"shared subscription {topic_filter!r}: the group name contains {ch!r} (position {7 + k})",
                7 + k,
            )
    try:
        validate_filter(parts[2])
    except InvalidTopic as exc:
        pos = None if exc.position is None else exc.position + 8 + len(group)
        raise InvalidTopic(f"shared subscription {topic_filter!r}: {exc}", pos) from None
    return group, parts[2]


class SubscriptionIndex(Generic[O]):
    """All clients' subscriptions and negative entries; see the module docstring for the rules.

    ``O`` is the type of the opaque per-subscription options (QoS, flags, identifiers, ...).
    Filters are MQTT filters (``validate_filter``, '#' last); invalid ones raise
    :class:`topics.InvalidTopic`.
    """

    def __init__(self, partial_unsubscribe: bool = True) -> None:
        self.partial_unsubscribe = partial_unsubscribe
        self._root = _Node()
        # client id -> its entries: a dict filter -> record (oldest first), or the record
        # itself when the client's only entry is a (plain or shared) subscription
        self._clients: dict[str, dict[str, _Rec] | _Rec] = {}
        self._negatives: dict[str, dict[str, _Neg]] = {}
        self._count = 0
        self._seq = 0

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        """All entries of all clients (subscriptions, shared subscriptions, negative entries)."""
        return self._count

    @property
    def client_count(self) -> int:
        """Clients with at least one entry."""
        return len(self._clients)

    def entry_count(self, client_id: str) -> int:
        ents = self._clients.get(client_id)
        if ents is None:
            return 0
        return len(ents) if type(ents) is dict else 1

    def entries(self, client_id: str) -> list[Entry[O]]:
        """The client's entries, oldest first (shared subscriptions by their full filter)."""
        ents = self._clients.get(client_id)
        if ents is None:
            return []
        out: list[Entry[O]] = []
        for r in _records(ents):
            if type(r) is _Neg:
                out.append(Entry(r.topic_filter, False, None))
            else:
                out.append(Entry(r.topic_filter, True, r.options))  # type: ignore[union-attr]
        return out

    # ------------------------------------------------------------------ tree helpers
    def _node(self, topic_filter: str) -> _Node:
        """The node of ``topic_filter``, created if missing.

        A node's only child has its level interned (a fixed suffix such as ``cmd`` in
        ``fleet/<id>/cmd`` is then one string for all devices); a level added beside
        siblings is kept as it is (usually an id: interning it would cost an entry in the
        interpreter's table of interned strings, with nothing to share)."""
        n = self._root
        intern = sys.intern
        for lv in topic_filter.split("/"):
            if lv == "+":
                c = n.plus
                if c is None:
                    c = n.plus = _Node()
            elif lv == "#":
                c = n.hash
                if c is None:
                    c = n.hash = _Node()
            else:
                ch = n.children
                if ch is None:
                    c = n.children = _Node(intern(lv))
                elif type(ch) is _Node:
                    if ch.level == lv:
                        c = ch
                    else:  # a second child: a dict from now on
                        c = _Node(lv)
                        n.children = {ch.level: ch, c.level: c}
                else:
                    c = ch.get(lv)  # type: ignore[union-attr]
                    if c is None:
                        c = ch[lv] = _Node(lv)  # type: ignore[index]
            n = c
        return n

    def _path(self, topic_filter: str) -> list[tuple[_Node, str]]:
        """(node, level) pairs from the root to the node of an existing filter."""
        n = self._root
        path = []
        for lv in topic_filter.split("/"):
            path.append((n, lv))
            if lv == "+":
                c = n.plus
            elif lv == "#":
                c = n.hash
            else:
                c = _child(n, lv)
            assert c is not None
            n = c
        path.append((n, ""))
        return path

    @staticmethod
    def _prune(path: list[tuple[_Node, str]]) -> None:
        for i in range(len(path) - 1, 0, -1):
            node = path[i][0]
            if not node.empty():
                return
            parent, lv = path[i - 1]
            if lv == "+":
                parent.plus = None
            elif lv == "#":
                parent.hash = None
            else:
                ch = parent.children
                assert ch is not None
                if type(ch) is _Node:
                    parent.children = None
                else:
                    del ch[lv]  # type: ignore[union-attr]
                    if len(ch) == 1:  # type: ignore[arg-type]
                        parent.children = next(iter(ch.values()))  # type: ignore[union-attr]

    @staticmethod
    def _leaf_put(node: _Node, rec: _Leaf) -> None:
        s = node.subs
        cid = rec.client_id
        if s is None:
            node.subs = rec
        elif type(s) is dict:
            s[cid] = rec
        else:
            one: _Leaf = s  # type: ignore[assignment]
            if one.client_id == cid:
                node.subs = rec
            else:
                node.subs = {one.client_id: one, cid: rec}

    def _unlink(self, rec: _Rec) -> None:
        """Remove ``rec`` from the tree (not from the client's dicts) and prune."""
        if type(rec) is _Shared:
            path = self._path(rec.inner)
            node = path[-1][0]
            groups = node.shared
            assert groups is not None
            members = groups[rec.group]
            del members[rec.client_id]
            if not members:
                del groups[rec.group]
                if not groups:
                    node.shared = None
        else:
            path = self._path(rec.topic_filter)
            node = path[-1][0]
            s = node.subs
            if type(s) is dict:
                del s[rec.client_id]
                if len(s) == 1:
                    node.subs = next(iter(s.values()))
            else:
                node.subs = None
        self._prune(path)

    def _remove(self, ents: dict[str, _Rec], client_id: str, key: str) -> _Rec:
        rec = ents.pop(key)
        self._unlink(rec)
        self._count -= 1
        if type(rec) is _Neg:
            negs = self._negatives[client_id]
            del negs[key]
            if not negs:
                del self._negatives[client_id]
        return rec

    def _remove_included_negatives(self, ents: dict[str, _Rec], client_id: str, f: str) -> int:
        negs = self._negatives.get(client_id)
        if not negs:
            return 0
        victims = [g for g in negs if includes(f, g)]
        for g in victims:
            self._remove(ents, client_id, g)
        return len(victims)

    def _dict(self, client_id: str) -> dict[str, _Rec] | None:
        """The client's entries as a dict, about to change (an inline record becomes one). O(1)."""
        ents = self._clients.get(client_id)
        if ents is None or type(ents) is dict:
            return ents
        one: _Rec = ents  # type: ignore[assignment]
        d = self._clients[client_id] = {one.topic_filter: one}
        return d

    def _filters(self, client_id: str) -> list[str]:
        """The filters of the client's entries (read-only)."""
        ents = self._clients.get(client_id)
        return [] if ents is None else [r.topic_filter for r in _records(ents)]

    def _settle(self, client_id: str, ents: dict[str, _Rec]) -> None:
        """After a change: forget a client without entries, store a lone subscription inline."""
        if not ents:
            self._clients.pop(client_id, None)
        elif len(ents) == 1:
            (one,) = ents.values()
            if type(one) is not _Neg:
                self._clients[client_id] = one

    def _tidy(self, client_id: str, ents: dict[str, _Rec]) -> None:
        """Drop negative entries older than every plain subscription; forget empty clients."""
        if client_id in self._negatives:
            while True:
                lead = None
                for key, r in ents.items():
                    if type(r) is not _Shared:
                        lead = key if type(r) is _Neg else None
                        break
                if lead is None:
                    break
                self._remove(ents, client_id, lead)
        self._settle(client_id, ents)

    # ------------------------------------------------------------------ updates
    def subscribe(self, client_id: str, topic_filter: str, options: O) -> SubscribeOutcome:
        """SUBSCRIBE ``topic_filter`` for ``client_id`` with ``options``; raises InvalidTopic."""
        if topic_filter.startswith(SHARE_PREFIX):
            return self._subscribe_shared(client_id, topic_filter, options)
        validate_filter(topic_filter)
        self._seq += 1
        rec: _Sub[O] = _Sub(topic_filter, options, client_id, self._seq)
        ents = self._dict(client_id)
        if ents is None:  # the client's first entry: stored inline
            self._count += 1
            self._leaf_put(self._node(topic_filter), rec)
            self._clients[client_id] = rec
            return SubscribeOutcome(False, 0)
        removed = self._remove_included_negatives(ents, client_id, topic_filter)
        old = ents.pop(topic_filter, None)
        if old is None:
            self._count += 1
        self._leaf_put(self._node(topic_filter), rec)
        ents[topic_filter] = rec
        if (removed or old is not None) and client_id in self._negatives:
            self._tidy(client_id, ents)
        else:
            self._settle(client_id, ents)
        return SubscribeOutcome(old is not None, removed)

    def _subscribe_shared(self, client_id: str, topic_filter: str, options: O) -> SubscribeOutcome:
        group, inner = _split_shared(topic_filter)
        ents = self._dict(client_id)
        if ents is None:
            ents = self._clients[client_id] = {}
        old = ents.pop(topic_filter, None)
        if old is None:
            self._count += 1
        self._seq += 1
        rec = _Shared(topic_filter, options, client_id, self._seq, (group, inner))
        node = self._node(inner)
        groups = node.shared
        if groups is None:
            groups = node.shared = {}
        members = groups.get(group)
        if members is None:
            members = groups[group] = {}
        members[client_id] = rec
        ents[topic_filter] = rec
        if old is not None and client_id in self._negatives:
            self._tidy(client_id, ents)
        else:
            self._settle(client_id, ents)
        return SubscribeOutcome(old is not None, 0)

    def unsubscribe(self, client_id: str, topic_filter: str) -> UnsubscribeOutcome:
        """UNSUBSCRIBE ``topic_filter`` for ``client_id``; raises InvalidTopic."""
        if topic_filter.startswith(SHARE_PREFIX):
            _split_shared(topic_filter)
            if topic_filter not in self._filters(client_id):
                return UnsubscribeOutcome.NO_SUBSCRIPTION
            ents = self._dict(client_id)
            assert ents is not None
            self._remove(ents, client_id, topic_filter)
            self._tidy(client_id, ents)
            return UnsubscribeOutcome.REMOVED
        validate_filter(topic_filter)
        ents = self._dict(client_id)
        if ents is None:
            return UnsubscribeOutcome.NO_SUBSCRIPTION
        old = ents.get(topic_filter)
        removed = old is not None and type(old) is _Sub
        if removed:
            self._remove(ents, client_id, topic_filter)
        self._remove_included_negatives(ents, client_id, topic_filter)
        outcome = UnsubscribeOutcome.REMOVED if removed else UnsubscribeOutcome.NO_SUBSCRIPTION
        if not removed and self.partial_unsubscribe:
            for r in reversed(ents.values()):
                if type(r) is _Sub and overlaps(r.topic_filter, topic_filter):
                    self._seq += 1
                    neg = _Neg(topic_filter, client_id, self._seq)
                    self._leaf_put(self._node(topic_filter), neg)
                    ents[topic_filter] = neg
                    negs = self._negatives.get(client_id)
                    if negs is None:
                        negs = self._negatives[client_id] = {}
                    negs[topic_filter] = neg
                    self._count += 1
                    outcome = UnsubscribeOutcome.PARTIAL
                    break
        self._tidy(client_id, ents)
        return outcome

    def remove_client(self, client_id: str) -> int:
        """Remove every entry of ``client_id`` (session end); returns how many there were."""
        ents = self._clients.pop(client_id, None)
        if ents is None:
            return 0
        self._negatives.pop(client_id, None)
        recs = _records(ents)
        for rec in recs:
            self._unlink(rec)
        self._count -= len(recs)
        return len(recs)

    # ------------------------------------------------------------------ matching
    def match(self, topic: str) -> MatchResult[O]:  # noqa: C901, PLR0912, PLR0915 (hot path: the tree walk in one frame)
        """Per client, the subscriptions that apply to ``topic`` (newest first), and the shared
        subscription members per (group, filter).  ``topic`` must be a valid topic name."""
        found: list[_Node] = []  # nodes whose records apply to the topic
        push = found.append
        dollar = topic[:1] == "$"
        nodes = [self._root]
        for lv in topic.split("/"):
            nxt: list[_Node] = []
            for n in nodes:
                if not dollar:
                    h = n.hash
                    if h is not None:
                        push(h)
                    p = n.plus
                    if p is not None:
                        nxt.append(p)
                ch = n.children
                if ch is not None:
                    if type(ch) is _Node:  # one literal child
                        if ch.level == lv:
                            nxt.append(ch)
                    else:
                        c = ch.get(lv)  # type: ignore[union-attr]
                        if c is not None:
                            nxt.append(c)
            nodes = nxt
            if not nxt:
                break
            dollar = False
        for n in nodes:
            push(n)
            h = n.hash
            if h is not None:  # "a/#" matches "a"
                push(h)

        clients: dict[str, list[Subscription[O]]] = {}
        get = clients.get
        negs: dict[str, int] | None = None
        shared_nodes: list[_Node] | None = None
        multi = False
        for n in found:
            s = n.subs
            if s is not None:
                if type(s) is dict:
                    for cid, r in s.items():
                        if type(r) is _Neg:
                            if negs is None:
                                negs = {}
                            if negs.get(cid, -1) < r.seq:
                                negs[cid] = r.seq
                        else:
                            lst = get(cid)
                            if lst is None:
                                clients[cid] = [r]  # type: ignore[list-item]
                            else:
                                lst.append(r)  # type: ignore[arg-type]
                                multi = True
                elif type(s) is _Neg:
                    if negs is None:
                        negs = {}
                    if negs.get(s.client_id, -1) < s.seq:
                        negs[s.client_id] = s.seq
                else:
                    cid = s.client_id  # type: ignore[union-attr]
                    lst = get(cid)
                    if lst is None:
                        clients[cid] = [s]  # type: ignore[list-item]
                    else:
                        lst.append(s)  # type: ignore[arg-type]
                        multi = True
            if n.shared is not None:
                if shared_nodes is None:
                    shared_nodes = []
                shared_nodes.append(n)
        if negs is not None:
            for cid, nseq in negs.items():
                lst = get(cid)
                if lst is not None:
                    keep = [r for r in lst if r.seq > nseq]  # type: ignore[attr-defined]
                    if keep:
                        clients[cid] = keep
                    else:
                        del clients[cid]
        if multi:
            for lst in clients.values():
                if len(lst) > 1:
                    lst.sort(key=_seq_of, reverse=True)
        if shared_nodes is None:
            return MatchResult(clients, {})
        shared: dict[tuple[str, str], list[tuple[str, O]]] = {}
        for n in shared_nodes:
            assert n.shared is not None
            for group, members in n.shared.items():
                first = next(iter(members.values()))
                shared[(group, first.inner)] = [(cid, m.options) for cid, m in members.items()]
        return MatchResult(clients, shared)

    # ------------------------------------------------------------------ invariants
    def _check(self) -> None:  # noqa: C901, PLR0912, PLR0915 (one assertion per invariant)
        """Assert the invariants (O(total size + sum of squared entries per client))."""
        found: dict[tuple[str, str], _Rec] = {}
        stack: list[tuple[_Node, list[str]]] = [(self._root, [])]
        while stack:
            n, path = stack.pop()
            f = "/".join(path)
            if path:
                assert not n.empty(), f"empty node {f!r} not pruned"
            ch = n.children
            if ch is not None:
                if type(ch) is _Node:
                    kids = {ch.level: ch}
                else:
                    kids = ch  # type: ignore[assignment]
                    assert len(kids) >= 2, "a lone child kept in a dict"
                for lv, c in kids.items():
                    assert lv not in ("+", "#")
                    assert c.level == lv, (c.level, lv)
                    stack.append((c, [*path, lv]))
            if n.plus is not None:
                stack.append((n.plus, [*path, "+"]))
            if n.hash is not None:
                assert n.hash.children is None and n.hash.plus is None and n.hash.hash is None
                stack.append((n.hash, [*path, "#"]))
            s = n.subs
            if s is not None:
                recs = list(s.values()) if type(s) is dict else [s]
                if type(s) is dict:
                    assert len(s) >= 2, "single subscriber not stored inline"
                    assert all(k == r.client_id for k, r in s.items())
                for r in recs:
                    assert r.topic_filter == f, (r.topic_filter, f)  # type: ignore[union-attr]
                    key = (r.client_id, f)  # type: ignore[union-attr]
                    assert key not in found
                    found[key] = r  # type: ignore[assignment]
            if n.shared is not None:
                assert n.shared
                for group, members in n.shared.items():
                    assert members
                    for cid, m in members.items():
                        assert m.client_id == cid and m.group == group and m.inner == f
                        found[(cid, m.topic_filter)] = m
        total = 0
        for cid, stored in self._clients.items():
            if type(stored) is dict:
                ents = stored
                assert len(ents) >= 2, f"client {cid!r}: a lone entry not stored inline"
            else:
                assert type(stored) is not _Neg, f"client {cid!r}: a negative entry stored inline"
                ents = {stored.topic_filter: stored}  # type: ignore[dict-item, union-attr]
            assert ents, f"client {cid!r} without entries"
            total += len(ents)
            last = 0
            negs = {k for k, r in ents.items() if type(r) is _Neg}
            assert negs == set(self._negatives.get(cid, {})), cid
            if negs:
                assert self.partial_unsubscribe
            plain = [r for r in ents.values() if type(r) is not _Shared]
            if plain:
                assert type(plain[0]) is not _Neg, f"leading negative entry for {cid!r}"
            for i, e in enumerate(plain):
                if type(e) is _Neg:
                    for q in plain[i + 1 :]:
                        assert not includes(q.topic_filter, e.topic_filter), "negative entry not removed"
            for fkey, rec in ents.items():
                assert rec.client_id == cid and rec.topic_filter == fkey
                assert rec.seq > last, "entries out of order"
                last = rec.seq
                assert found.pop((cid, fkey)) is rec, (cid, fkey)
        assert not found, f"records in the tree without a client entry: {list(found)[:3]}"
        assert total == self._count
        assert set(self._negatives) <= set(self._clients)


def _child(n: _Node, lv: str) -> _Node | None:
    """The literal child ``lv`` of ``n`` (None if there is none)."""
    ch = n.children
    if ch is None:
        return None
    if type(ch) is _Node:
        return ch if ch.level == lv else None
    return ch.get(lv)  # type: ignore[union-attr]


def _records(ents: dict[str, _Rec] | _Rec) -> list[_Rec]:
    """A client's records, oldest first, whether stored as a dict or inline."""
    return list(ents.values()) if type(ents) is dict else [ents]  # type: ignore[list-item]


def _seq_of(r: Subscription[Any]) -> int:
    return r.seq  # type: ignore[attr-defined, no-any-return]
