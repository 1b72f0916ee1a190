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

The JVM provider of ``format("siftmq")`` (``bridge/_jar.py``, Java sources in ``bridge/jvm/src``):
``setup.py build_jar`` (``make build``) compiles ``bridge/jvm/siftmq-spark.jar`` in place, and
``build_py`` puts it into a wheel (the in-place jar when it is current, else compiled there).
No javac, or no pyspark/pyarrow in the build environment: a warning, no jar (the Python data
source serves reads).

Build time (it is on the critical path of ``make test``, docs/development.md): mypyc writes one
C file per shared library and gcc compiles each on one core (-O2 or -g0 saved nothing), so the
hot path is one shared library per package folder (``broker/protocol``, ``broker/durability``,
``broker/values``, ``topics``) and two for ``broker/core`` (``broker._build.SPLIT_LIBRARIES``:
its 7.7 MB of C was the longest compile, on one core), compiled side by side (``build_ext``
parallel, the largest C first): 8.4 MB of C that took ~45 s of one core when ``broker`` was one
library. Calls between the libraries go through mypyc's export tables; the same-run benchmarks
showed no loss.
"""

from __future__ import annotations

import ast
import gc
import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from setuptools import Command, Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

#: mypyc's incremental cache: its own, not the .mypy_cache that ``make typecheck`` rewrites
#: beside the build (mypyc took a module's rewritten metadata as its own and reused old IR)
MYPYC_CACHE = os.path.join("build", "mypyc-cache")

#: gcc's optimization level of mypyc's C (``-O3`` is mypyc's default); ``SIFTMQ_OPT_LEVEL``
#: overrides it (docs/development.md, "Suite time (session 17)": -O1 compiles in ~60 % of the
#: time and runs QoS 0 1.5-9 % slower)
OPT_LEVEL = "3"


def _from_build(name: str) -> Any:
    """A literal (module names) from ``broker/_build.py`` (their one home), read without
    importing the package."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "broker", "_build.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            value = ast.literal_eval(node.value)
            return value if isinstance(value, dict) else list(value)
    raise RuntimeError(f"broker/_build.py defines no {name}")


def hot_modules() -> list[str]:
    """``broker._build.HOT_MODULES`` as source paths."""
    return [m.replace(".", "/") + ".py" for m in _from_build("HOT_MODULES")]


#: C extensions written by hand (not mypyc): module name -> its C source.  topics._gather is the
#: memory-bound loop of SubscriptionIndex.match (issue 42 item 3; the file's comment says why
#: C); topics._index runs the same loop in Python without it (SIFTMQ_PURE=1, no compiler)
NATIVE_MODULES = {m: m.replace(".", "/") + ".c" for m in _from_build("NATIVE_MODULES")}


def libraries() -> dict[str, list[str]]:
    """The shared libraries (mypyc's groups) and their source paths: one per package folder,
    ``<package>._native``, but for ``broker._build.SPLIT_LIBRARIES`` (a library of their own)."""
    split = {m: lib for lib, modules in _from_build("SPLIT_LIBRARIES").items() for m in modules}
    libs: dict[str, list[str]] = {}
    for m in _from_build("HOT_MODULES"):
        lib = split.get(m, m.rpartition(".")[0] + "._native")
        libs.setdefault(lib, []).append(m.replace(".", "/") + ".py")
    return libs


