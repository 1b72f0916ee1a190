"""Side-by-side broker benchmark (issue 8): siftmq vs amqtt, iotcore and mosquitto in one run.

Usage (from the repository root):

    .venv/bin/python benchmarks/bench_brokers.py                       # everything, ~12 min
    .venv/bin/python benchmarks/bench_brokers.py --brokers mosquitto,siftmq --scenarios qos0,fanout
    .venv/bin/python benchmarks/bench_brokers.py --render /tmp/brokers-bench.json   # docs only
    .venv/bin/python benchmarks/bench_brokers.py --profile qos0,content --brokers siftmq \
        --scenarios qos0,content_base,content

Each scenario starts a fresh broker pinned to ``--broker-cpu`` (os.sched_setaffinity in the
child), starts ``--procs`` load-generator processes pinned to ``--load-cpus``, waits until all
clients are connected and subscribed, then lets traffic run ``--warmup`` seconds before a
``--duration`` second measurement window. Figures: delivered messages/s inside the window,
latency p50/p99 from the timestamp in each payload (CLOCK_MONOTONIC), broker CPU (psutil,
percent of one core), broker peak RSS (VmHWM) and RSS once all clients are set up, and the
generator's own CPU so a saturated generator is visible. ``qos0_half`` re-runs QoS 0 one-to-one
open loop at half of that broker's measured maximum (latency at half load). Results go to a JSON
file; ``--docs`` renders docs/lab/performance-brokers.md (newest run first, older runs kept) and
docs/lab/img/brokers-<run>-*.png from it (docs/performance-brokers.md quotes the newest run).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import SCENARIOS, WorkerPlan, WorkerResult, worker_main

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = ROOT / ".venv" / "bin" / "python"
BROKERS = ("siftmq", "mosquitto", "amqtt", "iotcore")
PEERS = ("amqtt", "mosquitto", "iotcore")
DOC = ROOT / "docs" / "lab" / "performance-brokers.md"
IMG = ROOT / "docs" / "lab" / "img"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningBroker:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    tmp: Path
    ps: psutil.Process = field(init=False)

    def __post_init__(self) -> None:
        self.ps = psutil.Process(self.proc.pid)

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def hwm(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    def children_cpu(self) -> float:
        """CPU seconds of the live child processes alone (included in :meth:`cpu`)."""
        total = 0.0
        with contextlib.suppress(psutil.Error):
            for child in self.ps.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    c = child.cpu_times()
                    total += float(c.user + c.system)
        return total

    def cpu(self) -> float:
        """CPU seconds of the broker and of its live child processes (siftmq's bridge writes from
        a child by default, issue 42: its CPU is the broker's)."""
        t = self.ps.cpu_times()
        return float(t.user + t.system) + self.children_cpu()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _command(name: str, port: int, tmp: Path, engine: str) -> list[str]:
    match name:
        case "mosquitto":
            conf = tmp / "mosquitto.conf"
            conf.write_text(
                f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                "log_dest none\nmax_queued_messages 10000\nmax_inflight_messages 20\nset_tcp_nodelay true\n"
            )
            return [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)]
        case "amqtt":
            conf = tmp / "amqtt.yaml"
            conf.write_text(
                f"listeners:\n  default:\n    type: tcp\n    bind: 127.0.0.1:{port}\n"
                "    max_connections: 20000\n"
                "plugins:\n  amqtt.plugins.authentication.AnonymousAuthPlugin:\n    allow_anonymous: true\n"
            )
            return [str(ROOT / ".venv" / "bin" / "amqtt"), "-c", str(conf)]
        case "iotcore":
            code = (
                "import logging; logging.basicConfig(level=logging.CRITICAL)\n"
                "from iotcore.iotcore import IotCoreBroker\n"
                f"IotCoreBroker(listen='127.0.0.1', port={port}, max_connections=20000,"
                " max_inflight_count=100).run_forever()\n"
            )
            return [str(VENV_PY), "-c", code]
        case "siftmq":
            return [
                str(ROOT / ".venv" / "bin" / "siftmq"),
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-bridge",
                "--log-level",
                "WARNING",
                "--content-engine",
                engine,
                "--data-dir",
                str(tmp / "data"),
                # extra `siftmq serve` flags for A/B runs, e.g. "--content-batch-min 1000000"
                *os.environ.get("SIFTMQ_SERVE_ARGS", "").split(),
            ]
    raise ValueError(name)


