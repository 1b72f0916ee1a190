"""Selector parser (placeholder until the content issue lands)."""

from __future__ import annotations

from content._filter import Filter

__all__ = ["FilterSyntaxError", "compile"]


class FilterSyntaxError(ValueError):
    """A selector that cannot be parsed; ``position`` is the character offset."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position


def compile(selector: str) -> Filter:
    raise NotImplementedError("selector parser is not implemented yet")
