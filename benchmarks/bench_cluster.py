"""Cross-node delivery in a siftmq cluster vs one node, in the same run (issue 17 targets).

Usage (from the repository root):

    .venv/bin/python benchmarks/bench_cluster.py                 # both layouts, ~1 min
    .venv/bin/python benchmarks/bench_cluster.py --layout shared --rounds 3
    .venv/bin/python benchmarks/bench_cluster.py --rounds 3 --half-reps 5    # docs/cluster.md

Two ``siftmq serve`` processes (``--no-bridge --no-persistence``) form a cluster over loopback.
Scenarios, 10 QoS 0 pairs each, the issue-8 load generator (benchmarks/loadgen) pinned to its
core:

* ``single``: publishers and subscribers on node A (the single-node rate: no link involved);
* ``cross``: subscribers on node A, publishers on node B (every message crosses one link);
* ``single_half`` / ``cross_half``: open loop at half of the best ``single`` rate, for p99
  latency; ``--half-reps N`` repeats the pair N times (interleaved) and reports each difference
  of p99 and their median, since one pair varies by a few ms on a busy 2-core machine.

For every run the CPU time of each broker process and of the load generator is read from
``/proc`` over the measured window (Linux): CPU microseconds per delivered message per node and
each one's share of a core, which says where the time goes (the cross path costs both nodes
about one broker's pass each) and how busy the machine was; and the time each of them was
runnable but waiting for a core (``/proc/<pid>/task/*/schedstat``), which says how much of the
latency is contention for the cores rather than work.

Layouts (2-core machine): ``shared``: both brokers on core 0, generator on core 1 (the cluster
does twice the broker work on the same core: the cost of the path); ``split``: A on core 0, B
on core 1, generator unpinned (the brokers run in parallel, the generator competes).
Closed-loop rounds are interleaved (single, cross, single, ...) and the ratio is taken per
round. Results: JSON (``--out``) and a table printed for docs/cluster.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import WorkerPlan, WorkerResult, worker_main
from loadgen._codec import Block, connect, make_payload, publish, subscribe
from loadgen._plan import ClientSpec, GroupSpec

ROOT = Path(__file__).resolve().parent.parent
SECRET = "bench-cluster-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    proc: subprocess.Popen[bytes]
    port: int
    cluster_port: int
    tmp: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.tmp, ignore_errors=True)


def start_node(cpu: int | None, join: int | None) -> Node:
    tmp = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    port, cport = free_port(), free_port()
    cmd = [
        str(ROOT / ".venv" / "bin" / "siftmq"),
        "serve",
        "--port",
        str(port),
        "--no-bridge",
        "--no-persistence",
        "--log-level",
        "WARNING",
        "--data-dir",
        str(tmp),
        "--cluster-listen",
        f"127.0.0.1:{cport}",
    ]
    if join is not None:
        cmd += ["--join", f"127.0.0.1:{join}"]

    def pre() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    log = open(tmp / "broker.log", "wb")  # noqa: SIM115 - closed with the process
    env = {**os.environ, "SIFTMQ_CLUSTER_SECRET": SECRET}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=pre)  # noqa: PLW1509
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((tmp / "broker.log").read_text()[-2000:])
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return Node(proc, port, cport, tmp)
        time.sleep(0.05)
    raise RuntimeError("node did not listen")


def wait_linked(sub_port: int, pub_port: int) -> None:
    """Until a message published at ``pub_port`` reaches a subscriber at ``sub_port``."""
    import paho.mqtt.client as mqtt

    got: list[bytes] = []
    s = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, "probe-s")
    s.on_message = lambda _c, _u, m: got.append(m.payload)
    s.connect("127.0.0.1", sub_port)
    s.loop_start()
    s.subscribe("probe", 0)
    p = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, "probe-p")
    p.connect("127.0.0.1", pub_port)
    p.loop_start()
    deadline = time.monotonic() + 30
    try:
        while not got:
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not link")
            p.publish("probe", b"x")
            time.sleep(0.2)
    finally:
        for c in (s, p):
            c.loop_stop()
            c.disconnect()


def plans(
    tag: str, sub_port: int, pub_port: int, rate: float, procs: int, pairs: int = 10
) -> list[WorkerPlan]:
    out = []
    for p in range(procs):
        idx = list(range(p, pairs, procs))
        pl = make_payload(64)
        subs = tuple(
            ClientSpec(connect(f"{tag}-s{i}"), (subscribe(1, [(f"bench/{tag}/{i}", 0)]),), port=sub_port)
            for i in idx
        )
        pubs = tuple(
            ClientSpec(
                connect(f"{tag}-p{i}"),
                blocks=(Block.of([publish(f"bench/{tag}/{i}", pl)] * 10, 10),),
                port=pub_port,
            )
            for i in idx
        )
        out.append(WorkerPlan(groups=(GroupSpec(pubs, subs, 200 * len(idx), rate * len(idx) / pairs),)))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_delay(pid: int) -> float:
    """Seconds process ``pid``'s threads spent runnable but waiting for a CPU so far (Linux
    ``/proc/<pid>/task/*/schedstat``, second field; 0 elsewhere): the contention for cores."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(stat.read_text().split()[1])
    return total / 1e9


def run(
    worker_plans: list[WorkerPlan],
    load_cpus: list[int],
    warmup: float,
    duration: float,
    nodes: tuple[Node, ...] = (),
) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    workers = []
    for plan in worker_plans:
        a, c = ctx.Pipe()
        p = ctx.Process(target=worker_main, args=(plan, "127.0.0.1", 0, load_cpus, c), daemon=True)
        p.start()
        workers.append((p, a))
    try:
        for _, a in workers:
            if not a.poll(60):
                raise TimeoutError("setup")
            a.recv()
        now = time.monotonic_ns()
        t0 = now + int(warmup * 1e9)
        t1 = t0 + int(duration * 1e9)
        for _, a in workers:
            a.send(("go", t0, t1))
        pids = [n.proc.pid for n in nodes] + [p.pid for p, _ in workers if p.pid is not None]
        time.sleep(max(0.0, (t0 - time.monotonic_ns()) / 1e9))
        cpu0 = [cpu_seconds(pid) for pid in pids]
        wait0 = [run_delay(pid) for pid in pids]
        time.sleep(max(0.0, (t1 - time.monotonic_ns()) / 1e9))
        cpu1 = [cpu_seconds(pid) for pid in pids]
        wait1 = [run_delay(pid) for pid in pids]
        results: list[WorkerResult] = []
        for p, a in workers:
            if not a.poll(warmup + duration + 60):
                raise TimeoutError("worker did not report")
            kind, res = a.recv()
            assert kind == "result"
            results.append(res)
            p.join(10)
    finally:
        for p, _ in workers:
            if p.is_alive():
                p.kill()
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(errors)
    window = max(r.window_s for r in results) or duration
    lat = np.array([x for r in results for x in r.latencies_ns], dtype=np.int64)
    rate = sum(r.delivered for r in results) / window
    used = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    node_cpu = used[: len(nodes)]
    return {
        "delivered_per_s": rate,
        "lost": sum(r.lost for r in results),
        "p50_ms": float(np.percentile(lat, 50)) / 1e6 if lat.size else None,
        "p99_ms": float(np.percentile(lat, 99)) / 1e6 if lat.size else None,
        # per node (A, B): CPU microseconds per delivered message, share of one core
        "cpu_us_per_msg": [c / (rate * duration) * 1e6 if rate else None for c in node_cpu],
        "cpu_share": [c / duration for c in node_cpu],
        "generator_cpu_share": sum(used[len(nodes) :]) / duration,
        # per node, then the generator: share of the window spent runnable, waiting for a core
        "run_delay_share": [(b - a) / duration for a, b in zip(wait0[: len(nodes)], wait1, strict=False)]
        + [sum(wait1[len(nodes) :]) / duration - sum(wait0[len(nodes) :]) / duration],
    }


def layout_run(layout: str, args: argparse.Namespace) -> dict[str, Any]:
    cpus = (0, 0) if layout == "shared" else (0, 1)
    load = [1] if layout == "shared" else []
    a = start_node(cpus[0], None)
    b = None
    try:
        b = start_node(cpus[1], a.cluster_port)
        wait_linked(a.port, b.port)
        rounds: list[dict[str, Any]] = []
        both = (a, b)
        for r in range(args.rounds):
            single = run(
                plans(f"s{r}", a.port, a.port, 0.0, args.procs), load, args.warmup, args.duration, both
            )
            cross = run(
                plans(f"c{r}", a.port, b.port, 0.0, args.procs), load, args.warmup, args.duration, both
            )
            ratio = cross["delivered_per_s"] / single["delivered_per_s"]
            rounds.append({"single": single, "cross": cross, "ratio": ratio})
            print(
                f"{layout} round {r}: single {single['delivered_per_s']:,.0f}/s, "
                f"cross {cross['delivered_per_s']:,.0f}/s, ratio {ratio:.2f}",
                flush=True,
            )
        best_single = max(x["single"]["delivered_per_s"] for x in rounds)
        half = best_single / 2
        halves: list[dict[str, Any]] = []
        for r in range(args.half_reps):
            sh = run(
                plans(f"sh{r}", a.port, a.port, half, args.procs), load, args.warmup, args.duration, both
            )
            ch = run(
                plans(f"ch{r}", a.port, b.port, half, args.procs), load, args.warmup, args.duration, both
            )
            halves.append({"single": sh, "cross": ch, "p99_diff_ms": ch["p99_ms"] - sh["p99_ms"]})
            print(
                f"{layout} at {half:,.0f}/s: single p99 {sh['p99_ms']:.2f} ms "
                f"({sh['delivered_per_s']:,.0f}/s, A {_cpu(sh, 0)}), "
                f"cross p99 {ch['p99_ms']:.2f} ms ({ch['delivered_per_s']:,.0f}/s, "
                f"A {_cpu(ch, 0)}, B {_cpu(ch, 1)}); generator "
                f"{sh['generator_cpu_share']:.0%} / {ch['generator_cpu_share']:.0%} of a core; "
                f"waiting for a core, single / cross: {_waits(sh)} / {_waits(ch)}",
                flush=True,
            )
        return {"layout": layout, "rounds": rounds, "half_rate": half, "halves": halves}
    finally:
        if b is not None:
            b.stop()
        a.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", default="shared,split")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--half-reps", type=int, default=1, help="single/cross pairs at half load")
    ap.add_argument("--out", default="/tmp/bench-cluster.json")
    args = ap.parse_args(argv)
    results = [layout_run(lay, args) for lay in args.layout.split(",")]
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(
        "\n| layout | single msg/s (median) | cross msg/s (median) | cross/single per round | "
        "p99 single / cross at half load, each pair | cross - single p99 (median) |"
    )
    print("|---|---|---|---|---|---|")
    for res in results:
        rs = res["rounds"]
        single = float(np.median([x["single"]["delivered_per_s"] for x in rs]))
        cross = float(np.median([x["cross"]["delivered_per_s"] for x in rs]))
        ratios = ", ".join(f"{x['ratio']:.2f}" for x in rs)
        pairs = ", ".join(f"{h['single']['p99_ms']:.2f} / {h['cross']['p99_ms']:.2f}" for h in res["halves"])
        diff = float(np.median([h["p99_diff_ms"] for h in res["halves"]]))
        print(
            f"| {res['layout']} | {single:,.0f} | {cross:,.0f} | {ratios} | "
            f"{pairs} ms at {res['half_rate']:,.0f}/s | {diff:+.2f} ms |"
        )
    print("\nCPU per delivered message at half load (medians; A receives, B forwards):")
    for res in results:
        hs = res["halves"]
        print(
            f"  {res['layout']}: single A {_med(hs, 'single', 'cpu_us_per_msg', 0):.2f} us "
            f"({_med(hs, 'single', 'cpu_share', 0):.0%} core); "
            f"cross A {_med(hs, 'cross', 'cpu_us_per_msg', 0):.2f} us "
            f"({_med(hs, 'cross', 'cpu_share', 0):.0%}), "
            f"B {_med(hs, 'cross', 'cpu_us_per_msg', 1):.2f} us ({_med(hs, 'cross', 'cpu_share', 1):.0%}); "
            f"generator {_med(hs, 'single', 'generator_cpu_share'):.0%} / "
            f"{_med(hs, 'cross', 'generator_cpu_share'):.0%} of a core"
        )
    print("\nShare of the window runnable but waiting for a core at half load (medians: A, B, generator):")
    for res in results:
        hs = res["halves"]
        for kind in ("single", "cross"):
            waits = ", ".join(f"{_med(hs, kind, 'run_delay_share', i):.1%}" for i in range(3))
            print(f"  {res['layout']} {kind}: {waits}")
    return 0


def _waits(res: dict[str, Any]) -> str:
    """A, B and the generator's share of the window spent waiting for a core."""
    return "A {:.1%}, B {:.1%}, generator {:.1%}".format(*res["run_delay_share"])


def _med(halves: list[dict[str, Any]], kind: str, key: str, i: int | None = None) -> float:
    """Median over the half-load pairs of ``pair[kind][key]`` (its ``i``-th item for lists)."""
    return float(np.median([h[kind][key] if i is None else h[kind][key][i] for h in halves]))


def _cpu(res: dict[str, Any], i: int) -> str:
    us = res["cpu_us_per_msg"][i]
    return "?" if us is None else f"{us:.2f} us/msg, {res['cpu_share'][i]:.0%} core"


if __name__ == "__main__":
    raise SystemExit(main())