def start_broker(name: str, cpu: int, engine: str) -> RunningBroker:
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    port = free_port()

    def pre() -> None:
        os.sched_setaffinity(0, {cpu})
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    log = open(tmp / "broker.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        _command(name, port, tmp, engine),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.PIPE,
        preexec_fn=pre,  # noqa: PLW1509 - the driver starts no threads
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {(tmp / 'broker.log').read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return RunningBroker(name, proc, port, tmp)
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{name} did not listen on {port}")


def available(name: str) -> str:
    """Empty when the broker can run here, else why not."""
    match name:
        case "mosquitto":
            return (
                ""
                if shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()
                else "mosquitto not installed (apt-get install mosquitto)"
            )
        case "amqtt":
            return "" if (ROOT / ".venv" / "bin" / "amqtt").exists() else "amqtt not installed"
        case "iotcore":
            r = subprocess.run(
                [str(VENV_PY), "-c", "import iotcore.iotcore"], check=False, capture_output=True
            )
            return "" if r.returncode == 0 else "iotcore not importable (pip install iotcore)"
        case "siftmq":
            r = subprocess.run(
                [str(ROOT / ".venv" / "bin" / "siftmq"), "serve", "--help"], check=False, capture_output=True
            )
            return "" if r.returncode == 0 else "siftmq serve unavailable"
    return "unknown broker"


def run_scenario(
    broker: str,
    scen: str,
    plans: list[WorkerPlan],
    args: argparse.Namespace,
    on_window: Callable[[RunningBroker], None] | None = None,
) -> dict[str, Any]:
    b = start_broker(broker, args.broker_cpu, args.content_engine)
    rss_start = b.rss()
    ctx = mp.get_context("fork")
    workers = []
    try:
        for plan in plans:
            a, c = ctx.Pipe()
            p = ctx.Process(
                target=worker_main, args=(plan, "127.0.0.1", b.port, args.load_cpus, c), daemon=True
            )
            p.start()
            workers.append((p, a))
        setup_s = 0.0
        conns = 0
        for _, a in workers:
            if not a.poll(args.setup_timeout):
                raise TimeoutError(f"setup took more than {args.setup_timeout} s")
            _, s, n = a.recv()
            setup_s = max(setup_s, s)
            conns += n
        rss_ready = b.rss()
        now = time.monotonic_ns()
        t_start = now + int(args.warmup * 1e9)
        t_end = t_start + int(args.duration * 1e9)
        for _, a in workers:
            a.send(("go", t_start, t_end))
        time.sleep(max(0.0, (t_start - time.monotonic_ns()) / 1e9))
        c0, w0 = b.cpu(), time.monotonic()
        if on_window is not None:
            on_window(b)
        rss_peak_window = b.rss()
        while time.monotonic_ns() < t_end:
            time.sleep(0.2)
            with contextlib.suppress(psutil.Error):
                rss_peak_window = max(rss_peak_window, b.rss())
        c1, w1 = b.cpu(), time.monotonic()
        results: list[WorkerResult] = []
        for p, a in workers:
            if not a.poll(args.duration + 60):
                raise TimeoutError("worker did not report")
            kind, res = a.recv()
            assert kind == "result"
            results.append(res)
            p.join(10)
        hwm = b.hwm()
        alive = b.proc.poll() is None
    finally:
        for p, _ in workers:
            if p.is_alive():
                p.kill()
        b.stop()
    errors = [r.error for r in results if r.error]
    window = max(r.window_s for r in results) or args.duration
    lat = np.array([x for r in results for x in r.latencies_ns], dtype=np.int64)
    cyc = np.array([x for r in results for x in r.cycle_ns], dtype=np.int64)
    out: dict[str, Any] = {
        "broker": broker,
        "scenario": scen,
        "delivered_per_s": sum(r.delivered for r in results) / window,
        "published_per_s": sum(r.published for r in results) / window,
        "lost": sum(r.lost for r in results),
        "p50_ms": float(np.percentile(lat, 50)) / 1e6 if lat.size else None,
        "p99_ms": float(np.percentile(lat, 99)) / 1e6 if lat.size else None,
        "cycle_p50_ms": float(np.percentile(cyc, 50)) / 1e6 if cyc.size else None,
        "cycle_p99_ms": float(np.percentile(cyc, 99)) / 1e6 if cyc.size else None,
        "broker_cpu_pct": 100 * (c1 - c0) / (w1 - w0),
        "loadgen_cpu_pct": 100 * sum(r.cpu_s for r in results) / window,
        "rss_start_mb": rss_start / 2**20,
        "rss_ready_mb": rss_ready / 2**20,
        "rss_window_peak_mb": rss_peak_window / 2**20,
        "peak_rss_mb": hwm / 2**20,
        "setup_s": setup_s,
        "connections": conns,
        "broker_alive": alive,
        "errors": errors,
    }
    return out


def _fmt(r: dict[str, Any]) -> str:
    p99 = f"{r['p99_ms']:.2f}" if r.get("p99_ms") is not None else "-"
    return (
        f"{r['broker']:>9} {r['scenario']:>13}: {r['delivered_per_s']:>10,.0f} msg/s  p99 {p99} ms  "
        f"cpu {r['broker_cpu_pct']:.0f}%  gen {r['loadgen_cpu_pct']:.0f}%  "
        f"rss {r['peak_rss_mb']:.0f} MB  lost {r['lost']}  {'; '.join(r['errors'])}"
    )


def py_spy_profile(duration: float, out: Path) -> Callable[[RunningBroker], None]:
    def start(b: RunningBroker) -> None:
        spy = ROOT / ".venv" / "bin" / "py-spy"
        subprocess.Popen(
            [
                str(spy),
                "record",
                "--pid",
                str(b.proc.pid),
                "--duration",
                str(int(duration)),
                "--rate",
                "250",
                "--format",
                "raw",
                "--output",
                str(out),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    return start


def summarize_profile(path: Path, top: int = 15) -> str:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks."""
    self_: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n_s = line.rpartition(" ")
        n = int(n_s)
        total += n
        # one frame per function: "name (file:line)" -> "name (file)"
        frames = [f.rsplit(":", 1)[0] + ")" if f.endswith(")") and ":" in f else f for f in stack.split(";")]
        self_[frames[-1]] = self_.get(frames[-1], 0) + n
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
    lines = [f"{total} samples (py-spy, 250 Hz, idle excluded)", "", "| self % | function |", "|---:|---|"]
    lines += [
        f"| {100 * v / total:.1f} | `{k}` |" for k, v in sorted(self_.items(), key=lambda kv: -kv[1])[:top]
    ]
    lines += ["", "| inclusive % | function |", "|---:|---|"]
    lines += [
        f"| {100 * v / total:.1f} | `{k}` |" for k, v in sorted(incl.items(), key=lambda kv: -kv[1])[:top]
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", default=",".join(BROKERS))
    ap.add_argument("--scenarios", default=",".join([*SCENARIOS, "qos0_half"]))
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--procs", type=int, default=1, help="load-generator processes")
    ap.add_argument("--broker-cpu", type=int, default=0)
    ap.add_argument("--load-cpus", default="1", help="comma-separated cores for the generator")
    ap.add_argument("--content-engine", default="hema", help="siftmq --content-engine")
    ap.add_argument("--setup-timeout", type=float, default=120.0)
    ap.add_argument(
        "--window-scale",
        type=float,
        default=1.0,
        help="multiply every closed-loop window (smaller: less queueing, lower latency)",
    )
    ap.add_argument("--out", default="/tmp/brokers-bench.json")
    ap.add_argument("--docs", action="store_true", help="render docs/lab/performance-brokers.md (the runs)")
    ap.add_argument("--render", metavar="JSON", help="only render the docs from an earlier JSON")
    ap.add_argument(
        "--profile",
        nargs="?",
        const="qos0",
        default="",
        help="py-spy siftmq during these scenarios (comma-separated; bare flag: qos0)",
    )
    args = ap.parse_args(argv)
    if args.render:
        from loadgen._report import render

        render(json.loads(Path(args.render).read_text()), DOC, IMG, args.render)
        return 0
    args.load_cpus = [int(c) for c in args.load_cpus.split(",") if c]
    os.sched_setaffinity(0, set(args.load_cpus))
    brokers = [b for b in args.brokers.split(",") if b]
    scens = [s for s in args.scenarios.split(",") if s]
    run: dict[str, Any] = {
        "started": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([".venv/bin/python", "benchmarks/bench_brokers.py", *(argv or sys.argv[1:])]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores ({platform.processor() or 'cpu'}), "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}",
        "git": subprocess.run(
            ["git", "log", "-1", "--format=%h %s"], cwd=ROOT, check=False, capture_output=True, text=True
        ).stdout.strip(),
        "settings": {
            "duration": args.duration,
            "warmup": args.warmup,
            "procs": args.procs,
            "broker_cpu": args.broker_cpu,
            "load_cpus": args.load_cpus,
            "content_engine": args.content_engine,
            "window_scale": args.window_scale,
        },
        "loadavg": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "titles": {
            **{k: v.title for k, v in SCENARIOS.items()},
            "qos0_half": "QoS 0 one-to-one, open loop at half of this broker's QoS 0 maximum",
        },
        "unavailable": {},
        "results": [],
        "profiles": {},
    }
    for b in list(brokers):
        why = available(b)
        if why:
            run["unavailable"][b] = why
            brokers.remove(b)
            print(f"skip {b}: {why}", flush=True)
    out = Path(args.out)
    for scen in scens:
        for b in brokers:
            sc = SCENARIOS.get("qos0" if scen == "qos0_half" else scen)
            assert sc is not None, scen
            if sc.siftmq_only and b != "siftmq":
                continue
            rate = 0.0
            if scen == "qos0_half":
                base = [r for r in run["results"] if r["broker"] == b and r["scenario"] == "qos0"]
                if not base:
                    continue
                rate = base[0]["delivered_per_s"] / 2
            hook = None
            prof = Path(f"/tmp/siftmq-{scen}.pyspy.txt")
            prof.unlink(missing_ok=True)
            if b == "siftmq" and scen in args.profile.split(","):
                hook = py_spy_profile(args.duration, prof)
            try:
                plans = [
                    dataclasses.replace(
                        p,
                        groups=tuple(
                            dataclasses.replace(g, window=max(1, int(g.window * args.window_scale)))
                            for g in p.groups
                        ),
                    )
                    for p in sc.build(args.procs, rate)
                ]
                r = run_scenario(b, scen, plans, args, hook)
            except Exception as e:
                r = {"broker": b, "scenario": scen, "failed": f"{type(e).__name__}: {e}"}
                print(f"{b:>9} {scen:>13}: FAILED {r['failed']}", flush=True)
            else:
                r["target_rate"] = rate
                print(_fmt(r), flush=True)
            run["results"].append(r)
            if hook is not None:
                time.sleep(2)
                if prof.exists():
                    run["profiles"][scen] = summarize_profile(prof)
                    print(run["profiles"][scen], flush=True)
            out.write_text(json.dumps(run, indent=1))
    print(f"results: {out}", flush=True)
    if args.docs:
        from loadgen._report import render

        render(run, DOC, IMG, str(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
