"""Landing-zone schemas: one Arrow schema per record kind, and the matching Spark schemas.

The three record kinds are the broker's hook records (:mod:`broker.hooks`): ``Delivery``,
``Publication`` and ``SubscriptionChange``.  Each kind lands in its own directory of the landing
zone (``deliveries/``, ``publications/``, ``subscription_changes/``) with the columns below.
Times are stored as ``timestamp[us, UTC]`` so Spark reads them as ``TimestampType`` and can use
them as event time; the broker latency is stored in seconds (``double``).

The Spark ``StructType`` schemas are derived from the Arrow schemas by :func:`spark_schema`
(pyspark is imported only there), so the two can never disagree.
"""

from __future__ import annotations

import enum
from typing import Any

import pyarrow as pa

__all__ = ["SCHEMAS", "Kind", "spark_schema"]


class Kind(enum.Enum):
    """A record kind; its value is the landing-zone directory name."""

    DELIVERIES = "deliveries"
    PUBLICATIONS = "publications"
    SUBSCRIPTION_CHANGES = "subscription_changes"


_TS = pa.timestamp("us", tz="UTC")

SCHEMAS: dict[Kind, pa.Schema] = {
    Kind.DELIVERIES: pa.schema(
        [
            pa.field("time", _TS, nullable=False),
            pa.field("message_id", pa.int64(), nullable=False),
            pa.field("publisher_id", pa.string()),
            pa.field("subscriber_id", pa.string(), nullable=False),
            pa.field("topic", pa.string(), nullable=False),
            pa.field("subscription_filter", pa.string(), nullable=False),
            pa.field("content_filter", pa.string()),
            pa.field("qos", pa.int32(), nullable=False),
            pa.field("retained", pa.bool_(), nullable=False),
            pa.field("payload_size", pa.int64(), nullable=False),
            pa.field("latency", pa.float64(), nullable=False),
            pa.field("node", pa.string()),  # the cluster node that delivered (None: one broker)
        ]
    ),
    Kind.PUBLICATIONS: pa.schema(
        [
            pa.field("time", _TS, nullable=False),
            pa.field("message_id", pa.int64(), nullable=False),
            pa.field("publisher_id", pa.string()),
            pa.field("topic", pa.string(), nullable=False),
            pa.field("payload_size", pa.int64(), nullable=False),
            pa.field("qos", pa.int32(), nullable=False),
            pa.field("retained", pa.bool_(), nullable=False),
            pa.field("deliveries", pa.int64(), nullable=False),
            pa.field("node", pa.string()),  # the cluster node that routed it (None: one broker)
        ]
    ),
    Kind.SUBSCRIPTION_CHANGES: pa.schema(
        [
            pa.field("time", _TS, nullable=False),
            pa.field("client_id", pa.string(), nullable=False),
            pa.field("action", pa.string(), nullable=False),
            pa.field("topic_filter", pa.string()),
            pa.field("content_filter", pa.string()),
            pa.field("qos", pa.int32()),
            pa.field("entries", pa.int64(), nullable=False),
        ]
    ),
}


def spark_schema(kind: Kind) -> Any:
    """The ``pyspark.sql.types.StructType`` of ``kind`` (all fields nullable, as Spark's file
    source reads them)."""
    from pyspark.sql import types as T

    mapping: dict[pa.DataType, Any] = {
        _TS: T.TimestampType(),
        pa.int64(): T.LongType(),
        pa.int32(): T.IntegerType(),
        pa.string(): T.StringType(),
        pa.bool_(): T.BooleanType(),
        pa.float64(): T.DoubleType(),
    }
    return T.StructType([T.StructField(f.name, mapping[f.type], True) for f in SCHEMAS[kind]])
