"""Build hook: compile the broker's hot path with mypyc (metadata lives in pyproject.toml).

The modules in ``broker._build.HOT_MODULES`` are ordinary typed Python (mypy strict); mypyc turns them into C
extensions with the same behaviour (docs/performance.md, "Compiled hot path"). Everything else
stays interpreted: modules that users subclass (``broker.hooks``), that are bound by I/O, or
that mypyc cannot compile yet (generic dataclasses in ``topics._index``).

- ``make build`` (and so ``make run`` / ``make test``) runs ``setup.py build_ext --inplace``:
  the ``.so`` files land next to their sources and shadow them; ``broker._build`` reports
  compiled and stale modules, and the test suite refuses to run against a stale one.
- ``SIFTMQ_PURE=1``: build without compiling (the pure-Python package, same behaviour).
- No mypyc, or a C compiler that fails: a warning, and the pure-Python package.
"""

from __future__ import annotations

import ast
import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext


def hot_modules() -> list[str]:
    """``broker._build.HOT_MODULES`` (its one home), read without importing the package."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "broker", "_build.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "HOT_MODULES":
            return [m.replace(".", "/") + ".py" for m in ast.literal_eval(node.value)]
    raise RuntimeError("broker/_build.py: HOT_MODULES not found")


def remove_orphans() -> None:
    """Delete extensions of modules no longer compiled (moved or removed sources): an orphan
    extension would shadow the module's new source, or resurrect a deleted module."""
    here = os.path.dirname(os.path.abspath(__file__))
    keep = {m[: -len(".py")] for m in hot_modules()}
    for pkg in ("broker", "topics"):
        for folder, _dirs, files in os.walk(os.path.join(here, pkg)):
            for f in files:
                if not f.endswith((".so", ".pyd")) or f.startswith("_native__mypyc"):
                    continue
                module = os.path.relpath(os.path.join(folder, f.split(".")[0]), here)
                if module.replace(os.sep, "/") not in keep:
                    os.remove(os.path.join(folder, f))


class OptionalBuildExt(build_ext):
    """Fall back to the pure-Python modules when the C build fails (no compiler, no headers)."""

    def run(self) -> None:
        remove_orphans()
        try:
            super().run()
            # date every extension by this build (an unchanged shim is not relinked), so that
            # broker._build.stale_modules compares sources with the build that saw them
            for ext in self.extensions:
                path = self.get_ext_fullpath(ext.name)
                if os.path.exists(path):
                    os.utime(path)
        except Exception as exc:  # any build failure means: stay pure Python
            print(f"siftmq: compiling the hot path failed ({exc}); using pure Python", file=sys.stderr)


def ext_modules() -> list[object]:
    if os.environ.get("SIFTMQ_PURE"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("siftmq: mypyc not installed; using pure Python", file=sys.stderr)
        return []
    paths = hot_modules()
    # one shared library per package, inside it: topics/ never depends on broker/ (not even in C)
    groups = [
        ([p for p in paths if p.startswith(pkg + "/")], f"{pkg}._native") for pkg in ("broker", "topics")
    ]
    return list(mypycify(paths, opt_level="3", separate=groups))


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
