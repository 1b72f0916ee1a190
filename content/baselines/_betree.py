"""BE-Tree: the index-based baseline of seed 003 (Sadoghi & Jacobsen, SIGMOD 2011).

Seed 003 (section 4.1) measures HEMA against "the best index-based matcher, BE-Tree" (its
ref. [12]).  BE-Tree indexes Boolean expressions (conjunctions of attribute predicates) over
a high-dimensional discrete space by a *two-phase space cutting*:

* **space partitioning** (p-directory, p-nodes): an overflowing leaf node (l-node) of a
  c-node chooses the attribute most popular among its expressions (highest *score*: the
  number of expressions that constrain it) that no ancestor has used yet, creates a p-node
  for it and moves every expression on that attribute under it;
* **space clustering** (c-directory, buckets): a p-node owns a binary c-directory over its
  attribute's domain.  An expression sits in the *smallest bucket that encloses* the value
  interval its predicates allow on that attribute; an overflowing leaf bucket is *split in
  half* and the expressions that fit a half move down.  Every bucket owns a c-node (an
  l-node plus, recursively, its own p-directory), so the two phases alternate down the tree.

Insertion follows the same path: at a c-node, the expression goes to the existing p-node of
its attributes with the highest score (adaptive: the scores follow the workload), then to
the smallest enclosing bucket; with no such p-node it lands in the c-node's l-node, and an
overflow partitions (root c-node, inner or atomic bucket) or clusters (leaf bucket).  Full
l-nodes that cannot be cut further get a larger capacity (the paper's capacity rule).
Deletion removes the expression from its l-node (found through a back pointer instead of a
second descent) and prunes every node that became empty, bottom up; no rebuild.

Matching visits the root c-node and, for every p-node whose attribute the event carries with
the right type, the buckets on the path that contains the event's value (exactly one child
per level: the halves partition their parent), collecting the expressions of each visited
l-node as candidates.  BE-Tree then evaluates the candidates.

How siftmq's filters map onto it (docs/content.md, "betree", lists the deviations):

* every conjunction (clause) of a DNF :class:`~content._filter.Filter` is one expression; a
  subscription matches when one of its expressions does;
* a *dimension* is (attribute, type family): numbers, strings and booleans of one attribute
  live in separate p-nodes (a number never satisfies a string predicate);
* the interval of an expression on a dimension is the intersection of what its indexable
  predicates allow (``= < <= > >= BETWEEN``, ``IN`` with members of one type, a non-empty
  ``LIKE 'p%'`` prefix, boolean ``=``/``<>``), as a closed superset.  Everything else (``<>``,
  ``NOT IN``, other ``LIKE`` forms, ...) only restricts which events match, so candidates are
  always verified against the whole conjunction: answers are exact for the whole language;
* domains: the paper assumes a known finite domain per attribute.  Here a p-node's root
  bucket spans the whole line; its split points halve a nominal domain taken from the
  finite interval ends of the expressions present when the p-node is created, and the two
  edge buckets of every level stay open towards -inf / +inf (as in the authors' C code's
  open left/right bounds), so any later value still has exactly one bucket per level.
  String dimensions have no midpoint: a string bucket splits at the median interval end of
  its expressions (population halving).  A bucket whose expressions all have the same
  interval is atomic (no split separates them);
* verification: the candidates whose conjunction is all-numeric ranges are tested as boxes
  in one numpy step (:class:`~content._hema_boundary.BoundaryBoxes`, the structure hema's
  Mlist uses), the others predicate by predicate.

Complexity (n expressions, k dimensions, capacity A): insert O(k log n) descent plus the
amortised splits (each split moves at most the l-node's A expressions); delete O(depth);
match O(visited c-nodes + candidates * k), where the visited c-nodes are at most one bucket
path per p-node reached.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from content._engine import Engine, Event, SubId
from content._filter import Clause, Filter
from content._hema_boundary import BoundaryBoxes, box_of
from content._predicate import Kind, Op, Predicate, kind_of

__all__ = ["BETree"]

Key = Any  # float (numbers, booleans as 0.0 / 1.0) or str
Dim = tuple[str, Kind]
Interval = tuple[Key | None, Key | None]  # closed [lo, hi]; None = unbounded

_TYPE_KIND: dict[type, Kind] = {int: Kind.NUM, float: Kind.NUM, str: Kind.STR, bool: Kind.BOOL}


def _succ(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix`` (None: none)."""
    chars = list(prefix)
    while chars:
        c = ord(chars[-1])
        if c < 0x10FFFF:
            chars[-1] = chr(c + 1)
            return "".join(chars)
        chars.pop()
    return None


