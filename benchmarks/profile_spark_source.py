"""Where the time of a ``format("siftmq")`` read goes, beside the Parquet file source (issue 29).

Run from the repository root:
    .venv/bin/python benchmarks/profile_spark_source.py [--files 20] [--rows 25000] [--reps 3]

Writes a landing zone of FILES bridge files of ROWS deliveries, then in one Spark session
(local[2]), alternating the sources, REPS times (after a warm-up) for the batch query of
``benchmarks/bench_spark_source.py`` (``groupBy(topic).agg(count, sum(payload_size))``):

* ``load``: ``spark.read...load()`` (the siftmq source: a Python process makes the DataSource);
* ``plan``: the executed plan of the aggregation (the siftmq source: a Python process runs
  ``reader.partitions()`` and pickles the read function);
* ``run``: ``collect()`` of the planned query (the tasks: Python workers read with pyarrow,
  the JVM converts the Arrow batches to rows);
* the SQL metrics of the scan node (Python time, rows and bytes received) from the executed plan.

Session 12: the sources are ``file``, ``jvm`` (``format("siftmq")`` with the JVM provider's jar:
Spark's Parquet source underneath; absent without the jar) and ``python`` (the Python data
source, ``siftmq_python`` beside the JVM provider), ``+columns`` with option ``columns``.

And, in this process without Spark: the pyarrow read of all files (``read_files``), all columns
and two, i.e. the floor of the Python side of ``run``; and the import time of the source module
in a fresh interpreter (what each Python worker that unpickles the source pays once).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_spark_source import _agg, _landing  # type: ignore[import-not-found]

from bridge import jvm_provider, register, spark_schema
from bridge._analytics import spark_session
from bridge._landing import kind_schema, list_files, read_files
from bridge._schema import Kind

COLUMNS = "topic,payload_size"

#: source -> format name, set in main(): ``jvm`` only in a session with the jar
FORMATS: dict[str, str] = {}


def _reader(spark: Any, src: str, streaming: bool = False) -> Any:
    """``spark.read``/``readStream`` of source ``src`` (``jvm``, ``python``, ``python+columns``,
    ``python+pushFilters``) over kind deliveries, ``load`` still to call."""
    name, _, extra = src.partition("+")
    r = (spark.readStream if streaming else spark.read).format(FORMATS[name]).option("kind", "deliveries")
    if extra == "columns":
        r = r.option("columns", COLUMNS)
    elif extra == "pushFilters":
        r = r.option("pushFilters", "true")
    return r


def _metrics(plan: Any) -> dict[str, str]:
    """The SQL metrics of the plan's nodes whose name has Python/Scan/Arrow in it."""
    out: dict[str, str] = {}
    nodes = [plan]
    while nodes:
        node = nodes.pop()
        name = node.nodeName()
        if any(s in name for s in ("Python", "Scan", "Arrow", "DataSource")):
            it = node.metrics().iterator()
            while it.hasNext():
                kv = it.next()
                value = kv._2().value()
                if value:
                    out[f"{name}.{kv._1()}"] = str(value)
        kids = node.children()
        nodes.extend(kids.apply(i) for i in range(kids.size()))
        if hasattr(node, "innerChildren"):
            pass
    return out


