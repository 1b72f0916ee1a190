"""Landing-zone schemas: one Arrow schema per record kind, and the matching Spark schemas.

The record kinds are the broker's hook records (:mod:`broker.hooks`): ``Delivery``,
``Publication`` and ``SubscriptionChange``, and for composite subscriptions (issue 16)
``CompositeChange``, ``CompositeEventRecord`` and ``CompositeLoss``.  Each kind lands in its own
directory of the landing zone (``deliveries/``, ``publications/``, ``subscription_changes/``,
``composite_changes/``, ``composite_events/``, ``composite_losses/``) with the columns below,
and, when the bridge is asked to (``Bridge(messages=[topic filters])``, issue 29), whole
messages with their payload in ``messages/``.  Every kind has a ``node`` column: the cluster
node that recorded the row (None for a broker alone).
A landing zone written before the composite kinds existed simply lacks their directories.
Times are stored as ``timestamp[us, UTC]`` so Spark reads them as ``TimestampType`` and can use
them as event time; the broker latency is stored in seconds (``double``).

The Spark ``StructType`` schemas are derived from the Arrow schemas by :func:`spark_schema`
(pyspark is imported only there), so the two can never disagree; :func:`spark_ddl` writes the
same schema as Spark DDL without pyspark, for the JVM provider's jar (``bridge/_jar.py``: the
build puts it in the jar's ``schemas.properties``).
"""

from __future__ import annotations

import enum
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["COMPOSITE_KINDS", "SCHEMAS", "Kind", "spark_ddl", "spark_schema"]


class Kind(enum.Enum):
    """A record kind; its value is the landing-zone directory name."""

    DELIVERIES = "deliveries"
    PUBLICATIONS = "publications"
    SUBSCRIPTION_CHANGES = "subscription_changes"
    COMPOSITE_CHANGES = "composite_changes"
    COMPOSITE_EVENTS = "composite_events"
    COMPOSITE_LOSSES = "composite_losses"
    MESSAGES = "messages"


#: the Arrow schemas (built with pyarrow at their first use: see :func:`_build`)
SCHEMAS: dict[Kind, pa.Schema]
_TS: pa.DataType
_STRINGS: pa.DataType
_DDL: dict[pa.DataType, str]
_LAZY = frozenset({"SCHEMAS", "_TS", "_STRINGS", "_DDL", "pa"})
_build_lock = threading.Lock()


