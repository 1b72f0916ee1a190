"""Fleet connections (issue 27, items 2, 3 and 6): memory per idle connection and connection
storms, siftmq (asyncio and uvloop) beside mosquitto in the same run.

For each broker and each connection count N a fresh broker process starts (pinned to CPU 0
with ``--pin``; descriptor limit raised to the hard limit; siftmq: ``siftmq serve --no-bridge
--no-persistence --sys-interval 0``), one MQTT 5 probe client measures its QoS 1 round trip
(500 rounds, also the warm-up), then ``--workers`` generator processes (CPU 1 with ``--pin``;
``benchmarks/loadgen/_fleet.py``) open N devices *at once* from 200 loopback source addresses
(clean session, keep-alive 600, one SUBSCRIBE each). Reported: CONNACK latency p50/p99 from
the start of each device's TCP connect, connections per second (N / time from the first
connect to the last CONNACK), refusals and failures, broker RSS delta per connection (after
every SUBACK), the probe's round trip with the N devices idle, and the CPU seconds of the
broker and of the generator during the storm.

    .venv/bin/python benchmarks/bench_fleet.py --counts 1000,5000,10000,19000
    .venv/bin/python benchmarks/bench_fleet.py --counts 5000 --tls          # over TLS
    .venv/bin/python benchmarks/bench_fleet.py --counts 19000 --brokers siftmq \\
        --serve-args "--connection-rate 50 --connection-burst 20"             # rate limit

Results (JSON next to the plots) and plots: docs/performance-connections.md, docs/lab/img.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
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
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_connections import _latency, _ms
from loadgen._fleet import FleetPlan, FleetResult, fleet_main, sources

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "lab" / "img"
BROKERS = ("siftmq", "siftmq-uvloop", "mosquitto")
PIN = False  # --pin: broker on CPU 0, generator on CPU 1 (on a quiet machine)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _certs(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    req = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost"]
    subprocess.run(
        [*req, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


def _command(name: str, port: int, tmp: Path, tls: bool, serve_args: list[str]) -> list[str]:
    if name == "mosquitto":
        conf = tmp / "mosquitto.conf"
        text = f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest none\n"
        text += "max_connections -1\nset_tcp_nodelay true\n"
        if tls:  # mosquitto started as root reads its files as the mosquitto user
            cert, key = _certs(tmp)
            for f in (tmp, cert, key):
                f.chmod(0o755)
            text += f"certfile {cert}\nkeyfile {key}\n"
        conf.write_text(text)
        return [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)]
    cmd = [str(ROOT / ".venv" / "bin" / "siftmq"), "serve", "--host", "127.0.0.1", "--no-bridge"]
    cmd += ["--no-persistence", "--sys-interval", "0", "--log-level", "WARNING", "--data-dir", str(tmp)]
    if tls:
        cert, key = _certs(tmp)
        cmd += ["--port", "0", "--tls-port", str(port), "--tls-cert", str(cert), "--tls-key", str(key)]
    else:
        cmd += ["--port", str(port)]
    if name == "siftmq":
        cmd.append("--no-uvloop")
    return cmd + serve_args


def start(name: str, tls: bool, serve_args: list[str]) -> tuple[subprocess.Popen[bytes], int, Path]:
    tmp = Path(tempfile.mkdtemp(prefix=f"fleet-{name}-"))
    port = free_port()

    def pre() -> None:
        if PIN:
            os.sched_setaffinity(0, {0})
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    log = open(tmp / "broker.log", "wb")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(
        _command(name, port, tmp, tls, serve_args),
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=pre,  # noqa: PLW1509 (the driver starts no threads before)
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {(tmp / 'broker.log').read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, port, tmp
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{name} did not listen")


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[int(q * (len(xs) - 1))] * 1000 if xs else float("nan")


def one(name: str, n: int, workers: int, tls: bool, serve_args: list[str], rounds: int) -> dict[str, Any]:
    proc, port, tmp = start(name, tls, serve_args)
    ps = psutil.Process(proc.pid)
    ctx = mp.get_context("spawn")
    srcs = sources(200)
    pipes, procs = [], []
    try:
        per = -(-n // workers)
        for w in range(workers):
            count = min(per, n - w * per)
            plan = FleetPlan(port, w * per, count, srcs, tls=tls)
            a, b = ctx.Pipe()
            p = ctx.Process(target=fleet_main, args=(b, plan), daemon=True)
            p.start()
            if PIN:
                os.sched_setaffinity(p.pid, {1})
            pipes.append(a)
            procs.append(p)
        for a in pipes:
            assert a.recv() == "ready"
        base = [] if tls else asyncio.run(_latency(port, rounds))
        gc.collect()
        rss0 = ps.memory_info().rss
        cpu0 = sum(ps.cpu_times()[:2])
        for a in pipes:
            a.send("go")
        results: list[FleetResult] = [a.recv() for a in pipes]
        cpu1 = sum(ps.cpu_times()[:2])
        time.sleep(0.5)  # the broker settles (last SUBACK flushes) before its RSS is read
        rss1 = ps.memory_info().rss
        loaded = [] if tls else asyncio.run(_latency(port, rounds))
        for a in pipes:
            a.send("close")
        for a in pipes:
            a.recv()
        lat = [x for r in results for x in r.connack_s]
        refused: dict[int, int] = {}
        for r in results:
            for rc, k in r.refused.items():
                refused[rc] = refused.get(rc, 0) + k
        start_t = min(r.first_start for r in results)
        end_t = max(r.last_connack for r in results)
        ok = len(lat)
        row = {
            "broker": name,
            "tls": tls,
            "connections": n,
            "connected": ok,
            "subscribed": sum(r.subscribed for r in results),
            "refused": refused,
            "failed": sum(r.failed for r in results),
            "errors": {k: sum(r.errors.get(k, 0) for r in results) for r in results for k in r.errors},
            "connack_p50_ms": _pct(lat, 0.5),
            "connack_p99_ms": _pct(lat, 0.99),
            "conn_per_s": ok / (end_t - start_t) if end_t > start_t else float("nan"),
            "rss_before_mib": rss0 / 2**20,
            "rss_after_mib": rss1 / 2**20,
            "bytes_per_conn": (rss1 - rss0) / max(ok, 1),
            "broker_cpu_s": cpu1 - cpu0,
            "loadgen_cpu_s": sum(r.cpu_s for r in results),
            "rtt_p50_ms_idle": _ms(base, 0.5) if base else None,
            "rtt_p50_ms_loaded": _ms(loaded, 0.5) if loaded else None,
            "rtt_p99_ms_loaded": _ms(loaded, 0.99) if loaded else None,
        }
        return row
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log = tmp / "broker.log"
        if log.exists() and log.stat().st_size:  # the broker's warnings (e.g. out of descriptors)
            shutil.copy(log, Path(tempfile.gettempdir()) / f"fleet-{name}-{n}{'-tls' * tls}.log")
        shutil.rmtree(tmp, ignore_errors=True)


def show(r: dict[str, Any]) -> str:
    rtt = ""
    if r["rtt_p50_ms_loaded"] is not None:
        rtt = f" | probe RTT p50 {r['rtt_p50_ms_idle']:.2f} -> {r['rtt_p50_ms_loaded']:.2f} ms"
    return (
        f"| {r['broker']}{' TLS' if r['tls'] else ''} | {r['connections']:,} | {r['connected']:,} "
        f"| {r['refused'] or 0} / {r['failed']} | {r['connack_p50_ms']:.1f} / {r['connack_p99_ms']:.1f} ms "
        f"| {r['conn_per_s']:,.0f}/s | {r['rss_before_mib']:.1f} -> {r['rss_after_mib']:.1f} MiB "
        f"| {r['bytes_per_conn']:,.0f} B | {r['broker_cpu_s']:.1f} s / {r['loadgen_cpu_s']:.1f} s{rtt} |"
    )


def plot(rows: list[dict[str, Any]], stem: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = {"siftmq": "tab:orange", "siftmq-uvloop": "tab:green", "mosquitto": "tab:blue"}
    for name in sorted({r["broker"] for r in rows}):
        c = colors.get(name)
        mine = [r for r in rows if r["broker"] == name and not r["tls"]]
        mine.sort(key=lambda r: r["connections"])
        if not mine:
            continue
        xs = [r["connections"] for r in mine]
        axes[0].plot(xs, [r["bytes_per_conn"] for r in mine], "o-", color=c, label=name)
        axes[1].plot(xs, [r["connack_p50_ms"] for r in mine], "o-", color=c, label=f"{name} p50")
        axes[1].plot(xs, [r["connack_p99_ms"] for r in mine], "x--", color=c, label=f"{name} p99")
        axes[2].plot(xs, [r["rtt_p50_ms_loaded"] for r in mine], "o-", color=c, label=name)
    axes[0].axhline(1536, color="grey", linestyle=":", label="target 1.5 KiB")
    axes[0].set(title="broker memory per idle connection", xlabel="connections", ylabel="bytes (RSS / N)")
    axes[1].set(title="CONNACK latency, all connecting at once", xlabel="connections", ylabel="ms")
    axes[1].set_yscale("log")
    axes[2].set(title="QoS 1 round trip of one more client", xlabel="connections", ylabel="p50 ms")
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    IMG.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMG / f"{stem}.png", dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", default=",".join(BROKERS))
    ap.add_argument("--counts", default="1000,5000,10000,19000")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--serve-args", default="", help="extra `siftmq serve` flags")
    ap.add_argument("--pin", action="store_true", help="broker on CPU 0, generator on CPU 1")
    ap.add_argument("--replot", default="", help="only redraw docs/lab/img/<name>.png from its JSON")
    ap.add_argument("--plot", default="", help="write docs/lab/img/<name>.png and <name>.json")
    a = ap.parse_args()
    if a.replot:
        plot(json.loads((IMG / f"{a.replot}.json").read_text()), a.replot)
        return
    global PIN  # noqa: PLW0603 (one switch for the whole run)
    PIN = a.pin
    rows = []
    print(f"load average before the run: {os.getloadavg()}")
    print(
        "| broker | N | connected | refused / failed | CONNACK p50 / p99 | conn/s | broker RSS | per conn "
        "| CPU broker / generator | |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in a.counts.split(",")):
        for name in a.brokers.split(","):
            args = a.serve_args.split() if name.startswith("siftmq") else []
            r = one(name, n, a.workers, a.tls, args, a.rounds)
            rows.append(r)
            print(show(r), flush=True)
    if a.plot:
        (IMG / f"{a.plot}.json").write_text(json.dumps(rows, indent=1))
        plot(rows, a.plot)


if __name__ == "__main__":
    main()
