"""Clause bookkeeping shared by the counting engines (Counting, ICCounting, RABasedMatching).

Seed 000 (section 3.1) matches conjunctive subscriptions by counting: a subscription S_i
matches event E_j when the number n_ij of S_i's constraints that E_j satisfies equals the
number n_i of constraints of S_i (Definition 9).  Our filters are disjunctions (DNF), so
the unit that is counted is a *clause* (one conjunction of one filter): every clause gets a
dense integer id, ``need[cid]`` is its number of distinct predicates and a subscription
matches when at least one of its clauses reaches its need.

Identical predicates are stored once (Theorem 2): :attr:`ClauseTable.csl` maps each distinct
predicate to the list of clause ids that contain it -- the paper's constraint-subscription
list (CSList, Fig. 4).  The index structures of each engine hold *the same list objects*, so
a satisfied constraint contributes its whole CSList with one ``list.extend``.

A clause with no predicate is always true (an engine gets it only from a hand-built
:class:`~content._filter.Filter`); such subscriptions are kept in :attr:`ClauseTable.always`.

A CSList is a bag: the order of its ids means nothing, so a clause leaves each of its
CSLists by a swap-remove (the last id moves into its slot) at the position the table keeps
for it (:attr:`ClauseTable.cpos`), O(1) however long the list: the CSList of a predicate
shared by thousands of clauses (``class = 'pump'`` in a fleet of 100,000 selectors) cost a
``list.remove`` scan of ~20 us per removal before (issue 42 item 2, a fleet's teardown).
A clause id some index still holds after its clause left (ICCounting's ordered leaves drop
such entries lazily, :class:`content._ic_index._Ordered`) is *held* (:meth:`ClauseTable.hold`)
and returns to the free ids only when the last holder lets it go (:meth:`ClauseTable.release`);
it never fires meanwhile (its need is -1).

Complexity: add/remove O(total predicates of the filter) (plus O(predicates of a clause) to
fix the position of an id moved by a swap-remove);
:meth:`ClauseTable.fired` O(len(acc)) (one C-level ``Counter`` pass plus one pass over the
distinct touched clauses).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

from content._engine import SubId
from content._filter import Filter
from content._predicate import Predicate

__all__ = ["NUMPY_FROM", "SINK", "ClauseTable"]

NUMPY_FROM = 4096
"""From this many credited clause ids on, :meth:`ClauseTable.fired_np` counts with numpy
even when they all came as Python ints."""

SINK = 0
"""A reserved clause id that never fires (its need is -1) and is never given to a clause."""


_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def _int64(sub_id: object) -> int | None:
    """``sub_id`` if it is a plain int (not a bool) that fits int64, else None."""
    if type(sub_id) is int and _INT64_MIN <= sub_id <= _INT64_MAX:
        return sub_id
    return None


class ClauseTable:
    """Clause ids, their needs and owners, and the CSList of every distinct predicate."""

    __slots__ = (
        "always",
        "ccsl",
        "cpos",
        "cpreds",
        "csl",
        "entries",
        "free",
        "held",
        "n_obj",
        "need",
        "need_np",
        "owner",
        "owner_np",
        "sub_cids",
    )

    def __init__(self) -> None:
        # cid -> number of distinct predicates (0 = free slot or SINK)
        self.need: list[int] = [0]
        self.owner: list[SubId | None] = [None]  # cid -> subscription id
        self.cpreds: list[tuple[Predicate, ...]] = [()]  # cid -> its distinct predicates
        self.ccsl: list[tuple[list[int], ...]] = [()]  # cid -> their CSLists (same order)
        self.cpos: list[list[int]] = [[]]  # cid -> its index in each of them (same order)
        self.free: list[int] = []  # recycled clause ids
        self.held: dict[int, int] = {}  # removed clause id -> holds left (not free until 0)
        self.csl: dict[Predicate, list[int]] = {}  # CSList: predicate -> clause ids
        self.always: dict[SubId, int] = {}  # subscriptions with an empty clause (count)
        self.sub_cids: dict[SubId, list[int]] = {}
        # need as a numpy array (capacity grows by doubling; -1 = free slot, never fires)
        self.need_np: np.ndarray[Any, np.dtype[np.int64]] = np.full(64, -1, dtype=np.int64)
        # owner as int64 for the clauses whose subscription id is a plain int (same capacity);
        # n_obj counts the live clauses whose id is anything else (see fired_np)
        self.owner_np: np.ndarray[Any, np.dtype[np.int64]] = np.zeros(64, dtype=np.int64)
        self.n_obj = 0
        # (CSList, clause id): every CSList entry the last add made
        self.entries: list[tuple[list[int], int]] = []

    def add(self, sub_id: SubId, f: Filter) -> list[Predicate]:
        """Register the clauses of ``f``; return the predicates seen for the first time
        (the caller indexes them, pointing at ``csl[p]``).  :attr:`entries` lists every
        (CSList, clause id) added."""
        new: list[Predicate] = []
        entries: list[tuple[list[int], int]] = []
        self.entries = entries
        cids: list[int] = []
        csl = self.csl
        free = self.free
        as_int = _int64(sub_id)
        for clause in f.clauses:
            if not clause:
                self.always[sub_id] = self.always.get(sub_id, 0) + 1
                continue
            if free:
                cid = free.pop()
            else:
                cid = len(self.need)
                self.need.append(0)
                self.owner.append(None)
                self.cpreds.append(())
                self.ccsl.append(())
                self.cpos.append([])
                if cid >= len(self.need_np):
                    grown = np.full(2 * len(self.need_np), -1, dtype=np.int64)
                    grown[: len(self.need_np)] = self.need_np
                    self.need_np = grown
                    grown_owner = np.zeros(len(grown), dtype=np.int64)
                    grown_owner[: len(self.owner_np)] = self.owner_np
                    self.owner_np = grown_owner
            preds: list[Predicate] = []
            lists: list[list[int]] = []
            pos: list[int] = []
            for p in clause:
                lst = csl.get(p)
                if lst is None:
                    lst = csl[p] = []
                    new.append(p)
                elif lst[-1] == cid:
                    continue  # p repeated within this clause: counted once
                pos.append(len(lst))
                lst.append(cid)
                preds.append(p)
                lists.append(lst)
                entries.append((lst, cid))
            self.need[cid] = len(preds)
            self.need_np[cid] = len(preds)
            self.owner[cid] = sub_id
            if as_int is not None:
                self.owner_np[cid] = as_int
            else:
                self.n_obj += 1
            self.cpreds[cid] = tuple(preds)
            self.ccsl[cid] = tuple(lists)
            self.cpos[cid] = pos
            cids.append(cid)
        self.sub_cids[sub_id] = cids
        return new

    def remove(self, sub_id: SubId) -> list[tuple[Predicate, list[int]]]:
        """Forget ``sub_id``'s clauses; return the predicates no clause uses any more with
        their (now empty) CSLists (the caller removes them from its index).  A clause id
        leaves each CSList by a swap-remove at its kept position (O(1) per entry, plus
        O(predicates of the moved clause) to find which of its positions moved); it returns
        to the free ids unless it is held (:meth:`hold`)."""
        gone: list[tuple[Predicate, list[int]]] = []
        csl = self.csl
        ccsl = self.ccsl
        cpos = self.cpos
        held = self.held
        as_int = _int64(sub_id) is not None
        for cid in self.sub_cids.pop(sub_id):
            for p, lst, i in zip(self.cpreds[cid], ccsl[cid], cpos[cid], strict=True):
                last = lst.pop()
                if i < len(lst):  # cid was not the last id: the last one takes its slot
                    lst[i] = last
                    k = 0
                    lists = ccsl[last]
                    while lists[k] is not lst:
                        k += 1
                    cpos[last][k] = i
                elif not lst:
                    del csl[p]
                    gone.append((p, lst))
            self.need[cid] = 0
            self.need_np[cid] = -1
            self.owner[cid] = None
            if not as_int:
                self.n_obj -= 1
            self.cpreds[cid] = ()
            ccsl[cid] = ()
            cpos[cid] = []
            if cid not in held:
                self.free.append(cid)
        self.always.pop(sub_id, None)
        return gone

    def hold(self, cid: int) -> None:
        """Keep clause ``cid`` from the free ids once it is removed, until as many
        :meth:`release` calls as holds (an index that still lists it). O(1)."""
        held = self.held
        held[cid] = held.get(cid, 0) + 1

    def release(self, cids: Iterable[int]) -> None:
        """One hold of each of ``cids`` ends (an id may repeat); an id whose last hold ends
        is free again. O(len(cids))."""
        held = self.held
        free = self.free
        for cid in cids:
            n = held[cid] - 1
            if n:
                held[cid] = n
            else:
                del held[cid]
                free.append(cid)

    def fired(self, acc: Iterable[int]) -> set[SubId]:
        """Owners of the clauses whose count in ``acc`` reaches their need, plus the
        always-true subscriptions."""
        need = self.need
        owner = self.owner
        out = {owner[c] for c, n in Counter(acc).items() if n == need[c]}
        if self.always:
            out.update(self.always)
        return out

    def fired_np(self, acc: list[int], parts: list[np.ndarray[Any, np.dtype[np.intp]]]) -> set[SubId]:
        """:meth:`fired` for ids given partly as numpy runs: one ``bincount`` over all ids
        and one vectorised comparison with the needs (O(len(ids) + number of clauses) in C).
        Without runs, a short ``acc`` is counted by :meth:`fired` (cheaper than the
        O(number of clauses) comparison), a long one (:data:`NUMPY_FROM` ids or more) here."""
        if not parts:
            if len(acc) < NUMPY_FROM:
                return self.fired(acc)
            parts.append(np.fromiter(acc, dtype=np.intp, count=len(acc)))
        elif acc:
            parts.append(np.fromiter(acc, dtype=np.intp, count=len(acc)))
        ids = np.concatenate(parts) if len(parts) > 1 else parts[0]
        n = len(self.need)
        counts = np.bincount(ids, minlength=n)
        hit = np.flatnonzero(counts == self.need_np[:n])
        if self.n_obj == 0:
            # all ids are ints: gather them in C; fresh int objects hash without touching
            # the stored ids scattered over the heap (a cache miss each: 4x faster at 1,000s)
            out = set(self.owner_np[hit].tolist())
        else:
            owner = self.owner
            out = {owner[c] for c in hit.tolist()}
        if self.always:
            out.update(self.always)
        return out

    def _check(self) -> None:
        assert len(self.need) == len(self.owner) == len(self.cpreds) == len(self.ccsl) == len(self.cpos)
        assert self.need_np[: len(self.need)].tolist() == [n if n else -1 for n in self.need]
        assert (self.need_np[len(self.need) :] == -1).all()
        free = set(self.free)
        assert len(free) == len(self.free)
        assert all(n > 0 for n in self.held.values())
        assert not free & self.held.keys(), "a held clause id is free"
        assert len(self.owner_np) == len(self.need_np)
        live_obj = 0
        for cid, o in enumerate(self.owner):
            if o is None:
                continue
            if _int64(o) is not None:
                assert self.owner_np[cid] == o
            else:
                live_obj += 1
        assert live_obj == self.n_obj, (live_obj, self.n_obj)
        assert SINK not in free and self.need[SINK] == 0 and self.owner[SINK] is None
        assert self.cpreds[SINK] == () and self.need_np[SINK] == -1
        for cid, preds in enumerate(self.cpreds):
            if cid == SINK:
                continue
            if cid in free or cid in self.held:
                assert self.need[cid] == 0 and self.owner[cid] is None and preds == ()
                assert self.ccsl[cid] == () and self.cpos[cid] == [] and self.need_np[cid] == -1
                continue
            assert self.need[cid] == len(preds) == len(set(preds)) > 0
            assert all(self.csl[p] is cl for p, cl in zip(preds, self.ccsl[cid], strict=True))
            assert all(cl[i] == cid for cl, i in zip(self.ccsl[cid], self.cpos[cid], strict=True))
            assert cid in self.sub_cids[self.owner[cid]]
            for p in preds:
                assert self.csl[p].count(cid) == 1
        for p, lst in self.csl.items():
            assert lst, p
            assert all(p in self.cpreds[c] for c in lst)
