"""Deliveries and subscription changes streamed to a landing zone that Spark reads.

``Bridge`` (a :class:`broker.hooks.Hooks`) buffers the broker's hook records and commits them as
Parquet files per record kind (``bridge/_writer.py``); ``bridge/_schema.py`` declares the
schemas; ``bridge/_analytics.py`` runs the Spark Structured Streaming jobs over the landing zone
and ``bridge/_report.py`` renders their results as HTML.  ``siftmq analytics`` is wired in by
``bridge/_cli.py``.  Imports from ``broker`` only its public hook records (:mod:`broker.hooks`).
:func:`register` adds the PySpark data source ``siftmq`` (``bridge/_datasource.py``: reads the
landing zone, batch and streaming; writes rows to MQTT, ``bridge/_sink.py``), issue 29.
See docs/bridge.md.
"""

from __future__ import annotations

from typing import Any

from bridge._schema import SCHEMAS, Kind, spark_schema
from bridge._writer import Bridge, BridgeStats

__all__ = ["SCHEMAS", "Bridge", "BridgeStats", "Kind", "register", "spark_schema"]


def register(spark: Any) -> None:
    """Register the data source ``siftmq`` in ``spark`` (a ``SparkSession``): then
    ``spark.read.format("siftmq").option("kind", "deliveries").load(LANDING)`` and
    ``df.writeStream.format("siftmq").option("url", ...).option("topic", ...)`` work."""
    from bridge._datasource import SiftmqDataSource

    spark.dataSource.register(SiftmqDataSource)
