"""Deliveries and subscription changes streamed to a landing zone that Spark reads.

``Bridge`` (a :class:`broker.hooks.Hooks`) buffers the broker's hook records and commits them as
Parquet files per record kind (``bridge/_writer.py``); ``bridge/_schema.py`` declares the
schemas; ``bridge/_analytics.py`` runs the Spark Structured Streaming jobs over the landing zone
and ``bridge/_report.py`` renders their results as HTML.  ``siftmq analytics`` is wired in by
``bridge/_cli.py``.  Imports from ``broker`` only public modules: :mod:`broker` (types),
the hook records (:mod:`broker.hooks`), the plugin registration (:mod:`broker.plugins`), the
packets (:mod:`broker.packets`) and :mod:`broker.ext` (the delivery log it drains, the options
of its plugin, the optional extras, private files), never a ``_``-module of the broker.
:func:`register` adds the PySpark data source ``siftmq`` (``bridge/_datasource.py``: reads the
landing zone, batch and streaming; writes rows to MQTT, ``bridge/_sink.py``), issue 29; in a
session made with :func:`with_spark_jar` the name ``siftmq`` is the JVM provider's
(``bridge/_jar.py``: reads by Spark's own Parquet source, writes by the Python sink), and
:func:`register` adds the Python source as ``siftmq_python`` only.  See docs/bridge.md.

Everything here needs the ``spark`` extra (pyarrow, ...), which a broker-only install lacks, and
the ``siftmq`` plugin (:mod:`bridge._plugin`) is imported through this package: so the public
names are loaded on first use (PEP 562), and using one without the extra raises
:class:`broker.ext.MissingExtra` naming ``pip install 'siftmq[spark]'``.

Seam (docs/architecture.md, "Seams"): this module is the package's public face, for users
(``Bridge``, ``register``, ``with_spark_jar``, the schemas); ``siftmq`` reaches the plugin
through its entry point. Nothing outside ``bridge`` imports its ``_``-modules, and the bridge
imports from ``broker`` only public modules (``tests/test_layers.py``). Stable: the names in
``__all__`` and the landing zone's schemas (docs/bridge.md).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from broker.ext import Extra, lazy_names, require

if TYPE_CHECKING:
    from bridge._jar import spark_jar, with_spark_jar
    from bridge._schema import SCHEMAS, Kind, spark_schema
    from bridge._writer import Bridge, BridgeStats

__all__ = [
    "SCHEMAS",
    "Bridge",
    "BridgeStats",
    "Kind",
    "WorkerPythonError",
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


#: the names that need no extra, imported at first use too: ``siftmq serve`` imports this
#: package for its plugin, and bridge._jar imports zipfile and tempfile (issue 42 item 1)
_JAR = {"spark_jar": "bridge._jar", "with_spark_jar": "bridge._jar"}
__getattr__ = lazy_names("bridge", _HOME, Extra.SPARK, plain=_JAR)


class WorkerPythonError(RuntimeError):
    """Spark's Python workers would run an interpreter that cannot import ``bridge``."""


def _check_worker_python(spark: Any) -> None:
    """Point the workers at the session's :data:`bridge._jar.WORKER_PYTHON` when
    ``PYSPARK_PYTHON`` does not name one (PySpark reads only the variable, at the context's
    start), then check that they can import ``bridge`` (local masters only: a cluster's
    workers may have paths this machine lacks)."""
    import shutil
    import subprocess

    from bridge._jar import WORKER_PYTHON

    sc = spark.sparkContext
    configured = sc.getConf().get(WORKER_PYTHON)
    if configured and not os.environ.get("PYSPARK_PYTHON") and sc.pythonExec != configured:
        sc.pythonExec = configured  # data sources and UDFs registered from now on use it
    python = str(sc.pythonExec)
    if not str(sc.master).startswith("local"):
        return
    found = shutil.which(python)
    if found is not None and os.path.abspath(found) == os.path.abspath(sys.executable):
        return
    ok = False
    if found is not None:  # what the workers unpickle: bridge's data source (pyarrow, pyspark)
        check = [found, "-c", "import bridge._datasource"]
        try:
            ok = subprocess.run(check, capture_output=True, timeout=120, check=False).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
    if not ok:
        raise WorkerPythonError(
            f"Spark's Python workers would run {python!r}"
            + (f" ({found})" if found and found != python else "")
            + f", which cannot import bridge: set PYSPARK_PYTHON={sys.executable} before the session "
            f"starts, or build it with bridge.with_spark_jar(SparkSession.builder) (sets {WORKER_PYTHON})"
        )


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
    writes through ``siftmq_python``.  Idempotent.

    Spark's Python workers must import ``bridge``: the session's ``spark.pyspark.python``
    (set by :func:`with_spark_jar`) is used for them unless ``PYSPARK_PYTHON`` is set, and on a
    local master an interpreter other than this one is tried once (``python -c "import
    bridge._datasource"``, about 1 s); one that cannot import it raises :class:`WorkerPythonError` naming
    ``PYSPARK_PYTHON``, instead of every read failing later in a worker with a truncated
    traceback."""
    require(Extra.SPARK, "bridge.register")
    _check_worker_python(spark)
    from bridge._datasource import PythonSiftmqDataSource, SiftmqDataSource

    spark.dataSource.register(PythonSiftmqDataSource)
    if not jvm_provider(spark):
        spark.dataSource.register(SiftmqDataSource)
