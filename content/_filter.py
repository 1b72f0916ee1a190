"""The compiled form of a selector: a disjunction of conjunctions of predicates (DNF).

``Filter`` is what :func:`content.compile` returns and what every engine indexes.  Each
conjunction is a tuple of distinct predicates in a canonical order; identical predicates
are the same value (seed 000, Theorem 2), so an engine may intern them across filters.
A filter with no conjunction never matches; a conjunction with no predicate always does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from content._predicate import Predicate

__all__ = ["Clause", "Filter"]

Clause = tuple[Predicate, ...]


@dataclass(frozen=True, slots=True)
class Filter:
    """A normalised content filter.

    ``selector`` is the source text (kept for display, logs and the bridge); ``clauses`` the
    DNF.  ``matches`` is the reference evaluation used by the brute-force engine: O(total
    number of predicates).
    """

    selector: str
    clauses: tuple[Clause, ...]

    def matches(self, event: Mapping[str, object]) -> bool:
        get = event.get
        return any(all(p.test(get(p.attr)) for p in clause) for clause in self.clauses)

    @property
    def predicates(self) -> frozenset[Predicate]:
        """Every distinct predicate of the filter."""
        return frozenset(p for clause in self.clauses for p in clause)

    @property
    def attributes(self) -> frozenset[str]:
        """Every attribute name the filter reads."""
        return frozenset(p.attr for clause in self.clauses for p in clause)

    def __str__(self) -> str:
        return self.selector
