"""Spark Structured Streaming analytics over the bridge's landing zone.

Sources: one streaming DataFrame per record kind, the ``siftmq`` data source
(``spark.readStream.format("siftmq").option("kind", K).load(LANDINGS)``, issue 29): the JVM
provider (``bridge/_jar.py``: Spark's own file stream source underneath) in the sessions of
:func:`spark_session` when its jar was built, else the Python data source
(``bridge/_datasource.py``), with the declared schemas (:func:`bridge.spark_schema`), over one
landing zone or several (one per cluster node) read as one.  The writer commits files
atomically under their final name, and dot files are ignored, so a micro-batch never sees a
half-written file.  A checkpoint belongs to the source that wrote it (Spark's file source,
the JVM provider or the Python source: their offsets differ): after a change of
source use a fresh ``--output`` (or delete ``OUTPUT/_checkpoints``).

Jobs (one streaming query each, each with its own checkpoint under ``OUTPUT/_checkpoints/``):

==================  =======================================================  ===================
result              computation                                              key
==================  =======================================================  ===================
topic_rate          deliveries per topic per event-time window (watermark)  window_start, topic
subscriber_rate     deliveries per subscriber per window (watermark)        window_start, subscriber_id
node_rate           deliveries per cluster node per window ("" alone)       window_start, node
churn               subscription changes per action per window (watermark) window_start, action
latency             broker latency p50/p90/p99/max per window (watermark)   window_start
fanout              publications per fan-out (deliveries per message)       deliveries
top_topics          messages, deliveries and bytes per topic                 topic
filter_selectivity  deliveries through each content-filtered subscription   subscriber, filters
active_filters      +1/-1 events per (topic filter, content filter), from a  (events, summed)
                    stateful per-client operator (applyInPandasWithState)
composite_*         composite subscriptions: events, time to completion,      see
                    occupancy, expiries, drops, changes (issue 16)            ``bridge/_composite.py``
==================  =======================================================  ===================

Sinks: results are written in *update* mode through ``foreachBatch`` to
``OUTPUT/<result>/batch=<id>/`` with ``mode("overwrite")``.  Spark logs a micro-batch's offsets
before running it and re-runs exactly that batch (same id, same files) after a restart, so the
overwrite makes the sink idempotent and the checkpointed state makes the whole exactly once.
Update mode makes a window's count visible in the first batch that sees it (an append-mode file
sink would hold every window back until the watermark passes it).  :func:`results` reads a
result back: for each key the row of the latest batch wins; ``active_filters`` rows are deltas.

Content-filter selectivity is ``deliveries through the filtered subscription / messages
published on topics its topic filter matches`` (:func:`selectivity`), from ``filter_selectivity``
and ``top_topics``; it ignores negative entries and the subscription's lifetime.

A landing zone from before a record kind existed (the composite kinds) is read as empty (the
source reads a missing directory as empty).

This part has no seed document: it follows issue 6, item 3 (and issue 16 item 5 for the
composite view).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]

from bridge._composite import build_composite, composite_summary, composite_view
from bridge._jar import with_spark_jar
from bridge._results import RESULT_KEYS, results
from bridge._schema import Kind, spark_schema

__all__ = [
    "RESULT_KEYS",
    "console_summary",
    "landing_reader",
    "landing_streams",
    "results",
    "run_cli",
    "selectivity",
    "spark_session",
    "start_queries",
]


#: the driver's log4j 2 configuration, from the JVM's start: Spark's default profile printed
#: its name, "Setting default log level to WARN" with a hint (a root level other than WARN
#: prints them too: WARN here, ERROR by ``setLogLevel`` once the session is up) and the
#: NativeCodeLoader WARN (no native Hadoop library: expected, the Java one is used)
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
logger.nativecode.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativecode.level = error
"""


def _driver_log_options() -> str | None:
    """``-Dlog4j2.configurationFile=...`` for the driver JVM (the file written once into the
    temporary directory), or None when the user configures Spark's logging (SPARK_CONF_DIR)."""
    if os.environ.get("SPARK_CONF_DIR"):
        return None
    path = Path(tempfile.gettempdir()) / f"siftmq-spark-log4j2-{os.getuid()}.properties"
    try:
        if not path.is_file() or path.read_text() != _LOG4J2:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(_LOG4J2)
            tmp.replace(path)
    except OSError:
        return None
    return f"-Dlog4j2.configurationFile=file:{path}"


