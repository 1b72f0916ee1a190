"""``SubscriptionIndex``: every client's MQTT subscriptions and negative entries, by filter.

Semantics (docs/reference.md, "Negative entries inside the MQTT broker"; seed 002 Fig. 4 and 8 adapted
to MQTT).  Each client has an ordered list (oldest first) of entries: MQTT subscriptions
(filter + opaque options ``O``) and negative entries (filter only).

* SUBSCRIBE F replaces an identical subscription F (MQTT), removes every negative entry that F
  includes, and becomes the newest entry.  Other subscriptions are untouched (unlike the
  patent's TopicSet, a subscription is never dropped or merged: it carries options).
* UNSUBSCRIBE F removes an identical subscription F and every negative entry F includes; with
  no identical subscription, if F overlaps a remaining subscription of the client, a negative
  entry F is appended (partial unsubscribe, ``PARTIAL``); otherwise ``NO_SUBSCRIPTION``.
* Negative entries that have no subscription older than themselves can never decide anything
  and are dropped (the patent's "leading negative entries" optimisation).
* ``match(topic)``: for each client, walk its entries newest first and collect the matching
  subscriptions until the first matching negative entry (seed 002 Fig. 8, generalised from a
  yes/no answer to "which subscriptions apply", since MQTT delivers by the union of options).
* ``partial_unsubscribe=False``: pure MQTT (no negative entries are ever created).
* Shared subscriptions ``$share/<group>/<filter>`` (MQTT 5 section 4.8.2) are entries of the
  client too (``entries`` lists them by their full filter), but they live in per-group member
  lists under ``<filter>``.  Negative entries never apply to them, an UNSUBSCRIBE
  of ``$share/g/f`` removes exactly that membership, and a plain UNSUBSCRIBE never turns into a
  partial unsubscribe because of a shared subscription.  ``match`` reports, per (group, filter),
  the members; choosing one member is the broker's business.

Data structure (issue 42 item 3: 1M subscriptions in <= 150 bytes each, match p50 <= 5 us,
built in <= 3 s): no tree.  Every filter is a key of one dict, filter -> its *bucket*: the
records of the clients that hold it (subscriptions and negative entries): the record itself
when there is one, a tuple of 2 to 8, a dict client id -> record above 8 (a tuple of 4 takes
72 bytes, a dict of 4 takes 184; a record is found in a tuple by identity, without reading the
other records).  Negative entries have a second dict of the same kind, looked at only when
some client has one.  A record is the
``Subscription`` object handed out by ``match`` (no allocation per delivery) with the client id
and a sequence number in extra slots.  Exact filters (85 % in the IoT workload of
``benchmarks/bench_topics.py``) are then found by one lookup of the topic name itself.  A
wildcard filter has a *shape*: how many levels, whether it ends in '#', where its '+' levels
are (``a/+/c/+`` and ``b/+/d/+`` share the shape (4, no '#', (1, 3))).  ``_Shapes`` counts the
distinct filters of each shape and keeps, per topic length, the shapes that can match a topic
that long; ``match`` builds, for each such shape, the one filter of that shape the topic would
match (the topic's levels with '+' at the shape's positions, cut before a final '#') and looks
it up.  The key strings are the caller's filter strings: the index stores no level strings and
no tree nodes.  Shared subscriptions ``$share/<group>/<filter>`` sit in their own dict, inner
filter -> group -> client id -> record, with their own shapes.

Per client, a dict filter -> record keeps the order (dict insertion order), and a second small
dict holds only its negative entries.  A client whose only entry is a subscription (the common
device: one command topic) is stored compactly as that record itself, without a dict of one
entry (issue 27, item 2); an update turns it into a dict first (``_dict``) and stores it inline
again when one subscription is left (``_settle``).  Sequence numbers order a client's entries
(newest first in ``match``, a negative entry hides only older subscriptions); they are per
client and renumbered 0..n-1 when they reach 256 (for a client with more than 128 entries:
when they reach twice its number of entries), so they are CPython's cached small ints, not a
32-byte int object per record.

Where the time goes (measured, ``benchmarks/bench_topics.py``; docs/performance-topics.md,
"Where the match time goes"): at 1M subscriptions ``match`` is bound by memory latency, not by
instructions: a random topic reads about 36 places that are not in the CPU caches (per lookup
a dict slot, its entry and the key string; the buckets; about 10 records and their client id
strings).  The interpreter takes those misses one after the other (each is followed by enough
bytecode that the next one cannot be in flight), and so would mypyc's code, which calls the
same C API one object at a time.  So the loop is C (``topics/_gather.c``, built by setup.py
beside the mypyc modules): for an ASCII topic it builds the key of each wildcard shape, looks
every key up, then prefetches level by level (every bucket found, then every record, then every
record's client id) before it builds the result, so that the misses of one level overlap.
Without the C module (``SIFTMQ_PURE=1``, no compiler), and for what the C loop leaves to Python
(a topic that is not ASCII or deeper than 64 levels, a length matched through the tree below),
the same loop runs in Python (``_collect``): the same records in the same order.

The build: CPython's cyclic collector tracks every instance of a class, and its full passes
traverse all of them: a million records made building 1M subscriptions one at a time twice as
slow with the collector on as with it off.  The C module makes the records untracked
(``_gather.record``), and the tuples and dicts that hold them (``_gather.append``,
``_untrack`` after an insertion re-tracks a dict): none of them can be part of a reference
cycle (they hold records and strings; a record holds two strings, a small int and the caller's
options, which never refer back to the records ``match`` hands out), and they are still freed
by reference counting.

Complexity: ``match`` is O(1) for the exact filters, plus O(levels) per wildcard shape that can
match the topic's length, plus O(matched records); it does not depend on the number of clients
or subscriptions.  One lookup per shape would be the price of no tree where many shapes share a
length (a client may hold 10,000 filters with '+' at different positions: that many lookups per
topic, matching or not), so above 8 shapes for a topic's length the wildcard filters are found
by walking a tree of the wildcard filters alone (O(levels x matching paths), the former tree's
bound), built at its first use and maintained from then on.  ``subscribe`` and the
identical-filter ``unsubscribe`` are O(levels + the client's negative entries +
min(subscribers of the filter, 8)); a partial unsubscribe
additionally tests overlap against the client's subscriptions (O(entries of that client)).
``replay`` (a store's restore) costs at most one of those per entry, less for a client that
has no entries yet: its leading plain subscriptions are stored without the per-call work.
"""

