"""What the idle ``siftmq serve`` holds, by module (issue 42 item 1): the measurement behind
docs/performance.md "Footprint".

1. ``--in-process`` (the default): starts ``siftmq serve FLAGS`` in this process the way the
   command does (``broker._cli.main``), waits ``--wait`` seconds, then prints its RSS, the
   number of modules, the modules per top-level package, and (``--tracemalloc``, slower)
   the Python memory allocated per top-level package (by the file that allocated it) and per
   import statement (the innermost frame outside importlib: what that line's import cost);
   ``--maps``: the resident memory by mapping (``/proc/self/smaps``: anonymous memory, the
   C heap, each shared library and extension), CPython's object allocator (``obmalloc``
   arenas and the bytes in use, from ``sys._debugmallocstats``) and the threads;
   ``--per-module``: each module's own cost, measured around its import (RSS, or traced
   Python memory with ``--tracemalloc``), its imports' cost subtracted, and who imported it
   (``<fn>``: an import inside a function). The RSS column is page- and arena-granular: a
   module that grows the heap by a page is charged the page; read it with the traced one.
   ``--transient``: per module, the Python memory its import kept and the peak above that
   while it ran (traced): a module compiled from source (no byte code: the machine's
   ``PYTHONDONTWRITEBYTECODE``) frees 0.2-0.6 MB of the compiler's objects, whose pools the
   allocator keeps, so the idle RSS is the start-up's peak, not what it keeps (session 18).
2. ``--rank MOD ...``: each module imported alone in a fresh interpreter on top of
   ``--base`` (default: asyncio without ssl, as ``siftmq serve`` imports it), the RSS it
   adds (median of 3), largest first. Cumulative: a module's imports are counted with it.
3. ``--steps``: what uvloop costs, step by step in one fresh interpreter on top of
   ``--base`` (:data:`STEPS`: ``import _ssl`` (the extension: ``libssl``, ``libcrypto``
   loaded and relocated), OpenSSL's initialisation (what ``ssl.py``'s first
   ``_ASN1Object`` does at its import), the rest of ``import ssl``, ``import uvloop``, a
   uvloop loop run), the resident memory each step adds per mapping, split into
   *file* (clean pages of the file: the page cache's, shared with every process that maps
   it, reclaimable; the kernel maps up to 64 kB of them around each page fault) and
   *private* (anonymous memory, the heap, and pages of a library written by its relocation
   or its data: this process's alone), and the Python memory it allocated (tracemalloc,
   started after the base: its own overhead is outside the RSS columns only approximately).

    .venv/bin/python benchmarks/footprint_modules.py -- --no-bridge --no-persistence --no-uvloop
    .venv/bin/python benchmarks/footprint_modules.py --tracemalloc -- --no-bridge --no-persistence
    .venv/bin/python benchmarks/footprint_modules.py --maps -- --no-bridge --no-persistence --no-uvloop
    .venv/bin/python benchmarks/footprint_modules.py --per-module --tracemalloc --wait 10 -- \
        --no-bridge --no-persistence --no-uvloop
    .venv/bin/python benchmarks/footprint_modules.py --transient -- --no-bridge --no-persistence
    .venv/bin/python benchmarks/footprint_modules.py --rank orjson composite content uvloop ssl
    .venv/bin/python benchmarks/footprint_modules.py --steps

Not a benchmark of speed: numbers are resident megabytes (``/proc/self/statm``).
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# asyncio without ssl, as broker/_sslhook.py imports it (without importing the broker package)
NOSSL = "import sys; sys.modules['ssl'] = None; import asyncio; del sys.modules['ssl']"


def statm_mb() -> float:
    """Resident set of this process in MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


#: module -> (own cost, cost with its imports, who imported it), filled by --per-module
_PER_MODULE: dict[str, tuple[int, int, str]] = {}
#: module -> (traced bytes its import kept, peak above that while it ran), for --transient
_TRANSIENT: dict[str, tuple[int, int]] = {}


