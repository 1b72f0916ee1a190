"""``format("siftmq")`` with real local Spark: batch reads of several landing zones, a streaming
read that resumes exactly once from its checkpoint, and the MQTT sink when a Python worker dies
mid-batch (the re-run re-publishes with the same idempotency keys).  The suite's session has the
JVM provider's jar when it was built: ``siftmq`` is then the JVM provider and ``siftmq_python``
the Python source; both read the same rows of every kind (the landing zones of
test_bridge_jvm.py), and the sink works through the JVM provider.  Invalid rows, refused
credentials and a broker that is down are tested without Spark (test_bridge_sink.py): the
task raises the same error, which fails the query."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bridge import SCHEMAS, Bridge, Kind, register, spark_schema
from bridge._datasource import SiftmqDataSource
from bridge._sink import KEY_PROPERTY
from broker import Broker
from tests.bridge.conftest import spark_call
from tests.bridge.records import delivery, feed
from tests.bridge.test_bridge_jvm import jvm_session, landings, sorted_rows
from tests.bridge.test_bridge_sink import _Collector
from tests.waiting import eventually

pytestmark = pytest.mark.spark


def _commit(landing: Path, lo: int, hi: int) -> None:
    """One file of deliveries lo..hi-1 (a writer of its own)."""
    with Bridge(landing) as b:
        for i in range(lo, hi):
            feed(b, delivery(i, 1.8e9 + i))


def _node_file(landing: Path, node: str, n: int) -> None:
    """A deliveries file as a cluster node's bridge writes it (its node id in every row)."""
    table = pa.Table.from_pylist(
        [
            {
                "time": 1.8e9 * 1e6 + i,
                "message_id": i,
                "subscriber_id": "s",
                "topic": "t",
                "subscription_filter": "t",
                "qos": 0,
                "retained": False,
                "payload_size": 1,
                "latency": 0.0,
                "node": node,
            }
            for i in range(n)
        ],
        schema=SCHEMAS[Kind.DELIVERIES],
    )
    (landing / "deliveries").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, landing / "deliveries" / f"part-0000000000000001-{node}-00000001.parquet")


def test_batch_read_of_several_landing_zones_per_node(spark: Any, tmp_path: Path) -> None:
    register(spark)
    _node_file(tmp_path / "n1", "n1", 30)
    _node_file(tmp_path / "n2", "n2", 20)
    for kind in Kind:  # every kind has its documented schema (what Spark asks the source)
        assert SiftmqDataSource({"kind": kind.value, "path": "x"}).schema() == spark_schema(kind)
    both = (
        spark.read.format("siftmq")
        .option("kind", "deliveries")
        .schema("node string")  # a schema of some of the kind's columns: only those are read
        .load([str(tmp_path / "n1"), str(tmp_path / "n2")])
    )
    assert both.columns == ["node"]
    assert {r["node"]: r["count"] for r in both.groupBy("node").count().collect()} == {"n1": 30, "n2": 20}


def test_batch_read_with_pushed_filters(spark: Any, tmp_path: Path) -> None:
    """``option("pushFilters", "true")``: the rows of the ``WHERE`` (which files and rows the
    filters skip is tested without Spark in test_bridge_filters.py); without Spark's pushdown
    setting the read fails naming it."""
    import datetime as dt

    from pyspark.sql import functions as F

    register(spark)
    _commit(tmp_path, 0, 50)
    _commit(tmp_path, 50, 100)
    # the Python source's option (the JVM provider's reads get Spark's own pushdown)
    read = spark.read.format("siftmq_python").option("kind", "deliveries").option("pushFilters", "true")
    late = F.col("time") >= F.lit(dt.datetime.fromtimestamp(1.8e9 + 90, dt.UTC))
    where = late & (F.col("qos") == 0) & F.col("topic").startswith("a/")
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        assert sorted(r["message_id"] for r in read.load(str(tmp_path)).where(where).collect()) == [
            90,
            93,
            96,
            99,
        ]
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    with pytest.raises(Exception, match="filterPushdown"):
        read.load(str(tmp_path)).where(late).collect()