from __future__ import annotations

import enum
import gc
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Generic, Protocol, TypeVar, Union

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
O_co = TypeVar("O_co", covariant=True)

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


class _EntryLike(Protocol[O_co]):
    """What :meth:`SubscriptionIndex.replay` reads of an entry: an :class:`Entry`, or a
    store's record of one (``broker.store.EntryRecord``)."""

    @property
    def topic_filter(self) -> str: ...

    @property
    def positive(self) -> bool: ...

    @property
    def options(self) -> O_co | None: ...


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
    subscription ``$share/<group>/<filter>`` matches (never empty).  Each list is the
    index's own, the same object for every match until the group changes (a subscribe or
    unsubscribe of it makes a new one): read it, never change it.
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


try:  # the memory-bound loop of ``match`` in C (topics/_gather.c), built by setup.py
    from topics import _gather as _native
except ImportError:  # SIFTMQ_PURE=1, or no compiler: the same loop in Python
    _native = None  # type: ignore[assignment]
#: ``_native.gather`` once set up for ``_Sub``, else None (``match`` then runs in Python; the
#: benchmark sets it to None on a second copy of this module to compare both in one run)
_gather: Callable[[dict[str, Any], list[str]], dict[str, list[Any]] | None] | None = None
#: ``_native.match`` once set up, else None: the whole of ``match`` but negative entries and
#: shared subscriptions, in C (None for a topic it leaves to Python: not ASCII, > 64 levels)
_native_match: Callable[[dict[str, Any], str, tuple[tuple[int, ...], ...]], Any] | None = None
#: a new ``_Sub`` record: ``_native.record`` (not tracked by the cyclic collector, see
#: topics/_gather.c) or the class itself
_new_sub: Callable[[str, Any, str, int], _Sub[Any]] = _Sub


def _append_py(b: _Leaf | tuple[_Leaf, ...], rec: _Leaf) -> tuple[_Leaf, ...]:
    """A new bucket tuple: ``b`` (a tuple, or one record) then ``rec``. O(len(b))."""
    return (*b, rec) if type(b) is tuple else (b, rec)  # type: ignore[return-value]


def _untrack_py(obj: object) -> None:
    """Pure Python cannot take an object off the collector's lists: nothing. O(1)."""


#: ``_native.untrack``: take one of the index's containers off the cyclic collector's lists
#: (it holds records and strings, never anything that refers back to it: no cycle passes
#: through it; the next insertion of a record tracks it again), or ``_untrack_py``
_untrack: Callable[[object], None] = _untrack_py

#: ``_native.append`` (the tuple not tracked by the collector) or ``_append_py``
_append: Callable[[_Leaf | tuple[_Leaf, ...], _Leaf], tuple[_Leaf, ...]] = _append_py
if _native is not None:
    _native.setup(_Sub, MatchResult)
    _gather = _native.gather
    _native_match = _native.match
    _new_sub = _native.record
    _append = _native.append
    _untrack = _native.untrack

_Leaf = Union["_Sub[Any]", _Neg]
_Rec = Union["_Sub[Any]", _Neg, "_Shared[Any]"]
# the records of one filter: one record, a tuple of 2.._TUPLE_MAX, or a dict client id -> record
_Bucket = Union["_Sub[Any]", _Neg, tuple[_Leaf, ...], dict[str, _Leaf]]
# where a filter has its wildcards: (levels before any final '#', ends with '#', '+' positions)
_Shape = tuple[int, bool, tuple[int, ...]]

