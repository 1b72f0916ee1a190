"""Content filters on subscriptions: selector language, attribute extraction, matching engines.

Public surface (docs/reference.md, "content"): :func:`compile` turns an SQL-92 selector into a
:class:`Filter` (DNF of :class:`Predicate` atoms) and :func:`format_filter` prints that normal
form back as selector text; :func:`attributes` flattens a JSON payload
into the event an engine matches; :data:`ENGINES` maps engine names to classes that all give
the same answers (seeds 000, 003, 004; brute force is the oracle). The product engines live
here; the research baselines (BE-Tree, Poset, TAMA, H-Tree), kept to reproduce the papers'
comparisons, live in :mod:`content.baselines` and are listed in :data:`ENGINES` under their
names all the same.

This package imports nothing from ``broker`` or ``bridge``.

The engines are imported when first used (issue 42, the idle broker's footprint): most need
numpy and a broker uses one, the configured one. :data:`ENGINES` is a read-only mapping that
lists every name without importing anything and imports an engine's module at its first lookup
(``ENGINES["hema"]``); the classes (``content.HEMA``, ``from content import TAMA``) are module
attributes loaded the same way (PEP 562 ``__getattr__``).

Seam (docs/architecture.md, "Seams"): this module and :mod:`content.baselines` are the
package's public modules, for users, for ``composite`` and for the broker; nobody outside
``content`` imports its ``_``-modules (``tests/test_layers.py``). Stable: the selector
language, :func:`compile`, :func:`attributes`, :data:`ENGINES` and the ``Engine`` interface;
the engines' internals are not.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from content._attributes import attributes
    from content._counting import Counting
    from content._engine import BruteForce, Engine, Event, SubId
    from content._filter import Clause, Filter
    from content._hcem import HCEM
    from content._hema import HEMA
    from content._iccounting import ICCounting
    from content._predicate import Kind, Op, Predicate, Scalar
    from content._rabased import RABasedMatching
    from content._rein import REIN
    from content._selector import FilterSyntaxError, compile, format_filter
    from content.baselines import TAMA, BETree, HTree, Poset

__all__ = [
    "ENGINES",
    "HCEM",
    "HEMA",
    "REIN",
    "TAMA",
    "BETree",
    "BruteForce",
    "Clause",
    "Counting",
    "Engine",
    "Event",
    "Filter",
    "FilterSyntaxError",
    "HTree",
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
    "format_filter",
]

#: name -> its module, for the names loaded at their first use: the engines, and the selector
#: language, filters and attribute extraction (a broker without content filters loads none of
#: them, issue 42 item 1; the first ``content.compile`` or ``content.attributes`` does)
_CLASSES: dict[str, str] = {
    "attributes": "content._attributes",
    "BruteForce": "content._engine",
    "Engine": "content._engine",
    "Event": "content._engine",
    "SubId": "content._engine",
    "Clause": "content._filter",
    "Filter": "content._filter",
    "Kind": "content._predicate",
    "Op": "content._predicate",
    "Predicate": "content._predicate",
    "Scalar": "content._predicate",
    "FilterSyntaxError": "content._selector",
    "compile": "content._selector",
    "format_filter": "content._selector",
    "Counting": "content._counting",
    "ICCounting": "content._iccounting",
    "RABasedMatching": "content._rabased",
    "HEMA": "content._hema",
    "REIN": "content._rein",
    "HCEM": "content._hcem",
    "BETree": "content.baselines",
    "Poset": "content.baselines",
    "TAMA": "content.baselines",
    "HTree": "content.baselines",
}

#: engine name (``Engine.name``) -> class name, in the order ENGINES lists them
_NAMES: dict[str, str] = {
    "brute-force": "BruteForce",
    "counting": "Counting",
    "iccounting": "ICCounting",
    "rabased": "RABasedMatching",
    "hema": "HEMA",
    "rein": "REIN",
    "hcem": "HCEM",
    "betree": "BETree",
    "poset": "Poset",
    "tama": "TAMA",
    "htree": "HTree",
}


def __getattr__(name: str) -> object:
    """A name of :data:`_CLASSES`, its module imported at its first use (PEP 562); then a
    module attribute like any (O(1) after the first, no call)."""
    home = _CLASSES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


class _Engines(Mapping[str, "type[Engine]"]):
    """Engine name -> engine class; a read-only mapping whose lookups import the engine's
    module at its first use. Names, ``in``, ``len`` and iteration import nothing. O(1)."""

    __slots__ = ()

    def __getitem__(self, name: str) -> type[Engine]:
        cls_name = _NAMES[name]  # KeyError for an unknown engine, as a dict
        cls = globals().get(cls_name)
        return cast("type[Engine]", cls if cls is not None else __getattr__(cls_name))

    def __iter__(self) -> Iterator[str]:
        return iter(_NAMES)

    def __len__(self) -> int:
        return len(_NAMES)

    def __contains__(self, name: object) -> bool:
        return name in _NAMES

    def __repr__(self) -> str:
        return f"ENGINES({', '.join(_NAMES)})"


#: engine name -> class (a read-only mapping: ``ENGINES["hema"]``, ``in``, iteration, ``len``)
ENGINES: Mapping[str, type[Engine]] = _Engines()
