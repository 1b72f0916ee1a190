"""Which hot-path modules run compiled (mypyc), and whether a compiled one is stale.

``setup.py`` compiles the codec, session machine, router and topic matching into C
extensions placed next to their sources (``make build``).  An extension shadows its ``.py``
file, so an edit of the source does nothing until the next build: :func:`stale_modules`
finds such modules (extension older than its source) so that ``siftmq serve`` warns and the
test suite refuses to test old code.  Cost: one ``stat`` per module, at start-up only.
"""

from __future__ import annotations

import importlib
import os
from importlib.machinery import EXTENSION_SUFFIXES

__all__ = ["HOT_MODULES", "compiled_modules", "stale_modules"]

#: the modules ``setup.py`` compiles (issue 8, "Compiled hot path" in docs/performance.md)
HOT_MODULES = (
    "broker.packets",
    "broker._codec",
    "broker._router",
    "broker._session",
    "topics._match",
    "topics._retained",
    "topics._topicset",
)


def _file(name: str) -> str:
    return str(getattr(importlib.import_module(name), "__file__", "") or "")


def compiled_modules() -> list[str]:
    """The hot modules imported from a C extension (empty: the pure-Python build)."""
    return [m for m in HOT_MODULES if _file(m).endswith(tuple(EXTENSION_SUFFIXES))]


def stale_modules() -> list[str]:
    """Compiled hot modules whose ``.py`` source is newer than their extension."""
    stale = []
    for m in compiled_modules():
        ext = _file(m)
        source = os.path.join(os.path.dirname(ext), m.rsplit(".", 1)[1] + ".py")
        if os.path.exists(source) and os.path.getmtime(source) > os.path.getmtime(ext):
            stale.append(m)
    return stale