# per topic length: (getters, getters for a '$' topic, more than _FEW_SHAPES, the same shapes as
# ``_gather.match`` specs, specs for a '$' topic)
_Fitting = tuple[
    tuple[Callable[[list[str]], Any], ...],
    tuple[Callable[[list[str]], Any], ...],
    bool,
    tuple[tuple[int, ...], ...],
    tuple[tuple[int, ...], ...],
]
_join = "/".join
_WILD = ("+", "#")  # appended to a topic's levels: what the getters of ``_Shapes`` pick for wildcards

_TUPLE_MAX = 8  # a filter's records sit in a tuple up to this many, in a dict above
_FEW_SHAPES = 8  # up to this many shapes for a topic's length: one lookup each; above: the tree
_LENGTHS_CACHED = 64  # topic lengths whose applicable shapes _Shapes keeps (bounded: any input)
_SEQ_CACHED = 256  # CPython caches the ints up to 256: a client's sequence numbers stay below

_NEW = SubscribeOutcome(False, 0)
_REPLACED = SubscribeOutcome(True, 0)


def _shape(topic_filter: str) -> _Shape | None:
    """The shape of a filter, None when it has no wildcard. O(levels)."""
    if "+" not in topic_filter and "#" not in topic_filter:
        return None
    levels = topic_filter.split("/")
    tail = levels[-1] == "#"
    if tail:
        del levels[-1]
    return len(levels), tail, tuple(i for i, lv in enumerate(levels) if lv == "+")


class _TNode:
    """A node of the wildcard filters' tree: literal children in a dict, the '+' and '#'
    children apart, and ``key``: the wildcard filter that ends here (None if none does)."""

    __slots__ = ("children", "hash", "key", "plus")

    def __init__(self) -> None:
        self.children: dict[str, _TNode] | None = None
        self.plus: _TNode | None = None
        self.hash: _TNode | None = None
        self.key: str | None = None

    def empty(self) -> bool:
        return self.key is None and self.children is None and self.plus is None and self.hash is None


