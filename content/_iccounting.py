"""The ICCounting engine (placeholder until its issue lands; see content/_engine.py for the interface)."""

from __future__ import annotations

from content._engine import Engine, Event, SubId
from content._filter import Filter

__all__ = ["ICCounting"]


class ICCounting(Engine):
    """Not implemented yet."""

    name = "iccounting"

    def _insert(self, sub_id: SubId, f: Filter) -> None:
        raise NotImplementedError("iccounting engine is not implemented yet")

    def _delete(self, sub_id: SubId, f: Filter) -> None:
        raise NotImplementedError("iccounting engine is not implemented yet")

    def match(self, event: Event) -> set[SubId]:
        raise NotImplementedError("iccounting engine is not implemented yet")
