"""Deliveries and subscription changes streamed to a landing zone that Spark reads.

``Bridge`` (a :class:`broker.hooks.Hooks`) buffers the broker's hook records and commits them as
Parquet files per record kind (``bridge/_writer.py``); ``bridge/_schema.py`` declares the
schemas; ``bridge/_analytics.py`` runs the Spark Structured Streaming jobs over the landing zone
and ``bridge/_report.py`` renders their results as HTML.  ``siftmq analytics`` is wired in by
``bridge/_cli.py``.  Imports from ``broker`` only its public hook records (:mod:`broker.hooks`).
:func:`register` adds the PySpark data source ``siftmq`` (``bridge/_datasource.py``: reads the
landing zone, batch and streaming; writes rows to MQTT, ``bridge/_sink.py``), issue 29; in a
session made with :func:`with_spark_jar` the name ``siftmq`` is the JVM provider's
(``bridge/_jar.py``: reads by Spark's own Parquet source, writes by the Python sink), and
:func:`register` adds the Python source as ``siftmq_python`` only.  See docs/bridge.md.

Everything here needs the ``spark`` extra (pyarrow, ...), which a broker-only install lacks, and
the ``siftmq`` plugin (:mod:`bridge._plugin`) is imported through this package: so the public
names are loaded on first use (PEP 562), and using one without the extra raises
:class:`broker._extras.MissingExtra` naming ``pip install 'siftmq[spark]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bridge._jar import spark_jar, with_spark_jar
from broker._extras import Extra, lazy_names, require

if TYPE_CHECKING:
    from bridge._schema import SCHEMAS, Kind, spark_schema
    from bridge._writer import Bridge, BridgeStats

__all__ = [
    "SCHEMAS",
    "Bridge",
    "BridgeStats",
    "Kind",
    "jvm_provider",
    "register",
    "spark_jar",
    "spark_schema",
    "with_spark_jar",
]

#: the module each public name lives in
_HOME = {
    "SCHEMAS": "bridge._schema",
    "Kind": "bridge._schema",
    "spark_schema": "bridge._schema",
    "Bridge": "bridge._writer",
    "BridgeStats": "bridge._writer",
}


__getattr__ = lazy_names("bridge", _HOME, Extra.SPARK)


def jvm_provider(spark: Any) -> bool:
    """Whether ``spark`` (a ``SparkSession``) has the JVM provider of ``format("siftmq")`` on its
    class path (a session made with :func:`with_spark_jar`)."""
    from bridge._jar import PROVIDER_CLASS

    jvm = spark.sparkContext._jvm
    loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
    try:
        jvm.java.lang.Class.forName(PROVIDER_CLASS, False, loader)
    except Exception:  # py4j's Py4JJavaError: ClassNotFoundException
        return False
    return True


def register(spark: Any) -> None:
    """Make ``format("siftmq")`` work in ``spark`` (a ``SparkSession``):
    ``spark.read.format("siftmq").option("kind", "deliveries").load(LANDING)`` and
    ``df.writeStream.format("siftmq").option("url", ...).option("topic", ...)``.

    Registers the Python data source as ``siftmq_python``, and as ``siftmq`` too unless the
    session has the JVM provider (:func:`jvm_provider`), which then reads under that name and
    writes through ``siftmq_python``.  Idempotent."""
    require(Extra.SPARK, "bridge.register")
    from bridge._datasource import PythonSiftmqDataSource, SiftmqDataSource

    spark.dataSource.register(PythonSiftmqDataSource)
    if not jvm_provider(spark):
        spark.dataSource.register(SiftmqDataSource)