class _Shapes:
    """The wildcard shapes of a set of filters, and per topic length the shapes that apply;
    beside them, a tree of the wildcard filters for lengths with many shapes.

    ``counts``: shape -> how many distinct filters of the set have it.  ``_by_len``: topic
    length -> the shapes that can match a topic of that many levels (the same length without a
    final '#', at most that length with one: 'a/#' matches 'a'), as ``operator.itemgetter``
    objects over its levels (``for_length``).  Built on first use per length and dropped
    when a shape comes or goes (a new shape, not a new filter: rare).  Exact filters have no
    shape.

    One lookup per shape is cheap for a few shapes (the IoT workload has 3) but would make a
    set of many shapes at one length (a client may hold 10,000 subscriptions, each with '+' at
    other positions) cost that many lookups per topic, matching or not.  So every wildcard
    filter is also in a tree (``root``, literal levels and '+'/'#' children), and a topic
    length with more than ``_FEW_SHAPES`` shapes is matched by walking it instead: O(levels x
    matching paths), the former topic tree's bound.  The tree holds only wildcard filters and
    is built only when a topic first needs it (a set with few shapes never pays its memory:
    about 13 bytes per subscription in the benchmark's workload).
    """

    __slots__ = ("_by_len", "_source", "counts", "root")

    def __init__(self, source: Mapping[str, object]) -> None:
        self.counts: dict[_Shape, int] = {}
        self._by_len: dict[int, _Fitting] = {}
        self._source = source  # the set's filters (its dict's keys): the tree is built from them
        self.root: _TNode | None = None  # built at the first walk, then kept up to date

    def add(self, shape: _Shape, key: str) -> None:
        """One more filter ``key``, of ``shape``. O(1), O(levels) once the tree exists."""
        n = self.counts.get(shape, 0)
        self.counts[shape] = n + 1
        if not n:
            self._by_len.clear()
        if self.root is not None:
            self._insert(self.root, key)

    @staticmethod
    def _insert(root: _TNode, key: str) -> None:
        node = root
        for lv in key.split("/"):
            if lv == "+":
                nxt = node.plus
                if nxt is None:
                    nxt = node.plus = _TNode()
            elif lv == "#":
                nxt = node.hash
                if nxt is None:
                    nxt = node.hash = _TNode()
            else:
                ch = node.children
                if ch is None:
                    ch = node.children = {}
                nxt = ch.get(lv)
                if nxt is None:
                    nxt = ch[lv] = _TNode()
            node = nxt
        node.key = key

    def remove(self, shape: _Shape, key: str) -> None:
        """One filter ``key``, of ``shape``, fewer; empty tree nodes are pruned. O(levels)."""
        n = self.counts[shape] - 1
        if n:
            self.counts[shape] = n
        else:
            del self.counts[shape]
            self._by_len.clear()
        if self.root is None:
            return
        path: list[tuple[_TNode, str]] = []
        node = self.root
        for lv in key.split("/"):
            path.append((node, lv))
            nxt = node.plus if lv == "+" else node.hash if lv == "#" else node.children[lv]  # type: ignore[index]
            assert nxt is not None
            node = nxt
        node.key = None
        for parent, lv in reversed(path):
            if not node.empty():
                return
            if lv == "+":
                parent.plus = None
            elif lv == "#":
                parent.hash = None
            else:
                ch = parent.children
                assert ch is not None
                del ch[lv]
                if not ch:
                    parent.children = None
            node = parent

    def walk(self, topic: str, levels: list[str]) -> list[str]:
        """The filters of the tree that match ``topic``: O(levels x matching paths).  The first
        walk builds the tree (O(filters of the set)); it is kept up to date from then on."""
        root = self.root
        if root is None:
            root = self.root = _TNode()
            for key in self._source:
                if "+" in key or "#" in key:
                    self._insert(root, key)
        out: list[str] = []
        nodes = [root]
        dollar = topic[:1] == "$"  # MQTT 5 section 4.7.2: no wildcard-first filter matches
        for lv in levels:
            nxt: list[_TNode] = []
            for n in nodes:
                if not dollar:
                    h = n.hash
                    if h is not None and h.key is not None:
                        out.append(h.key)
                    if n.plus is not None:
                        nxt.append(n.plus)
                ch = n.children
                if ch is not None:
                    c = ch.get(lv)
                    if c is not None:
                        nxt.append(c)
            if not nxt:
                return out
            nodes = nxt
            dollar = False
        for n in nodes:
            if n.key is not None:
                out.append(n.key)
            h = n.hash
            if h is not None and h.key is not None:  # "a/#" matches "a"
                out.append(h.key)
        return out

    def check(self, keys: set[str]) -> None:
        """Assert that the tree holds exactly ``keys`` (the set's wildcard filters), each at
        the node of its levels, and no empty node.  O(nodes)."""
        if self.root is None:
            return
        found: set[str] = set()
        stack: list[tuple[_TNode, list[str]]] = [(self.root, [])]
        while stack:
            n, path = stack.pop()
            if path:
                assert not n.empty(), f"empty tree node {'/'.join(path)!r} not pruned"
            if n.key is not None:
                assert n.key == "/".join(path), (n.key, path)
                found.add(n.key)
            for lv, c in (n.children or {}).items():
                assert lv not in ("+", "#")
                stack.append((c, [*path, lv]))
            if n.plus is not None:
                stack.append((n.plus, [*path, "+"]))
            if n.hash is not None:
                assert n.hash.children is None and n.hash.plus is None and n.hash.hash is None
                stack.append((n.hash, [*path, "#"]))
        assert found == keys, f"tree and filters differ: {sorted(found ^ keys)[:3]}"

    def for_length(self, n: int) -> _Fitting:
        """The shapes that can match a topic of ``n`` levels, as ``(getters, getters for a
        '$' topic, more than _FEW_SHAPES)``.  A getter is an ``operator.itemgetter`` over the
        topic's levels followed by ``'+'`` and ``'#'`` (``levels + ['+', '#']``): joined with
        '/', what it picks is the filter of that shape the topic would match (``a/+/c`` for
        ``a/b/c`` and the shape (3, no '#', (1,))).  Shapes whose first level is a wildcard are
        left out of the second tuple (MQTT 5 section 4.7.2: they never match a '$' topic).
        O(1), O(shapes x levels) on a miss."""
        got = self._by_len.get(n)
        if got is None:
            every: list[Callable[[list[str]], Any]] = []
            plain: list[Callable[[list[str]], Any]] = []
            every_specs: list[tuple[int, ...]] = []
            plain_specs: list[tuple[int, ...]] = []
            for k, tail, pluses in self.counts:
                if k == n or (tail and k <= n):
                    picks = [n if i in pluses else i for i in range(k)] + ([n + 1] if tail else [])
                    # one pick is a lone '+' or '#': the getter returns that string, and
                    # '/'.join of a one-character string is the string itself
                    getter = itemgetter(*picks)
                    spec = (k, int(tail), *pluses)
                    every.append(getter)
                    every_specs.append(spec)
                    if not ((tail and k == 0) or (bool(pluses) and pluses[0] == 0)):
                        plain.append(getter)
                        plain_specs.append(spec)
            got = (
                tuple(every),
                tuple(plain),
                len(every) > _FEW_SHAPES,
                tuple(every_specs),
                tuple(plain_specs),
            )
            if len(self._by_len) >= _LENGTHS_CACHED:  # topics of many lengths: start afresh
                self._by_len.clear()
            self._by_len[n] = got
        return got

    def keys(self, topic: str, levels: list[str]) -> list[str]:
        """The keys to look up for ``topic`` (``levels``: its split): with few shapes for its
        length, one filter per shape (whether or not it is in the set), O(shapes x levels);
        else the set's filters that match it, from the tree (:meth:`walk`)."""
        every, plain, many, _, _ = self.for_length(len(levels))
        if many:
            return self.walk(topic, levels)
        levels = [*levels, "+", "#"]
        return [_join(g(levels)) for g in (plain if topic[:1] == "$" else every)]


