"""Topic names and filters, the topic tree, and negative entries (seed 002, the IBM patent).

This package imports nothing from ``broker`` or ``bridge``.
"""

from __future__ import annotations

__all__: list[str] = []