def _measure_transient() -> None:
    """Wrap importlib's loader: each module's traced memory kept and its transient peak (the
    peak is reset at each import's start, so an import's own imports end its window: their
    peaks are theirs)."""
    import importlib._bootstrap as bootstrap
    import tracemalloc

    load = bootstrap._load_unlocked  # type: ignore[attr-defined]

    def measured(spec: Any) -> Any:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        try:
            return load(spec)
        finally:
            after, peak = tracemalloc.get_traced_memory()
            _TRANSIENT[spec.name] = (after - before, peak - after)

    bootstrap._load_unlocked = measured  # type: ignore[attr-defined]


def _measure_imports(trace: bool) -> None:
    """Wrap importlib's loader: each module's cost is measured around its execution (RSS from
    /proc/self/statm, or traced bytes), minus its own imports' (a stack of running totals)."""
    import importlib._bootstrap as bootstrap

    if trace:
        import tracemalloc

        def used() -> int:
            return tracemalloc.get_traced_memory()[0]

    else:
        page = os.sysconf("SC_PAGE_SIZE")

        def used() -> int:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * page

    stack: list[list[Any]] = []
    load = bootstrap._load_unlocked  # type: ignore[attr-defined]

    def measured(spec: Any) -> Any:
        by = stack[-1][0] if stack else "<fn>"
        stack.append([spec.name, 0])
        before = used()
        try:
            return load(spec)
        finally:
            whole = used() - before
            _, children = stack.pop()
            _PER_MODULE[spec.name] = (whole - children, whole, by)
            if stack:
                stack[-1][1] += whole

    bootstrap._load_unlocked = measured  # type: ignore[attr-defined]


def _maps(top: int) -> None:
    """RSS by mapping, obmalloc's arenas, threads."""
    rss: collections.Counter[str] = collections.Counter()
    name = "?"
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's first line
                name = head[5].rsplit("/", 1)[-1] if len(head) > 5 else "[anonymous]"
            elif head[0] == "Rss:":
                rss[name] += int(head[1])
    print(f"resident by mapping ({sum(rss.values()) / 1e3:.1f} MB, 1 MB = 1,000 kB):")
    for what, kb in rss.most_common(top):
        print(f"  {kb:7d} kB  {what}")
    import tempfile

    with tempfile.TemporaryFile("w+") as out:  # _debugmallocstats writes to the C stderr
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        stats = out.read()
    for line in stats.splitlines():
        if any(
            k in line for k in ("arenas * ", "in allocated blocks", "in available blocks", "unused pools")
        ):
            print("  obmalloc: " + " ".join(line.split()))
    names = ", ".join(t.name for t in threading.enumerate())
    print(f"threads: {len(os.listdir('/proc/self/task'))} ({names})")


