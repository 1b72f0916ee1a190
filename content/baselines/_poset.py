"""Siena's covering poset: the covering-based baseline of seed 003.

Seed 003 (section 4.1) takes "the widely used Poset-based algorithm" as its representative of
covering-based matchers (its ref. [7]: Carzaniga, Rosenblum & Wolf, "Design and evaluation of
a wide-area event notification service", ACM TOCS 19(3), 2001, section 5 / Siena's ``Poset``).
Filters are arranged in a partial order by *covering*: ``f1`` covers ``f2`` when every event
that matches ``f2`` matches ``f1``.  The poset is kept as its Hasse diagram, a DAG whose roots
are the filters no other filter covers; identical (or mutually covering) filters share one
node holding all their subscribers.

* **Insertion** walks down from the roots through the nodes that cover the new filter; the
  deepest such nodes are its immediate *predecessors*.  Below them (from the roots when
  there are none) it then looks for its immediate *successors*, the most general nodes it
  covers, and links predecessors -> new node -> successors, dropping the direct
  predecessor -> successor edges the new node now mediates.  O(n) covering tests in the
  worst case: this is what makes covering structures slow under churn (seed 003, Table 1:
  "typical covering network: O(kn)" per subscription change).
* **Deletion** removes a node whose last subscriber leaves and reconnects each of its
  predecessors to each of its successors unless the successor is still reachable from that
  predecessor through another path (a successor left without a parent becomes a root).
* **Matching** walks from the roots; a node whose filter the event does not match is pruned
  together with everything below it (all of it is covered by it), a matching node adds its
  subscribers and opens its successors.  Each node is evaluated at most once per event.

Covering test (:func:`covers`): *sound*, never complete -- when in doubt it answers "no",
which only costs structure (a missing edge), never an answer.  A filter (DNF) covers another
when each conjunction of the second is covered by some conjunction of the first; a
conjunction covers another when each of its predicates is *implied* by the other's predicates
on the same attribute: identical predicates; value sets pinned by ``=`` / ``IN`` / boolean
``<>`` (every possible value is tested exactly); intervals of ``< <= > >= BETWEEN`` (also
against ``<>`` and ``NOT IN``); prefix / suffix / substring containment and their negations.

Deviations from Siena (docs/content.md, "poset"): siftmq's language is the SQL selector subset
(DNF) rather than Siena's conjunctive filters, hence the conjunction-wise test above.  Two
pruning aids that change no edge: a bitmask of the attributes every conjunction of a filter
reads (a necessary condition for covering: the coverer's mask is a subset of the covered
one's) and, per node, a never-shrinking union of the masks below it, so the successor search
skips subtrees holding nothing the new filter could cover.  The roots' filters are evaluated
in one numpy box test when they are many and all-numeric (the same
:class:`~content._hema_boundary.BoundaryBoxes` hema and betree use); every other node is
evaluated one by one, exactly as the walk reaches it.

Complexity: insert/delete O(n) covering tests worst case (mask-pruned); match O(roots + nodes
reached below matching nodes) filter evaluations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from content._engine import Engine, Event, SubId
from content._filter import Clause, Filter
from content._hema_boundary import BoundaryBoxes, box_of
from content._predicate import Kind, Op, Predicate, Scalar, kind_of

__all__ = ["Poset", "covers"]

_ORDER = (Op.LT, Op.LE, Op.GT, Op.GE)
_ORDER_NE = frozenset({*_ORDER, Op.NE})
_NUMPY_ROOTS = 64  # evaluate the roots with one numpy box test from this many on

Interval = tuple[Any, bool, Any, bool]


class _Attr:
    """What one conjunction says about one attribute, precomputed for covering tests."""

    __slots__ = ("ivs", "pts", "qs")

    def __init__(self, qs: tuple[Predicate, ...]) -> None:
        self.qs = qs
        self.pts = _points(qs)
        self.ivs: dict[Kind, Interval] = {}
        for k in (Kind.NUM, Kind.STR):
            iv = _interval(qs, k)
            if iv is not None:
                self.ivs[k] = iv


ByAttr = dict[str, _Attr]


def _by_attr(clause: Clause) -> ByAttr:
    out: dict[str, list[Predicate]] = {}
    for p in clause:
        out.setdefault(p.attr, []).append(p)
    return {a: _Attr(tuple(ps)) for a, ps in out.items()}


def _points(qs: tuple[Predicate, ...]) -> list[Scalar] | None:
    """The finite set of values ``qs`` allow (None: not pinned to a finite set)."""
    best: list[Scalar] | None = None
    for q in qs:
        if q.op is Op.EQ:
            cand: list[Scalar] = [q.value]  # type: ignore[list-item]
        elif q.op is Op.IN:
            assert isinstance(q.value, frozenset)
            cand = list(q.value)
        elif q.kind is Kind.BOOL and q.op is Op.NE:
            cand = [not q.value]
        else:
            continue
        if best is None or len(cand) < len(best):
            best = cand
    if best is None:
        return None
    return [v for v in best if all(q.test(v) for q in qs)]


def _interval(qs: tuple[Predicate, ...], kind: Kind) -> tuple[Any, bool, Any, bool] | None:
    """(lo, lo strict, hi, hi strict) forced by the order predicates of ``kind`` (None: none)."""
    lo: Any = None
    hi: Any = None
    lo_s = hi_s = False
    seen = False
    for q in qs:
        if q.kind is not kind or q.op not in _ORDER:
            continue
        seen = True
        v = q.value
        if q.op is Op.LT or q.op is Op.LE:
            strict = q.op is Op.LT
            if hi is None or v < hi or (v == hi and strict):
                hi, hi_s = v, strict
        else:
            strict = q.op is Op.GT
            if lo is None or v > lo or (v == lo and strict):
                lo, lo_s = v, strict
    return (lo, lo_s, hi, hi_s) if seen else None


def _below(iv: tuple[Any, bool, Any, bool], t: Any) -> bool:
    """Every value of the interval is < t."""
    hi, hi_s = iv[2], iv[3]
    return hi is not None and (hi < t or (hi == t and hi_s))


def _above(iv: tuple[Any, bool, Any, bool], t: Any) -> bool:
    lo, lo_s = iv[0], iv[1]
    return lo is not None and (lo > t or (lo == t and lo_s))


def _implied(info: _Attr, p: Predicate) -> bool:  # noqa: C901, PLR0912 (one case per operator pair)
    """Sound test: every value satisfying all of ``info.qs`` (one attribute) satisfies ``p``."""
    pts = info.pts
    if pts is not None:
        return all(p.test(v) for v in pts)
    op, t = p.op, p.value
    if op in _ORDER_NE and (iv := info.ivs.get(p.kind)) is not None:
        if op is Op.LT:
            got = _below(iv, t)
        elif op is Op.LE:
            got = iv[2] is not None and iv[2] <= t
        elif op is Op.GT:
            got = _above(iv, t)
        elif op is Op.GE:
            got = iv[0] is not None and iv[0] >= t
        else:
            got = _below(iv, t) or _above(iv, t)
        if got:
            return True
    qs = info.qs
    if p in qs:
        return True
    if op is Op.NOT_IN:
        assert isinstance(t, frozenset)
        kinds = {kind_of(m) for m in t}
        if len(kinds) == 1:
            (k,) = kinds
            if k is Kind.NUM or k is Kind.STR:
                iv2 = info.ivs.get(k)
                if iv2 is not None:
                    return all(_below(iv2, m) or _above(iv2, m) for m in t)
        return False
    if not isinstance(t, str):
        return False
    for q in qs:
        y = q.value
        if not isinstance(y, str):
            continue
        if op is Op.PREFIX and q.op is Op.PREFIX and y.startswith(t):
            return True
        if op is Op.SUFFIX and q.op is Op.SUFFIX and y.endswith(t):
            return True
        if op is Op.CONTAINS and q.op in (Op.PREFIX, Op.SUFFIX, Op.CONTAINS) and t in y:
            return True
        if op is Op.NOT_PREFIX and q.op is Op.NOT_PREFIX and t.startswith(y):
            return True
        if op is Op.NOT_SUFFIX and q.op is Op.NOT_SUFFIX and t.endswith(y):
            return True
        if op is Op.NOT_CONTAINS and q.op is Op.NOT_CONTAINS and y in t:
            return True
    return False


def _clause_covers(c1: Clause, by2: ByAttr) -> bool:
    """Conjunction ``c1`` covers the conjunction whose predicates by attribute are ``by2``."""
    for p in c1:
        info = by2.get(p.attr)
        if info is None or not _implied(info, p):
            return False
    return True


def covers(f1: Filter, f2: Filter) -> bool:
    """Sound covering test: True only if every event matching ``f2`` matches ``f1``."""
    return all(any(_clause_covers(c1, by2) for c1 in f1.clauses) for by2 in map(_by_attr, f2.clauses))


class _Node:
    """One poset element: a filter, its subscribers, and its Hasse-diagram neighbours."""

    __slots__ = ("box", "by", "children", "filter", "mask", "nid", "parents", "slot", "subs", "union")

    def __init__(self, nid: int, f: Filter, mask: int) -> None:
        self.nid = nid
        self.filter = f
        self.by = [_by_attr(c) for c in f.clauses]
        self.subs: set[SubId] = set()
        self.parents: dict[_Node, None] = {}
        self.children: dict[_Node, None] = {}
        self.mask = mask  # attributes every conjunction reads
        self.union = mask  # superset of the masks of this node and everything below it
        self.slot = -1  # BoundaryBoxes slot (single all-numeric conjunction)
        box = box_of(f.clauses[0]) if len(f.clauses) == 1 else None
        self.box = tuple((a, lo, hi) for a, (lo, hi) in box.items()) if box is not None else None

    def matches(self, event: Event, get: Callable[[str], object]) -> bool:
        box = self.box
        if box is None:
            return self.filter.matches(event)
        for a, lo, hi in box:
            v = get(a)
            t = type(v)
            if t is not float and t is not int and (t is bool or not isinstance(v, int | float)):
                return False
            if not lo <= v <= hi:  # type: ignore[operator]
                return False
        return True


class Poset(Engine):
    """Siena's covering poset over whole filters; see the module docstring."""

    name = "poset"

    def __init__(self) -> None:
        super().__init__()
        self._nodes: dict[tuple[Clause, ...], _Node] = {}
        self._node_of: dict[SubId, _Node] = {}
        self._roots: dict[_Node, None] = {}
        self._bits: dict[str, int] = {}
        self._next = 0
        self._boxes = BoundaryBoxes()
        self._by_nid: dict[int, _Node] = {}
        self._root_slots: dict[int, None] = {}  # slots of the boxed roots
        self._root_other: dict[_Node, None] = {}  # the other roots
        self._root_arr: np.ndarray[Any, np.dtype[np.intp]] | None = None
        self.tests = 0  # covering tests run (for the benchmarks' structure column)

    # -- covering ------------------------------------------------------------------------

    def _mask(self, f: Filter) -> int:
        m = -1
        for c in f.clauses:
            cm = 0
            for p in c:
                bit = self._bits.get(p.attr)
                if bit is None:
                    bit = self._bits[p.attr] = 1 << len(self._bits)
                cm |= bit
            m &= cm
        return m

    def _covers(self, a: _Node, b: _Node) -> bool:
        return not a.mask & ~b.mask and self._covers_full(a, b)

    def _covers_full(self, a: _Node, b: _Node) -> bool:
        """The covering test proper (the caller checked the masks)."""
        self.tests += 1
        return all(any(_clause_covers(c1, by2) for c1 in a.filter.clauses) for by2 in b.by)

    # -- insertion -----------------------------------------------------------------------

    def _insert(self, sub_id: SubId, f: Filter) -> None:
        node = self._nodes.get(f.clauses)
        if node is None:
            node = self._place(f)
        node.subs.add(sub_id)
        self._node_of[sub_id] = node

    def _place(self, f: Filter) -> _Node:  # noqa: C901, PLR0912 (Siena insertion: predecessors and successors in one walk)
        new = _Node(self._next, f, self._mask(f))
        # predecessors: the deepest nodes covering f, walking down from the roots
        preds: list[_Node] = []
        seen: set[_Node] = set()
        m = new.mask
        full = self._covers_full
        stack = [r for r in self._roots if not r.mask & ~m and full(r, new)]
        cover_memo: dict[_Node, bool] = {}
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if self._covers(new, n):
                return n  # equivalent filters share one node
            deeper = False
            for c in n.children:
                got = cover_memo.get(c)
                if got is None:
                    got = cover_memo[c] = self._covers(c, new)
                if got:
                    deeper = True
                    stack.append(c)
            if not deeper:
                preds.append(n)
        # successors: the most general nodes f covers, below the predecessors
        strict = _ancestors([q for p in preds for q in p.parents])  # strictly above a predecessor
        above = strict | set(preds)  # every node known to cover f
        succs: list[_Node] = []
        start: Iterable[_Node] = (c for p in preds for c in p.children) if preds else self._roots
        stack = list(start)
        seen = set()
        while stack:
            n = stack.pop()
            if n in seen or n in above:
                continue
            seen.add(n)
            if m & ~n.union:
                continue  # nothing below n reads every attribute f needs
            if not m & ~n.mask and full(new, n):
                if self._covers(n, new):
                    return n
                succs.append(n)
            else:
                stack.extend(n.children)
        if len(succs) > 1:  # a successor below another successor is implied by it
            succ_set = set(succs)
            succs = [s for s in succs if not _ancestors(list(s.parents)) & succ_set]
        # link
        self._next += 1
        self._nodes[f.clauses] = new
        self._by_nid[new.nid] = new
        if new.box is not None:
            new.slot = self._boxes.add(new.nid, dict((a, (lo, hi)) for a, lo, hi in new.box))
        for s in succs:
            new.union |= s.union
            for q in list(s.parents):
                if q in above:  # q -> s now runs through the new node: keep the Hasse diagram
                    _unlink(q, s)
            _link(new, s)
            self._unroot(s)
        preds = [p for p in preds if p not in strict]  # a predecessor above another is implied
        for p in preds:
            _link(p, new)
        if not preds:
            self._root(new)
        _raise_union(new)
        return new

    def _root(self, n: _Node) -> None:
        self._roots[n] = None
        if n.slot >= 0:
            self._root_slots[n.slot] = None
            self._root_arr = None
        else:
            self._root_other[n] = None

    def _unroot(self, n: _Node) -> None:
        if self._roots.pop(n, 0) is None:
            if n.slot >= 0:
                del self._root_slots[n.slot]
                self._root_arr = None
            else:
                del self._root_other[n]

    # -- deletion ------------------------------------------------------------------------

    def _delete(self, sub_id: SubId, f: Filter) -> None:
        n = self._node_of.pop(sub_id)
        n.subs.discard(sub_id)
        if n.subs:
            return
        del self._nodes[n.filter.clauses]
        del self._by_nid[n.nid]
        self._unroot(n)
        if n.slot >= 0:
            self._boxes.remove(n.slot)
        parents = list(n.parents)
        children = list(n.children)
        for p in parents:
            _unlink(p, n)
        for c in children:
            _unlink(n, c)
        for c in children:
            for p in parents:
                if not _reaches(p, c):
                    _link(p, c)
            if not c.parents:
                self._root(c)

    # -- matching ------------------------------------------------------------------------

    def match(self, event: Event) -> set[SubId]:
        get = event.get
        out: set[SubId] = set()
        seen: set[_Node] = set()
        stack: list[_Node] = []
        roots = self._roots
        if len(self._root_slots) >= _NUMPY_ROOTS and (hits := self._root_hits(event)) is not None:
            by_nid = self._by_nid
            for nid in hits:
                n = by_nid[nid]
                seen.add(n)
                out |= n.subs
                stack.extend(n.children)
            stack.extend(self._root_other)
        else:
            stack.extend(roots)
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n.matches(event, get):
                out |= n.subs
                stack.extend(n.children)
        return out

    def _root_hits(self, event: Event) -> list[int] | None:
        """Node ids of the boxed roots the event matches (None: not vectorisable)."""
        ev = self._boxes.event_vector(event)
        if ev is None:
            return None
        arr = self._root_arr
        if arr is None:
            arr = self._root_arr = np.fromiter(self._root_slots, dtype=np.intp, count=len(self._root_slots))
        parts: list[np.ndarray[Any, np.dtype[np.int64]]] = []
        sink: set[SubId] = set()
        self._boxes.test(arr, ev[0], ev[1], sink, parts)
        assert not sink  # node ids are ints
        return [nid for part in parts for nid in part.tolist()]

    # -- introspection -------------------------------------------------------------------

    def explain(self, event: Event) -> dict[str, int]:
        """What the walk for ``event`` does: nodes evaluated, edges followed, matching nodes."""
        get = event.get
        seen: set[_Node] = set()
        stack = list(self._roots)
        evaluated = edges = hits = 0
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            evaluated += 1
            if n.matches(event, get):
                hits += 1
                edges += len(n.children)
                stack.extend(n.children)
        return {"evaluated": evaluated, "edges_followed": edges, "matching_nodes": hits}

    def redundant_edges(self) -> int:
        """Edges p -> c where c is also reachable from p through another child (not Hasse)."""
        count = 0
        for p in self._nodes.values():
            below: set[_Node] = set()
            stack = [g for c in p.children for g in c.children]
            while stack:
                n = stack.pop()
                if n not in below:
                    below.add(n)
                    stack.extend(n.children)
            count += sum(1 for c in p.children if c in below)
        return count

    @property
    def stats(self) -> dict[str, int]:
        edges = sum(len(n.children) for n in self._nodes.values())
        return {"nodes": len(self._nodes), "roots": len(self._roots), "edges": edges}

    def _check(self) -> None:
        super()._check()
        self._boxes._check()
        nodes = set(self._nodes.values())
        assert set(self._by_nid.values()) == nodes
        assert {n for n in nodes if not n.parents} == set(self._roots)
        assert set(self._root_slots) == {n.slot for n in self._roots if n.slot >= 0}
        assert set(self._root_other) == {n for n in self._roots if n.slot < 0}
        assert set(self._node_of) == set(self._filters)
        for sid, n in self._node_of.items():
            assert sid in n.subs and n in nodes and self._nodes[n.filter.clauses] is n
            f = self._filters[sid]
            assert f.clauses == n.filter.clauses or (covers(f, n.filter) and covers(n.filter, f))
        for key, n in self._nodes.items():
            assert n.filter.clauses == key and n.subs
            assert n.mask == self._mask(n.filter)
            if n.slot >= 0:
                assert self._boxes.sids[n.slot] == n.nid
            for c in n.children:
                assert n in c.parents and c in nodes
                assert covers(n.filter, c.filter), "every edge is a covering"
                assert n.union & c.union == c.union
            for p in n.parents:
                assert n in p.children
        # acyclic: a topological order exists
        indeg = {n: len(n.parents) for n in nodes}
        ready = [n for n, d in indeg.items() if d == 0]
        done = 0
        while ready:
            n = ready.pop()
            done += 1
            for c in n.children:
                indeg[c] -= 1
                if indeg[c] == 0:
                    ready.append(c)
        assert done == len(nodes), "the covering graph has a cycle"


def _link(p: _Node, c: _Node) -> None:
    p.children[c] = None
    c.parents[p] = None


def _unlink(p: _Node, c: _Node) -> None:
    del p.children[c]
    del c.parents[p]


def _ancestors(nodes: list[_Node]) -> set[_Node]:
    out: set[_Node] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if n not in out:
            out.add(n)
            stack.extend(n.parents)
    return out


def _reaches(p: _Node, c: _Node) -> bool:
    """Is ``p`` an ancestor of ``c`` (searched upwards from c's parents)?"""
    stack = list(c.parents)
    seen: set[_Node] = set()
    while stack:
        n = stack.pop()
        if n is p:
            return True
        if n not in seen:
            seen.add(n)
            stack.extend(n.parents)
    return False


def _raise_union(n: _Node) -> None:
    """Add ``n``'s union mask to its ancestors (stopping where it is already included)."""
    stack = list(n.parents)
    u = n.union
    while stack:
        a = stack.pop()
        if a.union | u != a.union:
            a.union |= u
            stack.extend(a.parents)
