"""The engine interface (docs/reference.md, "content") and the brute-force oracle.

Every engine maps subscription ids to :class:`~content._filter.Filter` values and answers
``match(event)`` with the set of ids whose filter the event satisfies.  Engines differ only
in speed and memory; :class:`BruteForce` evaluates every filter and is the reference the
property tests compare all others with (seed 000 uses brute force as its baseline too).
"""

from __future__ import annotations

import abc
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import ClassVar

from content._filter import Filter

__all__ = ["BruteForce", "Engine", "Event", "SubId"]

SubId = Hashable
Event = Mapping[str, object]


def as_filter(selector_or_filter: str | Filter) -> Filter:
    """Compile a selector string; pass a Filter through."""
    if isinstance(selector_or_filter, Filter):
        return selector_or_filter
    from content._selector import compile as compile_selector

    return compile_selector(selector_or_filter)


class Engine(abc.ABC):
    """Base class: id bookkeeping, ``add`` replacing an existing id, batch by default per event.

    Subclasses implement ``_insert``, ``_delete`` and ``match``; ``match_batch`` may be
    overridden by batch engines (RABasedMatching, HCEM).
    """

    name: ClassVar[str]
    #: True for engines whose ``match_batch`` shares work among the events of a batch (the
    #: broker then matches the PUBLISHes of one read as one batch); False: a loop over ``match``
    batch_native: ClassVar[bool] = False
    #: the smallest batch for which ``match_batch`` beats a loop over ``match`` (batch engines)
    batch_min_events: ClassVar[int] = 2

    def __init__(self) -> None:
        self._filters: dict[SubId, Filter] = {}

    def add(self, sub_id: SubId, selector_or_filter: str | Filter) -> None:
        """Add (or replace) subscription ``sub_id``; a selector string is compiled first."""
        f = as_filter(selector_or_filter)
        if sub_id in self._filters:
            self.remove(sub_id)
        self._filters[sub_id] = f
        self._insert(sub_id, f)

    def remove(self, sub_id: SubId) -> None:
        """Remove subscription ``sub_id``; KeyError when it is unknown."""
        f = self._filters.pop(sub_id)
        self._delete(sub_id, f)

    def filter_of(self, sub_id: SubId) -> Filter:
        return self._filters[sub_id]

    def __len__(self) -> int:
        return len(self._filters)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self._filters

    def __iter__(self) -> Iterator[SubId]:
        return iter(self._filters)

    @abc.abstractmethod
    def _insert(self, sub_id: SubId, f: Filter) -> None: ...

    @abc.abstractmethod
    def _delete(self, sub_id: SubId, f: Filter) -> None: ...

    @abc.abstractmethod
    def match(self, event: Event) -> set[SubId]:
        """Ids of the subscriptions that ``event`` satisfies."""

    def match_batch(self, events: Sequence[Event]) -> list[set[SubId]]:
        """``[match(e) for e in events]``; batch engines override this."""
        return [self.match(e) for e in events]

    def _check(self) -> None:
        """Assert the engine's invariants (subclasses extend)."""
        assert all(isinstance(f, Filter) for f in self._filters.values())


class BruteForce(Engine):
    """Evaluate every filter against the event: O(total predicates) per event."""

    name = "brute-force"

    def _insert(self, sub_id: SubId, f: Filter) -> None:
        pass

    def _delete(self, sub_id: SubId, f: Filter) -> None:
        pass

    def match(self, event: Event) -> set[SubId]:
        return {sid for sid, f in self._filters.items() if f.matches(event)}
