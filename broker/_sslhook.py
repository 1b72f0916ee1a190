"""``ssl`` loaded at its first use, asyncio included (issue 42 item 1: the light broker's footprint).

``import asyncio`` imports :mod:`ssl` (``asyncio.base_events``, ``selector_events`` and
``sslproto`` do ``try: import ssl except ImportError: ssl = None``), and ``ssl`` maps OpenSSL's
``libcrypto`` and ``libssl``: about 4.5 MB of the 20 MB that an interpreter with asyncio
occupies, for a broker that may have no TLS listener at all. ``siftmq serve`` therefore imports
asyncio through :func:`import_asyncio_without_ssl`: ``ssl`` is hidden while asyncio is imported
(``sys.modules["ssl"] = None`` makes the import fail, so those modules hold ``ssl = None``), and
a finder first on ``sys.meta_path`` waits for the first real ``import ssl``, by anyone (a TLS
listener, the HTTP authentication's client, uvloop, a plugin's library). Once that module is
executed, the finder gives it to every module that got ``None`` meanwhile (and rebuilds the one
module-level value derived from it, ``asyncio.sslproto.SSLAgainErrors``), then takes itself
off ``sys.meta_path``: from then on asyncio is exactly as if ``ssl`` had been imported first.
Code that hands asyncio an ``ssl.SSLContext`` has imported ``ssl`` to make it, so asyncio
always has the module before it needs it.

Only the command line does this (an embedding program imports asyncio itself); when ``ssl``
or asyncio is already imported it does nothing. O(1): one probe per import while waiting.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["import_asyncio_without_ssl"]


class _Relink:
    """The loader of ``ssl`` wrapped: once the module is executed, it is handed to the modules
    that hid it (``finder.waiting``) and the finder leaves ``sys.meta_path``."""

    def __init__(self, loader: Any, finder: _SslFinder) -> None:
        self.loader = loader
        self.finder = finder

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self.loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        for waiter in self.finder.waiting:
            if vars(waiter).get("ssl", 0) is None:
                waiter.ssl = module  # type: ignore[attr-defined]
        proto = sys.modules.get("asyncio.sslproto")
        if proto is not None and not hasattr(proto, "SSLAgainErrors"):  # `if ssl is not None:` at import
            proto.SSLAgainErrors = (module.SSLWantReadError, module.SSLSyscallError)  # type: ignore[attr-defined]
        if self.finder in sys.meta_path:  # done: ssl is imported for good
            sys.meta_path.remove(self.finder)


class _SslFinder:
    """First on ``sys.meta_path`` until ``ssl`` is imported: finds it with the other finders
    and wraps its loader in :class:`_Relink` (also for ``importlib.util.find_spec("ssl")``,
    which loads nothing: the finder stays until a spec of it is executed)."""

    def __init__(self, waiting: list[ModuleType]) -> None:
        self.waiting = waiting

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != "ssl":
            return None
        for finder in sys.meta_path:
            find = None if finder is self else getattr(finder, "find_spec", None)
            spec: ModuleSpec | None = None if find is None else find(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Relink(spec.loader, self)  # type: ignore[assignment]
                return spec
        return None


def import_asyncio_without_ssl() -> None:
    """Import asyncio with ``ssl`` left for its first real use (module docstring)."""
    if "ssl" in sys.modules or "asyncio" in sys.modules:
        return
    before = set(sys.modules)
    sys.modules["ssl"] = None  # type: ignore[assignment]
    try:
        import asyncio  # noqa: F401
    finally:
        del sys.modules["ssl"]
    waiting = [
        m
        for n in sys.modules.keys() - before
        if (m := sys.modules[n]) is not None and vars(m).get("ssl", 0) is None
    ]
    sys.meta_path.insert(0, _SslFinder(waiting))