def remove_orphans(here: str) -> None:
    """Delete extensions of modules no longer compiled (moved or removed sources) and shared
    libraries of folders no longer compiled (an earlier grouping) under ``here`` (the sources,
    or build_ext's build folder that a wheel is made from): an orphan extension would shadow
    the module's new source, or resurrect a deleted module."""
    keep = {m[: -len(".py")] for m in hot_modules()} | {m.replace(".", "/") for m in NATIVE_MODULES}
    shared = {os.path.join(here, *lib.split(".")) + "__mypyc" for lib in libraries()}
    for pkg in ("broker", "topics"):
        for folder, _dirs, files in os.walk(os.path.join(here, pkg)):
            for f in files:
                if not f.endswith((".so", ".pyd")):
                    continue
                if "__mypyc." in f:
                    if os.path.join(folder, f.split(".")[0]) not in shared:
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
        here = os.path.dirname(os.path.abspath(__file__))
        remove_orphans(here)
        remove_orphans(os.path.abspath(self.build_lib))
        inplace = self.inplace  # setuptools' run clears it while building, and on failure leaves it so
        if not inplace and self._reuse_inplace(here):
            return
        try:
            try:
                super().run()
            except Exception:
                # mypyc's incremental mode (its IR cache) can generate C whose calls into
                # another library name symbols missing from that library's export table (seen
                # with mypy 2.4 when every module came from the cache): once more, from fresh IR
                if not os.path.isdir(MYPYC_CACHE):
                    raise
                print("siftmq: compiling failed; again without mypyc's cache", file=sys.stderr)
                shutil.rmtree(MYPYC_CACHE)
                ext_modules()  # rewrites the C files at the same paths as self.extensions'
                self.inplace, self.compiler = inplace, None  # as before the first attempt
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
            for self.inplace in {inplace, False}:  # the copies in the sources and in build_lib
                for ext in self.extensions:
                    path = self.get_ext_fullpath(ext.name)
                    if os.path.exists(path):
                        os.remove(path)
            self.inplace = inplace
            print(f"siftmq: compiling the hot path failed ({exc}); using pure Python", file=sys.stderr)

    def _reuse_inplace(self, here: str) -> bool:
        """A wheel built beside an in-place build (``make wheel`` after ``make build``) takes
        its extensions, compiled from these very sources, instead of compiling them again:
        every in-place extension must exist and be newer than every hot module and this file."""
        self.inplace = True
        built = [self.get_ext_fullpath(ext.name) for ext in self.extensions]
        self.inplace = False
        if not built or not all(os.path.exists(p) for p in built):
            return False
        sources = [os.path.join(here, m) for m in [*hot_modules(), *NATIVE_MODULES.values()]]
        sources.append(os.path.abspath(__file__))
        if min(os.path.getmtime(p) for p in built) < max(os.path.getmtime(p) for p in sources):
            return False
        for ext, path in zip(self.extensions, built, strict=True):
            target = self.get_ext_fullpath(ext.name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(path, target)
        print("siftmq: the in-place compiled hot path is current; the wheel takes it", file=sys.stderr)
        return True


def ext_modules() -> list[object]:
    if os.environ.get("SIFTMQ_PURE"):
        return []
    # optional: if one fails to compile, the others (and mypyc's) are still built, and its
    # Python fallback runs (topics._index without topics._gather)
    native: list[object] = [
        Extension(name, [src], extra_compile_args=["-O2"], optional=True)
        for name, src in NATIVE_MODULES.items()
    ]
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("siftmq: mypyc not installed; using pure Python", file=sys.stderr)
        return native
    paths = hot_modules()
    # one shared library per package folder (so topics/ never depends on broker/, not even in
    # C), broker/core in two (broker._build.SPLIT_LIBRARIES)
    groups = [(sources, lib) for lib, sources in libraries().items()]
    if os.environ.get("SIFTMQ_BUILD_GROUPS") == "folder":  # one per folder (benchmarks/bench_setup.py)
        groups = [
            ([p for p in paths if os.path.dirname(p) == folder], folder.replace("/", ".") + "._native")
            for folder in sorted({os.path.dirname(p) for p in paths})
        ]
    if os.environ.get("SIFTMQ_BUILD_GROUPS") == "package":  # the earlier layout (benchmarks/bench_setup.py)
        groups = [
            ([p for p in paths if p.startswith(pkg + "/")], pkg + "._native") for pkg in ("broker", "topics")
        ]
    level = os.environ.get("SIFTMQ_OPT_LEVEL", OPT_LEVEL)
    if level not in ("0", "1", "2", "3"):  # one line, not a page of gcc errors per module
        sys.exit(f"setup.py: SIFTMQ_OPT_LEVEL={level!r}: expected 0, 1, 2 or 3")
    compiled = mypycify(["--cache-dir", MYPYC_CACHE, *paths], opt_level=level, separate=groups)
    # mypyc's analysis leaves mypy's whole build of the hot path's import graph in this process
    # (~3 million objects from an empty cache): the collections of the interpreter's shutdown
    # walked them for ~10 s of one core after the build was done, at the end of the set-up's
    # critical path (docs/development.md, "Suite time (session 19)"). Frozen (never collected,
    # as a process that is about to exit can afford), the process exits at once
    gc.freeze()
    # largest C first (mypycify has written it): build_ext's threads take them in this order,
    # so the longest compile starts first and the small ones fill the other core
    compiled.sort(key=lambda ext: -sum(os.path.getsize(src) for src in ext.sources if os.path.exists(src)))
    return [*compiled, *native]


def jar_module() -> ModuleType:
    """``bridge/_jar.py`` loaded by path (standard library only): the package is not importable
    while it is being built."""
    path = Path(__file__).resolve().parent / "bridge" / "_jar.py"
    spec = importlib.util.spec_from_file_location("_siftmq_build_jar", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_jar(target: Path) -> None:
    """``target``: the provider's jar, compiled unless the in-place one is current (then copied);
    a warning when it cannot be built."""
    jar = jar_module()
    root = Path(__file__).resolve().parent
    if jar.jar_is_current(root, jar.JAR):
        if target.resolve() != jar.JAR.resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(jar.JAR, target)
        return
    why = jar.build_jar(root, target)
    if why is not None:
        print(f"siftmq: no JVM provider jar ({why}); format('siftmq') reads with Python", file=sys.stderr)


class BuildJar(Command):
    """``setup.py build_jar``: ``bridge/jvm/siftmq-spark.jar`` in place (``make build``)."""

    description = "compile the JVM provider of format('siftmq') in place"
    user_options: ClassVar[list[tuple[str, str | None, str]]] = []

    def initialize_options(self) -> None:
        pass

    def finalize_options(self) -> None:
        pass

    def run(self) -> None:
        make_jar(jar_module().JAR)


class BuildPyWithJar(build_py):
    """The wheel's ``bridge/jvm/siftmq-spark.jar`` (package data)."""

    def run(self) -> None:
        super().run()
        make_jar(Path(self.build_lib) / "bridge" / "jvm" / "siftmq-spark.jar")


setup(
    ext_modules=ext_modules(),
    cmdclass={"build_ext": OptionalBuildExt, "build_jar": BuildJar, "build_py": BuildPyWithJar},
)