#: environment variable: ``python`` makes the sessions siftmq builds (``siftmq analytics``) leave
#: the JVM provider's jar out, so that ``format("siftmq")`` is the Python data source
SOURCE_ENV = "SIFTMQ_SPARK_SOURCE"


def spark_session(master: str = "local[2]", app_name: str = "siftmq-analytics") -> Any:
    """A SparkSession tuned for small runs: no UI, loopback driver, and few shuffle partitions
    (1 on a local master: each partition is a task and a state store per micro-batch, and
    with 1 the measured micro-batch of topic_rate went from 0.42 to 0.33 s; 2 on a cluster).
    A streaming query keeps the partition count recorded in its checkpoint.  With the jar of the
    JVM provider of ``format("siftmq")`` when it was built (:func:`bridge.with_spark_jar`) and
    :data:`SOURCE_ENV` is not ``python``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1" if master.startswith("local") else "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if master.startswith("local"):
        # the JVM binds to loopback from its start: without it, a host name that resolves to
        # a loopback address prints a WARN on every run (Utils: "Your hostname ... resolves
        # to a loopback address"), before the configuration below applies
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    if (options := _driver_log_options()) is not None:
        builder = builder.config("spark.driver.extraJavaOptions", options)
    if os.environ.get(SOURCE_ENV, "").lower() != "python":
        builder = with_spark_jar(builder)  # format("siftmq") on the JVM when the jar was built
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _spark_path(landing: str | Path) -> str:
    text = str(landing)
    return text if "://" in text else str(Path(text).resolve())


Landings = str | Path | Sequence[str | Path]


def _paths(landing: Landings) -> list[str]:
    items = [landing] if isinstance(landing, str | Path) else list(landing)
    return [_spark_path(x).rstrip("/") for x in items]


def landing_streams(spark: Any, landing: Landings) -> dict[Kind, Any]:
    """One streaming DataFrame per record kind over ``landing`` (one landing zone or several read
    as one): the ``siftmq`` data source, declared schemas."""
    read = landing_reader(spark, landing)
    return {kind: read(kind) for kind in Kind if kind is not Kind.MESSAGES}


def landing_reader(spark: Any, landing: Landings) -> Callable[..., Any]:
    """``read(kind, *columns)``: a streaming DataFrame of ``kind`` over ``landing`` with only
    ``columns`` (all without).  Spark prunes no column of a Python data source, so each
    analytics query names the columns it uses (the source's ``columns`` option): a query
    over two of the twelve columns of ``deliveries`` reads and ships two
    (docs/lab/performance-bridge.md)."""
    from bridge import jvm_provider, register

    register(spark)
    source = "the JVM provider" if jvm_provider(spark) else "the Python data source"
    logging.getLogger("siftmq").info('format("siftmq") reads with %s', source)
    paths = json.dumps(_paths(landing))  # readStream.load takes one path: the list as an option
    cores = str(spark.sparkContext.defaultParallelism)  # a micro-batch over 256 KiB: one task a core

    def read(kind: Kind, *columns: str) -> Any:
        from pyspark.sql.types import StructType

        # the schema given, Spark does not start a Python process to ask the source for it
        schema = spark_schema(kind)
        r = spark.readStream.format("siftmq").option("kind", kind.value).option("paths", paths)
        r = r.option("minPartitions", cores)
        if columns:
            r = r.option("columns", ",".join(columns))
            schema = StructType([schema[c] for c in columns])
        return r.schema(schema).load()

    return read


_STATE_SCHEMA = "filters STRING"
#: pyspark's applyInPandasWithState (pyspark/worker.py, ``construct_record_batch``) pads the
#: output of ``_active_filters`` with an untyped empty DataFrame (``dict.fromkeys`` columns, dtype
#: object) and concatenates: pandas >= 2.1 warns about it (FutureWarning, "concatenation with
#: empty or all-NA entries") on every run, whatever the function returns (typed columns meet
#: the padding's object ones, with 0 padding rows too).  The cause is inside pyspark, so that
#: one warning, raised from that module, is filtered; the Python worker runs this when it
#: imports this module to unpickle ``_active_filters`` (issue 31 item 6).
_PYSPARK_PADDING_WARNING = (
    "The behavior of DataFrame concatenation with empty or all-NA entries is deprecated"
)


def _filter_pyspark_padding_warning() -> None:
    warnings.filterwarnings(
        "ignore",
        message=re.escape(_PYSPARK_PADDING_WARNING),
        category=FutureWarning,
        module=r"pyspark\.worker\Z",
    )


_filter_pyspark_padding_warning()

_ACTIVE_SCHEMA = "time TIMESTAMP, client_id STRING, topic_filter STRING, content_filter STRING, delta INT"


def _active_filters(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """Per client: the set of (topic filter, content filter) it holds; emits +1/-1 deltas.

    ``subscribe`` replaces an identical topic filter (MQTT); ``unsubscribe`` removes it;
    ``partial_unsubscribe`` adds a negative entry (no subscription removed); ``session_end``
    and ``takeover`` with zero resulting entries clear the client's subscriptions.
    """
    client = key[0]
    held: dict[str, str | None] = dict(json.loads(state.get[0])) if state.exists else {}
    frames = [p for p in pdfs if len(p)]
    out: list[tuple[Any, str, str, str | None, int]] = []
    if frames:
        pdf = pd.concat(frames).sort_values("time", kind="stable")
        for t, action, tf, cf, entries in zip(
            pdf["time"],
            pdf["action"],
            pdf["topic_filter"],
            pdf["content_filter"],
            pdf["entries"],
            strict=True,
        ):
            selector = cf if isinstance(cf, str) else None  # pandas gives None or NaN
            if action == "subscribe" and tf is not None:
                if tf in held:
                    if held[tf] == selector:
                        continue
                    out.append((t, client, tf, held[tf], -1))
                held[tf] = selector
                out.append((t, client, tf, selector, 1))
            elif action == "unsubscribe" and tf in held:
                out.append((t, client, tf, held.pop(tf), -1))
            elif action in ("session_end", "takeover") and int(entries) == 0:
                out.extend((t, client, f, c, -1) for f, c in held.items())
                held.clear()
    state.update((json.dumps(sorted(held.items())),))
    yield pd.DataFrame(out, columns=["time", "client_id", "topic_filter", "content_filter", "delta"])


def _build(
    streams: dict[Kind, Any], window: str, watermark: str, read: Callable[..., Any] | None = None
) -> dict[str, Any]:
    """The analytics DataFrames.  With ``read`` (:func:`landing_reader`) the queries over
    deliveries and publications read only their columns; without, ``streams`` (all columns)."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    def deliveries(*columns: str) -> Any:
        df = streams[Kind.DELIVERIES] if read is None else read(Kind.DELIVERIES, "time", *columns)
        return df.withWatermark("time", watermark)

    def publications(*columns: str) -> Any:
        return streams[Kind.PUBLICATIONS] if read is None else read(Kind.PUBLICATIONS, *columns)

    c = streams[Kind.SUBSCRIPTION_CHANGES]
    win = F.window("time", window)

    def flat(df: Any) -> Any:
        return (
            df.withColumn("window_start", F.col("window.start"))
            .withColumn("window_end", F.col("window.end"))
            .drop("window")
        )

    return {
        **build_composite(streams),
        "topic_rate": flat(
            deliveries("topic", "payload_size")
            .groupBy(win.alias("window"), "topic")
            .agg(F.count("*").alias("deliveries"), F.sum("payload_size").alias("bytes"))
        ),
        "subscriber_rate": flat(
            deliveries("subscriber_id", "payload_size")
            .groupBy(win.alias("window"), "subscriber_id")
            .agg(F.count("*").alias("deliveries"), F.sum("payload_size").alias("bytes"))
        ),
        "node_rate": flat(
            deliveries("node", "payload_size")
            .withColumn("node", F.coalesce(F.col("node"), F.lit("")))
            .groupBy(win.alias("window"), "node")
            .agg(F.count("*").alias("deliveries"), F.sum("payload_size").alias("bytes"))
        ),
        "churn": flat(
            c.withWatermark("time", watermark)
            .groupBy(win.alias("window"), "action")
            .agg(F.count("*").alias("changes"))
        ),
        "latency": flat(
            deliveries("latency")
            .groupBy(win.alias("window"))
            .agg(
                F.count("*").alias("deliveries"),
                F.percentile_approx("latency", [0.5, 0.9, 0.99], 10000).alias("q"),
                F.max("latency").alias("max"),
            )
        )
        .withColumn("p50", F.col("q")[0])
        .withColumn("p90", F.col("q")[1])
        .withColumn("p99", F.col("q")[2])
        .drop("q"),
        "fanout": publications("deliveries").groupBy("deliveries").agg(F.count("*").alias("messages")),
        "top_topics": publications("topic", "deliveries", "payload_size")
        .groupBy("topic")
        .agg(
            F.count("*").alias("messages"),
            F.sum("deliveries").alias("deliveries"),
            F.sum("payload_size").alias("bytes"),
        ),
        "filter_selectivity": deliveries("subscriber_id", "subscription_filter", "content_filter")
        .where(F.col("content_filter").isNotNull())
        .groupBy("subscriber_id", "subscription_filter", "content_filter")
        .agg(F.count("*").alias("deliveries")),
        "active_filters": c.groupBy("client_id").applyInPandasWithState(
            _active_filters, _ACTIVE_SCHEMA, _STATE_SCHEMA, "update", GroupStateTimeout.NoTimeout
        ),
    }


def _sink(output: str, name: str) -> Callable[[Any, int], None]:
    def write(df: Any, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(f"{output}/{name}/batch={batch_id:012d}")

    return write


def start_queries(
    spark: Any,
    landing: Landings,
    output: str | Path,
    *,
    window: str = "10 seconds",
    watermark: str = "30 seconds",
    once: bool = False,
    trigger: float = 0.5,
    only: tuple[str, ...] | None = None,
) -> list[Any]:
    """Start the analytics queries; ``once`` uses ``trigger(availableNow=True)``."""
    out = _spark_path(output).rstrip("/")
    read = landing_reader(spark, landing)
    big = (Kind.MESSAGES, Kind.DELIVERIES, Kind.PUBLICATIONS)  # read per query, projected
    frames = _build({k: read(k) for k in Kind if k not in big}, window, watermark, read)
    queries = []
    for name, df in frames.items():
        if only is not None and name not in only:
            continue
        writer = (
            df.writeStream.queryName(f"siftmq_{name}")
            .outputMode("update")
            .option("checkpointLocation", f"{out}/_checkpoints/{name}")
            .foreachBatch(_sink(out, name))
        )
        writer = (
            writer.trigger(availableNow=True) if once else writer.trigger(processingTime=f"{trigger} seconds")
        )
        queries.append(_started(writer.start()))
    return queries


def _started(query: Any, timeout: float = 120.0) -> Any:
    """``query`` once its sources are initialized (or it ended).  Each streaming query starts a
    Python process on the driver for each ``siftmq`` source it reads, and Spark gives a new
    Python process 10 s to connect back: 13 queries spawning at once on a busy 2-core machine
    missed it.  Starting them one after the other keeps one spawn at a time."""
    deadline = time.monotonic() + timeout
    while query.isActive and query.status["message"] == "Initializing sources":
        if time.monotonic() >= deadline:
            break
        query.awaitTermination(0.05)
    return query


def _filter_regex(topic_filter: str) -> re.Pattern[str]:
    parts = []
    for level in topic_filter.split("/"):
        if level == "+":
            parts.append("[^/]*")
        elif level == "#":
            parts.append("\x00")
        else:
            parts.append(re.escape(level))
    pattern = "/".join(parts).replace("/\x00", "(/.*)?").replace("\x00", ".*")
    return re.compile(pattern + r"\Z")


def selectivity(output: str | Path) -> pd.DataFrame:
    """Per content-filtered subscription: deliveries, candidate messages and their ratio."""
    sel = results(output, "filter_selectivity")
    top = results(output, "top_topics")
    if sel.empty:
        return sel
    candidates = []
    for tf in sel["subscription_filter"]:
        rx = _filter_regex(str(tf))
        mask = [
            bool(rx.match(str(t))) and not (str(t).startswith("$") and tf[:1] in "+#") for t in top["topic"]
        ]
        candidates.append(int(top.loc[mask, "messages"].sum()) if len(top) else 0)
    sel = sel.assign(candidates=candidates)
    sel["selectivity"] = sel["deliveries"] / sel["candidates"].where(sel["candidates"] > 0)
    return sel.sort_values("selectivity").reset_index(drop=True)


@dataclass(frozen=True, slots=True)
class _Totals:
    deliveries: int
    messages: int
    changes: int


def _totals(output: str | Path) -> _Totals:
    topic = results(output, "topic_rate")
    top = results(output, "top_topics")
    churn = results(output, "churn")
    return _Totals(
        deliveries=int(topic["deliveries"].sum()) if not topic.empty else 0,
        messages=int(top["messages"].sum()) if not top.empty else 0,
        changes=int(churn["changes"].sum()) if not churn.empty else 0,
    )


def console_summary(output: str | Path, top_n: int = 5) -> str:
    """A short text summary of the latest results."""
    t = _totals(output)
    lines = [f"deliveries={t.deliveries} messages={t.messages} subscription_changes={t.changes}"]
    top = results(output, "top_topics")
    if not top.empty:
        lines.append("top topics (messages, deliveries):")
        ranked = top.sort_values(["messages", "topic"], ascending=[False, True]).head(top_n)
        lines.extend(f"  {r.topic}: {r.messages}, {r.deliveries}" for r in ranked.itertuples())
    fan = results(output, "fanout")
    if not fan.empty:
        mean = float((fan["deliveries"] * fan["messages"]).sum() / fan["messages"].sum())
        lines.append(f"fan-out: mean {mean:.2f}, max {int(fan['deliveries'].max())}")
    lat = results(output, "latency")
    if not lat.empty:
        last = lat.sort_values("window_start").iloc[-1]
        lines.append(f"latency (last window): p50 {last['p50'] * 1e3:.2f} ms, p99 {last['p99'] * 1e3:.2f} ms")
    sel = selectivity(output)
    if not sel.empty:
        known = sel["selectivity"].dropna()
        median = f"{float(known.median()):.3f}" if len(known) else "n/a"
        lines.append(f"content filters: {len(sel)} subscriptions, median selectivity {median}")
    lines.extend(composite_summary(composite_view(output), top_n))
    return "\n".join(lines)


def run_cli(
    *,
    landing: str | Sequence[str],
    output: str,
    master: str,
    once: bool,
    window: str,
    watermark: str,
    trigger: float,
    summary_every: float,
    only: tuple[str, ...] | None = None,
) -> int:
    """``siftmq analytics``: run the queries (until Ctrl-C, or once) and print summaries;
    ``only``: the results to compute (``--results``; default all)."""
    unknown = [r for r in only or () if r not in RESULT_KEYS]
    if unknown or only == ():
        names = ", ".join(RESULT_KEYS)
        print(
            f"siftmq analytics: option --results: {', '.join(unknown) or 'empty'} (results: {names})",
            file=sys.stderr,
        )
        return 2
    landings = [landing] if isinstance(landing, str) else list(landing)
    for one in landings:
        if "://" not in one and not Path(one).is_dir():
            print(f"siftmq analytics: landing zone {one!r} does not exist", file=sys.stderr)
            return 2
    if "://" not in output:
        Path(output).mkdir(parents=True, exist_ok=True)
    java = shutil.which("java") or (
        os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else None
    )
    if java is None or not os.path.exists(java):
        print(
            "siftmq analytics: Spark needs Java 17 (no `java` on PATH and no JAVA_HOME); the broker "
            "and its bridge run without it, only the analytics do not",
            file=sys.stderr,
        )
        return 2
    spark = spark_session(master)
    queries = start_queries(
        spark, landings, output, window=window, watermark=watermark, once=once, trigger=trigger, only=only
    )
    try:
        if once:
            for q in queries:
                q.awaitTermination()
        else:
            while all(q.isActive for q in queries):
                spark.streams.awaitAnyTermination(summary_every)
                print(time.strftime("%H:%M:%S"), console_summary(output), sep="\n", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        for q in queries:
            q.stop()
        spark.stop()
    failed = [q.name for q in queries if q.exception() is not None]
    print(console_summary(output))
    if failed:
        print(f"siftmq analytics: queries failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
