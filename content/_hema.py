"""HEMA: the hybrid event matching algorithm of seed 003 (You Tao, Acta Electronica Sinica 2015).

The paper (``003_fac3609301ef91cc.txt``) joins a predicate index, which is cheap to change,
with the covering relation of subscription networks, which is cheap to match.  Its pieces and
where they live here:

* **Predicate tables** (section 3.1, Definition 2): predicates are upper-threshold
  (``x < v``, ``x <= v``), lower-threshold (``x > v``, ``x >= v``) or equality.  One row per
  *predicate family* (same attribute, same comparison direction) kept sorted by threshold
  (:class:`sortedcontainers.SortedList`, binary search); equality predicates in hash tables.
* **Plist** (Definitions 4 to 7, section 3.2): subscriptions with the same predicates (the
  same families) whose thresholds do not cross form a *same-predicate partial-order list*, a
  chain ``s1 <= s2 <= ...`` in which every event matching ``s_i`` matches all later members.
  :class:`_Chain` keeps one chain sorted by its members' looseness keys plus, per family, the
  sorted column of thresholds (float bounds in an ``array('d')``, :func:`_bound`); since
  the chain is monotone in every family, the members an event satisfies are a suffix whose
  start is the largest of one binary search per family:
  O(k log m) per chain, then the suffix is added without testing (section 3.4, step 1).
  *K threshold* (Definition 7): at most ``max_chains`` (K) chains per predicate signature,
  and a chain serves matching only once it holds ``min_chain`` members (the paper's
  "threshold"); until then, and after it shrinks below half of that, its members are matched
  through the Mlist.  Moving a chain between the two is O(min_chain * k log n), a constant.
* **Mlist / Mtable with the match boundary** (section 3.2, 3.4 steps 2 to 5): every other
  subscription unit has a *start node* in a sorted row (or an equality hash bucket) and a
  linked list of its remaining predicates.  For an event, the boundary in a row is the
  bisected range of thresholds the event value satisfies; start nodes inside it become
  candidates (``Sa``) and each candidate walks its links, dropping out at the first node
  outside the boundary (that node's predicate is false for the event) and matching at its
  end node.  For units made only of numeric comparisons the walk is one vectorised box test
  over all their candidates (:mod:`content._hema_boundary`); so is it for a unit whose start
  node is an equality on a string or boolean (hash bucket; numeric starts are walked: their
  buckets are small) and whose other nodes are all numeric (``class = 'pump' AND temp >
  90``): its bucket keeps the units' box slots (:class:`_SlotSet`), and the
  event's bucket joins the candidates of the one box test (a bucket of at most
  ``_WALK_SLOTS`` units is walked instead: a numpy piece costs more than a few walks).
* **Insert/delete** (section 3.3, Fig. 4; section 3.5): Step 1 finds the predecessor and
  successor of the new subscription in its signature's chains by binary search and inserts
  it if it sits between them (or at an end); otherwise Step 2 inserts it into the Mtable.
  Both are O(k log n); deletion unlinks the unit and removes its nodes, also O(k log n).

Exactness for the whole selector language (docs/reference.md, "content"): a :class:`Filter` is a
DNF; every conjunction is indexed as its own *subscription unit* and a subscription matches
when any unit does.  A unit enters a chain only if all its predicates are numeric order
comparisons on distinct families with non-NaN literals.  In the Mlist a unit's start node is
an indexable predicate (``=`` on a number, string or boolean, ``IN``, or an order comparison
on numbers or strings); every other predicate (``<>``, LIKE patterns, NOT IN, NOT LIKE ...)
is only a link, verified with the predicate model's exact three-valued test.  A unit with no
indexable predicate (including the empty conjunction, which is always true) is *residual*
and verified for every event.  Type mismatches and missing attributes never reach an index
entry of the wrong kind: rows and buckets are keyed by the value's kind (numbers exclude
booleans), NaN event values skip every index (they satisfy no comparison), and the fast
link tests fall back to :meth:`Predicate.test` for any value that is not a plain
``int``/``float``/``str``/``bool``.

Deviations (docs/content-hema.md): the paper walks a unit's nodes in the fixed top-to-bottom
row order; here the start node is the unit's most selective indexable predicate (equality
first, then the order predicate whose threshold is most extreme by its quantile among the
thresholds already in that attribute's rows), so fewer start nodes fall inside the
boundary; non-start nodes are reached only through links, so the sorted rows hold start
nodes (the links carry the other thresholds).  An equality on a boolean counts as half of
the events (it has two values), not as the most selective start: ``alarm = FALSE`` would
otherwise start a fleet's units in a bucket that nearly every event opens.  Only numeric
chains are built (the paper's attributes are numbers; thresholds finite and below 2**53 in
magnitude); string order predicates use the Mlist.  Matched ids are gathered as int64
arrays while all ids are ints.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from operator import itemgetter
from typing import Any, Final

import numpy as np
from sortedcontainers import SortedList

from content._engine import Engine, Event, SubId
from content._filter import Clause, Filter
from content._hema_boundary import BoundaryBoxes, box_of, int64_id
from content._predicate import Kind, Op, Predicate, Scalar, kind_of

__all__ = ["HEMA"]

UPPER: Final = 0  # x < v, x <= v: satisfied by a suffix of the row sorted by (v, inclusive)
LOWER: Final = 1  # x > v, x >= v: satisfied by a prefix of the row sorted by (v, exclusive)

_FAST_KIND: Final[dict[type, Kind]] = {int: Kind.NUM, float: Kind.NUM, str: Kind.STR, bool: Kind.BOOL}
# Enum hashing runs Python code: sets/tuples of ops are tested by identity, hash keys use ints.
_ORDER: Final = (Op.LT, Op.LE, Op.GT, Op.GE)
_STR_OR_NUM: Final = (Kind.NUM, Kind.STR)


def _code(kind: Kind | None) -> int:
    """Small int standing for a value kind in hash-table keys (-1: not comparable)."""
    return 0 if kind is Kind.NUM else 1 if kind is Kind.STR else 2 if kind is Kind.BOOL else -1


Check = tuple[str, Callable[[object], bool]]
ChainKey = tuple[tuple[Scalar, int], ...]
RowKey = tuple[str, Kind, int, bool]  # attribute, kind, family, boxed (vectorised test)
_SLOT: Final = itemgetter(3)
# a slot set of at most this many units is walked in Python instead of joining the box test
# (seed 003's numeric equalities: ~1 unit per bucket, where a numpy piece costs more)
_WALK_SLOTS: Final = 8


def _value_kind(v: object) -> Kind | None:
    k = _FAST_KIND.get(type(v))
    return k if k is not None else kind_of(v)


def _is_nan(x: object) -> bool:
    return isinstance(x, float) and x != x  # noqa: PLR0124 (NaN test)


def _checker(p: Predicate) -> Callable[[object], bool]:
    """A fast exact test of ``p`` against one event value (falls back to ``p.test``)."""
    x: Any = p.value
    test = p.test
    if p.kind is Kind.NUM and not _is_nan(x):
        match p.op:
            case Op.LT:

                def f(v: Any) -> Any:
                    t = type(v)
                    return v < x if t is float or t is int else test(v)

            case Op.LE:

                def f(v: Any) -> Any:
                    t = type(v)
                    return v <= x if t is float or t is int else test(v)

            case Op.GT:

                def f(v: Any) -> Any:
                    t = type(v)
                    return v > x if t is float or t is int else test(v)

            case Op.GE:

                def f(v: Any) -> Any:
                    t = type(v)
                    return v >= x if t is float or t is int else test(v)

            case Op.EQ:

                def f(v: Any) -> Any:
                    t = type(v)
                    return v == x if t is float or t is int else test(v)

            case _:
                return test
        return f
    return test


def _family(p: Predicate) -> int:
    return UPPER if p.op in (Op.LT, Op.LE) else LOWER


def _row_entry(p: Predicate, unit: _Unit, slot: int) -> tuple[Scalar, int, int, _Unit | int]:
    """Sort key of a start node in its row; see :meth:`HEMA.match` for the boundary."""
    inclusive = p.op in (Op.LE, Op.GE)
    assert not isinstance(p.value, frozenset)
    last = unit if slot < 0 else slot
    if p.op in (Op.LT, Op.LE):
        return (p.value, 1 if inclusive else 0, unit.uid, last)
    return (p.value, 0 if inclusive else 1, unit.uid, last)


def _chain_key(p: Predicate) -> tuple[Scalar, int]:
    """Looseness of a numeric order predicate within its family: larger is looser."""
    v = p.value
    assert isinstance(v, int | float)
    inclusive = 1 if p.op in (Op.LE, Op.GE) else 0
    return (v, inclusive) if p.op in (Op.LT, Op.LE) else (-v, inclusive)


_CHAIN_LIMIT: Final = 2.0**53


def _chainable(v: object) -> bool:
    """A chain threshold: a finite number of magnitude below 2**53 (exact as a float, and
    no integer lies strictly between it and the next float; see :func:`_bound`)."""
    return type(v) in (int, float) and -_CHAIN_LIMIT < v < _CHAIN_LIMIT  # type: ignore[operator]


def _bound(k: tuple[Scalar, int]) -> float:
    """A chain key as one float B such that the predicate holds for event value e (negated
    for lower families) exactly when ``e < B``: ``x < t`` gives t, ``x <= t`` gives the float
    right after t (no number between them, so ``e <= t`` iff ``e < B``; for an int e too,
    as |t| < 2**53).  Monotone in the key, so a chain's column of bounds stays sorted."""
    x = float(k[0])
    return math.nextafter(x, math.inf) if k[1] else x


