"""CPU of one ``siftmq pub`` / ``siftmq sub`` process (docs/development.md, "Suite time
(session 17)"): the command-line clients run one process a message in users' scripts, and the
test suite starts ~120 of them, so their start-up is what they cost.

    .venv/bin/python benchmarks/bench_cli_start.py [--runs 20] [--rounds 2] [--siftmq PATH]

A siftmq broker (``siftmq serve --no-persistence --port 0``, a subprocess) holds a retained
message; then, ``--rounds`` times: ``--runs`` processes of ``siftmq pub -q 1`` and of
``siftmq sub --filter 'temp > 30' -C 1`` (which gets the retained message and exits), one after
the other. Figure: the CPU (user + system, ``RUSAGE_CHILDREN``) per process, and the wall time.
To compare two trees, run it in each, alternating (``--siftmq`` names another tree's script).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _measure(label: str, argv: list[str], runs: int) -> None:
    c0, t0 = _cpu(), time.monotonic()
    for _ in range(runs):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{label}: status {done.returncode}: {done.stderr.strip()}")
    cpu, wall = _cpu() - c0, time.monotonic() - t0
    print(f"{label:>4}: {1000 * cpu / runs:6.1f} ms of CPU per process ({runs} in {wall:.2f} s)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20, help="processes per command and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--siftmq", default=str(Path(sys.executable).parent / "siftmq"), help="the script")
    args = ap.parse_args()
    broker = subprocess.Popen(
        [args.siftmq, "serve", "--no-persistence", "--port", "0", "--host", "127.0.0.1"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert broker.stderr is not None
        port = None
        for line in broker.stderr:  # "listening on 127.0.0.1:PORT"
            if m := re.search(r"listening on 127\.0\.0\.1:(\d+)", line):
                port = m.group(1)
                break
        if port is None:
            raise SystemExit("siftmq serve did not start")
        threading.Thread(target=broker.stderr.read, daemon=True).start()  # its log, never blocked
        at = ["-h", "127.0.0.1", "-p", port]
        subprocess.run(
            [args.siftmq, "pub", *at, "-t", "b/r", "-m", '{"temp": 35}', "-r", "-q", "1"], check=True
        )
        print(f"load {os.getloadavg()[0]:.1f}; {args.siftmq}", flush=True)
        for _ in range(args.rounds):
            _measure("pub", [args.siftmq, "pub", *at, "-t", "b/x", "-m", "x", "-q", "1"], args.runs)
            _measure(
                "sub", [args.siftmq, "sub", *at, "-t", "b/#", "--filter", "temp > 30", "-C", "1"], args.runs
            )
    finally:
        broker.terminate()
        broker.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
