"""How many examples the suite's costliest Hypothesis model tests draw.

The suite runs on two cores and is CPU-bound (docs/development.md, "Suite time (session 18)"):
the model tests that took more than ~2 s of CPU each draw half of their examples in `make
test` and every other run, and all of them when ``SIFTMQ_HYPOTHESIS=full`` is set::

    SIFTMQ_HYPOTHESIS=full .venv/bin/python -m pytest -p no:xdist tests/topics tests/composite

The same state machines, rules, invariants and step counts either way; only the number of
examples (runs of the machine) differs. Use the full counts after changing what a model
test covers (the index, the composite engine, the broker's composite path, the bridge's
writer), and in the nightly-style runs where time does not matter.
"""

from __future__ import annotations

import os

__all__ = ["FULL", "examples"]

#: ``SIFTMQ_HYPOTHESIS=full``: every model test draws its full count of examples
FULL = os.environ.get("SIFTMQ_HYPOTHESIS", "") == "full"


def examples(full: int) -> int:
    """``full`` with ``SIFTMQ_HYPOTHESIS=full``, else half of it (at least 1): O(1)."""
    return full if FULL else max(1, full // 2)
