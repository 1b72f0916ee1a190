"""Seed 003's workload (section 4.1, Table 2) as a deterministic generator.

The paper's scenario: fighter aircraft publish events with six degrees of freedom, position
and time; radars subscribe.  Table 2:

=========================  ============  ============
parameter                  experiment 1  experiment 2
=========================  ============  ============
attributes                 13            15
predicate families / sub   1-6           3-8
equality predicates        10 %          10 %
same-predicate partial     50 %          70 %
order subscriptions
=========================  ============  ============

What the paper leaves open, chosen here (and stated in docs/performance-hema.md):

* attribute ``time`` is an int in [0, 1000); the others are doubles in [0, 100) with one
  decimal (so that an equality can hit: 1/1000 per attribute);
* every event carries every attribute, uniformly distributed;
* a *partial-order* subscription belongs to one of ``groups`` predicate signatures (distinct
  attributes, each with a fixed direction and operator) and sits at a random position ``t``
  of its group's nested family of thresholds, so the members of one group form one chain;
  one family passes an event with probability between 0.2 (the group's tightest member)
  and 0.7 (its loosest); these subscriptions hold no equality predicate;
* every other subscription draws its attributes and directions at random; each of its
  predicates is an equality with the probability that makes equalities 10 % of all
  predicates (10 % / (1 - partial-order share)), else ``<``, ``<=``, ``>`` or ``>=`` with a
  uniform threshold.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from content import Filter, Op, Predicate

__all__ = ["EXPERIMENTS", "Experiment", "Workload"]

ATTRIBUTES = (
    "time",
    "x",
    "y",
    "z",
    "roll",
    "pitch",
    "yaw",
    "vx",
    "vy",
    "vz",
    "lat",
    "lon",
    "alt",
    "speed",
    "heading",
)


@dataclass(frozen=True, slots=True)
class Experiment:
    """One column of seed 003's Table 2 plus the generator's free choices."""

    name: str
    attributes: int
    families: tuple[int, int]
    equality: float
    partial_order: float
    groups: int = 50


EXPERIMENTS = {
    "1": Experiment("1", 13, (1, 6), 0.10, 0.50),
    "2": Experiment("2", 15, (3, 8), 0.10, 0.70),
}


@dataclass(frozen=True, slots=True)
class _Dim:
    attr: str
    op: Op
    tight: float
    loose: float


class Workload:
    """Deterministic subscriptions and events of one experiment.

    ``seed`` fixes the application (the partial-order groups); ``stream`` selects an
    independent sequence of subscriptions and events within it (the churn experiment draws
    its replacements from another stream of the same application).
    """

    def __init__(self, experiment: Experiment, seed: int = 3, stream: int = 0) -> None:
        self.experiment = experiment
        self.attrs = ATTRIBUTES[: experiment.attributes]
        self._rng = random.Random(seed)
        self._eq_share = experiment.equality / (1.0 - experiment.partial_order)
        self._groups = [self._group() for _ in range(experiment.groups)]
        self._rng = random.Random(seed * 1_000_003 + stream)
        self.count = 0

    def _value(self, attr: str) -> float | int:
        rng = self._rng
        if attr == "time":
            return rng.randrange(1000)
        return rng.randrange(1000) / 10

    def _scale(self, attr: str) -> float:
        return 1000.0 if attr == "time" else 100.0

    def _group(self) -> list[_Dim]:
        rng = self._rng
        lo, hi = self.experiment.families
        dims = []
        for attr in rng.sample(self.attrs, rng.randint(lo, hi)):
            s = self._scale(attr)
            # a member passes one family with probability 0.2-0.7 (0.44 on average)
            tight = rng.uniform(0.2, 0.5)
            loose = rng.uniform(tight, 0.7)
            if rng.random() < 0.5:  # upper threshold: x < v, looser when v grows
                dims.append(_Dim(attr, rng.choice([Op.LT, Op.LE]), tight * s, loose * s))
            else:  # lower threshold: x > v, looser when v shrinks
                dims.append(_Dim(attr, rng.choice([Op.GT, Op.GE]), (1 - tight) * s, (1 - loose) * s))
        return dims

    def _threshold(self, attr: str, x: float) -> float | int:
        return round(x) if attr == "time" else round(x, 1)

    def subscription(self) -> Filter:
        """The next subscription (a one-conjunction filter)."""
        rng = self._rng
        self.count += 1
        preds: list[Predicate] = []
        if rng.random() < self.experiment.partial_order:
            t = rng.random()
            for d in rng.choice(self._groups):
                v = self._threshold(d.attr, d.tight + t * (d.loose - d.tight))
                preds.append(Predicate.of(d.attr, d.op, v))
        else:
            lo, hi = self.experiment.families
            for attr in rng.sample(self.attrs, rng.randint(lo, hi)):
                if rng.random() < self._eq_share:
                    preds.append(Predicate.of(attr, Op.EQ, self._value(attr)))
                else:
                    op = rng.choice([Op.LT, Op.LE, Op.GT, Op.GE])
                    preds.append(Predicate.of(attr, op, self._value(attr)))
        clause = tuple(preds)
        return Filter(" AND ".join(map(str, clause)), (clause,))

    def event(self) -> dict[str, object]:
        return {a: self._value(a) for a in self.attrs}