def _pred_interval(p: Predicate) -> tuple[Dim, Interval] | None:
    """The dimension and closed value interval (a superset) ``p`` allows, or None."""
    op, v, kind = p.op, p.value, p.kind
    if kind is Kind.NUM or kind is Kind.STR:
        if op is Op.EQ:
            return (p.attr, kind), (v, v)
        if op is Op.LT or op is Op.LE:
            return (p.attr, kind), (None, v)
        if op is Op.GT or op is Op.GE:
            return (p.attr, kind), (v, None)
        if op is Op.PREFIX and isinstance(v, str) and v:
            return (p.attr, kind), (v, _succ(v))
        return None
    if kind is Kind.BOOL:
        if op is Op.EQ:
            x = 1.0 if v else 0.0
        elif op is Op.NE:
            x = 0.0 if v else 1.0
        else:
            return None
        return (p.attr, Kind.BOOL), (x, x)
    if kind is Kind.SET and op is Op.IN and isinstance(v, frozenset) and v:
        kinds = {kind_of(m) for m in v}
        if len(kinds) != 1:
            return None
        (mk,) = kinds
        if mk is Kind.BOOL:
            keys: list[Key] = [1.0 if m else 0.0 for m in v]
        elif mk is Kind.NUM or mk is Kind.STR:
            keys = list(v)
        else:
            return None
        assert mk is not None
        return (p.attr, mk), (min(keys), max(keys))
    return None


def _intervals(clause: Clause) -> dict[Dim, Interval]:
    """Per dimension the intersection of the intervals of the clause's indexable predicates."""
    out: dict[Dim, Interval] = {}
    for p in clause:
        got = _pred_interval(p)
        if got is None:
            continue
        dim, (lo, hi) = got
        if dim in out:
            lo0, hi0 = out[dim]
            lo = lo0 if lo is None else (lo if lo0 is None else max(lo0, lo))
            hi = hi0 if hi is None else (hi if hi0 is None else min(hi0, hi))
        out[dim] = (lo, hi)
    return out


class _Expr:
    """One indexed conjunction: its subscription, predicates, intervals and place."""

    __slots__ = ("clause", "cnode", "iv", "sid", "slot")

    def __init__(self, sid: SubId, clause: Clause) -> None:
        self.sid = sid
        self.clause = clause
        self.iv = _intervals(clause)
        self.cnode: _CNode | None = None
        self.slot = -1  # BoundaryBoxes slot when the clause is an all-numeric box

    def check(self, get: Callable[[str], object]) -> bool:
        return all(p.test(get(p.attr)) for p in self.clause)


class _CNode:
    """A c-node: an l-node (its expressions) and a p-directory (dimension -> p-node)."""

    __slots__ = ("cap", "exprs", "other", "parent", "pdir", "slots", "used")

    def __init__(self, parent: _Bucket | None, used: frozenset[Dim], cap: int) -> None:
        self.parent = parent
        self.used = used  # dimensions partitioned on the path from the root
        self.cap = cap  # l-node capacity (grows when the l-node cannot be cut)
        self.exprs: dict[_Expr, None] = {}
        self.slots = array("q")  # box slots of the boxed expressions (gathered at match)
        self.other: list[_Expr] = []  # the expressions verified predicate by predicate
        self.pdir: dict[Dim, _PNode] = {}

    def empty(self) -> bool:
        return not self.exprs and not self.pdir


