"""Brute-force references for the topics tests (independent of the implementation).

``ref_match`` is the definition written as naive recursion; ``Universe`` enumerates every
topic name up to a length over a finite alphabet of levels: the literals the test filters use
plus fresh symbols ("q" and "$q", never used in filters) standing for every other level.
"""

from __future__ import annotations

import itertools
from functools import cache

LITERALS = ("a", "$b")  # literals filters may use (one '$' literal for the '$' rule)
FRESH = ("q", "$q")  # levels no filter mentions
LEVELS = LITERALS + FRESH


@cache
def _ref(p: tuple[str, ...], t: tuple[str, ...]) -> bool:
    if not p:
        return not t
    head = p[0]
    if head == "#":
        return _ref(p[1:], t) or (bool(t) and _ref(p, t[1:]))
    if not t:
        return False
    return (head == "+" or head == t[0]) and _ref(p[1:], t[1:])


def ref_match(f: str, topic: str) -> bool:
    """'+' one level, '#' zero or more levels anywhere; wildcard-first never matches '$...'."""
    p = tuple(f.split("/"))
    if p[0] in ("+", "#") and topic.startswith("$"):
        return False
    return _ref(p, tuple(topic.split("/")))


def all_topics(max_levels: int, levels: tuple[str, ...] = LEVELS) -> list[str]:
    out = []
    for n in range(1, max_levels + 1):
        out.extend("/".join(t) for t in itertools.product(levels, repeat=n))
    return out


def all_filters(max_levels: int, extended: bool, literals: tuple[str, ...] = LITERALS) -> list[str]:
    """Every filter up to ``max_levels`` levels over ``literals`` + '+' + '#'."""
    syms = (*literals, "+", "#")
    out = []
    for n in range(1, max_levels + 1):
        for t in itertools.product(syms, repeat=n):
            if not extended and "#" in t[:-1]:
                continue
            out.append("/".join(t))
    return out


class Universe:
    """Match sets of filters over all topics up to ``max_levels`` levels (cached)."""

    def __init__(self, max_levels: int) -> None:
        self.topics = all_topics(max_levels)
        self._cache: dict[str, frozenset[int]] = {}

    def M(self, f: str) -> frozenset[int]:
        s = self._cache.get(f)
        if s is None:
            s = frozenset(i for i, t in enumerate(self.topics) if ref_match(f, t))
            self._cache[f] = s
        return s

    def includes(self, x: str, y: str) -> bool:
        return self.M(y) <= self.M(x)

    def overlaps(self, x: str, y: str) -> bool:
        return bool(self.M(x) & self.M(y))