class _Filters:
    """Filter -> bucket (the records of every client holding that filter), and the wildcard
    shapes of the filters.  The index has one for subscriptions and one for negative entries
    (rare: ``match`` looks there only when there are any)."""

    __slots__ = ("buckets", "shapes")

    def __init__(self) -> None:
        self.buckets: dict[str, _Bucket] = {}
        self.shapes = _Shapes(self.buckets)

    def put(self, rec: _Leaf, old: _Leaf | None = None) -> None:
        """Store ``rec`` under its filter.  ``old``: the same client's record there, which
        ``rec`` replaces (the caller knows it from the client's entries), or None when the
        client has none: then nothing is searched.  Records are found by identity, never by
        reading them (a record elsewhere in memory is a cache miss).  O(levels) for a new
        filter, else O(min(records, _TUPLE_MAX))."""
        key = rec.topic_filter
        buckets = self.buckets
        b = buckets.get(key)
        if b is None:
            buckets[key] = rec
            shape = _shape(key)
            if shape is not None:
                self.shapes.add(shape, key)
            return
        t = type(b)
        if t is dict:
            b[rec.client_id] = rec  # type: ignore[index]
            _untrack(b)  # (inserting a record tracks it again)
        elif t is tuple:
            tup: tuple[_Leaf, ...] = b  # type: ignore[assignment]
            if old is not None:
                i = _position(tup, old)
                buckets[key] = (*tup[:i], rec, *tup[i + 1 :])
            elif len(tup) < _TUPLE_MAX:
                buckets[key] = _append(tup, rec)
            else:
                d = {r.client_id: r for r in tup}
                d[rec.client_id] = rec
                _untrack(d)
                buckets[key] = d
        else:
            buckets[key] = rec if b is old else _append(b, rec)  # type: ignore[arg-type]

    def drop(self, rec: _Leaf) -> None:
        """Remove ``rec`` from its filter's bucket; forget the filter when it was the last.
        O(min(records, _TUPLE_MAX)), O(levels) when the filter goes."""
        key = rec.topic_filter
        buckets = self.buckets
        b = buckets[key]
        t = type(b)
        if t is dict:
            d: dict[str, _Leaf] = b  # type: ignore[assignment]
            del d[rec.client_id]
            if len(d) <= _TUPLE_MAX:
                buckets[key] = tuple(d.values())
            return
        if t is tuple:
            tup: tuple[_Leaf, ...] = b  # type: ignore[assignment]
            i = _position(tup, rec)
            buckets[key] = tup[1 - i] if len(tup) == 2 else tup[:i] + tup[i + 1 :]
            return
        del buckets[key]
        shape = _shape(key)
        if shape is not None:
            self.shapes.remove(shape, key)


def _position(tup: tuple[_Leaf, ...], rec: _Leaf) -> int:
    """The index of ``rec`` in ``tup``, by identity (``tuple.index`` would compare records by
    value, and two clients' records on one filter may be equal).  O(len(tup)), no record read."""
    for i, r in enumerate(tup):
        if r is rec:
            return i
    raise AssertionError(f"record of {rec.client_id!r} missing under {rec.topic_filter!r}")