class _PNode:
    """A p-node: one dimension, its c-directory (root bucket) and its score."""

    __slots__ = ("attr", "cap", "count", "dim", "kind", "parent", "root")

    def __init__(self, parent: _CNode, dim: Dim, root_bounds: tuple[float, float] | None, cap: int) -> None:
        self.parent = parent
        self.dim = dim
        self.attr, self.kind = dim
        self.count = 0  # expressions below: the popularity score
        self.cap = cap
        self.root = _Bucket(self, None, None, None, root_bounds, parent.used | {dim}, cap)


class _Bucket:
    """A c-directory bucket: values in [lo, hi) (None = open), a c-node, two halves."""

    __slots__ = ("cnode", "hi", "left", "lo", "mid", "nominal", "parent", "pnode", "right")

    def __init__(  # noqa: PLR0917 (private node record)
        self,
        pnode: _PNode,
        parent: _Bucket | None,
        lo: Key | None,
        hi: Key | None,
        nominal: tuple[float, float] | None,
        used: frozenset[Dim],
        cap: int,
    ) -> None:
        self.pnode = pnode
        self.parent = parent
        self.lo = lo
        self.hi = hi
        self.nominal = nominal  # numeric dimensions: the range whose half is the split point
        self.mid: Key | None = None  # split point once split; children may be pruned (None)
        self.left: _Bucket | None = None
        self.right: _Bucket | None = None
        self.cnode = _CNode(self, used, cap)

    def encloses(self, iv: Interval) -> bool:
        lo, hi = iv
        if self.lo is not None and (lo is None or lo < self.lo):
            return False
        return self.hi is None or (hi is not None and hi < self.hi)

    def child(self, left: bool) -> _Bucket:
        """The left / right half, created (again) when missing."""
        got = self.left if left else self.right
        if got is None:
            mid = self.mid
            assert mid is not None
            if self.nominal is not None:
                a, b = self.nominal
                nominal = (a, float(mid)) if left else (float(mid), b)
            else:
                nominal = None
            used = self.cnode.used
            cap = self.pnode.cap
            if left:
                got = self.left = _Bucket(self.pnode, self, self.lo, mid, nominal, used, cap)
            else:
                got = self.right = _Bucket(self.pnode, self, mid, self.hi, nominal, used, cap)
        return got

    def is_leaf(self) -> bool:
        return self.mid is None


