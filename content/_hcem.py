"""The HCEM engine (placeholder until its issue lands; see content/_engine.py for the interface)."""

from __future__ import annotations

from content._engine import Engine, Event, SubId
from content._filter import Filter

__all__ = ["HCEM"]


class HCEM(Engine):
    """Not implemented yet."""

    name = "hcem"

    def _insert(self, sub_id: SubId, f: Filter) -> None:
        raise NotImplementedError("hcem engine is not implemented yet")

    def _delete(self, sub_id: SubId, f: Filter) -> None:
        raise NotImplementedError("hcem engine is not implemented yet")

    def match(self, event: Event) -> set[SubId]:
        raise NotImplementedError("hcem engine is not implemented yet")