def _build() -> None:
    """Import pyarrow and build the module's Arrow constants (:data:`SCHEMAS`, ...), once.

    Lazy (issue 42): ``siftmq serve`` imports this module for :class:`Kind` when it registers
    the bridge, and pyarrow (with numpy and, at its first array conversion, pandas: ~95 MB of
    the idle broker's RSS) is loaded only when the bridge first writes. ``SCHEMAS`` is read as
    an ordinary module attribute (``from bridge._schema import SCHEMAS`` builds it: module
    ``__getattr__``, PEP 562). O(1) after the first call."""
    global pa, _TS, _STRINGS, SCHEMAS, _DDL  # noqa: PLW0603 -- the lazy constants, built once
    with _build_lock:
        if "_DDL" in globals():
            return
        import pyarrow as pa

        _TS = pa.timestamp("us", tz="UTC")
        _STRINGS = pa.list_(pa.string())

        SCHEMAS = {
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
                    pa.field("node", pa.string()),  # the cluster node that recorded it (None: one broker)
                ]
            ),
            Kind.COMPOSITE_CHANGES: pa.schema(
                [
                    pa.field("time", _TS, nullable=False),
                    pa.field("client_id", pa.string(), nullable=False),
                    pa.field("name", pa.string(), nullable=False),  # $composite/<name>
                    pa.field(
                        "action", pa.string(), nullable=False
                    ),  # subscribe unsubscribe session_end expired
                    pa.field("expression", pa.string(), nullable=False),  # canonical
                    pa.field("window", pa.float64()),  # seconds (None: matched on another cluster node)
                    pa.field("max_buffer", pa.int64()),
                    pa.field("qos", pa.int32(), nullable=False),
                    pa.field("subscriptions", pa.int64(), nullable=False),  # the client's, after the change
                    pa.field("node", pa.string()),
                ]
            ),
            Kind.COMPOSITE_EVENTS: pa.schema(
                [
                    pa.field("time", _TS, nullable=False),
                    pa.field("expression", pa.string(), nullable=False),
                    pa.field("window", pa.float64(), nullable=False),
                    pa.field("max_buffer", pa.int64(), nullable=False),
                    pa.field("client_ids", _STRINGS, nullable=False),  # one per delivery of the event
                    pa.field("names", _STRINGS, nullable=False),  # the subscription names, same order
                    pa.field("begin", _TS, nullable=False),
                    pa.field("end", _TS, nullable=False),
                    pa.field("components", pa.int32(), nullable=False),
                    pa.field("completion", pa.float64(), nullable=False),  # end - begin, seconds
                    pa.field("buffered", pa.int64(), nullable=False),  # the subscription's, after the event
                    pa.field("node", pa.string()),
                ]
            ),
            Kind.COMPOSITE_LOSSES: pa.schema(
                [
                    pa.field("time", _TS, nullable=False),
                    pa.field("expression", pa.string(), nullable=False),
                    pa.field("window", pa.float64(), nullable=False),
                    pa.field("max_buffer", pa.int64(), nullable=False),
                    pa.field("element", pa.string(), nullable=False),  # the atom
                    pa.field("expired", pa.int64(), nullable=False),
                    pa.field("dropped", pa.int64(), nullable=False),
                    pa.field("node", pa.string()),
                ]
            ),
            # opt-in (``Bridge(messages=...)``): whole messages, payload included, of chosen topics
            Kind.MESSAGES: pa.schema(
                [
                    pa.field("time", _TS, nullable=False),
                    pa.field("message_id", pa.int64(), nullable=False),
                    pa.field("publisher_id", pa.string()),
                    pa.field("topic", pa.string(), nullable=False),
                    pa.field("payload", pa.binary(), nullable=False),
                    pa.field("qos", pa.int32(), nullable=False),
                    pa.field("retained", pa.bool_(), nullable=False),
                    pa.field("node", pa.string()),
                ]
            ),
        }

        #: Spark SQL type names of the Arrow types above (DDL)
        _DDL = {
            _TS: "TIMESTAMP",
            pa.int64(): "BIGINT",
            pa.int32(): "INT",
            pa.string(): "STRING",
            pa.bool_(): "BOOLEAN",
            pa.float64(): "DOUBLE",
            pa.binary(): "BINARY",
            _STRINGS: "ARRAY<STRING>",
        }


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        _build()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: the composite record kinds (absent from landing zones written before issue 16)
COMPOSITE_KINDS = (Kind.COMPOSITE_CHANGES, Kind.COMPOSITE_EVENTS, Kind.COMPOSITE_LOSSES)


def spark_schema(kind: Kind) -> Any:
    """The ``pyspark.sql.types.StructType`` of ``kind`` (all fields nullable, as Spark's file
    source reads them)."""
    from pyspark.sql import types as T

    _build()
    mapping: dict[pa.DataType, Any] = {
        _TS: T.TimestampType(),
        pa.int64(): T.LongType(),
        pa.int32(): T.IntegerType(),
        pa.string(): T.StringType(),
        pa.bool_(): T.BooleanType(),
        pa.float64(): T.DoubleType(),
        pa.binary(): T.BinaryType(),
        _STRINGS: T.ArrayType(T.StringType(), True),
    }
    return T.StructType([T.StructField(f.name, mapping[f.type], True) for f in SCHEMAS[kind]])


def spark_ddl(kind: Kind) -> str:
    """The Spark schema of ``kind`` as DDL (``time TIMESTAMP, ...``; names quoted: ``end`` and
    ``window`` are keywords), the same as :func:`spark_schema` without importing pyspark."""
    _build()
    return ", ".join(f"`{f.name}` {_DDL[f.type]}" for f in SCHEMAS[kind])
