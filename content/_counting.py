"""The Counting engine: the counting algorithm of Yan and Garcia-Molina (seed 000, ref. [7];
described in seed 000, section 1, as reducing matching work "by judging the duplicate
relation of constraints").

Identical predicates are stored once (Theorem 2) with their clause lists (CSList, shared
with ICCounting through :class:`~content._ic_clauses.ClauseTable`) in a predicate index
keyed by attribute name only.  For each attribute of an event *every* distinct predicate on
that name is evaluated (no operator level, no covering order, no hashing of values: that is
what ICCounting adds); each satisfied predicate credits its clauses, and a clause fires
when its count reaches its number of predicates.

Evaluation is the algorithm's inner loop, so each predicate is stored with a test bound
once at insertion: for ``= <> < <= > >=`` a ``functools.partial`` of the C comparison from
:mod:`operator` with the literal (``attr < x`` is ``partial(gt, x)``), filed under the
predicate's kind; an event value is only tested against the predicates of its own kind
(:func:`~content._predicate.kind_of` once per attribute, not once per predicate), which is
exactly the reference semantics' "a value of another type is unknown".  Everything else
(string patterns, ``IN`` / ``NOT IN`` lists whose members may mix kinds) keeps the reference
:meth:`content.Predicate.test`, so every operator, type mismatch and missing attribute is
exact; OR is handled by counting clauses.

Cost per event: O(predicates on the event's attribute names + CSList entries of the
satisfied ones) -- on a workload whose events carry every attribute (seed 003) that is
*every* distinct predicate, which is why Counting cannot beat an index there (see
docs/content.md, "Counting on the seed 003 workloads"); add/remove O(predicates of the
filter).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import partial
from typing import Any

from content._engine import Engine, Event, SubId
from content._filter import Filter
from content._ic_clauses import ClauseTable
from content._predicate import Kind, Op, Predicate, kind_of

__all__ = ["Counting"]

Test = Callable[[object], bool]

# attr OP x  <=>  x REVERSED(OP) v: the literal is bound as the left operand
_BOUND: dict[Op, Callable[[Any, Any], bool]] = {
    Op.EQ: operator.eq,
    Op.NE: operator.ne,
    Op.LT: operator.gt,
    Op.LE: operator.ge,
    Op.GT: operator.lt,
    Op.GE: operator.le,
}


def _test_of(p: Predicate) -> tuple[Kind | None, Test]:
    """(kind of the values it is tested on -- None: every value --, its test)."""
    fn = _BOUND.get(p.op)
    if fn is None or p.kind is Kind.SET:
        return None, p.test
    return p.kind, partial(fn, p.value)


class Counting(Engine):
    """Counting algorithm: predicate index by name (then by the kind of value a predicate
    can be true on), per-clause counts."""

    name = "counting"

    def __init__(self) -> None:
        super().__init__()
        self._table = ClauseTable()
        # name -> kind (None: any) -> {predicate: (test, CSList)}; dict order is insertion
        # order, removal O(1)
        self._by_name: dict[str, dict[Kind | None, dict[Predicate, tuple[Test, list[int]]]]] = {}

    def _insert(self, sub_id: SubId, f: Filter) -> None:
        csl = self._table.csl
        by_name = self._by_name
        for p in self._table.add(sub_id, f):
            kind, test = _test_of(p)
            by_name.setdefault(p.attr, {}).setdefault(kind, {})[p] = (test, csl[p])

    def _delete(self, sub_id: SubId, f: Filter) -> None:
        by_name = self._by_name
        for p, _ in self._table.remove(sub_id):
            kinds = by_name[p.attr]
            kind = _test_of(p)[0]
            preds = kinds[kind]
            del preds[p]
            if not preds:
                del kinds[kind]
                if not kinds:
                    del by_name[p.attr]

    def match(self, event: Event) -> set[SubId]:
        acc: list[int] = []
        ext = acc.extend
        by_name = self._by_name
        for name, v in event.items():
            kinds = by_name.get(name)
            if kinds is None:
                continue
            preds = kinds.get(kind_of(v))
            if preds is not None:
                for test, cl in preds.values():
                    if test(v):
                        ext(cl)
            preds = kinds.get(None)
            if preds is not None:
                for test, cl in preds.values():
                    if test(v):
                        ext(cl)
        return self._table.fired_np(acc, [])

    def _check(self) -> None:
        super()._check()
        self._table._check()
        flat = {
            p: cl
            for kinds in self._by_name.values()
            for preds in kinds.values()
            for p, (_, cl) in preds.items()
        }
        assert flat.keys() == self._table.csl.keys()
        assert all(flat[p] is cl for p, cl in self._table.csl.items())
        for name, kinds in self._by_name.items():
            assert kinds and all(kinds.values())
            for kind, preds in kinds.items():
                assert all(p.attr == name and _test_of(p)[0] is kind for p in preds)
