"""The loop's delay: a device publishes an outlier -> the device's alert arrives back over MQTT.

Run from the repository root:
    .venv/bin/python benchmarks/bench_spark_loop.py [--seconds 30] [--roll 0.5] [--trigger 0.5]

Starts ``siftmq serve --bridge-messages 'telemetry/#' --bridge-roll-interval ROLL`` on a free
loopback port and, in this process, local Spark (``local[2]``) running the loop's query
(``bridge/_loop.py``: window 10 s, threshold 3, trigger TRIGGER s).  20 devices publish normal
readings (10 or 11) five times a second each (100 messages/s); once a second one device (in
turn, so a device's previous outlier has left its 10 s window) publishes an outlier whose value
encodes the probe's number.  A subscriber on ``alerts/#`` timestamps each alert; the delay of a
probe is its alert's arrival minus the probe's publication.  Reports p50/p90/max over the
probes and how many alerts arrived.

Stages per probe (medians reported): *landing*, publication -> the modification time of the
landing file that holds the probe (the bridge's roll wait and its write); *trigger wait*, that
time -> the start of the micro-batch whose end offset first covers the file (the query's
progress ``timestamp``: the trigger interval, or the batch still running when the file
landed); *micro-batch*, that start -> the alert's arrival (listing, offset log, planning,
reading, scoring, publishing; the batch's own ``durationMs`` split is printed too).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import subprocess

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from benchmarks._storm_client import free_port, wait_port
from bridge import jvm_provider
from bridge._analytics import spark_session
from bridge._loop import LoopOptions, alerts_query

DEVICES = 20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--roll", type=float, default=0.5)
    ap.add_argument("--trigger", type=float, default=0.5)
    ap.add_argument(
        "--source",
        default="siftmq",
        help="the read's format: siftmq (the JVM provider when the session has its jar) or siftmq_python",
    )
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-spark-loop-"))
    repo = Path(__file__).resolve().parents[1]
    port = free_port()
    cmd = [str(repo / ".venv/bin/siftmq"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--no-persistence", "--data-dir", str(root), "--bridge-messages", "telemetry/#"]
    cmd += ["--bridge-roll-interval", str(args.roll), "--log-level", "WARNING"]
    broker = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, broker)
        (root / "landing" / "messages").mkdir(parents=True, exist_ok=True)
        spark = spark_session("local[2]")
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
        o = LoopOptions(url=f"mqtt://127.0.0.1:{port}", window=10.0, trigger=args.trigger)
        query = alerts_query(spark, str(root / "landing"), str(root / "ck"), o, source=args.source)
        print(f"source {args.source}, JVM provider in the session: {jvm_provider(spark)}", flush=True)
        deadline = time.monotonic() + 180
        while query.lastProgress is None and time.monotonic() < deadline:
            query.awaitTermination(0.1)  # the query's start (its Python source process) is not measured
        sent: dict[int, float] = {}
        delays: dict[int, float] = {}
        lock = threading.Lock()

        def on_alert(client: object, userdata: object, m: mqtt.MQTTMessage) -> None:
            now = time.time()
            k = round(json.loads(m.payload)["value"]) - 1000
            with lock:
                if k in sent and k not in delays:
                    delays[k] = now - sent[k]

        sub = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        sub.on_message = on_alert
        sub.connect("127.0.0.1", port)
        sub.subscribe("alerts/#", qos=1)
        sub.loop_start()
        pub = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        pub.connect("127.0.0.1", port)
        pub.loop_start()
        start = time.monotonic()
        warmup = 8.0  # history for every device, and the query's first batches
        tick, probe = 0, 0
        while time.monotonic() - start < warmup + args.seconds:
            for d in range(DEVICES):
                pub.publish(f"telemetry/d{d}", json.dumps({"value": 10 + (tick + d) % 2}), qos=0)
            if time.monotonic() - start >= warmup and tick % 5 == 0:
                with lock:
                    sent[probe] = time.time()
                pub.publish(f"telemetry/d{probe % DEVICES}", json.dumps({"value": 1000 + probe}), qos=0)
                probe += 1
            tick += 1
            time.sleep(max(0.0, start + tick * 0.2 - time.monotonic()))  # pacing the devices: 5 Hz
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(delays) < len(sent):
            time.sleep(0.1)  # the last probes' alerts, bounded
        every = list(query.recentProgress)
        progress = [p for p in every if p["numInputRows"] > 0]
        query.stop()
        spark.stop()
        if progress:
            parts = (
                "triggerExecution",
                "latestOffset",
                "queryPlanning",
                "addBatch",
                "walCommit",
                "commitOffsets",
            )
            med = {k: statistics.median(p["durationMs"].get(k, 0) for p in progress) for k in parts}
            print(f"micro-batches with input: {len(progress)}; median ms: {med}")
        sub.loop_stop()
        pub.loop_stop()
        got = sorted(delays.values())
        print(
            f"source {args.source}, roll {args.roll} s, trigger {args.trigger} s, "
            f"load average {os.getloadavg()[0]:.1f} (2 cores): "
            f"{len(got)} of {len(sent)} probes alerted"
        )
        if got:
            p90 = got[min(len(got) - 1, int(0.9 * len(got)))]
            p50 = statistics.median(got)
            print(f"device-to-alert delay: p50 {p50:.2f} s, p90 {p90:.2f} s, max {got[-1]:.2f} s")
            _stages(root / "landing", sent, delays, every)
    finally:
        broker.terminate()
        broker.wait(10)


def _stages(landing: Path, sent: dict[int, float], delays: dict[int, float], progress: list[Any]) -> None:
    """Split each alerted probe's delay at its landing file's mtime and its micro-batch's start."""
    import pyarrow.parquet as pq

    from bridge._landing import list_files
    from bridge._schema import Kind

    where: dict[int, tuple[float, str, int]] = {}  # probe -> (file mtime, writer tag, sequence)
    for f in list_files(str(landing), Kind.MESSAGES):
        mtime = os.stat(f.path).st_mtime
        for payload in pq.read_table(f.path, columns=["payload"]).column("payload").to_pylist():
            value = json.loads(payload)["value"]
            if value >= 1000:
                where[round(value) - 1000] = (mtime, f.tag, f.seq)
    batches = []
    for p in progress:
        end = p["sources"][0]["endOffset"]
        end = json.loads(end) if isinstance(end, str) else end
        if not isinstance(end, dict) or str(landing) not in end:
            return  # not the Python source's offsets (the JVM provider's are a file log index)
        start = datetime.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        batches.append((start, end.get(str(landing), {})))
    land, wait, batch = [], [], []
    for k, delay in delays.items():
        if k not in where:
            continue
        mtime, tag, seq = where[k]
        starts = [t for t, tags in batches if tags.get(tag, 0) >= seq]
        if not starts:
            continue
        begin = min(starts)
        land.append(mtime - sent[k])
        wait.append(begin - mtime)
        batch.append(sent[k] + delay - begin)
    if land:
        med = statistics.median
        print(
            f"stages (median of {len(land)} probes): landing {med(land):.2f} s, trigger wait "
            f"{med(wait):.2f} s, micro-batch to the alert's arrival {med(batch):.2f} s"
        )


if __name__ == "__main__":
    main()
