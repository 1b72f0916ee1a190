"""The PySpark data source ``siftmq``: read the landing zone, write rows to MQTT (issue 29).

``bridge.register(spark)`` registers :class:`SiftmqDataSource` under the name ``siftmq``
(``spark.dataSource.register``).  This module imports pyspark at its top, so only
:func:`bridge.register` imports it (the broker and the bridge's writer run without pyspark).

Reading (``spark.read`` / ``spark.readStream``): option ``kind`` (a :class:`~bridge.Kind`
value), ``load(LANDING)`` or ``load([LANDING1, LANDING2])`` (several landing zones, e.g. one
per cluster node, read as one), the kind's schema (:func:`bridge.spark_schema`).  Listing,
offsets and reading are in ``bridge/_landing.py`` (its docstring says why a restarted query
reads every file exactly once).  Options ``maxPartitionBytes`` and ``minPartitions`` tune the
packing of files into partitions; ``columns`` (comma-separated) reads only those columns: Spark
does not prune the columns of a Python data source, so a query that needs two of the twelve
columns of ``deliveries`` reads, converts and ships all twelve unless it says so (measured in
docs/lab/performance-bridge.md).  ``pushFilters=true`` (batch reads, with Spark's
``spark.sql.python.filterPushdown.enabled``) lets the query's simple predicates skip row groups
and drop rows in the workers (``bridge/_filters.py``); a separate reader class, because Spark
refuses a reader with ``pushFilters`` while that setting is off.

Cheap to import (each streaming query starts a cold Python process that unpickles the source):
pyarrow.parquet is imported where files are read, the sink's modules where rows are written.

Writing (``df.write`` / ``df.writeStream``): see ``bridge/_sink.py`` (options, at-least-once
with idempotency keys, errors).  The batch writer and the stream writer are Arrow writers: the
rows reach the publisher as Arrow record batches.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from bridge._filters import Op, RowFilter, usable
from bridge._landing import (
    LandingFile,
    Offset,
    files_between,
    kind_schema,
    latest_offset,
    pack,
    parse_kind,
    read_files,
)
from bridge._schema import Kind, spark_schema

if TYPE_CHECKING:
    import pyarrow as pa

    from bridge._sink import SinkOptions

__all__ = ["PythonSiftmqDataSource", "SiftmqDataSource"]


def _landings(options: dict[str, str]) -> list[str]:
    if "paths" in options:
        raw = json.loads(options["paths"])
        paths = [str(p) for p in raw] if isinstance(raw, list) else [str(raw)]
    elif "path" in options:
        paths = [options["path"]]
    else:
        raise ValueError("siftmq source: no landing zone: use load(LANDING) or load([LANDING, ...])")
    return [p if "://" in p else os.path.abspath(p) for p in paths]


def _columns(options: dict[str, str]) -> tuple[str, ...] | None:
    raw = options.get("columns")
    return None if raw is None else tuple(c.strip() for c in raw.split(",") if c.strip())


def _int_option(options: dict[str, str], name: str, default: int) -> int:
    value = options.get(name)
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"siftmq source: option {name}={value!r} is not an integer") from None
    if n < 1:
        raise ValueError(f"siftmq source: option {name}={value!r} must be positive")
    return n


def _schema_columns(
    kind: Kind, schema: StructType, columns: tuple[str, ...] | None
) -> tuple[str, ...] | None:
    """The columns to read for the schema Spark reads with: a schema given by the user
    (``spark.read.schema("topic string, payload_size long")``) that names some of the kind's
    columns reads only those, as option ``columns`` does; None: every column."""
    names = tuple(schema.fieldNames())
    if columns is not None:
        if names != columns:
            raise ValueError(
                f"siftmq source: the schema given ({', '.join(names)}) is not option "
                f"columns={','.join(columns)!r}: give one of the two, or the same columns"
            )
        return columns
    full = spark_schema(kind)
    if list(names) == full.fieldNames():
        return None
    kind_schema(kind, names)  # checks the names
    for f in schema.fields:
        want = full[f.name].dataType
        if f.dataType != want:
            raise ValueError(
                f"siftmq source: column {f.name} of {kind.value} is {want.simpleString()}, "
                f"not {f.dataType.simpleString()} (schema given)"
            )
    return names


class _Files(InputPartition):
    """A partition: the files one task reads."""

    def __init__(self, paths: list[str]) -> None:
        super().__init__(paths)
        self.paths = paths


@dataclass(frozen=True, slots=True)
class _ReadPlan:
    kind: Kind
    landings: tuple[str, ...]
    max_partition_bytes: int
    min_partitions: int
    columns: tuple[str, ...] | None

    def partitions(
        self, start: Offset | None, end: Offset, known: dict[str, LandingFile] | None = None
    ) -> list[_Files]:
        files = files_between(self.landings, self.kind, start, end, known)
        return [_Files(p) for p in pack(files, self.max_partition_bytes, self.min_partitions)]


class _BatchReader(DataSourceReader):
    def __init__(self, plan: _ReadPlan) -> None:
        self.plan = plan

    def partitions(self) -> Sequence[InputPartition]:
        plan = self.plan
        return plan.partitions(None, latest_offset(plan.landings, plan.kind))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, _Files):  # no files: Spark reads one partition of its own
            yield from read_files(partition.paths, self.plan.kind, self.plan.columns)


_OPS: dict[type[Filter], Op] = {
    EqualTo: Op.EQ,
    In: Op.IN,
    GreaterThan: Op.GT,
    GreaterThanOrEqual: Op.GE,
    LessThan: Op.LT,
    LessThanOrEqual: Op.LE,
    StringStartsWith: Op.PREFIX,
}


class _FilteringBatchReader(_BatchReader):
    """The batch reader with ``pushFilters`` (option ``pushFilters=true``): the filters it can
    evaluate (``bridge/_filters.py``) skip row groups and drop rows in the workers; every filter
    is handed back to Spark, which evaluates it again on the rows left.  A separate class:
    Spark refuses a reader that implements ``pushFilters`` unless
    ``spark.sql.python.filterPushdown.enabled`` is set, and pays one more Python round trip
    to plan it, so a read pays for it only when asked."""

    def __init__(self, plan: _ReadPlan) -> None:
        super().__init__(plan)
        self.filters: tuple[RowFilter, ...] = ()

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        schema = kind_schema(self.plan.kind, self.plan.columns)
        used = []
        for f in filters:
            op = _OPS.get(type(f))
            attribute: tuple[str, ...] = getattr(f, "attribute", ())
            if op is not None and len(attribute) == 1:
                rf = usable(RowFilter(attribute[0], op, getattr(f, "value", None)), schema)
                if rf is not None:
                    used.append(rf)
        self.filters = tuple(used)
        return list(filters)  # all of them: Spark evaluates every filter again

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, _Files):
            plan = self.plan
            yield from read_files(partition.paths, plan.kind, plan.columns, filters=self.filters)


class _StreamReader(DataSourceStreamReader):
    """Lives in the query's source process on the driver for the query's lifetime: ``known``
    caches the landing files seen (path -> file), so each trigger's listing stats only the
    new files (bridge/_landing.py, ``list_files``)."""

    def __init__(self, plan: _ReadPlan) -> None:
        self.plan = plan
        self.known: dict[str, LandingFile] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"plan": self.plan, "known": {}}  # the cache stays where it was built

    def initialOffset(self) -> dict[str, Any]:
        return {landing: {} for landing in self.plan.landings}

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        return latest_offset(self.plan.landings, self.plan.kind, self.known)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return self.plan.partitions(start, end, self.known)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, _Files):  # no files: Spark reads one partition of its own
            yield from read_files(partition.paths, self.plan.kind, self.plan.columns)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the landing zone's files stay (see docs/bridge.md)."""