def _bucket_records(b: _Bucket) -> tuple[_Leaf, ...] | list[_Leaf]:
    """The records of a bucket. O(records)."""
    if type(b) is tuple:
        return b
    if type(b) is dict:
        return list(b.values())
    return (b,)  # type: ignore[return-value]


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
        self._subs = _Filters()  # filter -> the subscription records of every client on it
        self._negs = _Filters()  # filter -> the negative entries on it
        # inner filter -> group -> client id -> shared subscription record
        self._shared: dict[str, dict[str, dict[str, _Shared[Any]]]] = {}
        self._shared_shapes = _Shapes(self._shared)
        # (group, inner filter) -> its members as ``match`` reports them, made by the first
        # match after the group changed (dropped by every change): no copy per match
        self._shared_lists: dict[tuple[str, str], list[tuple[str, Any]]] = {}
        # client id -> its entries: a dict filter -> record (oldest first), or the record
        # itself when the client's only entry is a (plain or shared) subscription
        self._clients: dict[str, dict[str, _Rec] | _Rec] = {}
        self._negatives: dict[str, dict[str, _Neg]] = {}
        self._count = 0

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

    def _empty(self) -> bool:
        """No filter, shape or shared group is left (everything was pruned). O(1)."""
        return not (
            self._subs.buckets
            or self._subs.shapes.counts
            or self._negs.buckets
            or self._negs.shapes.counts
            or self._shared
            or self._shared_shapes.counts
        )

    # ------------------------------------------------------------------ filter side
    def _unlink(self, rec: _Rec) -> None:
        """Remove ``rec`` from the filter side (not from the client's dicts)."""
        if type(rec) is _Shared:
            groups = self._shared[rec.inner]
            members = groups[rec.group]
            del members[rec.client_id]
            self._shared_lists.pop((rec.group, rec.inner), None)
            if not members:
                del groups[rec.group]
                if not groups:
                    del self._shared[rec.inner]
                    shape = _shape(rec.inner)
                    if shape is not None:
                        self._shared_shapes.remove(shape, rec.inner)
        elif type(rec) is _Neg:
            self._negs.drop(rec)
        else:
            self._subs.drop(rec)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ client helpers
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

    @staticmethod
    def _next_seq(ents: dict[str, _Rec]) -> int:
        """The sequence number of the client's next entry: one more than its newest entry's.
        Numbers are per client (only a client's own entries are ever compared) and kept
        small: past the cached ints they are renumbered 0..n-1 in order (O(entries), once per
        ~n updates), so no int object is allocated per record."""
        if not ents:
            return 0
        nxt: int = next(reversed(ents.values())).seq + 1
        if nxt < _SEQ_CACHED or nxt < 2 * len(ents):
            return nxt
        for i, r in enumerate(ents.values()):
            _set(r, "seq", i)
        return len(ents)

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
        """SUBSCRIBE ``topic_filter`` for ``client_id`` with ``options``; raises InvalidTopic.
        O(levels + the client's negative entries + min(subscribers of the filter, 8))."""
        if topic_filter.startswith(SHARE_PREFIX):
            return self._subscribe_shared(client_id, topic_filter, options)
        if topic_filter not in self._subs.buckets:  # a filter held already was validated
            validate_filter(topic_filter)
        clients = self._clients
        ents = clients.get(client_id)
        if ents is None:  # the client's first entry: stored inline
            rec: _Sub[O] = _new_sub(topic_filter, options, client_id, 0)
            self._count += 1
            self._subs.put(rec)
            clients[client_id] = rec
            return _NEW
        if type(ents) is not dict:
            one: _Rec = ents  # type: ignore[assignment]
            ents = clients[client_id] = {one.topic_filter: one}
        negs = client_id in self._negatives
        removed = self._remove_included_negatives(ents, client_id, topic_filter) if negs else 0
        old = ents.pop(topic_filter, None)
        if old is None:
            self._count += 1
        seq = 0
        if ents:  # one more than the newest entry's (_next_seq, inline: the common path)
            seq = next(reversed(ents.values())).seq + 1
            if seq >= _SEQ_CACHED:
                seq = self._next_seq(ents)
        rec = _new_sub(topic_filter, options, client_id, seq)
        self._subs.put(rec, old)  # type: ignore[arg-type]
        ents[topic_filter] = rec
        _untrack(ents)  # (inserting a record tracks it again)
        if (removed or old is not None) and negs and client_id in self._negatives:
            self._tidy(client_id, ents)
        elif len(ents) < 2:
            self._settle(client_id, ents)
        if not removed:
            return _NEW if old is None else _REPLACED
        return SubscribeOutcome(old is not None, removed)

    def _subscribe_shared(self, client_id: str, topic_filter: str, options: O) -> SubscribeOutcome:
        group, inner = _split_shared(topic_filter)
        ents = self._dict(client_id)
        if ents is None:
            ents = self._clients[client_id] = {}
        old = ents.pop(topic_filter, None)
        if old is None:
            self._count += 1
        rec = _Shared(topic_filter, options, client_id, self._next_seq(ents), (group, inner))
        groups = self._shared.get(inner)
        if groups is None:
            groups = self._shared[inner] = {}
            shape = _shape(inner)
            if shape is not None:
                self._shared_shapes.add(shape, inner)
        members = groups.get(group)
        if members is None:
            members = groups[group] = {}
        members[client_id] = rec
        self._shared_lists.pop((group, inner), None)
        ents[topic_filter] = rec
        if old is not None and client_id in self._negatives:
            self._tidy(client_id, ents)
        else:
            self._settle(client_id, ents)
        return SubscribeOutcome(old is not None, 0)

    def unsubscribe(self, client_id: str, topic_filter: str) -> UnsubscribeOutcome:
        """UNSUBSCRIBE ``topic_filter`` for ``client_id``; raises InvalidTopic.  O(levels + the
        client's negative entries), plus O(the client's entries) for a partial unsubscribe."""
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
                    neg = _Neg(topic_filter, client_id, self._next_seq(ents))
                    self._negs.put(neg)
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

    def replay(self, client_id: str, entries: Iterable[_EntryLike[O]]) -> int:
        """Apply a client's saved entries, oldest first, as :meth:`entries` lists them: each
        positive entry as :meth:`subscribe` with its options, each negative one as
        :meth:`unsubscribe` (a store restoring its sessions at start-up).  Returns how many
        entries were applied; raises InvalidTopic at the first invalid filter (the entries
        before it stay applied, as with one call each).

        The same result as one call per entry, faster for a client without entries: its
        leading plain subscriptions are stored without the per-call work of ``subscribe``
        (no lookup of the client per entry, no negative entries to search, the client's dict
        built once).  From its first negative or shared entry on, or for a client that has
        entries already, each entry is one ``subscribe`` / ``unsubscribe``.  O(entries x
        levels), plus what those calls cost."""
        it = iter(entries)
        done = 0
        clients = self._clients
        pending: _EntryLike[O] | None = None  # the entry that ended the fast path
        if client_id not in clients:
            ents: dict[str, _Rec] = {}
            clients[client_id] = ents
            subs = self._subs
            buckets = subs.buckets
            seq = 0
            try:
                for e in it:
                    f = e.topic_filter
                    if not e.positive or f.startswith(SHARE_PREFIX):
                        pending = e
                        break
                    b = buckets.get(f)
                    if b is None:  # a filter held already was validated
                        validate_filter(f)
                    old: Any = ents.pop(f, None)
                    rec: _Sub[O] = _new_sub(f, e.options, client_id, seq)
                    if old is None and type(b) is tuple and len(b) < _TUPLE_MAX:  # _Filters.put
                        buckets[f] = _append(b, rec)
                    else:
                        subs.put(rec, old)
                    ents[f] = rec
                    seq += 1
                    done += 1
            finally:
                self._count += len(ents)
                if seq != len(ents) and seq >= _SEQ_CACHED:  # entries replaced: renumber 0..n-1
                    for i, r in enumerate(ents.values()):
                        _set(r, "seq", i)
                _untrack(ents)
                self._settle(client_id, ents)
        if pending is not None:
            self._replay_one(client_id, pending)
            done += 1
        for e in it:
            self._replay_one(client_id, e)
            done += 1
        return done

    def _replay_one(self, client_id: str, e: _EntryLike[O]) -> None:
        if e.positive:
            self.subscribe(client_id, e.topic_filter, e.options)  # type: ignore[arg-type]
        else:
            self.unsubscribe(client_id, e.topic_filter)

    def remove_client(self, client_id: str) -> int:
        """Remove every entry of ``client_id`` (session end); returns how many there were.
        O(its entries)."""
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
    def match(self, topic: str) -> MatchResult[O]:
        """Per client, the subscriptions that apply to ``topic`` (newest first), and the shared
        subscription members per (group, filter).  ``topic`` must be a valid topic name.

        O(1 + applicable wildcard shapes x levels + matched records)."""
        subs = self._subs
        buckets = subs.buckets
        shapes = subs.shapes
        fitting: _Fitting | None = None
        if shapes.counts:
            n = topic.count("/") + 1
            fitting = shapes._by_len.get(n)
            if fitting is None:
                fitting = shapes.for_length(n)
        native = _native_match
        res: MatchResult[O] | None = None
        if native is not None and (fitting is None or not fitting[2]):  # the loop in C
            res = native(
                buckets, topic, () if fitting is None else fitting[4] if topic[:1] == "$" else fitting[3]
            )
        if res is None:
            if fitting is None:
                keys = [topic]
            elif fitting[2]:  # many shapes at this length: the tree
                keys = [topic, *shapes.walk(topic, topic.split("/"))]
            else:  # one key per shape (MQTT 5 4.7.2: the '$' rule)
                levels = topic.split("/")
                levels += _WILD
                keys = [topic]
                keys += [_join(g(levels)) for g in (fitting[1] if topic[:1] == "$" else fitting[0])]
            clients = None
            gather = _gather
            if gather is not None:
                clients = gather(buckets, keys)
            res = MatchResult(_collect(buckets, keys) if clients is None else clients, {})
        clients = res.clients
        negs = self._negs
        if negs.buckets and (negs.shapes.counts or topic in negs.buckets):
            self._apply_negatives(topic, clients)
        if self._shared:
            _set(res, "shared", self._match_shared(topic))
        return res

    def _apply_negatives(self, topic: str, clients: dict[str, list[Subscription[O]]]) -> None:
        """Per client, drop the subscriptions older than its newest negative entry matching
        ``topic``.  O(applicable negative shapes x levels + matched records)."""
        negs = self._negs
        keys = [topic]
        if negs.shapes.counts:
            keys += negs.shapes.keys(topic, topic.split("/"))
        newest: dict[str, int] = {}
        for key in keys:
            b = negs.buckets.get(key)
            if b is not None:
                for r in _bucket_records(b):
                    if newest.get(r.client_id, -1) < r.seq:
                        newest[r.client_id] = r.seq
        for cid, nseq in newest.items():
            lst = clients.get(cid)
            if lst is not None:
                keep = [r for r in lst if r.seq > nseq]  # type: ignore[attr-defined]
                if keep:
                    clients[cid] = keep
                else:
                    del clients[cid]

    def _match_shared(self, topic: str) -> dict[tuple[str, str], list[tuple[str, O]]]:
        """(group, inner filter) -> members, for the shared subscriptions matching ``topic``:
        each group's list as kept (``_shared_lists``; made again only after the group
        changed).  O(applicable shapes x levels + matched groups)."""
        shared = self._shared
        lists = self._shared_lists
        keys = [topic]
        if self._shared_shapes.counts:
            keys += self._shared_shapes.keys(topic, topic.split("/"))
        out: dict[tuple[str, str], list[tuple[str, O]]] = {}
        for key in keys:
            groups = shared.get(key)
            if groups is not None:
                for group, members in groups.items():
                    gk = (group, key)
                    kept = lists.get(gk)
                    if kept is None:  # the group changed since the last match: O(members) once
                        kept = lists[gk] = [(cid, m.options) for cid, m in members.items()]
                    out[gk] = kept
        return out

    # ------------------------------------------------------------------ invariants
    def _check(self) -> None:  # noqa: C901, PLR0912, PLR0915 (one assertion per invariant)
        """Assert the invariants (O(total size + sum of squared entries per client))."""
        found: dict[tuple[str, str], _Rec] = {}
        for table, kind in ((self._subs, _Sub), (self._negs, _Neg)):
            shapes: dict[_Shape, int] = {}
            for f, b in table.buckets.items():
                validate_filter(f)
                assert not f.startswith(SHARE_PREFIX), f
                if type(b) is tuple:
                    assert 2 <= len(b) <= _TUPLE_MAX, f"bucket {f!r}: a tuple of {len(b)}"
                elif type(b) is dict:
                    assert len(b) > _TUPLE_MAX, f"bucket {f!r}: a dict of {len(b)}"
                    assert all(k == r.client_id for k, r in b.items())
                recs = _bucket_records(b)
                assert len({r.client_id for r in recs}) == len(recs), f"bucket {f!r}: a client twice"
                for r in recs:
                    assert type(r) is kind, f"bucket {f!r}: a {type(r).__name__} among {kind.__name__}"
                    # records are made by _new_sub: with the C module, off the collector's lists
                    assert kind is _Neg or _native is None or not gc.is_tracked(r), (
                        f"bucket {f!r}: a tracked record"
                    )
                    assert r.topic_filter == f, (r.topic_filter, f)
                    found[(r.client_id, f)] = r
                shape = _shape(f)
                if shape is not None:
                    shapes[shape] = shapes.get(shape, 0) + 1
            assert shapes == table.shapes.counts, "wildcard shapes out of step with the filters"
            table.shapes.check({f for f in table.buckets if _shape(f) is not None})
        shapes = {}
        for inner, groups in self._shared.items():
            assert groups, f"shared filter {inner!r} without groups"
            for group, members in groups.items():
                assert members, f"shared group {group!r} without members"
                kept = self._shared_lists.get((group, inner))
                assert kept is None or kept == [(c, m.options) for c, m in members.items()], (group, inner)
                for cid, m in members.items():
                    assert type(m) is _Shared
                    assert m.client_id == cid and m.group == group and m.inner == inner
                    assert m.topic_filter == f"{SHARE_PREFIX}{group}/{inner}"
                    found[(cid, m.topic_filter)] = m
            shape = _shape(inner)
            if shape is not None:
                shapes[shape] = shapes.get(shape, 0) + 1
        for group, inner in self._shared_lists:  # dropped with the group
            assert group in self._shared.get(inner, {}), f"kept members of a gone group {group!r}"
        assert shapes == self._shared_shapes.counts, "shared shapes out of step with the filters"
        self._shared_shapes.check({f for f in self._shared if _shape(f) is not None})
        for cache in (self._subs.shapes, self._negs.shapes, self._shared_shapes):
            for n, cached in list(cache._by_len.items()):
                del cache._by_len[n]
                fresh = cache.for_length(n)
                assert repr(fresh) == repr(cached), f"shapes cached for length {n} are stale"
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
            last = -1
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
        assert not found, f"records under a filter without a client entry: {list(found)[:3]}"
        assert total == self._count
        assert set(self._negatives) <= set(self._clients)


