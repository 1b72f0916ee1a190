"""A compiled module's source run by the interpreter, for tests that must see both builds.

The hot modules are compiled by mypyc; some of their guarantees differ when interpreted
(e.g. a compiled ``DeliveryLog.record`` never lets the GIL go), so their tests run against
the module as imported and against a fresh interpreted copy of its ``.py`` source.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

__all__ = ["interpreted"]


def interpreted(module: ModuleType, name: str) -> ModuleType:
    """A new module named ``name`` executed from ``module``'s ``.py`` source (not its
    compiled extension, not registered in ``sys.modules``)."""
    # a compiled module's file is <name>.cpython-311-x86_64-linux-gnu.so beside <name>.py
    source = Path(module.__file__ or "").parent / (module.__name__.rpartition(".")[2] + ".py")
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