def _split_point(b: _Bucket, exprs: list[_Expr]) -> Key | None:
    """Where to halve leaf bucket ``b`` holding ``exprs`` (None: atomic, no useful split)."""
    dim = b.pnode.dim
    ivs = [e.iv[dim] for e in exprs]
    if all(iv == ivs[0] for iv in ivs):
        return None  # identical intervals: no split separates them
    if b.nominal is not None:
        a, z = b.nominal
        mid = a + (z - a) / 2
        if not (a < mid < z) or not math.isfinite(mid):
            return None
        return mid
    ends = sorted(x for iv in ivs for x in iv if x is not None)
    if not ends:
        return None
    mid = ends[len(ends) // 2]
    if (b.lo is not None and not b.lo < mid) or (b.hi is not None and not mid < b.hi):
        return None
    return mid


class BETree(Engine):
    """BE-Tree (SIGMOD 2011) over the clauses of every filter; see the module docstring.

    ``capacity`` is the l-node capacity A; ``min_partition`` the fewest expressions on one
    attribute for which space partitioning creates a p-node.
    """

    name = "betree"
    capacity: ClassVar[int] = 16
    min_partition: ClassVar[int] = 4

    def __init__(self) -> None:
        super().__init__()
        self._root = _CNode(None, frozenset(), self.capacity)
        self._exprs: dict[SubId, list[_Expr]] = {}
        self._boxes = BoundaryBoxes()
        self._slot_expr: dict[int, _Expr] = {}

    # -- insertion -----------------------------------------------------------------------

    def _insert(self, sub_id: SubId, f: Filter) -> None:
        exprs = []
        for clause in f.clauses:
            e = _Expr(sub_id, clause)
            box = box_of(clause)
            if box is not None:
                e.slot = self._boxes.add(sub_id, box)
                self._slot_expr[e.slot] = e
            exprs.append(e)
            self._insert_at(e, self._root)
        self._exprs[sub_id] = exprs

    def _insert_at(self, e: _Expr, c: _CNode) -> None:
        while True:
            best: _PNode | None = None
            pdir = c.pdir
            if pdir:
                for dim in e.iv:
                    p = pdir.get(dim)
                    if p is not None and (best is None or p.count > best.count):
                        best = p
            if best is None:
                break
            best.count += 1
            c = _descend(best.root, e.iv[best.dim]).cnode
        _put(e, c)
        if len(c.exprs) > c.cap:
            self._overflow(c)

    def _overflow(self, c: _CNode) -> None:
        b = c.parent
        if b is None or not b.is_leaf():
            self._partition(c)
        else:
            self._cluster(b)

    def _partition(self, c: _CNode) -> None:
        """Space partitioning: move the expressions of the best unused dimension to a p-node."""
        while len(c.exprs) > c.cap:
            counts: dict[Dim, int] = {}
            for e in c.exprs:
                for dim in e.iv:
                    if dim not in c.used:
                        counts[dim] = counts.get(dim, 0) + 1
            if not counts:
                break
            dim = max(counts, key=lambda d: (counts[d], d[0], d[1].value))
            if counts[dim] < self.min_partition:
                break
            movers = [e for e in c.exprs if dim in e.iv]
            nominal = None
            if dim[1] is not Kind.STR:
                ends = [float(x) for e in movers for x in e.iv[dim] if x is not None]
                nominal = (min(ends), max(ends))
            assert dim not in c.pdir
            p = c.pdir[dim] = _PNode(c, dim, nominal, self.capacity)
            for e in movers:
                _take(e, c)
                p.count += 1
                _put(e, p.root.cnode)
            self._cluster(p.root)
        _grow_cap(c, self.capacity)

    def _cluster(self, b: _Bucket) -> None:
        """Space clustering: split an overflowing leaf bucket in half, recursively."""
        c = b.cnode
        if len(c.exprs) <= c.cap:
            return
        if not b.is_leaf():
            self._partition(c)
            return
        dim = b.pnode.dim
        mid = _split_point(b, list(c.exprs))
        if mid is None:  # atomic bucket: cut along another attribute instead
            self._partition(c)
            return
        b.mid = mid
        left, right = b.child(True), b.child(False)
        for e in list(c.exprs):
            lo, hi = e.iv[dim]
            if hi is not None and hi < mid:
                _take(e, c)
                _put(e, left.cnode)
            elif lo is not None and lo >= mid:
                _take(e, c)
                _put(e, right.cnode)
        if len(c.exprs) > c.cap:
            self._partition(c)
        else:
            _grow_cap(c, self.capacity)
        self._cluster(left)
        self._cluster(right)
        _prune(left)
        _prune(right)

    # -- deletion ------------------------------------------------------------------------

    def _delete(self, sub_id: SubId, f: Filter) -> None:
        for e in self._exprs.pop(sub_id):
            if e.slot >= 0:
                self._boxes.remove(e.slot)
                del self._slot_expr[e.slot]
            c = e.cnode
            assert c is not None
            _take(e, c)
            while c.parent is not None:
                b = c.parent
                p = b.pnode
                p.count -= 1
                _prune(b)
                c = p.parent

    # -- matching ------------------------------------------------------------------------

    def match(self, event: Event) -> set[SubId]:
        get = event.get
        slots = array("q")
        other: list[_Expr] = []
        stack = [self._root]
        type_kind = _TYPE_KIND
        while stack:
            c = stack.pop()
            if c.slots:
                slots += c.slots
            if c.other:
                other += c.other
            for p in c.pdir.values():
                v = get(p.attr)
                if v is None:
                    continue
                k = type_kind.get(type(v)) or kind_of(v)
                if k is not p.kind:
                    continue
                if k is Kind.BOOL:
                    v = 1.0 if v else 0.0
                b: _Bucket | None = p.root
                while b is not None:
                    bc = b.cnode
                    if bc.exprs or bc.pdir:
                        stack.append(bc)
                    mid = b.mid
                    if mid is None:
                        break
                    b = b.left if v < mid else b.right
        out: set[SubId] = set()
        if slots:
            self._verify_boxes(event, slots, out)
        for e in other:
            if e.sid not in out and e.check(get):
                out.add(e.sid)
        return out

    def _verify_boxes(self, event: Event, slots: array[int], out: set[SubId]) -> None:
        boxes = self._boxes
        ev = boxes.event_vector(event)
        if ev is None:  # a number numpy cannot hold exactly: verify in Python
            get = event.get
            exprs = self._slot_expr
            for s in slots:
                e = exprs[s]
                if e.sid not in out and e.check(get):
                    out.add(e.sid)
            return
        int_parts: list[np.ndarray[Any, np.dtype[np.int64]]] = []
        boxes.test(
            np.frombuffer(slots, dtype=np.int64).astype(np.intp, copy=False), ev[0], ev[1], out, int_parts
        )
        for part in int_parts:
            out.update(part.tolist())

    # -- introspection -------------------------------------------------------------------

    def explain(self, event: Event) -> dict[str, int]:
        """What matching ``event`` visits: c-nodes, bucket steps, candidate expressions."""
        get = event.get
        cnodes = steps = cands = 0
        stack = [self._root]
        while stack:
            c = stack.pop()
            cnodes += 1
            cands += len(c.exprs)
            for p in c.pdir.values():
                v = get(p.attr)
                k = _TYPE_KIND.get(type(v)) or kind_of(v)
                if k is not p.kind:
                    continue
                if k is Kind.BOOL:
                    v = 1.0 if v else 0.0
                b: _Bucket | None = p.root
                while b is not None:
                    steps += 1
                    if not b.cnode.empty():
                        stack.append(b.cnode)
                    if b.mid is None:
                        break
                    b = b.left if v < b.mid else b.right
        return {"cnodes": cnodes, "bucket_steps": steps, "candidates": cands}

    def placement(self) -> dict[str, int]:
        """Where the expressions sit: root l-node, a p-node's root bucket (straddling its first
        split), or a deeper bucket."""
        out = {"root_lnode": len(self._root.exprs), "top_bucket": 0, "deeper_bucket": 0}
        for exprs in self._exprs.values():
            for e in exprs:
                c = e.cnode
                assert c is not None
                if c.parent is not None:
                    out["top_bucket" if c.parent.parent is None else "deeper_bucket"] += 1
        return out

    @property
    def stats(self) -> dict[str, int]:
        """Node counts: c-nodes, p-nodes, buckets, expressions in the root l-node, depth."""
        cn = pn = bu = depth = 0
        todo: list[tuple[_CNode, int]] = [(self._root, 0)]
        while todo:
            c, d = todo.pop()
            cn += 1
            depth = max(depth, d)
            for p in c.pdir.values():
                pn += 1
                bs = [p.root]
                while bs:
                    b = bs.pop()
                    bu += 1
                    todo.append((b.cnode, d + 1))
                    bs.extend(x for x in (b.left, b.right) if x is not None)
        return {
            "cnodes": cn,
            "pnodes": pn,
            "buckets": bu,
            "root_exprs": len(self._root.exprs),
            "depth": depth,
        }

    def _check(self) -> None:
        super()._check()
        self._boxes._check()
        seen: set[_Expr] = set()
        self._check_cnode(self._root, None, frozenset(), seen)
        listed = {e for exprs in self._exprs.values() for e in exprs}
        assert seen == listed
        assert set(self._exprs) == set(self._filters)
        for sid, exprs in self._exprs.items():
            assert [e.clause for e in exprs] == list(self._filters[sid].clauses)
            for e in exprs:
                assert e.sid == sid
                if e.slot >= 0:
                    assert self._slot_expr[e.slot] is e and self._boxes.sids[e.slot] == sid
                else:
                    assert box_of(e.clause) is None
        assert len(self._slot_expr) == len(self._boxes)

    def _check_cnode(self, c: _CNode, parent: _Bucket | None, used: frozenset[Dim], seen: set[_Expr]) -> int:
        """Assert the invariants below ``c``; returns the number of expressions there."""
        assert c.parent is parent and c.used == used
        assert len(c.exprs) <= c.cap, (len(c.exprs), c.cap)
        assert sorted(c.slots) == sorted(e.slot for e in c.exprs if e.slot >= 0)
        assert set(c.other) == {e for e in c.exprs if e.slot < 0} and len(c.other) == len(set(c.other))
        for e in c.exprs:
            assert e.cnode is c and e not in seen
            seen.add(e)
            assert not (set(e.iv) & set(c.pdir)), "an l-node expression belongs in a p-node"
            _check_on_path(e, c)
        n = len(c.exprs)
        for dim, p in c.pdir.items():
            assert p.dim == dim and p.parent is c and dim not in used
            below = self._check_bucket(p.root, p, None, used | {dim}, seen)
            assert below == p.count > 0
            n += below
        return n

    def _check_bucket(
        self, b: _Bucket, p: _PNode, parent: _Bucket | None, used: frozenset[Dim], seen: set[_Expr]
    ) -> int:
        assert b.pnode is p and b.parent is parent
        if parent is None:
            assert b.lo is None and b.hi is None
        n = self._check_cnode(b.cnode, b, used, seen)
        if b.mid is None:
            assert b.left is None and b.right is None
        else:
            assert (b.lo is None or b.lo < b.mid) and (b.hi is None or b.mid < b.hi)
            if b.left is not None:
                assert b.left.lo == b.lo and b.left.hi == b.mid
                n += self._check_bucket(b.left, p, b, used, seen)
            if b.right is not None:
                assert b.right.lo == b.mid and b.right.hi == b.hi
                n += self._check_bucket(b.right, p, b, used, seen)
        assert n > 0, "empty buckets are pruned"
        return n


def _check_on_path(e: _Expr, c: _CNode) -> None:
    """Every bucket above ``e`` encloses its interval on the bucket's dimension."""
    b = c.parent
    while b is not None:
        iv = e.iv.get(b.pnode.dim)
        assert iv is not None and b.encloses(iv), (iv, b.lo, b.hi)
        b = b.pnode.parent.parent if b.parent is None else b.parent


def _descend(b: _Bucket, iv: Interval) -> _Bucket:
    """The smallest bucket below ``b`` (inclusive) that encloses ``iv``."""
    lo, hi = iv
    while b.mid is not None:
        if hi is not None and hi < b.mid:
            b = b.child(True)
        elif lo is not None and lo >= b.mid:
            b = b.child(False)
        else:
            break
    return b


def _put(e: _Expr, c: _CNode) -> None:
    c.exprs[e] = None
    e.cnode = c
    if e.slot >= 0:
        c.slots.append(e.slot)
    else:
        c.other.append(e)


def _take(e: _Expr, c: _CNode) -> None:
    del c.exprs[e]
    if e.slot >= 0:
        c.slots.remove(e.slot)
    else:
        c.other.remove(e)
    e.cnode = None


def _grow_cap(c: _CNode, base: int) -> None:
    """The paper's capacity rule: an l-node that stays full gets room in steps of A."""
    c.cap = max(base, -(-len(c.exprs) // base) * base)


def _prune(b: _Bucket) -> None:
    """Remove ``b`` and its ancestors while they hold nothing (and the p-node if empty)."""
    cur: _Bucket | None = b
    while cur is not None and cur.left is None and cur.right is None and cur.cnode.empty():
        up = cur.parent
        if up is None:
            p = cur.pnode
            del p.parent.pdir[p.dim]
            return
        if up.left is cur:
            up.left = None
        else:
            up.right = None
        cur = up
