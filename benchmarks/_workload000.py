"""Seed 000's workload generator (section 4.1), for benchmarks/bench_seed000.py.

* D_a: 4 types, Integer 40 %, Float 30 %, String 20 %, Boolean 10 %.  The type belongs to
  the attribute *name* (a name is Integer in every event and constraint that uses it), so
  that constraints and attributes of the same name are comparable -- the paper does not say
  whether types are drawn per name or per occurrence; per occurrence would only add type
  mismatches, which every engine rejects at once.
* D_n: A_n names, each 6 random letters.
* D_op: ``> < >= <= =``, 20 % each.  Booleans take ``=`` only (the language, like SQL,
  orders no booleans; the paper's generator does not say what ``>`` on a Boolean means).
* D_vi = D_vf = [-100, 100]: Integer values uniform integers, Float values uniform reals.
* D_vs: a table of 100 strings of 8 random letters; String values drawn from it.
* D_vb: true / false, 50 % each.
* ``narrow`` (not in the paper, for the duplicate-heavy variant of experiment 2): Integer and
  Float values are drawn from the 21 integers in [-10, 10], so identical attributes recur
  across events as RABasedMatching assumes.
* An event has a uniform number of attributes in [a_l, a_h] with distinct names; a
  subscription has a uniform number of constraints in [c_l, c_h] with distinct names (a
  conjunction: one DNF clause).
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from content import Filter, Kind, Op, Predicate
from content._predicate import Scalar

__all__ = ["Params", "Workload", "generate"]

_TYPES = (("int", 0.4), ("float", 0.3), ("str", 0.2), ("bool", 0.1))
_OPS = (Op.GT, Op.LT, Op.GE, Op.LE, Op.EQ)
_SYMBOL = {Op.GT: ">", Op.LT: "<", Op.GE: ">=", Op.LE: "<=", Op.EQ: "="}


@dataclass(frozen=True, slots=True)
class Params:
    """The paper's test parameters (section 4.1)."""

    E: int = 1000  # events
    a_l: int = 20  # attributes per event, lower bound
    a_h: int = 30  # ... upper bound
    A_n: int = 500  # attribute-name table length
    S: int = 1000  # subscriptions
    c_l: int = 10  # constraints per subscription, lower bound
    c_h: int = 15  # ... upper bound
    narrow: bool = False  # not in the paper: numbers drawn from the 21 integers in [-10, 10]


@dataclass(frozen=True, slots=True)
class Workload:
    params: Params
    events: list[dict[str, Scalar]]
    filters: list[Filter]


def _letters(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(n))


def _lit(v: Scalar) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, str):
        return f"'{v}'"
    return repr(v)


def generate(p: Params, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < p.A_n:
        n = _letters(rng, 6)
        if n not in seen:
            seen.add(n)
            names.append(n)
    kinds = rng.choices([t for t, _ in _TYPES], weights=[w for _, w in _TYPES], k=p.A_n)
    type_of = dict(zip(names, kinds, strict=True))
    table = [_letters(rng, 8) for _ in range(100)]

    def value(name: str) -> Scalar:
        match type_of[name]:
            case "int":
                return rng.randint(-10, 10) if p.narrow else rng.randint(-100, 100)
            case "float":
                return float(rng.randint(-10, 10)) if p.narrow else rng.uniform(-100.0, 100.0)
            case "str":
                return rng.choice(table)
        return rng.random() < 0.5

    events = [
        {n: value(n) for n in rng.sample(names, min(p.A_n, rng.randint(p.a_l, p.a_h)))} for _ in range(p.E)
    ]
    filters = []
    for _ in range(p.S):
        preds = []
        for n in rng.sample(names, min(p.A_n, rng.randint(p.c_l, p.c_h))):
            v = value(n)
            op = Op.EQ if isinstance(v, bool) else rng.choice(_OPS)
            kind = Kind.BOOL if isinstance(v, bool) else Kind.STR if isinstance(v, str) else Kind.NUM
            preds.append(Predicate(n, op, v, kind))
        text = " AND ".join(f"{q.attr} {_SYMBOL[q.op]} {_lit(q.value)}" for q in preds)  # type: ignore[arg-type]
        filters.append(Filter(text, (tuple(preds),)))
    return Workload(p, events, filters)
