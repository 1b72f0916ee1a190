"""The JVM provider of ``format("siftmq")`` (``bridge/jvm``, ``bridge/_jar.py``): its build and
its jar without Spark, and the landing zones of every kind that test_bridge_datasource.py reads
with it in the suite's Spark session (which has the jar: ``spark_session`` adds it), against
the Python source (``siftmq_python``)."""

from __future__ import annotations

import datetime as dt
import os
import zipfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bridge import SCHEMAS, Kind, jvm_provider, register, spark_jar
from bridge._jar import JAR, build_jar
from bridge._schema import spark_ddl


def jvm_session(spark: Any) -> None:
    if spark_jar() is None or not jvm_provider(spark):
        pytest.skip("no JVM provider jar (make build needs javac)")
    register(spark)


def _value(t: pa.DataType, name: str, i: int) -> Any:
    if pa.types.is_timestamp(t):
        return dt.datetime(2027, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i, microseconds=i)
    if pa.types.is_list(t):
        return [f"a{i}", f"b{i}"]
    return {
        pa.int64(): i * 1_000_003,
        pa.int32(): i % 3,
        pa.string(): f"{name}-{i}",
        pa.bool_(): i % 2 == 0,
        pa.float64(): i / 7,
        pa.binary(): bytes([i % 256]) * 3,
    }[t]


def _write(path: Path, kind: Kind, lo: int, hi: int, *, drop: str | None = None) -> None:
    """Rows lo..hi-1 of ``kind`` (every column; nullable ones null in every fourth row), without
    column ``drop`` (a file from before that column existed)."""
    schema = SCHEMAS[kind]
    rows = [
        {f.name: None if f.nullable and i % 4 == 3 else _value(f.type, f.name, i) for f in schema}
        for i in range(lo, hi)
    ]
    table = pa.Table.from_pylist(rows, schema=schema)
    if drop is not None:
        table = table.drop_columns([drop])
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def landings(root: Path) -> list[str]:
    """Two landing zones with every kind: a file named as a bridge names them, one copied in by
    hand, one from before the ``node`` column, and temporaries that no reader may see."""
    for kind in Kind:
        d1, d2 = root / "l1" / kind.value, root / "l2" / kind.value
        _write(d1 / "part-0000000000000001-aaaa0001-00000001.parquet", kind, 0, 6)
        _write(d1 / ".part-0000000000000002-aaaa0001-00000002.parquet", kind, 100, 103)  # being written
        _write(d2 / "by-hand.parquet", kind, 6, 9)
        _write(d2 / "part-0000000000000003-bbbb0002-00000001.parquet", kind, 9, 11, drop="node")
        _write(d2 / "_temporary.parquet", kind, 200, 202)
        (d2 / "notes.txt").write_text("not parquet")
    return [str(root / "l1"), str(root / "l2")]


def sorted_rows(df: Any) -> list[str]:
    return sorted(repr(tuple(r)) for r in df.collect())


def test_the_jar_holds_the_schemas_of_bridge_schema() -> None:
    """The jar's schemas are written from bridge/_schema.py at build time, not copied by hand."""
    if spark_jar() is None:
        pytest.skip("no JVM provider jar (make build needs javac)")
    with zipfile.ZipFile(JAR) as z:
        text = z.read("org/siftmq/spark/schemas.properties").decode()
        assert "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister" in z.namelist()
    lines = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert lines == {kind.value: spark_ddl(kind) for kind in Kind}


def test_without_javac_the_build_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    root = Path(__file__).resolve().parents[2]
    assert build_jar(root, tmp_path / "x.jar") == "no javac (a JDK 17) on PATH or in JAVA_HOME"
    assert not os.path.exists(tmp_path / "x.jar")
