"""Reading the landing zone: ``format("siftmq")`` against Spark's Parquet file source it replaced.

Run from the repository root:
    .venv/bin/python benchmarks/bench_spark_source.py [--files 40] [--rows 25000] [--reps 3]

A landing zone of FILES bridge files of ROWS deliveries each is written once; then, in the same
Spark session (local[2]) and alternating the two sources (ABAB...), REPS times each:

* batch: ``groupBy("topic").agg(count, sum(payload_size))`` collected;
* the same with ``option("columns", "topic,payload_size")`` (Spark prunes no column of a Python
  data source: the option does);
* stream: the same aggregation as a streaming query with ``trigger(availableNow=True)``, a fresh
  checkpoint each time, from start to termination (planning, listing, one micro-batch).

Reports the median seconds per variant, their ratio (siftmq / file; < 1 is faster) and the CPU
seconds of the whole process tree (driver JVM, Python workers) per variant.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from bridge import Bridge, register, spark_schema
from bridge._analytics import spark_session
from bridge._schema import Kind
from tests.bridge.records import delivery, feed


def _tree_cpu() -> float:
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def _landing(root: Path, files: int, rows: int) -> Path:
    land = root / "landing"
    b = Bridge(land, roll_interval=3600, roll_bytes=1 << 40)
    t0 = 1.8e9
    i = 0
    for _ in range(files):
        for _ in range(rows):
            feed(b, delivery(i, t0 + i / 1000, topic=f"t/{i % 50}", subscriber=f"s{i % 20}"))
            i += 1
        b.flush()
    b.close()
    return land


def _agg(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.groupBy("topic").agg(F.count("*").alias("n"), F.sum("payload_size").alias("bytes"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--rows", type=int, default=25_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-spark-source-"))
    t = time.perf_counter()
    land = _landing(root, args.files, args.rows)
    print(
        f"landing zone: {args.files} files x {args.rows} deliveries in {time.perf_counter() - t:.1f} s",
        flush=True,
    )
    spark = spark_session("local[2]")
    register(spark)
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    schema = spark_schema(Kind.DELIVERIES)
    want = args.files * args.rows

    def siftmq_batch() -> Any:
        return spark.read.format("siftmq").option("kind", "deliveries").load(str(land))

    def file_batch() -> Any:
        return spark.read.schema(schema).parquet(str(land / "deliveries"))

    def siftmq_stream() -> Any:
        return spark.readStream.format("siftmq").option("kind", "deliveries").load(str(land))

    def pruned_batch() -> Any:
        return (
            spark.read.format("siftmq")
            .option("kind", "deliveries")
            .option("columns", "topic,payload_size")
            .load(str(land))
        )

    def pruned_stream() -> Any:
        return (
            spark.readStream.format("siftmq")
            .option("kind", "deliveries")
            .option("columns", "topic,payload_size")
            .load(str(land))
        )

    def file_stream() -> Any:
        return spark.readStream.schema(schema).parquet(str(land / "deliveries"))

    counter = iter(range(10**6))

    def batch(make: Any) -> None:
        rows = _agg(make()).collect()
        assert sum(r["n"] for r in rows) == want

    def stream(make: Any) -> None:
        got: list[int] = []
        q = (
            _agg(make())
            .writeStream.outputMode("complete")
            .foreachBatch(lambda df, _: got.append(sum(r["n"] for r in df.collect())))
            .option("checkpointLocation", str(root / f"ck{next(counter)}"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        assert got[-1] == want, got

    variants = {
        ("batch", "file"): lambda: batch(file_batch),
        ("batch", "siftmq"): lambda: batch(siftmq_batch),
        ("stream", "file"): lambda: stream(file_stream),
        ("stream", "siftmq"): lambda: stream(siftmq_stream),
        ("batch", "siftmq+columns"): lambda: batch(pruned_batch),
        ("stream", "siftmq+columns"): lambda: stream(pruned_stream),
    }
    for fn in variants.values():  # warm-up: JVM JIT, Python workers
        fn()
    wall: dict[tuple[str, str], list[float]] = {k: [] for k in variants}
    cpu: dict[tuple[str, str], list[float]] = {k: [] for k in variants}
    for _ in range(args.reps):
        for key, fn in variants.items():
            c, t = _tree_cpu(), time.perf_counter()
            fn()
            wall[key].append(time.perf_counter() - t)
            cpu[key].append(_tree_cpu() - c)
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (2 cores)")
    print("| read | source | median s | CPU s (process tree) | ratio to the file source |")
    print("|---|---|---|---|---|")
    for mode in ("batch", "stream"):
        f = statistics.median(wall[(mode, "file")])
        for src in ("file", "siftmq", "siftmq+columns"):
            w, c = statistics.median(wall[(mode, src)]), statistics.median(cpu[(mode, src)])
            print(f"| {mode} | {src} | {w:.2f} | {c:.1f} | {w / f:.2f} |")
    print("all runs (s):", {f"{k[0]}/{k[1]}": [round(x, 2) for x in v] for k, v in wall.items()})
    spark.stop()


if __name__ == "__main__":
    main()