def _records(ents: dict[str, _Rec] | _Rec) -> list[_Rec]:
    """A client's records, oldest first, whether stored as a dict or inline."""
    return list(ents.values()) if type(ents) is dict else [ents]  # type: ignore[list-item]


def _collect(buckets: dict[str, _Bucket], keys: list[str]) -> dict[str, list[Any]]:
    """What ``_gather.gather`` returns, in Python: per client id, its records under ``keys``
    newest first.  O(keys + matched records)."""
    recs: list[Any] = []
    for key in keys:
        b = buckets.get(key)
        if b is not None:
            t = type(b)
            if t is tuple:
                recs.extend(b)  # type: ignore[arg-type]
            elif t is dict:
                recs.extend(b.values())  # type: ignore[union-attr]
            else:
                recs.append(b)
    # one subscription per client: the common case, one comprehension
    clients: dict[str, list[Any]] = {r.client_id: [r] for r in recs}
    if len(clients) != len(recs):  # a client with two or more: newest first
        clients = {}
        for r in recs:
            lst = clients.get(r.client_id)
            if lst is None:
                clients[r.client_id] = [r]
            else:
                lst.append(r)
        for lst in clients.values():
            if len(lst) > 1:
                lst.sort(key=_seq_of, reverse=True)
    return clients


def _seq_of(r: Subscription[Any]) -> int:
    return r.seq  # type: ignore[attr-defined, no-any-return]
