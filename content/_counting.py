"""The Counting engine: the counting algorithm of Yan and Garcia-Molina (seed 000, ref. [7];
described in seed 000, section 1, as reducing matching work "by judging the duplicate
relation of constraints").

Identical predicates are stored once (Theorem 2) with their clause lists (CSList, shared
with ICCounting through :class:`~content._ic_clauses.ClauseTable`) in a predicate index
keyed by attribute name only.  For each attribute of an event *every* distinct predicate on
that name is evaluated (no operator level, no covering order, no hashing of values: that is
what ICCounting adds); each satisfied predicate increments the counters of its clauses, and
a clause fires when its counter reaches its number of predicates.

Exactness: predicates are evaluated with :meth:`content.Predicate.test`, the reference
three-valued semantics, so every operator, type mismatch and missing attribute is exact; OR
is handled by counting clauses.  Cost per event: O(predicates on the event's attribute
names + CSList entries of the satisfied ones); add/remove O(predicates of the filter).
"""

from __future__ import annotations

from content._engine import Engine, Event, SubId
from content._filter import Filter
from content._ic_clauses import ClauseTable
from content._predicate import Predicate

__all__ = ["Counting"]


class Counting(Engine):
    """Counting algorithm: predicate index by name, per-clause counters."""

    name = "counting"

    def __init__(self) -> None:
        super().__init__()
        self._table = ClauseTable()
        # name -> {predicate: CSList}; dict order is insertion order, removal O(1)
        self._by_name: dict[str, dict[Predicate, list[int]]] = {}

    def _insert(self, sub_id: SubId, f: Filter) -> None:
        csl = self._table.csl
        by_name = self._by_name
        for p in self._table.add(sub_id, f):
            by_name.setdefault(p.attr, {})[p] = csl[p]

    def _delete(self, sub_id: SubId, f: Filter) -> None:
        by_name = self._by_name
        for p, _ in self._table.remove(sub_id):
            preds = by_name[p.attr]
            del preds[p]
            if not preds:
                del by_name[p.attr]

    def match(self, event: Event) -> set[SubId]:
        acc: list[int] = []
        ext = acc.extend
        by_name = self._by_name
        for name, v in event.items():
            preds = by_name.get(name)
            if preds is None:
                continue
            for p, cl in preds.items():
                if p.test(v):
                    ext(cl)
        return self._table.fired(acc)

    def _check(self) -> None:
        super()._check()
        self._table._check()
        flat = {p: cl for preds in self._by_name.values() for p, cl in preds.items()}
        assert flat.keys() == self._table.csl.keys()
        assert all(flat[p] is cl for p, cl in self._table.csl.items())
        assert all(p.attr == name for name, preds in self._by_name.items() for p in preds)