@dataclass(frozen=True)
class _Published(WriterCommitMessage):
    """What one task published: its partition and number of rows."""

    partition: int
    rows: int


class _BatchWriter(DataSourceArrowWriter):
    """A batch write: its own random "query id" and batch 0; or, for a micro-batch that the JVM
    provider's stream sink writes as a batch (``SiftmqProvider.java``), the streaming query's id
    and the batch id it passes as options ``siftmq.queryId``/``siftmq.batchId``."""

    def __init__(self, options: SinkOptions, query_id: str | None = None, batch_id: int = 0) -> None:
        self.options = options
        self.write_id = query_id or uuid.uuid4().hex
        self.batch_id = batch_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from bridge._sink import publish_batches

        partition, rows = publish_batches(
            self.options, iterator, query_id=self.write_id, batch_id=self.batch_id
        )
        return _Published(partition, rows)


class _StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from bridge._sink import publish_batches

        partition, rows = publish_batches(self.options, iterator, query_id=None, batch_id=None)
        return _Published(partition, rows)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The rows are published (acknowledged by the broker for QoS 1/2) when a task ends."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Published messages cannot be recalled: a re-run batch re-publishes with the same keys."""


class SiftmqDataSource(DataSource):
    """``format("siftmq")``: the landing zone (read) and an MQTT broker (write)."""

    @classmethod
    def name(cls) -> str:
        return "siftmq"

    def _plan(self, schema: StructType) -> _ReadPlan:
        opts = {k.lower(): v for k, v in self.options.items()}
        kind = parse_kind(opts.get("kind"))
        return _ReadPlan(
            kind,
            tuple(_landings(opts)),
            _int_option(opts, "maxpartitionbytes", 32 << 20),
            _int_option(opts, "minpartitions", 2),
            _schema_columns(kind, schema, _columns(opts)),
        )

    def schema(self) -> StructType:
        opts = {k.lower(): v for k, v in self.options.items()}
        kind = parse_kind(opts.get("kind"))
        full = spark_schema(kind)
        columns = _columns(opts)
        if columns is None:
            return full  # type: ignore[no-any-return]
        kind_schema(kind, columns)  # checks the names
        return StructType([full[c] for c in columns])

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = {k.lower(): v for k, v in self.options.items()}
        push = opts.get("pushfilters", "false").lower()
        if push not in ("true", "false"):
            raise ValueError(f"siftmq source: option pushFilters={push!r} must be true or false")
        plan = self._plan(schema)
        return _FilteringBatchReader(plan) if push == "true" else _BatchReader(plan)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(self._plan(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        from bridge._sink import SinkOptions

        opts = {k.lower(): v for k, v in self.options.items()}
        raw = opts.get("siftmq.batchid", "0")
        try:
            batch_id = int(raw)
        except ValueError:
            raise ValueError(f"siftmq sink: option siftmq.batchId={raw!r} is not an integer") from None
        parsed = SinkOptions.parse(dict(self.options), schema.fieldNames())
        return _BatchWriter(parsed, opts.get("siftmq.queryid"), batch_id)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        from bridge._sink import SinkOptions

        return _StreamWriter(SinkOptions.parse(dict(self.options), schema.fieldNames()))


class PythonSiftmqDataSource(SiftmqDataSource):
    """The same source under the name ``siftmq_python``: in a session with the JVM provider
    (``bridge/_jar.py``), which holds the name ``siftmq`` and writes through this one."""

    @classmethod
    def name(cls) -> str:
        return "siftmq_python"
