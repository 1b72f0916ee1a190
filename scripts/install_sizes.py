"""Installed size of each install set of the siftmq wheel (docs/operations.md, "Installing").

For each set (broker only, +spark, +cluster, +metrics, all) this makes a fresh venv without
pip, installs ``dist/siftmq-*.whl[EXTRAS]`` into it with this interpreter's pip
(``--python``) and sums the sizes of the files under its ``site-packages`` (bytes of the files,
and blocks on disk). Run by hand after ``make wheel``::

    .venv/bin/python scripts/install_sizes.py [--json]

It installs from the configured index (the wheels of the dependencies are cached after the first
run) and takes about a minute, most of it unpacking pyspark.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETS = {"broker only": "", "+spark": "spark", "+cluster": "cluster", "+metrics": "metrics", "all": "all"}


def _sizes(folder: Path) -> tuple[int, int]:
    """(bytes in files, bytes of disk blocks) under ``folder``."""
    apparent = blocks = 0
    for dirpath, _dirs, files in os.walk(folder):
        for f in files:
            st = os.lstat(os.path.join(dirpath, f))
            apparent += st.st_size
            blocks += st.st_blocks * 512
    return apparent, blocks


def _largest(site: Path, n: int = 6) -> list[tuple[str, int]]:
    sizes = [(p.name, _sizes(p)[0] if p.is_dir() else p.stat().st_size) for p in site.iterdir()]
    return sorted(sizes, key=lambda x: -x[1])[:n]


def measure(wheel: Path, extras: str, where: Path) -> dict[str, object]:
    venv = where / (extras or "broker")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    target = f"{wheel}[{extras}]" if extras else str(wheel)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", target],
        check=True,
    )
    site = next((venv / "lib").glob("python3*/site-packages"))
    apparent, blocks = _sizes(site)
    return {"bytes": apparent, "disk": blocks, "largest": _largest(site)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    wheels = sorted((ROOT / "dist").glob("siftmq-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        print("no wheel in dist/: run `make wheel` first", file=sys.stderr)
        return 2
    wheel = wheels[-1]
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extras in SETS.items():
            results[name] = measure(wheel, extras, Path(tmp))
    if args.json:
        print(json.dumps({"wheel": wheel.name, "sets": results}, indent=2))
        return 0
    mb = 1_000_000
    print(f"{wheel.name} ({wheel.stat().st_size / mb:.1f} MB)")
    print(f"{'set':<12} {'files MB':>9} {'disk MB':>8}  largest")
    for name, r in results.items():
        largest = ", ".join(f"{n} {s / mb:.1f}" for n, s in r["largest"])  # type: ignore[attr-defined]
        print(f"{name:<12} {r['bytes'] / mb:>9.1f} {r['disk'] / mb:>8.1f}  {largest}")  # type: ignore[operator]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
