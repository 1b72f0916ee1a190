"""Deliveries and subscription changes streamed to a landing zone that Spark reads.

Imports from ``broker`` only its public hook records (:mod:`broker.hooks`).
"""

from __future__ import annotations

__all__: list[str] = []
