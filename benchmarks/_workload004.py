"""Seed 004's workload (section 4, Table 3) as a deterministic generator.

Settings from the paper: m attributes per event (20), k constraints per subscription (10)
on distinct random attributes, predicate width theta (0.5); a constraint is a range whose
low end is uniform in [0, 1 - theta] and whose high end is low + theta (so the high ends are
uniform in [theta, 1], the paper's "same distribution" condition); event values uniform.

Choices the paper leaves open: the domain is the integers 0..10,000 (seed 004 "considers
only the integer type", like REIN) scaled from [0, 1]; a range is the selector
``a BETWEEN lo AND hi``, i.e. the predicates ``a >= lo`` and ``a <= hi``.  Predicates are
interned (identical ones are the same object, as content.compile's callers may do) so that
a million filters fit in memory alongside the index.
"""

from __future__ import annotations

import random

from content import Filter, Op, Predicate

__all__ = ["DOMAIN", "Workload"]

DOMAIN = 10_000


class Workload:
    """Subscriptions and events of one setting (m, k, theta); deterministic per seed."""

    def __init__(self, m: int = 20, k: int = 10, width: float = 0.5, seed: int = 4) -> None:
        self.m, self.k, self.width = m, k, width
        self.attrs = [f"a{i}" for i in range(m)]
        self._rng = random.Random(seed)
        self._pred: dict[tuple[int, Op, int], Predicate] = {}
        self._span = round(width * DOMAIN)

    def _p(self, a: int, op: Op, v: int) -> Predicate:
        key = (a, op, v)
        p = self._pred.get(key)
        if p is None:
            p = self._pred[key] = Predicate.of(self.attrs[a], op, v)
        return p

    def subscription(self) -> Filter:
        rng = self._rng
        clause: list[Predicate] = []
        for a in rng.sample(range(self.m), self.k):
            lo = rng.randint(0, DOMAIN - self._span)
            clause.append(self._p(a, Op.GE, lo))
            clause.append(self._p(a, Op.LE, lo + self._span))
        return Filter("", (tuple(clause),))

    def subscriptions(self, n: int) -> list[Filter]:
        return [self.subscription() for _ in range(n)]

    def event(self) -> dict[str, object]:
        randint = self._rng.randint
        return {a: randint(0, DOMAIN) for a in self.attrs}

    def events(self, h: int) -> list[dict[str, object]]:
        return [self.event() for _ in range(h)]
