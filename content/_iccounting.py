"""The ICCounting engine (seed 000, sections 1 and 3.1: the improved counting algorithm,
its ref. [8]/[9]): counting over a constraint multi-level index.

Subscriptions are compiled filters (DNF).  Every clause is counted separately
(:mod:`content._ic_clauses`); its distinct predicates are the paper's constraints, stored
once each (Theorem 2) in :class:`~content._ic_index.CIndex` (type -> name -> operator, with
covering-sorted lists and binary search for ``< <= > >=``, hash tables for ``=`` / ``IN`` and
for prefix / suffix / substring).  Matching one event: for each attribute, two hash lookups
reach its :class:`~content._ic_index.NameIndex`, whose leaves yield the CSLists of every
satisfied constraint; a C-level ``Counter`` pass counts them per clause and a clause whose
count equals its number of predicates fires; a subscription matches when one of its clauses
fires.

Exactness for the whole language (what the paper's index does not hold): negated operators
are leaves that yield all their constraints except the positive hits, general LIKE patterns
are verified by regex inside their leaf, missing attributes and type mismatches never reach a
leaf of the wrong type or name (so those constraints stay uncounted, i.e. false), and OR is
handled by counting clauses instead of subscriptions.  Nothing is left to a separate
verification pass.

Cost per event: O(sum over its attributes of (log n + k + lengths for string leaves)) Python
work, where the ordered leaves credit their satisfied runs as numpy slices, plus
O(total CSList entries of satisfied constraints) in C (``bincount``); add: O(predicates x
log n); remove: O(predicates) (CSLists by swap-remove, ordered leaves' snapshot entries left
dead until their rebuild: issue 42 item 2, a fleet's teardown), plus an O(leaf) rebuild of an
ordered leaf's flattened array after every max(64, leaf/32) changes to it, i.e. amortised
O(1) per change (the leaves stay exact and flattened under churn: see
:class:`content._ic_index._Ordered`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import numpy as np

from content._engine import Engine, Event, SubId
from content._filter import Filter
from content._ic_clauses import ClauseTable
from content._ic_index import ORDERED, CIndex, _Ordered
from content._predicate import Scalar

__all__ = ["ICCounting"]


class ICCounting(Engine):
    """Counting over the multi-level, covering-sorted constraint index of seed 000."""

    name = "iccounting"

    def __init__(self) -> None:
        super().__init__()
        self._table = ClauseTable()
        self._index = CIndex(self._table)
        # id(CSList) of every ``< <= > >=`` constraint -> (its ordered leaf, its value): a
        # CSList entry added or removed is passed on to the leaf without hashing predicates
        self._ordered: dict[int, tuple[_Ordered, Scalar]] = {}

    def _insert(self, sub_id: SubId, f: Filter) -> None:
        table = self._table
        index = self._index
        ordered = self._ordered
        for p in table.add(sub_id, f):
            cl = table.csl[p]
            index.insert(p, cl)
            if p.op in ORDERED:
                ordered[id(cl)] = (index.leaf(p), cast(Scalar, p.value))
        for cl, cid in table.entries:
            leaf = ordered.get(id(cl))
            if leaf is not None:
                leaf[0].add(leaf[1], cid)

    def _delete(self, sub_id: SubId, f: Filter) -> None:
        """O(predicates of ``f``) plus O(log) per ordered entry still in a leaf's delta:
        the ordered leaves drop their snapshot entries lazily (the clause id is held until
        the leaf's next rebuild), the CSLists by swap-remove (issue 42 item 2)."""
        table = self._table
        ordered = self._ordered
        touched: list[_Ordered] = []
        if ordered:
            ccsl = table.ccsl
            for cid in table.sub_cids[sub_id]:  # first the leaves, while every leaf still exists
                for cl in ccsl[cid]:
                    leaf = ordered.get(id(cl))
                    if leaf is not None and leaf[0].drop(leaf[1], cid):
                        table.hold(cid)  # left dead in the snapshot: not reused before its rebuild
                        touched.append(leaf[0])
        gone = table.remove(sub_id)
        if gone:
            index = self._index
            for p, cl in gone:
                ordered.pop(id(cl), None)
                index.delete(p, cl)
        for o in touched:  # a leaf the events never query is squeezed here (holds stay bounded)
            o.settle()

    def collect(self, event: Event, acc: list[int], parts: list[np.ndarray[Any, np.dtype[np.intp]]]) -> None:
        """Credit the clause ids of every constraint ``event`` satisfies (to ``acc`` as
        ints, to ``parts`` as numpy runs of flattened ordered leaves)."""
        leaf_names = self._index.leaf_names
        for name, v in event.items():
            ni = leaf_names(name, v)
            if ni is not None:
                ni.collect(cast(Scalar, v), acc, parts)

    def match(self, event: Event) -> set[SubId]:
        acc: list[int] = []
        parts: list[np.ndarray[Any, np.dtype[np.intp]]] = []
        self.collect(event, acc, parts)
        return self._table.fired_np(acc, parts)

    def _check(self) -> None:
        super()._check()
        self._table._check()
        self._index._check()
        assert set(self._table.sub_cids) == set(self._filters)
        csl = self._table.csl
        want = {id(cl): (self._index.leaf(p), p.value) for p, cl in csl.items() if p.op in ORDERED}
        assert self._ordered == want, "ordered-constraint map out of date"
        # every hold of a removed clause id is one dead entry of an ordered leaf
        holds = Counter(
            c
            for names in self._index.by_kind.values()
            for ni in names.values()
            for o in (ni.gt, ni.ge, ni.lt, ni.le)
            for c in o.stale
        )
        assert holds == Counter(self._table.held), "held clause ids differ from the leaves' dead entries"
