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

__all__ = ["HOT_MODULES", "NATIVE_MODULES", "SPLIT_LIBRARIES", "compiled_modules", "library", "stale_modules"]

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

#: The shared libraries (mypyc's groups, setup.py): a package folder's hot modules are one library,
#: ``<package>._native``, except the modules listed here, which are the library named by their key
#: (in the same folder). gcc compiles each library's one C file on one core, libraries side by side:
#: ``broker/core`` alone was 7.7 MB of C, the set-up's longest step on one core while the other
#: core's libraries (4.0 MB) were done; split by C size (``build/broker/core/__native__native.c``
#: by module: router 1.55 MB, core 1.17, publish 0.68, connection 0.67, journal 0.64, subscribe
#: 0.57, connect 0.45, session 0.41, deliverylog 0.32, shared 0.29, conntimers 0.27, internal
#: 0.23, connrare 0.22, observers 0.17, clock 0.09) into 4.0 and 3.7 MB. A call into another
#: library goes through that library's export table (one pointer load), as between folders
#: (docs/development.md, "Suite time (session 19)").
SPLIT_LIBRARIES = {
    "broker.core._native_conn": (
        "broker.core._publish",
        "broker.core._connection",
        "broker.core._journal",
        "broker.core._subscribe",
        "broker.core._connect",
        "broker.core._conntimers",
        "broker.core._internal",
        "broker.core._connrare",
    ),
}

#: suffix mypyc gives a shared library's extension module (``<library>__mypyc.<ABI>.so``)
_SHARED = "__mypyc."


def library(name: str) -> str:
    """The shared library (mypyc group) that holds hot module ``name``'s code: O(libraries)."""
    for lib, modules in SPLIT_LIBRARIES.items():
        if name in modules:
            return lib
    return name.rpartition(".")[0] + "._native"


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
        # its shared library (:func:`library`), so the newer of the two dates the build
        shared = library(m).rpartition(".")[2] + _SHARED
        built = max(
            [os.path.getmtime(ext)]
            + [os.path.getmtime(os.path.join(folder, f)) for f in os.listdir(folder) if f.startswith(shared)]
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
