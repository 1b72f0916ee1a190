"""Filters a ``siftmq`` read evaluates with pyarrow before Spark sees the rows (no Spark here).

With ``option("pushFilters", "true")`` (and Spark's ``spark.sql.python.filterPushdown.enabled``)
the batch reader receives the query's simple predicates (``DataSourceReader.pushFilters``,
translated in ``bridge/_datasource.py``) as :class:`RowFilter` values.  A read then

* skips a file's row groups whose statistics exclude a comparison on a column that has them
  (``time``, the integer columns: the bridge writes one row group per committed file, so a
  time range skips whole files after reading their footers), and
* drops the rows of the remaining batches that fail a filter (``pyarrow.compute``), so that
  the rows Spark converts from Arrow (its per-row cost, see docs/lab/performance-bridge.md) are
  only the matching ones.

The source still hands every filter back to Spark (Spark evaluates them again on what is left):
the filters here only ever drop rows Spark would drop, and a filter this module cannot
evaluate exactly (a timestamp without a time zone, a value of another type) is not used.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ["Op", "RowFilter", "keep_row_groups", "row_mask", "usable"]


class Op(enum.Enum):
    """A comparison of a column with a literal (Spark's ``EqualTo``, ``In``, ...)."""

    EQ = "="
    IN = "in"
    GT = ">"
    GE = ">="
    LT = "<"
    LE = "<="
    PREFIX = "starts with"


@dataclass(frozen=True, slots=True)
class RowFilter:
    """``column op value``; ``value`` is a tuple for :attr:`Op.IN`."""

    column: str
    op: Op
    value: Any


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _literal(t: pa.DataType, value: Any) -> Any:
    """``value`` as a Python value comparable with column type ``t``, or None (not usable)."""
    if pa.types.is_timestamp(t):
        if not isinstance(value, dt.datetime) or value.tzinfo is None or t.unit != "us":
            return None
        return (value - _EPOCH) // dt.timedelta(microseconds=1)  # the stored int64
    if pa.types.is_integer(t):
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if pa.types.is_floating(t):
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    if pa.types.is_string(t):
        return value if isinstance(value, str) else None
    return None


def usable(f: RowFilter, schema: pa.Schema) -> RowFilter | None:
    """``f`` with its literal in the column's stored form (timestamps as microseconds), or None
    when this module cannot evaluate it exactly on ``schema``."""
    i = schema.get_field_index(f.column)
    if i < 0:
        return None
    t = schema.field(i).type
    if f.op is Op.PREFIX:
        return f if pa.types.is_string(t) and isinstance(f.value, str) else None
    if f.op is Op.IN:
        values = [_literal(t, v) for v in f.value]
        return RowFilter(f.column, f.op, tuple(values)) if values and None not in values else None
    value = _literal(t, f.value)
    return None if value is None else RowFilter(f.column, f.op, value)


def keep_row_groups(metadata: Any, filters: Sequence[RowFilter]) -> list[int]:
    """The row groups of a Parquet file (``pyarrow.parquet.FileMetaData``) that statistics do
    not rule out (``filters`` from :func:`usable`)."""
    names = [metadata.schema.column(j).name for j in range(metadata.num_columns)]
    ranged = [f for f in filters if f.op not in (Op.PREFIX,) and f.column in names]
    keep = []
    for i in range(metadata.num_row_groups):
        rg = metadata.row_group(i)
        if all(_may_match(rg.column(names.index(f.column)).statistics, f) for f in ranged):
            keep.append(i)
    return keep


def _may_match(stats: Any, f: RowFilter) -> bool:
    if stats is None or not stats.has_min_max or stats.physical_type not in ("INT32", "INT64", "DOUBLE"):
        return True
    lo, hi = stats.min_raw, stats.max_raw
    if isinstance(f.value, str) or (f.op is Op.IN and any(isinstance(v, str) for v in f.value)):
        return True
    match f.op:
        case Op.EQ:
            return bool(lo <= f.value <= hi)
        case Op.IN:
            return any(lo <= v <= hi for v in f.value)
        case Op.GT:
            return bool(hi > f.value)
        case Op.GE:
            return bool(hi >= f.value)
        case Op.LT:
            return bool(lo < f.value)
        case Op.LE:
            return bool(lo <= f.value)
        case _:
            return True


def row_mask(batch: pa.RecordBatch, filters: Sequence[RowFilter]) -> pa.Array | None:
    """The rows of ``batch`` that pass every filter (null counts as failing, as in Spark's
    ``WHERE``), or None when no filter applies to its columns."""
    import pyarrow.compute as pc

    mask = None
    for f in filters:
        i = batch.schema.get_field_index(f.column)
        if i < 0:
            continue
        col = batch.column(i)
        if pa.types.is_timestamp(col.type):
            col = col.cast(pa.int64())
        match f.op:
            case Op.EQ:
                m = pc.equal(col, f.value)
            case Op.IN:
                m = pc.is_in(col, value_set=pa.array(f.value, col.type))
            case Op.GT:
                m = pc.greater(col, f.value)
            case Op.GE:
                m = pc.greater_equal(col, f.value)
            case Op.LT:
                m = pc.less(col, f.value)
            case Op.LE:
                m = pc.less_equal(col, f.value)
            case Op.PREFIX:
                m = pc.starts_with(col, pattern=f.value)
        m = pc.fill_null(m, False)
        mask = m if mask is None else pc.and_(mask, m)
    return mask