def _report(trace: bool, top: int, maps: bool = False, per_module: bool = False) -> None:
    mods = sorted(m for m in sys.modules if sys.modules[m] is not None)
    print(f"RSS {statm_mb():.1f} MB, {len(mods)} modules")
    if _TRANSIENT:
        import tracemalloc

        now = tracemalloc.get_traced_memory()[0]
        print(f"traced now {now / 1e6:.2f} MB; per module (kB: kept, transient peak above it):")
        for mod, (kept, over) in sorted(_TRANSIENT.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"  {kept / 1e3:7.0f} {over / 1e3:7.0f}  {mod}")
    if maps:
        _maps(top)
    if per_module:
        unit = "traced" if trace else "RSS"
        print(f"per module ({unit}, kB: own, with its imports, imported by), {len(_PER_MODULE)} measured:")
        ranked = sorted(_PER_MODULE.items(), key=lambda kv: -kv[1][0])
        for mod, (own, whole, by) in ranked[:top]:
            print(f"  {own / 1e3:7.0f} {whole / 1e3:7.0f}  {mod}  <- {by}")
    tops = collections.Counter(m.split(".")[0] for m in mods)
    print("modules per package: " + ", ".join(f"{t} {n}" for t, n in tops.most_common(25)))
    if trace and not per_module:
        import tracemalloc

        snap = tracemalloc.take_snapshot()
        per_file: collections.Counter[str] = collections.Counter()
        per_line: collections.Counter[str] = collections.Counter()
        for st in snap.statistics("traceback"):
            frames = [f for f in reversed(st.traceback) if not f.filename.startswith("<frozen")]
            where = frames[0] if frames else st.traceback[0]
            per_line[f"{where.filename}:{where.lineno}"] += st.size
            name = st.traceback[-1].filename  # the allocating file
            for p in sorted(sys.path, key=len, reverse=True):
                if p and name.startswith(p + "/"):
                    name = name[len(p) + 1 :].split("/")[0].removesuffix(".py")
                    break
            per_file[name] += st.size
        print(f"tracemalloc: {sum(per_file.values()) / 1e6:.2f} MB of Python objects")
        for name, size in per_file.most_common(top):
            print(f"  {size / 1e6:7.3f} MB  {name}")
        print("by import statement (innermost frame outside importlib):")
        for where, size in per_line.most_common(top):
            print(f"  {size / 1e6:7.3f} MB  {where.replace(str(ROOT) + '/', '')}")
    print("ALL " + " ".join(mods))


def in_process(
    flags: list[str],
    wait: float,
    trace: bool,
    top: int,
    maps: bool = False,
    per_module: bool = False,
    transient: bool = False,
) -> int:
    if trace or transient:
        import tracemalloc

        tracemalloc.start(1 if per_module or transient else 40)
    if per_module:
        _measure_imports(trace)
    elif transient:
        _measure_transient()

    def later() -> None:
        time.sleep(wait)
        _report(trace, top, maps, per_module)
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGTERM)  # serve stops gracefully

    threading.Thread(target=later, daemon=True).start()
    from broker._cli import main

    # not tempfile: it imports shutil and random, which the broker does not (this is a profile)
    data = f"/tmp/siftmq-modules-{os.getpid()}"
    os.makedirs(data, exist_ok=True)
    try:
        return main(["serve", "--port", "0", "--data-dir", data, *flags])
    finally:
        for name in os.listdir(data):
            os.unlink(os.path.join(data, name))
        os.rmdir(data)


def rank(mods: list[str], base: str) -> None:
    code = "{};import os;print(int(open('/proc/self/statm').read().split()[1])*os.sysconf('SC_PAGE_SIZE'))"

    def rss(stmt: str) -> float:
        cmd = [sys.executable, "-c", code.format(stmt)]
        runs = sorted(
            int(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout) for _ in range(3)
        )
        return runs[1] / 1e6

    floor = rss(base)
    print(f"base ({base}): {floor:.2f} MB")
    added = sorted(((rss(f"{base};import {m}") - floor, m) for m in mods), reverse=True)
    for mb, m in added:
        print(f"  {mb:6.2f} MB  {m}")


#: --steps: (label, statement), run in this order in one interpreter after --base
STEPS = (
    ("import _ssl (libssl, libcrypto loaded)", "import _ssl"),
    # ssl.py's class Purpose(_ASN1Object, Enum) calls _txt2obj at import: OBJ_txt2obj runs
    # OPENSSL_init_crypto(OPENSSL_INIT_LOAD_CONFIG), OpenSSL's one-time initialisation
    ("OpenSSL initialised (_ssl.txt2obj, as ssl.py)", "_ssl.txt2obj('1.3.6.1.5.5.7.3.1')"),
    ("the rest of import ssl (ssl.py)", "import ssl"),
    ("import uvloop", "import uvloop"),
    ("a uvloop loop run", "import asyncio; uvloop.new_event_loop().run_until_complete(asyncio.sleep(0.01))"),
)