def _read_variants(files: list[str]) -> None:
    """The pyarrow read of all files in this process, several ways (best of 3, all columns)."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    schema = kind_schema(Kind.DELIVERIES)

    def source() -> int:
        return sum(b.num_rows for b in read_files(files, Kind.DELIVERIES))

    def prebuffer_no_threads() -> int:
        n = 0
        for p in files:
            for b in pq.ParquetFile(p, pre_buffer=True).iter_batches(batch_size=1 << 20, use_threads=False):
                n += b.num_rows
        return n

    def read_table() -> int:
        return sum(pq.read_table(p, schema=schema).num_rows for p in files)

    def dataset_no_threads() -> int:
        d = ds.dataset(files, format="parquet", schema=schema)
        return sum(b.num_rows for b in d.to_batches(batch_size=1 << 20, use_threads=False))

    for name, fn in (
        ("read_files (the source)", source),
        ("iter_batches, pre_buffer, no threads", prebuffer_no_threads),
        ("read_table", read_table),
        ("dataset, no threads", dataset_no_threads),
    ):
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        print(f"pyarrow read variant {name}: {best:.3f} s")


def _zip_import() -> None:
    """What a cold Python process of Spark pays: the streaming source runner's imports with
    pyspark from ``pyspark/python/lib/pyspark.zip`` (first on a Spark worker's PYTHONPATH, no
    ``.pyc`` in it) against site-packages; CPU seconds of a fresh interpreter, best of 3."""
    import resource

    import pyspark

    zipped = Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip"
    code = "import pyspark.sql.streaming.python_streaming_source_runner"
    for label, env in (
        ("pyspark.zip", {**os.environ, "PYTHONPATH": str(zipped)}),
        ("site-packages", {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}),
    ):
        best = float("inf")
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-c", code], env=env, check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            best = min(best, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        print(f"import of the streaming source runner from {label}: {best:.2f} s CPU")


def _reuse(base: Path, files: int, rows: int) -> Path:
    """The landing zone under ``base`` if it has ``files`` delivery files, else a new one there."""
    land = base / "landing"
    if len(list((land / "deliveries").glob("part-*.parquet"))) != files:
        base.mkdir(parents=True, exist_ok=True)
        land = _landing(base, files, rows)
    return land


def _stream(spark: Any, df: Any, checkpoint: Path, want: int) -> tuple[float, dict[str, float]]:
    """Wall seconds of an availableNow query from start to end, and its progress's durations
    summed over its micro-batches (``outside`` = wall - triggerExecution: query start/stop)."""
    got: list[int] = []
    t = time.perf_counter()
    t_wall = time.time()
    q = (
        _agg(df)
        .writeStream.outputMode("complete")
        .foreachBatch(lambda d, _: got.append(sum(r["n"] for r in d.collect())))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    t_started = time.perf_counter() - t
    q.awaitTermination()
    wall = time.perf_counter() - t
    assert got[-1] == want, got
    parts: dict[str, float] = {"start()": t_started}
    for p in q.recentProgress:
        for k, v in p["durationMs"].items():
            parts[k] = parts.get(k, 0.0) + v / 1000
    parts["outside"] = wall - parts.get("triggerExecution", 0.0)
    from datetime import datetime

    stamps = [
        datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() for p in q.recentProgress
    ]
    parts["before 1st trigger"] = min(stamps) - t_wall
    last = q.recentProgress[-1]
    parts["after last trigger"] = t_wall + wall - max(stamps) - last["durationMs"]["triggerExecution"] / 1000
    return wall, parts


def _filtered(spark: Any, land: Path, schema: Any, rows: int, reps: int) -> None:
    """The aggregation under a time range (the last 10% of the rows) and a topic equality:
    file source, siftmq, siftmq with ``pushFilters`` (median wall s of ``reps``)."""
    import datetime as dt

    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    t_from = dt.datetime.fromtimestamp(1.8e9 + rows * 0.9 / 1000, dt.UTC)
    wheres = {"time >= last 10%": F.col("time") >= F.lit(t_from), "topic = 't/7'": F.col("topic") == "t/7"}

    def make(src: str) -> Any:
        if src == "file":
            return spark.read.schema(schema).parquet(str(land / "deliveries"))
        return _reader(spark, src).load(str(land))

    srcs = ("file", *(("jvm",) if "jvm" in FORMATS else ()), "python", "python+pushFilters")
    print("| filter | " + " | ".join(srcs) + " | rows |")
    print("|---|" + "---|" * (len(srcs) + 1))
    for label, cond in wheres.items():
        times: dict[str, list[float]] = {s: [] for s in srcs}
        counts = set()
        for rep in range(reps + 1):
            for src in srcs:
                t = time.perf_counter()
                got = _agg(make(src).where(cond)).collect()
                if rep:
                    times[src].append(time.perf_counter() - t)
                counts.add(sum(r["n"] for r in got))
        assert len(counts) == 1, counts
        med = [statistics.median(times[s]) for s in srcs]
        print(f"| {label} | " + " | ".join(f"{m:.3f}" for m in med) + f" | {counts.pop()} |")
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--rows", type=int, default=25_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--conf", action="append", default=[], help="KEY=VALUE Spark conf (repeat)")
    ap.add_argument("--filters", action="store_true", help="also time filtered reads (pushFilters)")
    ap.add_argument("--landing", help="reuse (or create) the landing zone under this directory")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="profile-spark-source-"))
    if args.landing:
        land = _reuse(Path(args.landing), args.files, args.rows)
    else:
        land = _landing(root, args.files, args.rows)
    files = [f.path for f in list_files(str(land), Kind.DELIVERIES)]
    for cols in (None, tuple(COLUMNS.split(","))):
        t = time.perf_counter()
        n = sum(b.num_rows for b in read_files(files, Kind.DELIVERIES, cols))
        print(f"pyarrow read_files in-process, columns={cols}: {n} rows in {time.perf_counter() - t:.3f} s")
    _read_variants(files)
    _zip_import()
    imp = subprocess.run(
        [
            sys.executable,
            "-c",
            "import time; t=time.perf_counter(); import bridge._datasource; "
            "print(round(time.perf_counter()-t, 3))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    imp0 = subprocess.run(
        [
            sys.executable,
            "-c",
            "import time; t=time.perf_counter(); import pyspark.sql.datasource, pyarrow; "
            "print(round(time.perf_counter()-t, 3))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    print(
        f"import bridge._datasource (fresh interpreter): {imp.stdout.strip()} s; "
        f"pyspark.sql.datasource + pyarrow alone: {imp0.stdout.strip()} s"
    )
    spark = spark_session("local[2]")
    for kv in args.conf:
        k, v = kv.split("=", 1)
        spark.conf.set(k, v)
    register(spark)
    jvm = jvm_provider(spark)
    FORMATS.update({"jvm": "siftmq", "python": "siftmq_python"} if jvm else {"python": "siftmq"})
    print(f"sources: file, {', '.join(FORMATS)}", flush=True)
    schema = spark_schema(Kind.DELIVERIES)
    want = args.files * args.rows

    def make(src: str) -> Any:
        if src == "file":
            return spark.read.schema(schema).parquet(str(land / "deliveries"))
        return _reader(spark, src).load(str(land))

    srcs = ("file", *(("jvm",) if "jvm" in FORMATS else ()), "python", "python+columns")
    phases: dict[str, dict[str, list[float]]] = {s: {"load": [], "plan": [], "run": []} for s in srcs}
    last: dict[str, dict[str, str]] = {}
    for rep in range(args.reps + 1):
        for src in srcs:
            t0 = time.perf_counter()
            df = make(src)
            t1 = time.perf_counter()
            q = _agg(df)
            qe = q._jdf.queryExecution()
            qe.executedPlan()
            t2 = time.perf_counter()
            rows = q.collect()
            t3 = time.perf_counter()
            assert sum(r["n"] for r in rows) == want
            if rep:
                for ph, v in (("load", t1 - t0), ("plan", t2 - t1), ("run", t3 - t2)):
                    phases[src][ph].append(v)
            last[src] = _metrics(qe.executedPlan())
    print(f"rows {want}, load average {os.getloadavg()[0]:.1f}")
    print("| source | load s | plan s | run s | total s |")
    print("|---|---|---|---|---|")
    for src in srcs:
        m = {ph: statistics.median(v) for ph, v in phases[src].items()}
        print(f"| {src} | {m['load']:.3f} | {m['plan']:.3f} | {m['run']:.3f} | {sum(m.values()):.3f} |")
    for src in srcs:
        print(src, "metrics:", last[src])
    every: dict[str, list[float]] = {s: [] for s in srcs if "+" not in s}
    for rep in range(args.reps + 1):
        for src, runs in every.items():
            from pyspark.sql import functions as F

            t = time.perf_counter()
            df = make(src)
            df.select(F.sum(F.hash(*df.columns).cast("long"))).collect()
            if rep:
                runs.append(time.perf_counter() - t)
    e = {s: statistics.median(v) for s, v in every.items()}
    print(
        "batch using every column (sum(hash(*columns))): "
        + ", ".join(f"{s} {v:.3f} s (ratio {v / e['file']:.2f})" for s, v in e.items())
        + f"; all {every}"
    )
    if args.filters:
        _filtered(spark, land, schema, args.files * args.rows, args.reps)
    streams: dict[str, list[tuple[float, dict[str, float]]]] = {s: [] for s in srcs}
    for rep in range(args.reps + 1):
        for src in srcs:
            if src == "file":
                df = spark.readStream.schema(schema).parquet(str(land / "deliveries"))
            else:
                df = _reader(spark, src, streaming=True).load(str(land))
            res = _stream(spark, df, root / f"ck-{src}-{rep}", want)
            if rep:
                streams[src].append(res)
    print(f"stream from start (availableNow), load average {os.getloadavg()[0]:.1f}")
    keys = ("start()", "latestOffset", "queryPlanning", "addBatch", "walCommit", "commit")
    keys += ("triggerExecution", "outside", "before 1st trigger", "after last trigger")
    print("| source | wall s | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for src in srcs:
        wall = statistics.median(w for w, _ in streams[src])
        med = {k: statistics.median(p.get(k, 0.0) for _, p in streams[src]) for k in keys}
        print(f"| {src} | {wall:.3f} | " + " | ".join(f"{med[k]:.3f}" for k in keys) + " |")
    print("all:", {s: {ph: [round(x, 3) for x in v] for ph, v in d.items()} for s, d in phases.items()})
    spark.stop()


if __name__ == "__main__":
    main()
