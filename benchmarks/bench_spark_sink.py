"""Spark -> MQTT: rows/s that ``df.write.format("siftmq")`` publishes into a local broker.

Run from the repository root:
    .venv/bin/python benchmarks/bench_spark_sink.py [--rows 100000] [--reps 2] [--qos 1]

Starts ``siftmq serve`` (no bridge, no persistence) and, as the peer in the same run, Debian's
``mosquitto`` (``max_inflight_messages 1000``, so both brokers grant the sink a window of
about a thousand unacknowledged messages), each on a free loopback port.  A DataFrame of ROWS
rows (device, reading, z; two partitions, cached) is written to each broker in turn, REPS times,
with the default options (topic ``bench/{device}``, payload the row as JSON, QoS 1): the time
runs from ``save()`` to its return, when the broker has acknowledged every message.  Reports
rows/s per broker, the broker's CPU seconds and the CPU seconds of this process tree (Spark's
JVM and Python workers: the load generator) per run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from benchmarks._storm_client import free_port, wait_port
from bridge import register
from bridge._analytics import spark_session


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _tree() -> list[int]:
    me = psutil.Process()
    return [me.pid, *(p.pid for p in me.children(recursive=True))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--qos", default="1")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-spark-sink-"))
    repo = Path(__file__).resolve().parents[1]
    brokers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    port = free_port()
    siftmq = [str(repo / ".venv/bin/siftmq"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    siftmq += ["--no-bridge", "--no-persistence", "--data-dir", str(root / "data"), "--log-level", "WARNING"]
    brokers["siftmq"] = (subprocess.Popen(siftmq, stderr=subprocess.DEVNULL), port)
    if shutil.which("mosquitto"):
        mport = free_port()
        conf = root / "mosquitto.conf"
        conf.write_text(f"listener {mport} 127.0.0.1\nallow_anonymous true\nmax_inflight_messages 1000\n")
        brokers["mosquitto"] = (
            subprocess.Popen(["mosquitto", "-c", str(conf)], stderr=subprocess.DEVNULL),
            mport,
        )
    try:
        for proc, p in brokers.values():
            wait_port(p, proc)
        spark = spark_session("local[2]")
        register(spark)
        df = (
            spark.range(args.rows)
            .selectExpr("concat('d', id % 100) AS device", "id AS reading", "rand(7) AS z")
            .repartition(2)
            .cache()
        )
        df.count()
        broker_pids = [proc.pid for proc, _ in brokers.values()]

        def write(port: int) -> None:
            df.write.format("siftmq").option("url", f"mqtt://127.0.0.1:{port}").option(
                "topic", "bench/{device}"
            ).option("qos", args.qos).mode("append").save()

        for _, p in brokers.values():  # warm-up: Python workers, paho import
            write(p)
        runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in brokers}
        for _ in range(args.reps):
            for name, (proc, p) in brokers.items():
                spark_pids = [x for x in _tree() if x not in broker_pids]
                b0, s0, t0 = _cpu([proc.pid]), _cpu(spark_pids), time.perf_counter()
                write(p)
                wall = time.perf_counter() - t0
                spark_pids = [x for x in _tree() if x not in broker_pids]
                runs[name].append((args.rows / wall, _cpu([proc.pid]) - b0, _cpu(spark_pids) - s0))
        print(f"rows {args.rows}, QoS {args.qos}, load average {os.getloadavg()[0]:.1f} (2 cores)")
        print("| broker | rows/s (median) | broker CPU s | Spark side CPU s | runs rows/s |")
        print("|---|---|---|---|---|")
        for name, rs in runs.items():
            med = statistics.median(r[0] for r in rs)
            bc = statistics.median(r[1] for r in rs)
            sc = statistics.median(r[2] for r in rs)
            print(f"| {name} | {med:,.0f} | {bc:.1f} | {sc:.1f} | {', '.join(f'{r[0]:,.0f}' for r in rs)} |")
        spark.stop()
    finally:
        for proc, _ in brokers.values():
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
