"""A timeline of ``format("siftmq")`` reads across Spark's Python processes (profiling).

Run from the repository root, on a landing zone written by ``benchmarks/bench_spark_source.py
--landing DIR`` (or any):
    .venv/bin/python benchmarks/timeline_spark_source.py DIR/landing [--reps 3]

Per rep: a batch read of the file source and of the source (columns ``topic,payload_size``),
``groupBy(topic).count()`` collected, then a stream of the source from start to end
(availableNow).  Prints the log of ``benchmarks/_timeline_source.py`` (every Python process
that imports the source: planner, streaming source runner, task workers) merged with the
driver's own events, times relative to the first event.  This is how the straggler task and
the cold streaming source process of docs/lab/performance-bridge.md (Session 11) were found.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("landing")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="timeline-"))
    os.environ["SIFTMQ_TIMELINE"] = str(work / "timeline.txt")
    # the Python workers must import the logging source: put benchmarks/ on their path
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)])
    from _timeline_source import TimelineSource, log  # type: ignore[import-not-found]

    from bridge._analytics import spark_session

    spark = spark_session("local[2]")
    spark.dataSource.register(TimelineSource)
    land = str(Path(args.landing).resolve())
    for rep in range(args.reps):
        for src in ("file", "siftmq"):
            if src == "file":
                df = spark.read.parquet(land + "/deliveries")
            else:
                df = (
                    spark.read.format("siftmqtimeline")
                    .option("kind", "deliveries")
                    .option("columns", "topic,payload_size")
                    .load(land)
                )
            log(f"driver: {src} batch {rep}: collect")
            df.groupBy("topic").count().collect()
            log(f"driver: {src} batch {rep}: collected")
        stream = spark.readStream.format("siftmqtimeline").option("kind", "deliveries")
        stream = stream.option("columns", "topic,payload_size").load(land)
        log(f"driver: stream {rep}: start()")
        q = (
            stream.groupBy("topic")
            .count()
            .writeStream.outputMode("complete")
            .foreachBatch(lambda d, _: d.collect())
            .option("checkpointLocation", str(work / f"ck{rep}"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        log(f"driver: stream {rep}: terminated")
    spark.stop()
    lines = (work / "timeline.txt").read_text().splitlines()
    t0 = float(lines[0].split()[0])
    for line in lines:
        t, rest = line.split(" ", 1)
        print(f"{float(t) - t0:8.3f} {rest}")


if __name__ == "__main__":
    main()