def _covers(tight: ChainKey, loose: ChainKey) -> bool:
    for a, b in zip(tight, loose, strict=True):  # noqa: SIM110 (no generator: insert hot path)
        if a > b:
            return False
    return True


@dataclass(eq=False, slots=True)
class _SlotSet:
    """The box slots of the boxed units started at one equality key, in insertion order;
    their array is made at the first match after a change (O(size)), then reused."""

    slots: dict[int, None] = field(default_factory=dict)
    arr: np.ndarray[Any, np.dtype[np.intp]] | None = None

    def add(self, slot: int) -> None:
        self.slots[slot] = None
        self.arr = None

    def discard(self, slot: int) -> None:
        del self.slots[slot]
        self.arr = None

    def array(self) -> np.ndarray[Any, np.dtype[np.intp]]:
        arr = self.arr
        if arr is None:
            arr = self.arr = np.fromiter(self.slots, dtype=np.intp, count=len(self.slots))
        return arr


@dataclass(eq=False, slots=True)
class _Unit:
    """One conjunction of one subscription (a *subscription unit*)."""

    uid: int
    sid: SubId
    clause: Clause
    chain: _Chain | None = None
    key: ChainKey = ()
    # Mlist state (when the unit is matched through the Mlist):
    in_mlist: bool = False
    start: tuple[Any, ...] = ()
    rest: tuple[Check, ...] = ()
    slot: int = -1  # row in the boundary boxes when the start node is in a boxed row
    column: list[tuple[tuple[str, Kind], Scalar]] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class _Chain:
    """A same-predicate partial-order list (Plist, Definition 5).

    ``members`` is sorted by the looseness key tuple (``keys``, the same order); consecutive
    members cover each other componentwise, so ``columns[d]`` (family ``d``'s keys as float
    bounds, :func:`_bound`) is sorted in member order too.  The members an event satisfies
    in family ``d`` are those from ``bisect_right(columns[d], e)`` on (``-e`` for a lower
    family); the chain's matched suffix starts at the largest of these.  ``columns`` are
    ``array('d')``: a bisection reads contiguous doubles instead of chasing a tuple and two
    number objects per comparison (those cache misses made the chain pass cost ~3x more).
    Keys, members and ids are plain lists searched with the C ``bisect``: locate O(k log m)
    comparisons, insert/delete the same plus a memmove of at most m entries per list
    (sub-microsecond at the chain lengths seen, ~5x cheaper than a ``SortedList`` step in
    Python); match: k bisections.  ``sids`` repeats the members' subscription ids in member
    order so that a matched suffix is handed to the result by one C-level slice; while every
    id is a plain int, the first ``len(sids)`` entries of ``ids`` (an int64 buffer with
    spare capacity, shifted in place on insert/delete: an O(m) memmove in C) are the same
    ids, whose slices the match joins and converts in one go (fresh ints hash without
    touching the stored id objects, which are scattered over the heap).
    """

    signature: tuple[tuple[str, int], ...]
    members: list[_Unit] = field(default_factory=list)
    keys: list[ChainKey] = field(default_factory=list)
    columns: tuple[array[float], ...] = ()
    sids: list[SubId] = field(default_factory=list)
    n_obj: int = 0  # members whose id is not a plain int64
    ids: np.ndarray[Any, np.dtype[np.int64]] = field(default_factory=lambda: np.zeros(8, dtype=np.int64))
    active: bool = False

    def __post_init__(self) -> None:
        self.columns = tuple(array("d") for _ in self.signature)

    def __len__(self) -> int:
        return len(self.members)

    def _span(self, key: ChainKey) -> tuple[int, int]:
        """The members whose first bound equals ``key``'s: a key's place is within it.

        One bisection of the contiguous ``columns[0]`` narrows the search, so the key-tuple
        comparisons (a cache miss per tuple and number) are made only among ties."""
        col = self.columns[0]
        b = _bound(key[0])
        return bisect_left(col, b), bisect_right(col, b)

    def fits(self, key: ChainKey) -> bool:
        """Fig. 4 Subscribe steps 1-11: predecessor and successor both cover-compatible."""
        keys = self.keys
        i = bisect_left(keys, key, *self._span(key))
        if i > 0 and not _covers(keys[i - 1], key):
            return False
        return not (i < len(keys) and not _covers(key, keys[i]))

    def add(self, unit: _Unit) -> None:
        i = bisect_right(self.keys, unit.key, *self._span(unit.key))
        n = len(self.keys)
        self.keys.insert(i, unit.key)
        self.members.insert(i, unit)
        self.sids.insert(i, unit.sid)
        for column, k in zip(self.columns, unit.key, strict=True):
            insort(column, _bound(k))
        ids = self.ids
        if n == len(ids):
            ids = self.ids = np.concatenate((ids, np.zeros(n, dtype=np.int64)))
        ids[i + 1 : n + 1] = ids[i:n]  # memmove (numpy handles the overlap)
        as_int = int64_id(unit.sid)
        if as_int is None:
            self.n_obj += 1
            ids[i] = 0  # unused while n_obj > 0
        else:
            ids[i] = as_int

    def discard(self, unit: _Unit) -> None:
        members = self.members
        i = bisect_left(self.keys, unit.key, *self._span(unit.key))
        while members[i] is not unit:
            i += 1
        n = len(members)
        del members[i]
        del self.keys[i]
        del self.sids[i]
        for column, k in zip(self.columns, unit.key, strict=True):
            del column[bisect_left(column, _bound(k))]
        if int64_id(unit.sid) is None:
            self.n_obj -= 1
        ids = self.ids
        ids[i : n - 1] = ids[i + 1 : n]

    def _check(self) -> None:
        keys = [u.key for u in self.members]
        assert keys == self.keys
        for a, b in pairwise(keys):
            assert _covers(a, b), (a, b)
        for d, column in enumerate(self.columns):
            assert column.tolist() == [_bound(k[d]) for k in keys]
        assert self.sids == [u.sid for u in self.members]
        assert self.n_obj == sum(1 for sid in self.sids if int64_id(sid) is None)
        assert len(self.ids) >= len(self.sids)
        for i, sid in enumerate(self.sids):
            assert int64_id(sid) is None or self.ids[i] == sid
        for u in self.members:
            assert u.chain is self
            assert u.in_mlist is not self.active


