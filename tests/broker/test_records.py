"""The hand-written per-message records (broker.protocol._record) keep a frozen dataclass's value
semantics, and the hot path really runs compiled where it was built so (broker._build)."""

from __future__ import annotations

import os
import pathlib

import pytest

from broker._build import HOT_MODULES, compiled_modules, stale_modules
from broker.packets import NO_PROPERTIES, Properties, Puback, Pubcomp, Publish, Pubrec, Pubrel, ReasonCode
from broker.values import Message, Route


def test_value_semantics() -> None:
    a = Publish("a/b", b"x", 1, packet_id=7, properties=Properties(content_type="t"))
    b = Publish("a/b", b"x", 1, False, False, 7, Properties(content_type="t"))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Publish("a/b", b"x", 1, packet_id=8)
    assert repr(Publish("t")) == (
        "Publish(topic='t', payload=b'', qos=0, retain=False, dup=False, packet_id=None, "
        f"properties={NO_PROPERTIES!r})"
    )
    # sibling acks with equal fields are different packets
    acks = [cls(3, ReasonCode.SUCCESS) for cls in (Puback, Pubrec, Pubrel, Pubcomp)]
    assert len(set(acks)) == 4 and acks[0] == Puback(3)


def test_replace() -> None:
    m = Message("t", b"p", 1, True, NO_PROPERTIES, "pub", 9, 1.5, None)
    r = m.replace(qos=0, expires_at=3.0)
    assert (r.qos, r.expires_at, r.topic, r.message_id) == (0, 3.0, "t", 9) and m.qos == 1
    with pytest.raises(TypeError, match="no field nope"):
        m.replace(nope=1)
    route = Route("c", 1, False, (4,), "t/#", None)
    assert route.replace(selector="x > 1") == Route("c", 1, False, (4,), "t/#", "x > 1")


@pytest.mark.skipif("broker.protocol._record" not in compiled_modules(), reason="pure-Python build")
def test_compiled_records_are_read_only() -> None:
    p = Publish("t", b"x")
    with pytest.raises(AttributeError):
        p.qos = 2  # type: ignore[misc]


def test_the_build_under_test_is_the_one_asked_for() -> None:
    """``make test`` compiles the hot path; only SIFTMQ_PURE=1 may leave it interpreted."""
    if os.environ.get("SIFTMQ_PURE"):
        assert compiled_modules() == []
    else:
        assert compiled_modules() == list(HOT_MODULES)
    assert stale_modules() == []


def test_a_native_module_older_than_its_c_source_is_stale(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hand-written C extension (broker._build.NATIVE_MODULES) is stale once its ``.c`` is
    edited after the build, like a mypyc module after its ``.py``: the suite refuses it."""
    import importlib.machinery
    import sys

    import broker._build as build

    pkg = tmp_path / "nativepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    ext = pkg / ("_loop" + importlib.machinery.EXTENSION_SUFFIXES[0])
    src = pkg / "_loop.c"
    src.write_text("/* source */")
    ext.write_bytes(b"")
    os.utime(src, (1_000, 1_000))
    os.utime(ext, (2_000, 2_000))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(build, "NATIVE_MODULES", ("nativepkg._loop",))
    monkeypatch.setattr(build, "HOT_MODULES", ())
    try:
        assert build.stale_modules() == []
        os.utime(src, (3_000, 3_000))
        assert build.stale_modules() == ["nativepkg._loop"]
    finally:
        sys.modules.pop("nativepkg", None)


def test_a_hot_module_is_dated_by_its_own_shared_library(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder can hold more than one of mypyc's shared libraries (broker/core: two,
    ``broker._build.SPLIT_LIBRARIES``): a module's code is in its own library, so that one,
    not another library of the folder, dates its build. A module shim is rebuilt only when
    its C changes, so it is older than the source here, as after any edit."""
    import importlib.machinery
    import sys

    import broker._build as build

    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    pkg = tmp_path / "hotpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("_a", "_b"):
        (pkg / f"{name}.py").write_text("")
        (pkg / f"{name}{suffix}").write_bytes(b"")
        os.utime(pkg / f"{name}.py", (2_000, 2_000))
        os.utime(pkg / f"{name}{suffix}", (1_000, 1_000))
    for lib, built in (("_native", 3_000), ("_native_b", 1_500)):  # _b's library before its edit
        (pkg / f"{lib}__mypyc{suffix}").write_bytes(b"")
        os.utime(pkg / f"{lib}__mypyc{suffix}", (built, built))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(build, "HOT_MODULES", ("hotpkg._a", "hotpkg._b"))
    monkeypatch.setattr(build, "SPLIT_LIBRARIES", {"hotpkg._native_b": ("hotpkg._b",)}, raising=False)
    monkeypatch.setattr(build, "NATIVE_MODULES", ())
    try:
        assert build.stale_modules() == ["hotpkg._b"]
        os.utime(pkg / f"_native_b__mypyc{suffix}", (3_000, 3_000))  # rebuilt
        assert build.stale_modules() == []
    finally:
        sys.modules.pop("hotpkg", None)


def test_the_split_libraries_name_hot_modules_of_their_folder() -> None:
    """Each module of ``SPLIT_LIBRARIES`` is a hot module in the folder of its library (mypyc
    puts a group's library beside its modules), listed once, and the build made that library."""
    from broker._build import SPLIT_LIBRARIES, library

    listed = [m for modules in SPLIT_LIBRARIES.values() for m in modules]
    assert len(listed) == len(set(listed))
    for lib, modules in SPLIT_LIBRARIES.items():
        for m in modules:
            assert m in HOT_MODULES
            assert m.rpartition(".")[0] == lib.rpartition(".")[0]
            assert library(m) == lib
    if compiled_modules():
        import importlib.util

        for lib in {library(m) for m in HOT_MODULES}:
            package, _, leaf = lib.rpartition(".")
            spec = importlib.util.find_spec(package)
            assert spec is not None and spec.submodule_search_locations
            folder = pathlib.Path(next(iter(spec.submodule_search_locations)))
            assert list(folder.glob(f"{leaf}__mypyc.*")), f"no shared library {lib}"


def test_setup_py_freezes_what_mypycs_analysis_left() -> None:
    """``setup.py`` freezes the heap once mypyc's analysis is done: mypy's build of the hot path's
    import graph (~3 million objects from an empty cache) was walked by the collections of the
    interpreter's shutdown, ~10 s of one core after ``make build`` had compiled everything, on
    the set-up's critical path. Frozen, nothing is walked (here with mypyc's cache warm)."""
    import subprocess
    import sys

    if not compiled_modules():
        pytest.skip("the pure-Python build: setup.py runs no mypyc")
    code = (
        "import gc, runpy, sys\n"
        "sys.argv = ['setup.py', '-q', '--version']\n"
        "runpy.run_path('setup.py', run_name='__main__')\n"
        "print(gc.get_freeze_count())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SIFTMQ_PURE"}
    root = pathlib.Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert int(done.stdout.split()[-1]) > 10_000, done.stdout
