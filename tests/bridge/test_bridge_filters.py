"""Filters a ``siftmq`` read evaluates with pyarrow (``bridge/_filters.py``), without Spark: on a
real landing zone written by the bridge, row groups are skipped by their statistics and rows
dropped exactly as Spark's ``WHERE`` would; a filter that cannot be evaluated exactly is not
used (Spark evaluates every filter again in any case)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow.parquet as pq

from bridge import Bridge, Kind
from bridge._filters import Op, RowFilter, keep_row_groups, usable
from bridge._landing import kind_schema, list_files, read_files
from tests.bridge.records import delivery, feed

T0 = 1.8e9


def _landing(root: Path) -> list[str]:
    """Three files of 100 deliveries, one second apart each, topics t/0..t/9."""
    with Bridge(root, roll_interval=3600, roll_bytes=1 << 40) as b:
        for f in range(3):
            for i in range(f * 100, f * 100 + 100):
                feed(b, delivery(i, T0 + i, topic=f"t/{i % 10}"))
            b.flush()
    return [f.path for f in list_files(str(root), Kind.DELIVERIES)]


def _at(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(T0 + seconds, dt.UTC)


def _rows(paths: list[str], *filters: RowFilter) -> list[int]:
    schema = kind_schema(Kind.DELIVERIES)
    used = [u for f in filters if (u := usable(f, schema)) is not None]
    return sorted(
        i for b in read_files(paths, Kind.DELIVERIES, filters=used) for i in b["message_id"].to_pylist()
    )


def test_filters_skip_files_and_drop_rows_like_a_where(tmp_path: Path) -> None:
    paths = _landing(tmp_path)
    assert len(paths) == 3
    assert _rows(paths, RowFilter("time", Op.GE, _at(250))) == list(range(250, 300))
    assert _rows(paths, RowFilter("time", Op.GT, _at(250))) == list(range(251, 300))
    assert _rows(paths, RowFilter("time", Op.LT, _at(5)), RowFilter("qos", Op.EQ, 1)) == [1, 4]
    assert _rows(paths, RowFilter("topic", Op.EQ, "t/7")) == list(range(7, 300, 10))
    assert _rows(paths, RowFilter("topic", Op.IN, ("t/1", "t/2")), RowFilter("message_id", Op.LE, 12)) == [
        1,
        2,
        11,
        12,
    ]
    assert _rows(paths, RowFilter("topic", Op.PREFIX, "t/9")) == list(range(9, 300, 10))
    assert _rows(paths, RowFilter("publisher_id", Op.EQ, "p1"), RowFilter("message_id", Op.LT, 6)) == [
        1,
        3,
        5,
    ]  # nulls fail
    # statistics: a time range rules out whole files (one row group per committed file)
    schema = kind_schema(Kind.DELIVERIES)
    late = usable(RowFilter("time", Op.GE, _at(250)), schema)
    assert late is not None
    kept = [keep_row_groups(pq.ParquetFile(p).metadata, [late]) for p in paths]
    assert kept == [[], [], [0]]


def test_filters_that_cannot_be_evaluated_exactly_are_not_used() -> None:
    schema = kind_schema(Kind.DELIVERIES)
    naive = dt.datetime(2027, 1, 1)  # no time zone: which instant is meant is Spark's business
    assert usable(RowFilter("time", Op.GE, naive), schema) is None
    assert usable(RowFilter("qos", Op.EQ, "1"), schema) is None  # a string for an int column
    assert usable(RowFilter("qos", Op.EQ, True), schema) is None
    assert usable(RowFilter("nope", Op.EQ, 1), schema) is None
    assert usable(RowFilter("retained", Op.EQ, True), schema) is None  # booleans: not handled
    assert usable(RowFilter("topic", Op.IN, ()), schema) is None
    assert usable(RowFilter("latency", Op.GT, 1), schema) == RowFilter("latency", Op.GT, 1.0)
    us = usable(RowFilter("time", Op.EQ, _at(1)), schema)
    assert us == RowFilter("time", Op.EQ, int((T0 + 1) * 1_000_000))


def test_the_readers_pushfilters_keeps_what_it_can_use_and_returns_everything() -> None:
    from pyspark.sql.datasource import (
        DataSourceReader,
        EqualTo,
        GreaterThanOrEqual,
        IsNull,
        Not,
        StringStartsWith,
    )
    from pyspark.sql.types import StructType

    from bridge._datasource import SiftmqDataSource

    source = SiftmqDataSource({"kind": "deliveries", "path": "/x", "pushFilters": "true"})
    reader = source.reader(StructType(source.schema().fields))
    late = GreaterThanOrEqual(("time",), _at(5))
    given = [
        late,
        EqualTo(("topic",), "t/7"),
        StringStartsWith(("subscriber_id",), "s"),
        Not(EqualTo(("qos",), 1)),  # not used: only plain comparisons
        IsNull(("node",)),  # not used
        EqualTo(("qos",), "1"),  # not used: a string for an int column
    ]
    assert reader.pushFilters(given) == given  # type: ignore[attr-defined]
    assert reader.filters == (  # type: ignore[attr-defined]
        RowFilter("time", Op.GE, int((T0 + 5) * 1_000_000)),
        RowFilter("topic", Op.EQ, "t/7"),
        RowFilter("subscriber_id", Op.PREFIX, "s"),
    )
    plain = SiftmqDataSource({"kind": "deliveries", "path": "/x"}).reader(StructType(source.schema().fields))
    assert type(plain).pushFilters is DataSourceReader.pushFilters  # Spark sees none: no setting needed
