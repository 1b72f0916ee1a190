"""Deliveries and subscription changes streamed to a landing zone that Spark reads.

``Bridge`` (a :class:`broker.hooks.Hooks`) buffers the broker's hook records and commits them as
Parquet files per record kind (``bridge/_writer.py``); ``bridge/_schema.py`` declares the
schemas; ``bridge/_analytics.py`` runs the Spark Structured Streaming jobs over the landing zone
and ``bridge/_report.py`` renders their results as HTML.  ``siftmq analytics`` is wired in by
``bridge/_cli.py``.  Imports from ``broker`` only its public hook records (:mod:`broker.hooks`).
:func:`register` adds the PySpark data source ``siftmq`` (``bridge/_datasource.py``: reads the
landing zone, batch and streaming; writes rows to MQTT, ``bridge/_sink.py``), issue 29.
See docs/bridge.md.

Everything here needs the ``spark`` extra (pyarrow, ...), which a broker-only install lacks, and
the ``siftmq`` plugin (:mod:`bridge._plugin`) is imported through this package: so the public
names are loaded on first use (PEP 562), and using one without the extra raises
:class:`broker._extras.MissingExtra` naming ``pip install 'siftmq[spark]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker._extras import Extra, lazy_names, require

if TYPE_CHECKING:
    from bridge._schema import SCHEMAS, Kind, spark_schema
    from bridge._writer import Bridge, BridgeStats

__all__ = ["SCHEMAS", "Bridge", "BridgeStats", "Kind", "register", "spark_schema"]

#: the module each public name lives in
_HOME = {
    "SCHEMAS": "bridge._schema",
    "Kind": "bridge._schema",
    "spark_schema": "bridge._schema",
    "Bridge": "bridge._writer",
    "BridgeStats": "bridge._writer",
}


__getattr__ = lazy_names("bridge", _HOME, Extra.SPARK)


def register(spark: Any) -> None:
    """Register the data source ``siftmq`` in ``spark`` (a ``SparkSession``): then
    ``spark.read.format("siftmq").option("kind", "deliveries").load(LANDING)`` and
    ``df.writeStream.format("siftmq").option("url", ...).option("topic", ...)`` work."""
    require(Extra.SPARK, "bridge.register")
    from bridge._datasource import SiftmqDataSource

    spark.dataSource.register(SiftmqDataSource)
