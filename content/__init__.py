"""Content filters on subscriptions: selector language, attribute extraction, matching engines.

Public surface (CONTRACT.md, "content"): :func:`compile` turns an SQL-92 selector into a
:class:`Filter` (DNF of :class:`Predicate` atoms); :func:`attributes` flattens a JSON payload
into the event an engine matches; :data:`ENGINES` maps engine names to classes that all give
the same answers (seeds 000, 003, 004; brute force is the oracle).

This package imports nothing from ``broker`` or ``bridge``.
"""

from __future__ import annotations

from content._attributes import attributes
from content._betree import BETree
from content._counting import Counting
from content._engine import BruteForce, Engine, Event, SubId
from content._filter import Clause, Filter
from content._hcem import HCEM
from content._hema import HEMA
from content._iccounting import ICCounting
from content._poset import Poset
from content._predicate import Kind, Op, Predicate, Scalar
from content._rabased import RABasedMatching
from content._rein import REIN
from content._selector import FilterSyntaxError, compile

__all__ = [
    "ENGINES",
    "HCEM",
    "HEMA",
    "REIN",
    "BETree",
    "BruteForce",
    "Clause",
    "Counting",
    "Engine",
    "Event",
    "Filter",
    "FilterSyntaxError",
    "ICCounting",
    "Kind",
    "Op",
    "Poset",
    "Predicate",
    "RABasedMatching",
    "Scalar",
    "SubId",
    "attributes",
    "compile",
]

ENGINES: dict[str, type[Engine]] = {
    cls.name: cls
    for cls in (BruteForce, Counting, ICCounting, RABasedMatching, HEMA, REIN, HCEM, BETree, Poset)
}