@pytest.mark.parametrize("source", ["siftmq", "siftmq_python"])
def test_stream_resumes_exactly_once_from_its_checkpoint(spark: Any, tmp_path: Path, source: str) -> None:
    """Over the JVM provider (``siftmq`` in a session with its jar: Spark's file stream source
    and its file log) and the Python source (its offsets of writer tags and sequence numbers)."""
    register(spark)
    land, ck = tmp_path / "landing", tmp_path / "ck"
    seen: list[tuple[int, list[int]]] = []

    def sink(df: Any, batch_id: int) -> None:
        seen.append((batch_id, sorted(r[0] for r in df.select("message_id").collect())))

    def run() -> None:
        q = (
            spark.readStream.format(source)
            .option("kind", "deliveries")
            .load(str(land))
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        assert q.exception() is None

    _commit(land, 0, 10)
    run()
    _commit(land, 10, 15)
    run()
    assert seen == [(0, list(range(10))), (1, list(range(10, 15)))]
    # the driver died after logging batch 1's offsets and before committing it
    os.remove(ck / "commits" / "1")
    os.remove(ck / "commits" / ".1.crc")
    run()  # re-runs batch 1 between its logged offsets: the same files, not one more or less
    _commit(land, 15, 22)
    run()
    assert seen[2:] == [(1, list(range(10, 15))), (2, list(range(15, 22)))]


async def test_a_worker_dying_mid_batch_republishes_with_the_same_keys(spark: Any, tmp_path: Path) -> None:
    """Two partitions (one file each, 40 rows); the task of the partition holding message 40
    dies (its Python worker exits) once the other partition's 40 messages were received.  The
    query fails; started again from its checkpoint it re-runs batch 0 and publishes all 80
    rows: a subscriber sees the first 40 twice, with identical keys and contents."""
    register(spark)
    land, go, killed = tmp_path / "landing", tmp_path / "go", tmp_path / "killed"
    _commit(land, 0, 40)
    _commit(land, 40, 80)
    from pyspark.sql import functions as F

    def check(mid: int) -> int:
        if mid == 40 and not killed.exists():
            deadline = time.monotonic() + 60
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.01)  # polls the test's "other partition received" marker
            killed.touch()
            os._exit(1)
        return mid

    guard = F.udf(lambda mid: check(mid), "long")  # noqa: PLW0108 (no type hints: pyspark would read them)

    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        sub = _Collector(b.port, "out/#")
        await eventually(sub.subscribed.is_set)

        def start() -> Any:
            return (
                spark.readStream.format("siftmq")
                .option("kind", "deliveries")
                .option("maxPartitionBytes", "1")
                .load(str(land))
                .select(guard("message_id").alias("message_id"), "topic")
                .writeStream.format("siftmq")
                .option("url", f"mqtt://127.0.0.1:{b.port}")
                .option("topic", "out/{topic}")
                .option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(availableNow=True)
                .start()
            )

        first = await asyncio.to_thread(spark_call, spark, start)
        await eventually(lambda: sub.count() >= 40, timeout=60)
        go.touch()
        with pytest.raises(Exception, match=r"Python worker|exited|crashed|SparkException"):
            await asyncio.to_thread(first.awaitTermination)
        assert sub.count() == 40 and killed.exists()
        once = {p[KEY_PROPERTY]: (t, pay) for t, pay, p in sub.got}
        second = await asyncio.to_thread(spark_call, spark, start)
        await asyncio.to_thread(second.awaitTermination)
        assert second.exception() is None
        await eventually(lambda: sub.count() == 120, timeout=30)
        sub.close()
    by_key: dict[str, set[tuple[str, bytes]]] = {}
    for t, pay, p in sub.got:
        by_key.setdefault(p[KEY_PROPERTY], set()).add((t, pay))
    assert len(by_key) == 80 and all(len(v) == 1 for v in by_key.values())
    assert all(by_key[k] == {v} for k, v in once.items())  # the re-run's keys name the same rows
    assert {k.rsplit("/", 3)[1] for k in by_key} == {"0"}  # batch 0, both times
    assert sorted(json.loads(next(iter(v))[1])["message_id"] for v in by_key.values()) == list(range(80))


