"""Reading the landing zone: ``format("siftmq")`` against Spark's Parquet file source it replaced.

Three sources (Session 12): ``file`` (Spark's Parquet file source over ``LANDING/deliveries``),
``jvm`` (``format("siftmq")`` in a session with the JVM provider's jar, ``bridge/_jar.py``:
Spark's own Parquet source underneath) and ``python`` (the Python data source, registered as
``siftmq_python`` beside the JVM provider; ``siftmq`` in a session without the jar, when only
``python`` runs).  ``+columns``: with ``option("columns", "topic,payload_size")``.

Run from the repository root:
    .venv/bin/python benchmarks/bench_spark_source.py [--files 40] [--rows 25000] [--reps 3] [--landing DIR]

A landing zone of FILES bridge files of ROWS deliveries each is written once; then, in the same
Spark session (local[2]) and alternating the two sources (ABAB...), REPS times each:

* batch: ``groupBy("topic").agg(count, sum(payload_size))`` collected;
* the same with ``option("columns", "topic,payload_size")`` (Spark prunes no column of a Python
  data source: the option does);
* stream: the same aggregation as a streaming query with ``trigger(availableNow=True)``, a fresh
  checkpoint each time, from start to termination (planning, listing, one micro-batch);
* running (``--running N``, default 4): the micro-batch of a query that is already running, as
  in ``siftmq analytics``: one query per source (file, siftmq, siftmq + columns), each over
  its own copy of the landing zone (a 0.2 s trigger, update mode, the
  changed groups collected by ``foreachBatch``); per round,
  N new files (ROWS deliveries each) are committed to each copy in turn, the query drains
  them (``processAllAvailable``), and its micro-batch's ``triggerExecution`` (listing,
  offset log, planning, reading, aggregation, state store, commit) is taken from its progress.

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

from bridge import Bridge, jvm_provider, register, spark_schema
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
    ap.add_argument("--running", type=int, default=4, help="new files per round of running queries (0: skip)")
    ap.add_argument("--source-option", action="append", default=[], help="KEY=VALUE for every siftmq read")
    ap.add_argument("--running-only", action="store_true", help="only the running queries (--running)")
    ap.add_argument("--landing", help="keep the landing zone in this directory, reused if it has FILES files")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-spark-source-"))
    t = time.perf_counter()
    if args.landing and len(list(Path(args.landing, "landing", "deliveries").glob("part-*"))) == args.files:
        land = Path(args.landing, "landing")
    else:
        land = _landing(Path(args.landing) if args.landing else root, args.files, args.rows)
    print(
        f"landing zone: {args.files} files x {args.rows} deliveries in {time.perf_counter() - t:.1f} s",
        flush=True,
    )
    print(f"load average at the start: {os.getloadavg()[0]:.1f} (2 cores)", flush=True)
    spark = spark_session("local[2]")
    register(spark)
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
    schema = spark_schema(Kind.DELIVERIES)
    want = args.files * args.rows
    extra = dict(kv.split("=", 1) for kv in args.source_option)

    jvm = jvm_provider(spark)
    formats = {"jvm": "siftmq", "python": "siftmq_python"} if jvm else {"python": "siftmq"}
    print(f"sources: file, {', '.join(formats)} (JVM provider jar: {jvm})", flush=True)

    def source(src: str, streaming: bool) -> Any:
        if src == "file":
            r = spark.readStream if streaming else spark.read
            return r.schema(schema).parquet(str(land / "deliveries"))
        name, _, cols = src.partition("+")
        r = (spark.readStream if streaming else spark.read).format(formats[name]).options(**extra)
        r = r.option("kind", "deliveries")
        return (r.option("columns", "topic,payload_size") if cols else r).load(str(land))

    counter = iter(range(10**6))

    def batch(src: str) -> None:
        rows = _agg(source(src, False)).collect()
        assert sum(r["n"] for r in rows) == want

    def stream(src: str) -> None:
        got: list[int] = []
        q = (
            _agg(source(src, True))
            .writeStream.outputMode("complete")
            .foreachBatch(lambda df, _: got.append(sum(r["n"] for r in df.collect())))
            .option("checkpointLocation", str(root / f"ck{next(counter)}"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        assert got[-1] == want, got

    srcs = ["file", *[f"{f}{c}" for f in formats for c in ("", "+columns")]]
    variants: dict[tuple[str, str], Any] = {}
    for mode, run in (("batch", batch), ("stream", stream)):
        for src in srcs:
            variants[(mode, src)] = lambda run=run, src=src: run(src)
    if args.running_only:
        variants.clear()
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
    if variants:
        print("| read | source | median s | CPU s (process tree) | ratio to the file source |")
        print("|---|---|---|---|---|")
        for mode in ("batch", "stream"):
            f = statistics.median(wall[(mode, "file")])
            for src in srcs:
                w, c = statistics.median(wall[(mode, src)]), statistics.median(cpu[(mode, src)])
                print(f"| {mode} | {src} | {w:.2f} | {c:.1f} | {w / f:.2f} |")
        print("all runs (s):", {f"{k[0]}/{k[1]}": [round(x, 2) for x in v] for k, v in wall.items()})
    if args.running:
        _running(spark, root, args.running, args.rows, args.reps, formats)
    spark.stop()


def _running(spark: Any, root: Path, files: int, rows: int, reps: int, formats: dict[str, str]) -> None:
    """Micro-batches of running queries (module docstring); prints the table.  The JVM provider
    runs once (Spark prunes its columns: ``+columns`` is the same read), the Python source
    with and without ``columns``."""
    schema = spark_schema(Kind.DELIVERIES)
    names = ["file", *(["jvm"] if "jvm" in formats else []), "python", "python+columns"]
    lands = {name: root / f"running-{name}" for name in names}
    staging = root / "running-staging"  # files are written here, then renamed in together
    writer = Bridge(staging, roll_interval=3600, roll_bytes=1 << 40)
    for land in lands.values():
        (land / "deliveries").mkdir(parents=True, exist_ok=True)  # the file source needs it

    def reader(name: str) -> Any:
        if name == "file":
            return spark.readStream.schema(schema).parquet(str(lands[name] / "deliveries"))
        r = spark.readStream.format(formats[name.partition("+")[0]]).option("kind", "deliveries")
        if name.endswith("+columns"):
            r = r.option("columns", "topic,payload_size")
        return r.load(str(lands[name]))

    queries: dict[str, Any] = {}
    for name in lands:  # one after the other: a source's Python process gets 10 s to connect
        queries[name] = (
            _agg(reader(name))
            .writeStream.foreachBatch(lambda df, _: df.collect())
            .outputMode("update")
            .option("checkpointLocation", str(root / f"ck-running-{name}"))
            .trigger(processingTime="0.2 seconds")
            .start()
        )
        queries[name].processAllAvailable()
    t0 = 1.9e9
    batch: dict[str, list[float]] = {name: [] for name in lands}
    parts: dict[str, list[dict[str, int]]] = {name: [] for name in lands}
    for rep in range(reps + 1):  # the first round warms up
        for name, q in queries.items():
            q.processAllAvailable()
            before = {p["id"] + p["timestamp"] for p in q.recentProgress}  # an idle query's progress
            for f in range(files):
                for i in range(rows):
                    k = (rep * files + f) * rows + i
                    feed(writer, delivery(k, t0 + k / 1000, topic=f"t/{k % 50}", subscriber=f"s{k % 20}"))
                writer.flush()
            for part in sorted((staging / "deliveries").glob("part-*.parquet")):
                part.rename(lands[name] / "deliveries" / part.name)
            deadline = time.monotonic() + 120
            while True:  # the query's progress for every new row (bounded wait)
                q.processAllAvailable()
                done = [
                    p
                    for p in q.recentProgress
                    if p["numInputRows"] > 0 and p["id"] + p["timestamp"] not in before
                ]
                if sum(p["numInputRows"] for p in done) >= files * rows or time.monotonic() > deadline:
                    break
            assert sum(p["numInputRows"] for p in done) == files * rows, (name, done)
            if rep:
                batch[name].append(sum(p["durationMs"]["triggerExecution"] for p in done) / 1000)
                parts[name].extend(p["durationMs"] for p in done)
    for q in queries.values():
        q.stop()
    writer.close()
    print(
        f"running queries: {files} new files x {rows} rows per micro-batch, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print("| source | micro-batch median s | latestOffset ms | addBatch ms | ratio to the file source |")
    print("|---|---|---|---|---|")
    f = statistics.median(batch["file"])
    for name in lands:
        m = statistics.median(batch[name])
        lo = statistics.median(d.get("latestOffset", 0) for d in parts[name])
        ab = statistics.median(d.get("addBatch", 0) for d in parts[name])
        print(f"| {name} | {m:.2f} | {lo:.0f} | {ab:.0f} | {m / f:.2f} |")
    print("all micro-batches (s):", {k: [round(x, 2) for x in v] for k, v in batch.items()})


if __name__ == "__main__":
    main()