class HEMA(Engine):
    """Seed 003's HEMA (see the module docstring for the mapping and exactness rules).

    Space O(k n).  ``add``/``remove``: O(k log n) per conjunction (K chains tried per
    signature, K constant).  ``match``: O(c k log m) for ``c`` active chains plus
    O(j log P + |Sa| q) in the Mlist, plus the output.
    """

    name = "hema"

    def __init__(self, *, max_chains: int = 8, min_chain: int = 4) -> None:
        super().__init__()
        if max_chains < 1 or min_chain < 1:
            raise ValueError("max_chains and min_chain must be positive")
        self.max_chains = max_chains
        self.min_chain = min_chain
        self._demote_below = max(1, min_chain // 2)
        self._next_uid = 0
        self._units: dict[int, _Unit] = {}
        self._units_of: dict[SubId, list[int]] = {}
        # Plist
        self._groups: dict[tuple[tuple[str, int], ...], list[_Chain]] = {}
        self._active: dict[_Chain, None] = {}
        self._active_list: list[tuple[_Chain, tuple[tuple[str, int, Any], ...]]] = []
        self._active_dirty = False
        # Mlist / Mtable
        self._rows: dict[RowKey, Any] = {}  # RowKey -> SortedList of start nodes
        self._attr_rows: dict[str, list[tuple[Kind, int, Any, bool]]] = {}
        self._boxes = BoundaryBoxes()
        # id(boxed row) -> the slots of its start nodes in row order (made on the first match
        # that needs it, then kept in step with the row by np.insert / np.delete)
        self._row_slots: dict[int, np.ndarray[Any, np.dtype[np.intp]]] = {}
        self._slot_units: dict[int, _Unit] = {}
        self._hash: dict[str, dict[tuple[int, Scalar], set[int]]] = {}
        # equality starts of units whose other nodes are a box: key -> their box slots
        self._hash_box: dict[str, dict[tuple[int, Scalar], _SlotSet]] = {}
        self._residual: dict[int, None] = {}
        self._column: dict[tuple[str, Kind], Any] = {}  # all order thresholds per attribute

    # ------------------------------------------------------------------ subscription changes

    def _insert(self, sub_id: SubId, f: Filter) -> None:
        uids = []
        for clause in f.clauses:
            uid = self._next_uid
            self._next_uid += 1
            unit = _Unit(uid, sub_id, clause)
            self._units[uid] = unit
            uids.append(uid)
            self._place(unit)
        self._units_of[sub_id] = uids

    def _delete(self, sub_id: SubId, f: Filter) -> None:
        for uid in self._units_of.pop(sub_id):
            unit = self._units.pop(uid)
            if unit.chain is not None:
                self._chain_remove(unit)
            else:
                self._mlist_remove(unit)

    def _place(self, unit: _Unit) -> None:
        signature = self._signature(unit.clause)
        if signature is not None:
            order = sorted(range(len(signature)), key=signature.__getitem__)
            sig = tuple(signature[i] for i in order)
            unit.key = tuple(_chain_key(unit.clause[i]) for i in order)
            chains = self._groups.setdefault(sig, [])
            chain = next((c for c in chains if c.fits(unit.key)), None)
            if chain is None and len(chains) < self.max_chains:
                chain = _Chain(sig)
                chains.append(chain)
            if chain is not None:
                self._chain_add(chain, unit)
                return
            if not chains:
                del self._groups[sig]
            unit.key = ()
        self._mlist_add(unit)

    @staticmethod
    def _signature(clause: Clause) -> list[tuple[str, int]] | None:
        """The families of a pure numeric order conjunction (else None: Mlist only)."""
        if not clause:
            return None
        sig = []
        for p in clause:
            if p.op not in _ORDER or p.kind is not Kind.NUM or not _chainable(p.value):
                return None
            sig.append((p.attr, _family(p)))
        return sig if len(set(sig)) == len(sig) else None

    def _chain_add(self, chain: _Chain, unit: _Unit) -> None:
        chain.add(unit)
        unit.chain = chain
        if chain.active:
            return
        self._mlist_add(unit)
        if len(chain) >= self.min_chain:
            for member in chain.members:
                self._mlist_remove(member)
            chain.active = True
            self._active[chain] = None
            self._active_dirty = True

    def _chain_remove(self, unit: _Unit) -> None:
        chain = unit.chain
        assert chain is not None
        chain.discard(unit)
        unit.chain = None
        if unit.in_mlist:
            self._mlist_remove(unit)
        if chain.active and len(chain) < self._demote_below:
            chain.active = False
            del self._active[chain]
            self._active_dirty = True
            for member in chain.members:
                self._mlist_add(member)
        if not chain.members:
            chains = self._groups[chain.signature]
            chains.remove(chain)
            if not chains:
                del self._groups[chain.signature]

    def _mlist_add(self, unit: _Unit) -> None:
        """Fig. 4 Step 2: choose the start node, bisect it into its row, link the rest."""
        clause = unit.clause
        costs = [self._start_cost(p) for p in clause]
        best = -1
        best_cost = 3.0
        for i, cost in enumerate(costs):
            if cost < best_cost:
                best, best_cost = i, cost
        uid = unit.uid
        if best < 0:
            unit.start = ("residual",)
            self._residual[uid] = None
        else:
            p = clause[best]
            if p.op is Op.EQ or p.op is Op.IN:
                self._hash_add(unit, best)
            else:
                box = box_of(clause)
                row_key: RowKey = (p.attr, p.kind, _family(p), box is not None)
                row = self._rows.get(row_key)
                if row is None:
                    row = self._rows[row_key] = SortedList()
                    self._attr_rows.setdefault(p.attr, []).append((p.kind, row_key[2], row, row_key[3]))
                if box is not None:
                    unit.slot = self._boxes.add(unit.sid, box)
                    self._slot_units[unit.slot] = unit
                entry = _row_entry(p, unit, unit.slot)
                row.add(entry)
                unit.start = ("row", row_key, entry)
                arr = self._row_slots.get(id(row)) if box is not None else None
                if arr is not None:  # keep the row's slot array in step: one C insert
                    self._row_slots[id(row)] = np.insert(arr, row.bisect_left(entry), unit.slot)
        # most selective link first: the walk usually leaves at its first node
        order = sorted((i for i in range(len(clause)) if i != best), key=costs.__getitem__)
        rest = [clause[i] for i in order]
        unit.rest = tuple((p.attr, _checker(p)) for p in rest)
        for p in clause:
            if p.op in _ORDER and p.kind in _STR_OR_NUM and not _is_nan(p.value):
                ck = (p.attr, p.kind)
                col = self._column.get(ck)
                if col is None:
                    col = self._column[ck] = SortedList()
                col.add(p.value)
                unit.column.append((ck, p.value))  # type: ignore[arg-type]
        unit.in_mlist = True

    def _hash_add(self, unit: _Unit, best: int) -> None:
        """Start ``unit`` at its equality / ``IN`` node ``clause[best]``: in a box-slot set
        when its other nodes are one box (numbers, booleans), else in a bucket walked per
        event.  O(k) for k members."""
        clause = unit.clause
        p = clause[best]
        members = p.value if isinstance(p.value, frozenset) else (p.value,)
        keys = tuple({(_code(kind_of(m)), m) for m in members})
        others = tuple(q for i, q in enumerate(clause) if i != best)
        # numeric starts stay walked: their buckets are small (seed 003's equalities on
        # numbers: ~1 unit each), and boxed they only grow the box test every event pays
        numeric = all(isinstance(m, (int, float)) and not isinstance(m, bool) for m in members)
        box = box_of(others, booleans=True) if others and not numeric else None
        if box is None:
            table = self._hash.setdefault(p.attr, {})
            for key in keys:
                table.setdefault(key, set()).add(unit.uid)
            unit.start = ("hash", p.attr, keys)
            return
        # the other nodes are one box: tested with the boxed rows' candidates
        unit.slot = self._boxes.add(unit.sid, box)
        self._slot_units[unit.slot] = unit
        boxed = self._hash_box.setdefault(p.attr, {})
        for key in keys:
            slot_set = boxed.get(key)
            if slot_set is None:
                slot_set = boxed[key] = _SlotSet()
            slot_set.add(unit.slot)
        unit.start = ("hashbox", p.attr, keys, best)

    def _hash_remove(self, unit: _Unit, attr: str, keys: tuple[tuple[int, Scalar], ...]) -> None:
        """Undo :meth:`_hash_add`.  O(k) for k members."""
        if unit.start[0] == "hash":
            table = self._hash[attr]
            for key in keys:
                bucket = table[key]
                bucket.discard(unit.uid)
                if not bucket:
                    del table[key]
            if not table:
                del self._hash[attr]
            return
        boxed = self._hash_box[attr]
        for key in keys:
            slot_set = boxed[key]
            slot_set.discard(unit.slot)
            if not slot_set.slots:
                del boxed[key]
        if not boxed:
            del self._hash_box[attr]
        self._boxes.remove(unit.slot)
        del self._slot_units[unit.slot]
        unit.slot = -1

    def _mlist_remove(self, unit: _Unit) -> None:
        uid = unit.uid
        match unit.start:
            case ("residual",):
                del self._residual[uid]
            case ("hash", attr, keys) | ("hashbox", attr, keys, _):
                self._hash_remove(unit, attr, keys)
            case ("row", row_key, entry):
                row = self._rows[row_key]
                arr = self._row_slots.get(id(row)) if unit.slot >= 0 else None
                if arr is not None:
                    self._row_slots[id(row)] = np.delete(arr, row.bisect_left(entry))
                row.remove(entry)
                if unit.slot >= 0:
                    if not row:
                        self._row_slots.pop(id(row), None)
                    self._boxes.remove(unit.slot)
                    del self._slot_units[unit.slot]
                    unit.slot = -1
                if not row:
                    del self._rows[row_key]
                    attr = row_key[0]
                    rows = [r for r in self._attr_rows[attr] if r[2] is not row]
                    if rows:
                        self._attr_rows[attr] = rows
                    else:
                        del self._attr_rows[attr]
            case _:
                raise AssertionError(unit.start)
        for ck, v in unit.column:
            col = self._column[ck]
            col.remove(v)
            if not col:
                del self._column[ck]
        unit.column = []
        unit.start = ()
        unit.rest = ()
        unit.in_mlist = False

    def _start_cost(self, p: Predicate) -> float:
        """Estimated fraction of events satisfying ``p`` if indexable, else 3 (not indexable)."""
        v = p.value
        if p.op is Op.EQ:
            if _is_nan(v) or p.kind is Kind.SET:
                return 3.0
            return 0.5 if p.kind is Kind.BOOL else 0.0  # a boolean has two values
        if p.op is Op.IN:
            assert isinstance(v, frozenset)
            if any(_is_nan(m) or kind_of(m) is None for m in v):
                return 3.0
            return min(1.0, 0.001 * len(v))
        if p.op in _ORDER and p.kind in _STR_OR_NUM and not _is_nan(v):
            col = self._column.get((p.attr, p.kind))
            if not col:
                return 0.5
            q: float = col.bisect_left(v) / len(col)  # quantile of v among known thresholds
            return q if p.op in (Op.LT, Op.LE) else 1.0 - q
        return 3.0

    # ------------------------------------------------------------------ matching

    def _refresh_active(self) -> None:
        self._active_list = [
            (
                chain,
                tuple(
                    (attr, family, column)
                    for (attr, family), column in zip(chain.signature, chain.columns, strict=True)
                ),
            )
            for chain in self._active
        ]
        self._active_dirty = False

    def match(self, event: Event) -> set[SubId]:  # noqa: C901, PLR0912, PLR0915 (hot path, seed 003 Alg. 2 in one frame)
        get = event.get
        out: set[SubId] = set()
        add = out.add
        # Plist (section 3.4, step 1): the matched members of a chain are a suffix.
        if self._active_dirty:
            self._refresh_active()
        int_parts: list[np.ndarray[Any, np.dtype[np.int64]]] = []
        if self._active_list:
            # the event's numbers, as compared with UPPER (x) and LOWER (-x) bounds; other
            # values and NaN satisfy no order comparison, so a chain needing them is skipped
            up_q: dict[str, Any] = {}
            low_q: dict[str, Any] = {}
            for name, val in event.items():
                tv = type(val)
                if (tv is float or tv is int or _value_kind(val) is Kind.NUM) and val == val:  # noqa: PLR0124
                    up_q[name] = val
                    low_q[name] = -val  # type: ignore[operator]
            queries = (up_q, low_q)  # indexed by family (UPPER = 0, LOWER = 1)
        for chain, dims in self._active_list:
            start = 0
            for dim_attr, dim_family, column in dims:
                q = queries[dim_family].get(dim_attr)
                if q is None:
                    break
                i = bisect_right(column, q)
                if i > start:  # noqa: PLR1730 (hot loop: cheaper than max())
                    start = i
            else:
                n = len(chain.sids)
                if start < n:
                    if chain.n_obj:
                        out.update(chain.sids[start:])
                    else:
                        int_parts.append(chain.ids[start:n])
        # Mlist (steps 2-5): start nodes inside the match boundary, then walk their links.
        units = self._units
        attr_rows = self._attr_rows
        hash_tables = self._hash
        hash_box = self._hash_box
        slot_units = self._slot_units
        boxed_sa: list[np.ndarray[Any, np.dtype[np.intp]]] = []
        row_slots = self._row_slots
        v: Any
        for attr, v in event.items():
            kind = _FAST_KIND.get(type(v))
            if kind is None:
                kind = kind_of(v)
                if kind is None:
                    continue
            if v != v:  # noqa: PLR0124 (NaN satisfies no comparison)
                continue
            boxed_table = hash_box.get(attr)
            if boxed_table is not None:
                slot_set = boxed_table.get((_code(kind), v))
                if slot_set is not None:
                    if len(slot_set.slots) > _WALK_SLOTS:
                        boxed_sa.append(slot_set.array())
                    else:  # a few units: walking their links beats a numpy piece
                        for slot in slot_set.slots:
                            unit = slot_units[slot]
                            for a, test in unit.rest:
                                if not test(get(a)):
                                    break
                            else:
                                add(unit.sid)
            table = hash_tables.get(attr)
            if table is not None:
                bucket = table.get((_code(kind), v))
                if bucket:
                    for uid in bucket:
                        unit = units[uid]
                        for a, test in unit.rest:
                            if not test(get(a)):
                                break
                        else:
                            add(unit.sid)
            rows = attr_rows.get(attr)
            if rows is None:
                continue
            for row_kind, family, row, boxed in rows:
                if row_kind is not kind:
                    continue
                i = row.bisect_left((v, 1))
                if boxed:  # Sa of boxed units: slices of the row's slot array, tested below
                    arr = row_slots.get(id(row))
                    if arr is None:
                        arr = row_slots[id(row)] = np.fromiter(map(_SLOT, row), dtype=np.intp, count=len(row))
                    boxed_sa.append(arr[i:] if family == UPPER else arr[:i])
                    continue
                nodes: Iterable[tuple[Scalar, int, int, Any]] = (
                    row.islice(i) if family == UPPER else row.islice(0, i)
                )
                for _v, _s, _uid, unit in nodes:
                    for a, test in unit.rest:
                        if not test(get(a)):
                            break
                    else:
                        add(unit.sid)
        if boxed_sa:
            slots = np.concatenate(boxed_sa) if len(boxed_sa) > 1 else boxed_sa[0]
            if len(slots):
                self._match_boxed(event, slots, out, int_parts)
        for uid in self._residual:
            unit = units[uid]
            for a, test in unit.rest:
                if not test(get(a)):
                    break
            else:
                add(unit.sid)
        if int_parts:
            out.update((np.concatenate(int_parts) if len(int_parts) > 1 else int_parts[0]).tolist())
        return out

    def _match_boxed(
        self,
        event: Event,
        slots: np.ndarray[Any, np.dtype[np.intp]],
        out: set[SubId],
        int_parts: list[np.ndarray[Any, np.dtype[np.int64]]],
    ) -> None:
        """Steps 3-5 for candidates whose nodes are all numeric: one vectorised box test."""
        boxes = self._boxes
        ev = boxes.event_vector(event)
        if ev is not None:
            boxes.test(slots, ev[0], ev[1], out, int_parts)
            return
        get = event.get  # an int beyond float precision: walk the links exactly
        for slot in slots.tolist():
            unit = self._slot_units[slot]
            for a, test in unit.rest:
                if not test(get(a)):
                    break
            else:
                out.add(unit.sid)

    # ------------------------------------------------------------------ invariants

    @property
    def stats(self) -> dict[str, int]:
        """Counts for reports: units in active chains, in the Mlist, residual; active chains."""
        in_plist = sum(len(c) for c in self._active)
        return {
            "units": len(self._units),
            "plist_units": in_plist,
            "mlist_units": len(self._units) - in_plist,
            "residual_units": len(self._residual),
            "active_chains": len(self._active),
            "chains": sum(len(cs) for cs in self._groups.values()),
        }

    def _check(self) -> None:  # noqa: C901, PLR0912 (one assertion per invariant)
        super()._check()
        assert set(self._units_of) == set(self._filters)
        for sid, uids in self._units_of.items():
            assert [self._units[u].clause for u in uids] == list(self._filters[sid].clauses)
            assert all(self._units[u].sid == sid for u in uids)
        assert sum(len(u) for u in self._units_of.values()) == len(self._units)
        starts: dict[int, int] = {}
        for chains in self._groups.values():
            assert 0 < len(chains) <= self.max_chains
            for chain in chains:
                assert chain.members, "empty chains are dropped"
                chain._check()
                assert (chain in self._active) is chain.active
                if not chain.active:
                    assert len(chain) < self.min_chain
                else:
                    assert len(chain) >= self._demote_below
        for row_key, row in self._rows.items():
            assert row, "empty rows are dropped"
            assert any(r[2] is row for r in self._attr_rows[row_key[0]])
            for entry in row:
                unit = self._units[entry[2]]
                assert unit.start == ("row", row_key, entry)
                if row_key[3]:
                    assert entry[3] == unit.slot >= 0 and self._slot_units[unit.slot] is unit
                    assert self._boxes.boxes[unit.slot] == box_of(unit.clause)
                else:
                    assert entry[3] is unit and unit.slot == -1
                starts[unit.uid] = starts.get(unit.uid, 0) + 1
        assert sum(len(rows) for rows in self._attr_rows.values()) == len(self._rows)
        boxed_rows = {id(row): row for row_key, row in self._rows.items() if row_key[3]}
        for rid, arr in self._row_slots.items():
            assert arr.tolist() == [entry[3] for entry in boxed_rows[rid]], "stale slot array"
        self._boxes._check()
        assert len(self._boxes) == len(self._slot_units)
        for attr, table in self._hash.items():
            assert table
            for key, bucket in table.items():
                assert bucket
                for uid in bucket:
                    unit = self._units[uid]
                    assert unit.start[:2] == ("hash", attr) and key in unit.start[2]
                    starts[uid] = starts.get(uid, 0) + 1
        for attr, boxed in self._hash_box.items():
            assert boxed
            for key, slot_set in boxed.items():
                assert slot_set.slots
                assert slot_set.arr is None or slot_set.arr.tolist() == list(slot_set.slots), "stale"
                for slot in slot_set.slots:
                    unit = self._slot_units[slot]
                    assert unit.slot == slot and unit.start[:2] == ("hashbox", attr) and key in unit.start[2]
                    starts[unit.uid] = starts.get(unit.uid, 0) + 1
        for uid in self._residual:
            assert self._units[uid].start == ("residual",)
            starts[uid] = 1
        column_count: dict[tuple[str, Kind], int] = {}
        for unit in self._units.values():
            if unit.chain is not None:
                assert unit in unit.chain.members
            if unit.in_mlist:
                expected = len(unit.start[2]) if unit.start[0] in ("hash", "hashbox") else 1
                assert starts.pop(unit.uid) == expected
                assert len(unit.rest) == len(unit.clause) - (unit.start[0] != "residual")
                for ck, _v in unit.column:
                    column_count[ck] = column_count.get(ck, 0) + 1
                if unit.start[0] == "hashbox":
                    others = tuple(q for i, q in enumerate(unit.clause) if i != unit.start[3])
                    assert self._boxes.boxes[unit.slot] == box_of(others, booleans=True)
            else:
                assert unit.chain is not None and unit.chain.active
                assert not unit.column
        assert not starts, "index entries of units not in the Mlist"
        assert {ck: len(col) for ck, col in self._column.items()} == column_count