# ---- the JVM provider (skipped without its jar)


def test_jvm_and_python_readers_return_the_same_rows_for_every_kind(spark: Any, tmp_path: Path) -> None:
    jvm_session(spark)
    both = landings(tmp_path)
    for kind in Kind:
        jvm = spark.read.format("siftmq").option("kind", kind.value).load(both)
        py = spark.read.format("siftmq_python").option("kind", kind.value).load(both)
        assert jvm.schema == py.schema == spark_schema(kind), kind
        rows = sorted_rows(jvm)
        assert len(rows) == 11 and rows == sorted_rows(py), kind
    # the old file: its rows with node null (every row of it: 9 and 10)
    old = spark.read.format("siftmq").option("kind", "deliveries").load(both).where("message_id >= 9000027")
    assert sorted((r["message_id"], r["node"]) for r in old.collect()) == [(9000027, None), (10000030, None)]


def test_spark_prunes_columns_and_pushes_filters(spark: Any, tmp_path: Path) -> None:
    jvm_session(spark)
    both = landings(tmp_path)
    df = spark.read.format("siftmq").option("kind", "deliveries").load(both[0])
    plan = df.where("qos = 1").select("topic")._jdf.queryExecution().executedPlan().toString()
    assert "ReadSchema: struct<topic:string,qos:int>" in plan and "EqualTo(qos,1)" in plan, plan
    # a schema of some columns (or option columns) is the schema Spark reads with
    cols = spark.read.format("siftmq").option("kind", "deliveries").option("columns", "node,topic")
    assert cols.load(both).columns == ["node", "topic"]
    given = spark.read.format("siftmq").option("kind", "deliveries").schema("topic string").load(both)
    assert given.count() == 11
    # a kind directory that does not exist (a landing zone from before that kind): no rows
    assert spark.read.format("siftmq").option("kind", "messages").load(str(tmp_path / "new")).count() == 0


def test_bad_options_are_clear_errors(spark: Any, tmp_path: Path) -> None:
    jvm_session(spark)

    def read(kind: str | None = "deliveries") -> Any:
        r = spark.read.format("siftmq")
        return r if kind is None else r.option("kind", kind)

    cases = [
        (read("nope"), "kind='nope' is not a record kind"),
        (read(None), "option 'kind' is required"),
        (read().option("columns", "topic,nope"), "columns nope"),
        (read().schema("topic int"), "topic of deliveries is string"),
        (read().schema("topic string").option("columns", "node"), "is not option columns='node'"),
    ]
    for reader, message in cases:
        with pytest.raises(Exception, match=message):
            reader.load(str(tmp_path)).collect()


async def test_batch_write_publishes_through_the_python_sink(spark: Any) -> None:
    """``df.write.format("siftmq")`` in a session with the jar: the JVM provider hands the rows
    to the Python sink (one write id, batch 0, a key per row); a save mode other than append
    or overwrite is refused naming it."""
    jvm_session(spark)
    df = spark.createDataFrame([(f"d{i % 2}", float(i)) for i in range(6)], "device string, z double")
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        sub = _Collector(b.port, "alerts/#")
        await eventually(sub.subscribed.is_set)

        def writer() -> Any:  # a new one each time: mode() changes the writer
            url = f"mqtt://127.0.0.1:{b.port}"
            return df.write.format("siftmq").option("url", url).option("topic", "alerts/{device}")

        await asyncio.to_thread(spark_call, spark, lambda: writer().mode("append").save())
        await eventually(lambda: sub.count() == 6)
        with pytest.raises(Exception, match="save mode ErrorIfExists"):
            await asyncio.to_thread(spark_call, spark, lambda: writer().save())
        sub.close()
    keys = {p[KEY_PROPERTY] for _, _, p in sub.got}
    assert len(keys) == 6 and len({k.split("/")[0] for k in keys}) == 1
    assert {k.split("/")[1] for k in keys} == {"0"}
    assert sorted(json.loads(pay)["z"] for _, pay, _ in sub.got) == [float(i) for i in range(6)]
    assert {t for t, _, _ in sub.got} == {"alerts/d0", "alerts/d1"}
