"""The set-up phase of `make test` on fresh clones of two commits, in the same run.

    flock /work/bench.lock .venv/bin/python benchmarks/bench_fresh_setup.py BEFORE AFTER [--rounds N]

For each commit (alternating, ``--rounds`` times): ``git clone`` of this repository into a
temporary folder, ``git checkout`` of the commit, then the first line of its Makefile's
``test`` recipe (the set-up goals run side by side with ``make -j3``, everything before the
tests), with the same pip cache and package index for both. Printed: wall seconds, the CPU
seconds of the child processes (user + system, so a starved run shows), the load average, and
when each stamp file of the Makefile appeared (seconds after the start). Results:
docs/development.md, "Suite time".
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAMPS = (
    ".venv/.siftmq-installed",
    ".venv/.siftmq-bytecode",
    ".venv/.siftmq-compiled",
    "dist/.siftmq-wheel",
    ".venv/.siftmq-test-bytecode",
)


def setup_goals(makefile: str) -> list[str]:
    """The goals of the first ``$(MAKE)`` line of the ``test`` recipe."""
    recipe = makefile.split("\ntest:", 1)[1]
    line = next(x for x in recipe.splitlines() if "$(MAKE)" in x)
    words = line.split()
    goals = words[words.index("-Otarget") + 1 :]
    return [re.sub(r"\$\(TESTPYC\)", ".venv/.siftmq-test-bytecode", g) for g in goals]


def run(commit: str, tmp: Path) -> None:
    clone = tmp / f"clone-{commit[:10]}"
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
    goals = setup_goals((clone / "Makefile").read_text())
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0 = os.getloadavg()[0]
    t0 = time.time()
    out = subprocess.run(
        ["make", "--no-print-directory", "-j3", "-Otarget", *goals],
        check=False,
        cwd=clone,
        capture_output=True,
        text=True,
    )
    wall = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    stamps = ", ".join(
        f"{Path(s).name.removeprefix('.siftmq-')} {(clone / s).stat().st_mtime - t0:.0f} s"
        for s in STAMPS
        if (clone / s).exists()
    )
    status = (
        "ok" if out.returncode == 0 else f"FAILED ({out.returncode}): {out.stdout[-400:]}{out.stderr[-400:]}"
    )
    print(
        f"{commit[:10]} {wall:6.1f} s wall {cpu:6.1f} s CPU  load {load0:.1f} -> {os.getloadavg()[0]:.1f}"
        f"  [{stamps}]  {status}",
        flush=True,
    )
    shutil.rmtree(clone, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("commits", nargs="+")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()

    def rev(c: str) -> str:
        return subprocess.run(
            ["git", "rev-parse", c], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout

    commits = [rev(c).strip() for c in args.commits]
    with tempfile.TemporaryDirectory(prefix="fresh-setup-") as tmp:
        for r in range(args.rounds):
            for commit in commits if r % 2 == 0 else commits[::-1]:
                run(commit, Path(tmp))


if __name__ == "__main__":
    main()
