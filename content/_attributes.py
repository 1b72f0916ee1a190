"""Attribute extraction from payloads (placeholder until the content issue lands)."""

from __future__ import annotations

from content._predicate import Scalar

__all__ = ["attributes"]


def attributes(payload: bytes) -> dict[str, Scalar]:
    raise NotImplementedError("attributes() is not implemented yet")
