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

Build time (it is on the critical path of ``make test``, docs/development.md): mypyc writes one
C file per shared library and gcc compiles each on one core (-O2 or -g0 saved nothing), so the
hot path is one shared library per package folder (``broker/core``, ``broker/protocol``,
``broker/durability``, ``topics``), compiled side by side (``build_ext`` parallel, largest
first): 8.4 MB of C that took ~45 s of one core when ``broker`` was one library. Calls between
the libraries go through mypyc's export tables; the same-run benchmarks showed no loss.
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


def group_folders() -> list[str]:
    """The folders of the hot modules, largest source first: one shared library each."""
    sizes: dict[str, int] = {}
    here = os.path.dirname(os.path.abspath(__file__))
    for m in hot_modules():
        folder = os.path.dirname(m)
        sizes[folder] = sizes.get(folder, 0) + os.path.getsize(os.path.join(here, m))
    return sorted(sizes, key=lambda folder: -sizes[folder])


def remove_orphans(here: str) -> None:
    """Delete extensions of modules no longer compiled (moved or removed sources) and shared
    libraries of folders no longer compiled (an earlier grouping) under ``here`` (the sources,
    or build_ext's build folder that a wheel is made from): an orphan extension would shadow
    the module's new source, or resurrect a deleted module."""
    keep = {m[: -len(".py")] for m in hot_modules()}
    shared = {os.path.join(here, folder) for folder in group_folders()}
    for pkg in ("broker", "topics"):
        for folder, _dirs, files in os.walk(os.path.join(here, pkg)):
            for f in files:
                if not f.endswith((".so", ".pyd")):
                    continue
                if f.startswith("_native__mypyc"):
                    if folder not in shared:
                        os.remove(os.path.join(folder, f))
                    continue
                module = os.path.relpath(os.path.join(folder, f.split(".")[0]), here)
                if module.replace(os.sep, "/") not in keep:
                    os.remove(os.path.join(folder, f))


class OptionalBuildExt(build_ext):
    """Fall back to the pure-Python modules when the C build fails (no compiler, no headers).
    The shared libraries compile side by side, one per core (``--parallel`` overrides)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        remove_orphans(os.path.dirname(os.path.abspath(__file__)))
        remove_orphans(os.path.abspath(self.build_lib))
        try:
            super().run()
            # date every extension by this build (an unchanged shim is not relinked), so that
            # broker._build.stale_modules compares sources with the build that saw them
            for ext in self.extensions:
                path = self.get_ext_fullpath(ext.name)
                if os.path.exists(path):
                    os.utime(path)
        except Exception as exc:  # any build failure means: stay pure Python
            # and really so: an extension left from an earlier build would shadow the sources
            # that failed to compile (stale code that looks built)
            for ext in self.extensions:
                path = self.get_ext_fullpath(ext.name)
                if os.path.exists(path):
                    os.remove(path)
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
    # one shared library per package folder (so topics/ never depends on broker/, not even in
    # C), largest first: build_ext hands them to its threads in this order
    groups = [
        ([p for p in paths if os.path.dirname(p) == folder], folder.replace("/", ".") + "._native")
        for folder in group_folders()
    ]
    if os.environ.get("SIFTMQ_BUILD_GROUPS") == "package":  # the earlier layout (benchmarks/bench_setup.py)
        groups = [
            ([p for p in paths if p.startswith(pkg + "/")], pkg + "._native") for pkg in ("broker", "topics")
        ]
    return list(mypycify(paths, opt_level="3", separate=groups))


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