# the child of --steps: snapshots of /proc/self/smaps (kB per mapping: file-clean, private)
# after the base and after each step, or (argv[1] "trace") the traced Python memory after
# each step: one line of JSON
STEPS_CHILD = r"""
import json, os, sys, tracemalloc
def snap():
    out, name = {}, "?"
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                name = head[5].rsplit("/", 1)[-1] if len(head) > 5 else "[anonymous]"
                out.setdefault(name, [0, 0])
            elif head[0] == "Rss:":
                out[name][1] += int(head[1])
            elif head[0] in ("Shared_Clean:", "Private_Clean:"):
                out[name][0] += int(head[1])
                out[name][1] -= int(head[1])
    return out
trace = sys.argv[1] == "trace"
exec(sys.argv[2])
if trace:
    tracemalloc.start()
snaps = [snap()]
for stmt in sys.argv[3:]:
    exec(stmt)
    snaps.append(tracemalloc.get_traced_memory()[0] if trace else snap())
if trace:
    snaps[0] = 0
print(json.dumps(snaps))
"""


def steps(base: str) -> None:
    """Resident memory each of :data:`STEPS` adds, by mapping (module docstring, 3.)."""
    import json

    def child(mode: str) -> Any:
        cmd = [sys.executable, "-c", STEPS_CHILD, mode, base, *(stmt for _, stmt in STEPS)]
        return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)

    snaps = child("rss")  # tracemalloc's own memory would count in the RSS: a separate run
    traced = [0, *child("trace")[1:]]
    print("kB added per step (file: clean pages of the file; private: this process's alone)")
    total = [0, 0]
    for (label, _), before, after, traced0, traced1 in zip(
        STEPS, snaps[:-1], snaps[1:], traced[:-1], traced[1:], strict=True
    ):
        rows = []
        for name in after.keys() | before.keys():
            f0, p0 = before.get(name, (0, 0))
            f1, p1 = after.get(name, (0, 0))
            if abs(f1 - f0) + abs(p1 - p0) >= 12:
                rows.append((f1 - f0 + p1 - p0, f1 - f0, p1 - p0, name))
        file_kb, priv_kb = sum(r[1] for r in rows), sum(r[2] for r in rows)
        total[0] += file_kb
        total[1] += priv_kb
        objs = (traced1 - traced0) // 1024
        print(f"{label}: {file_kb + priv_kb} kB (file {file_kb}, private {priv_kb}; objects {objs} kB)")
        for kb, f, p, name in sorted(rows, reverse=True):
            print(f"  {kb:6d} kB  file {f:5d}  private {p:5d}  {name}")
    print(f"all steps: {sum(total)} kB (file {total[0]}, private {total[1]})")


def main() -> None:
    # a fixed width: argparse would import shutil (bz2, lzma) for the terminal's, into the profile
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, width=100),
    )
    ap.add_argument("--wait", type=float, default=5.0, help="seconds serving before the report")
    ap.add_argument("--tracemalloc", action="store_true", help="Python memory per package and import")
    ap.add_argument("--top", type=int, default=40, help="lines of each tracemalloc table")
    ap.add_argument("--maps", action="store_true", help="RSS by mapping, obmalloc arenas, threads")
    ap.add_argument("--per-module", action="store_true", help="each module's own cost (RSS or --tracemalloc)")
    ap.add_argument("--transient", action="store_true", help="each import's kept and transient memory")
    ap.add_argument("--rank", nargs="+", default=None, metavar="MODULE", help="RSS each module adds")
    ap.add_argument("--steps", action="store_true", help="what OpenSSL and uvloop add, step by step")
    ap.add_argument("--base", default=NOSSL, help="statement every --rank/--steps interpreter runs first")
    ap.add_argument("flags", nargs="*", help="siftmq serve flags (after --)")
    args = ap.parse_args()
    if args.rank:
        rank(args.rank, args.base)
        return
    if args.steps:
        steps(args.base)
        return
    code = in_process(
        args.flags, args.wait, args.tracemalloc, args.top, args.maps, args.per_module, args.transient
    )
    raise SystemExit(code)


if __name__ == "__main__":
    main()
