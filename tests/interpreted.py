"""A compiled module's source run by the interpreter, for tests that must see both builds.

The hot modules are compiled by mypyc; some of their guarantees differ when interpreted
(e.g. a compiled ``DeliveryLog.record`` never lets the GIL go), so their tests run against
the module as imported and against a fresh interpreted copy of its ``.py`` source.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["interpreted"]


def interpreted(module: ModuleType, name: str) -> ModuleType:
    """A new module named ``name`` executed from ``module``'s ``.py`` source (not its
    compiled extension, not registered in ``sys.modules``)."""
    # the source <leaf>.py, found beside its package's __init__.py: a mypyc group that initialises a compiled module
    # through another member of the group gives it a __file__ (and spec origin) under the
    # native library's directory that names no file (seen after broker.packets came first)
    package, _, leaf = module.__name__.rpartition(".")
    source = Path(sys.modules[package].__file__ or "").parent / f"{leaf}.py"
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
