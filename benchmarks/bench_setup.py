"""Set-up steps of `make test` (issue 31 item 2), before and after, in the same run.

    flock /work/bench.lock .venv/bin/python benchmarks/bench_setup.py [--only pip|mypyc]

* pip: a new venv in a temporary folder, then the Makefile's install of the dev extra, the
  earlier way (pip upgraded, ``pip install -e '.[dev]'``: an isolated build environment with
  pyproject.toml's build requirements, every module byte-compiled) and the current way
  (pip and setuptools first, then ``--no-build-isolation``), and the same with
  ``--no-compile`` (not taken: docs/development.md). All from the same pip cache and package
  index (the first run may warm the cache: run the script twice).
* mypyc: ``setup.py build_ext --inplace`` in a fresh clone of HEAD (no build/ folder, so every
  C file is generated and compiled), the earlier layout (one shared library for all of
  ``broker``, one for ``topics``, ``--parallel 1``) and the current one (a library per
  package folder, ``build_ext`` parallel over ``os.cpu_count()`` threads).

Figures: wall seconds, and the CPU seconds of the child processes (user + system), so a run on
a loaded machine shows whether it was starved. Results: docs/development.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = ROOT / ".venv" / "bin" / "python"


def timed(label: str, cmds: list[list[str]], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Run ``cmds`` one after another; (wall s, children's CPU s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    for cmd in cmds:
        subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"{label:<48} {wall:6.1f} s wall {cpu:6.1f} s CPU  load {os.getloadavg()[0]:.2f}", flush=True)
    return wall, cpu


def bench_pip(tmp: Path) -> None:
    env = {**os.environ, "SIFTMQ_PURE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    ways = {
        "pip, earlier (isolated build, byte-compiled)": (
            ["-U", "pip"],
            ["-e", ".[dev]"],
        ),
        "pip, now (--no-build-isolation)": (
            ["-U", "pip", "setuptools>=77"],
            ["--no-build-isolation", "-e", ".[dev]"],
        ),
        "pip, not taken (--no-build-isolation --no-compile)": (
            ["-U", "pip", "setuptools>=77"],
            ["--no-compile", "--no-build-isolation", "-e", ".[dev]"],
        ),
    }
    for label, (first, second) in ways.items():
        venv = tmp / "venv"
        shutil.rmtree(venv, ignore_errors=True)
        py = str(venv / "bin" / "python")
        timed(
            label,
            [
                [sys.executable, "-m", "venv", str(venv)],
                [py, "-m", "pip", "install", "-q", *first],
                [py, "-m", "pip", "install", "-q", *second],
            ],
            ROOT,
            env,
        )


def bench_mypyc(tmp: Path) -> None:
    ways = {
        "mypyc, earlier (broker + topics, serial)": ({"SIFTMQ_BUILD_GROUPS": "package"}, ["--parallel", "1"]),
        f"mypyc, now (a library per folder, {os.cpu_count()} threads)": ({}, []),
    }
    for label, (extra, args) in ways.items():
        clone = tmp / "clone"
        shutil.rmtree(clone, ignore_errors=True)
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        env = {**os.environ, **extra}
        env.pop("SIFTMQ_PURE", None)
        timed(label, [[str(PY), "setup.py", "-q", "build_ext", "--inplace", *args]], clone, env)
        built = sorted(p.name for p in clone.glob("**/_native__mypyc*.so"))
        if not built:
            raise SystemExit(f"{label}: nothing compiled")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["pip", "mypyc"], default=None)
    args = ap.parse_args()
    print(f"cores {os.cpu_count()}, load {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-setup-") as d:
        if args.only in (None, "pip"):
            bench_pip(Path(d))
        if args.only in (None, "mypyc"):
            bench_mypyc(Path(d))


if __name__ == "__main__":
    main()
