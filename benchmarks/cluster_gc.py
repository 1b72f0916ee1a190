"""Garbage collections in the two nodes of a cluster under cross-node load (docs/cluster.md,
"Where the time went").

Usage (from the repository root):

    .venv/bin/python benchmarks/cluster_gc.py                  # 380,000 msg/s, split layout
    .venv/bin/python benchmarks/cluster_gc.py --rate 200000

Starts the two ``siftmq serve`` nodes of ``bench_cluster.py`` (split layout: A on core 0, B on
core 1, ``--no-bridge --no-persistence``) through a wrapper that counts the collections of each
generation and their durations (``gc.callbacks``) and the sizes of the reads of the cluster
links (what one ``data_received`` of a link brings), runs the same 10 QoS 0 pairs open loop at
``--rate`` for one single-node run (publishers and subscribers on A) and one cross-node run
(publishers on B), and prints, per run and node, the collections during the measured window.
Durations are wall-clock: a collection that the scheduler interrupts looks longer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cluster as bc

#: run in each node: counts collections and link read sizes, dumps them as JSON on SIGUSR1
WRAPPER = r"""
import gc, json, os, signal, sys, time
stats = {g: [0, 0.0, 0.0] for g in range(3)}
start = [0.0]
def on_gc(phase, info):
    if phase == "start":
        start[0] = time.perf_counter()
        return
    took = time.perf_counter() - start[0]
    s = stats[info["generation"]]
    s[0] += 1; s[1] += took; s[2] = max(s[2], took)
gc.callbacks.append(on_gc)
reads = []
import cluster._link as link
_data = getattr(link.PeerLink, "_data", None)  # (a link before it had one: no read sizes)
def counted(self, data):
    reads.append(len(data))
    return _data(self, data)
if _data is not None:
    link.PeerLink._data = counted
def dump(*_):  # what happened since the previous dump
    with open(os.environ["GC_DUMP"], "w") as f:
        json.dump({"gc": stats, "reads": reads}, f)
    for s in stats.values():
        s[:] = [0, 0.0, 0.0]
    reads.clear()
signal.signal(signal.SIGUSR1, dump)
sys.argv = ["siftmq"] + sys.argv[1:]
from broker._cli import main
sys.exit(main())
"""


def start(cpu: int, join: int | None, tmp: Path) -> tuple[bc.Node, Path]:
    port, cport = bc.free_port(), bc.free_port()
    wrapper = tmp / "wrapper.py"
    wrapper.write_text(WRAPPER)
    dump = tmp / f"gc-{port}.json"
    cmd = [sys.executable, str(wrapper), "serve", "--port", str(port), "--no-bridge", "--no-persistence"]
    cmd += [
        "--log-level",
        "WARNING",
        "--data-dir",
        str(tmp / str(port)),
        "--cluster-listen",
        f"127.0.0.1:{cport}",
    ]
    if join is not None:
        cmd += ["--join", f"127.0.0.1:{join}"]
    env = {**os.environ, "SIFTMQ_CLUSTER_SECRET": bc.SECRET, "GC_DUMP": str(dump)}
    log = open(tmp / f"{port}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        cmd,
        cwd=bc.ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),  # noqa: PLW1509 - no threads yet
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return bc.Node(proc, port, cport, tmp), dump
        time.sleep(0.05)
    raise RuntimeError("node did not listen")


def snapshot(nodes: list[tuple[bc.Node, Path]]) -> list[dict[str, Any]]:
    out = []
    for node, dump in nodes:
        dump.unlink(missing_ok=True)
        node.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while not dump.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.05)
        out.append(json.loads(dump.read_text()))
    return out


def summary(window: dict[str, Any]) -> str:
    """Collections per generation (count, total and longest ms) and link read sizes."""
    gcs = ", ".join(
        f"gen{g} {n} ({total * 1e3:.1f} ms, longest {most * 1e3:.1f} ms)"
        for g, (n, total, most) in window["gc"].items()
    )
    reads = sorted(window["reads"])

    def pct(p: float) -> int:
        return reads[min(len(reads) - 1, int(p * len(reads)))] if reads else 0

    biggest = reads[-1] if reads else 0
    return f"{gcs}; {len(reads)} link reads, bytes p50 {pct(0.5)}, p99 {pct(0.99)}, max {biggest}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=380_000)
    ap.add_argument("--duration", type=float, default=4.0)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="cluster-gc-"))
    a = start(0, None, tmp)
    b = start(1, a[0].cluster_port, tmp)
    try:
        bc.wait_linked(a[0].port, b[0].port)
        for kind, pub in (("single", a[0]), ("cross", b[0])):
            snapshot([a, b])  # the counts start here
            res = bc.run(
                bc.plans(kind, a[0].port, pub.port, args.rate, 1), [], 1.0, args.duration, (a[0], b[0])
            )
            window = snapshot([a, b])
            print(f"{kind}: {res['delivered_per_s']:,.0f} msg/s, p99 {res['p99_ms']:.2f} ms", flush=True)
            for name, w in zip("AB", window, strict=True):
                print(f"  {name}: {summary(w)}", flush=True)
    finally:
        b[0].proc.kill()
        a[0].proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
