"""Which hot-path modules run compiled (mypyc), and whether a compiled one is stale.

``setup.py`` compiles the codec, session machine, router and topic matching into C
extensions placed next to their sources (``make build``).  An extension shadows its ``.py``
file, so an edit of the source does nothing until the next build: :func:`stale_modules`
finds such modules (extension older than its source) so that ``siftmq serve`` warns and the
test suite refuses to test old code.  Cost: one ``stat`` per module, at start-up only.
"""

from __future__ import annotations

import importlib.util
import os
from importlib.machinery import EXTENSION_SUFFIXES

__all__ = ["HOT_MODULES", "NATIVE_MODULES", "compiled_modules", "stale_modules"]

#: the modules ``setup.py`` compiles (issue 8, "Compiled hot path" in docs/performance.md)
HOT_MODULES = (
    "broker.protocol._record",
    "broker.protocol._values",
    "broker.protocol._wire",
    "broker.protocol._encode",
    "broker.protocol._decode",
    "broker.core._clock",
    "broker.values._flow",
    "broker.values._message",
    "broker.core._session",
    "broker.core._shared",
    "broker.core._router",
    "broker.durability._store",
    "broker.core._deliverylog",
    "broker.core._observers",
    "broker.core._journal",
    "broker.core._core",
    "broker.core._connect",
    "broker.core._subscribe",
    "broker.core._publish",
    "broker.core._internal",
    "broker.core._connrare",
    "broker.core._connection",
    "broker.core._conntimers",
    "topics._match",
    "topics._retained",
    "topics._topicset",
)

#: hand-written C extensions (setup.py's ``NATIVE_MODULES``, optional: the module's Python
#: fallback runs without them), stale when their ``.c`` source is newer than the extension
NATIVE_MODULES = ("topics._gather",)

#: prefix of the shared library that holds a package's compiled code (setup.py's groups)
_SHARED = "_native__mypyc."


def _extension(name: str) -> str | None:
    """The C extension file of module ``name`` next to its package's sources, if any (found
    on disk: the ``__file__`` of a compiled module is not reliable)."""
    package, _, module = name.rpartition(".")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for suffix in EXTENSION_SUFFIXES:
            path = os.path.join(folder, module + suffix)
            if os.path.exists(path):
                return path
    return None


def compiled_modules() -> list[str]:
    """The hot modules that have a C extension, which the import system prefers to the source
    (empty: the pure-Python build)."""
    return [m for m in HOT_MODULES if _extension(m) is not None]


def stale_modules() -> list[str]:
    """Compiled hot modules whose ``.py`` source is newer than their extension, and native
    modules whose ``.c`` source is newer than theirs."""
    stale = []
    for m in HOT_MODULES:
        ext = _extension(m)
        if ext is None:
            continue
        folder = os.path.dirname(ext)
        # a module's own extension is a shim (rebuilt only when its C changes); the code is in
        # the package's shared library, so the newer of the two dates the build
        built = max(
            [os.path.getmtime(ext)]
            + [os.path.getmtime(os.path.join(folder, f)) for f in os.listdir(folder) if f.startswith(_SHARED)]
        )
        source = os.path.join(folder, m.rsplit(".", 1)[1] + ".py")
        if os.path.exists(source) and os.path.getmtime(source) > built:
            stale.append(m)
    for m in NATIVE_MODULES:
        ext = _extension(m)
        if ext is None:
            continue
        source = os.path.join(os.path.dirname(ext), m.rsplit(".", 1)[1] + ".c")
        if os.path.exists(source) and os.path.getmtime(source) > os.path.getmtime(ext):
            stale.append(m)
    return stale
