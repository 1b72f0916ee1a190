"""The JVM provider of ``format("siftmq")``: its jar, how it is built, how a session gets it.

The provider (Java, ``bridge/jvm/src/``, class ``org.siftmq.spark.SiftmqProvider``) hands every
read of the landing zone to Spark's own Parquet file source (column pruning, the vectorised
reader, filter pushdown, a stream's file log in its checkpoint) and every write to the Python
sink (``bridge/_sink.py``).  The Python data source (``bridge/_datasource.py``) does the same
reads in Python workers; docs/bridge.md ("Reading from Spark") says which to use.

**Built** by ``make build`` and by the wheel's ``build_py`` (``setup.py``): ``javac --release 17``
against pyspark's own jars, plus ``schemas.properties``, the kinds' schemas as Spark DDL written
from ``bridge/_schema.py`` (:func:`bridge._schema.spark_ddl`, the one source of truth), into
``bridge/jvm/siftmq-spark.jar`` (package data).  No javac, no pyspark or no pyarrow where the
package is built: no jar, a warning, and the Python source serves every read.  This module
imports only the standard library at its top: ``setup.py`` loads it by path, before the package
can be imported.

**On the classpath**: :func:`with_spark_jar` adds the jar to a ``SparkSession.builder``
(``spark.jars``: the driver's class path and every executor's) before the JVM starts;
:func:`bridge.register` then registers the Python data source under ``siftmq_python`` only
(Spark refuses one name for a JVM provider and a Python data source), and under ``siftmq`` too
when the session has no jar.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

__all__ = [
    "JAR",
    "PROVIDER_CLASS",
    "PYTHON_SOURCE",
    "WORKER_PYTHON",
    "build_jar",
    "jar_is_current",
    "spark_jar",
    "with_spark_jar",
]

_HERE = Path(__file__).resolve().parent
#: where the jar is built and shipped (package data of ``bridge``)
JAR = _HERE / "jvm" / "siftmq-spark.jar"
_SOURCES = _HERE / "jvm" / "src" / "main"
PROVIDER_CLASS = "org.siftmq.spark.SiftmqProvider"
#: the Python data source's name when the JVM provider holds ``siftmq`` (SiftmqProvider.java)
PYTHON_SOURCE = "siftmq_python"


def spark_jar() -> str | None:
    """The path of the ``format("siftmq")`` JVM provider's jar, or None when it was not built
    (no javac where the package was built: the Python data source serves reads)."""
    return str(JAR) if JAR.is_file() else None


#: the session option naming the Python of Spark's workers (PySpark's PYSPARK_PYTHON)
WORKER_PYTHON = "spark.pyspark.python"


def with_spark_jar(builder: Any) -> Any:
    """``builder`` (a ``SparkSession.builder``) with the provider's jar added to ``spark.jars``
    (kept: jars the builder already lists; none added when there is no jar), and with
    :data:`WORKER_PYTHON` set to this interpreter (``sys.executable``) unless the builder or
    ``PYSPARK_PYTHON`` already names one: Spark's Python workers (the Python data source, the
    sink, UDFs) then import ``bridge`` from the same environment even when it was not activated
    (a bare ``.venv/bin/python``, where Spark would start the system's ``python3``;
    :func:`bridge.register` applies the option).  The JVM reads both once, at its start: a
    session already running keeps its class path."""
    options = builder._options if hasattr(builder, "_options") else {}
    if not os.environ.get("PYSPARK_PYTHON") and not options.get(WORKER_PYTHON):
        builder = builder.config(WORKER_PYTHON, sys.executable)
    jar = spark_jar()
    if jar is None:
        return builder
    current = options.get("spark.jars")
    jars = [j for j in (current or "").split(",") if j]
    if jar not in jars:
        jars.append(jar)
    return builder.config("spark.jars", ",".join(jars))


def _inputs(root: Path) -> list[Path]:
    src = root / "bridge" / "jvm" / "src" / "main"
    files = [p for p in src.rglob("*") if p.is_file()]
    return [*files, root / "bridge" / "_schema.py", root / "bridge" / "_jar.py"]


def jar_is_current(root: Path, jar: Path) -> bool:
    """``jar`` exists and is newer than every input of the build."""
    if not jar.is_file():
        return False
    built = jar.stat().st_mtime
    return all(p.stat().st_mtime <= built for p in _inputs(root))


def _schemas(root: Path) -> str:
    """``schemas.properties``: ``kind = DDL`` for every kind, from ``bridge/_schema.py`` loaded by
    path (it needs pyarrow, not the package)."""
    spec = importlib.util.spec_from_file_location("_siftmq_build_schema", root / "bridge" / "_schema.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses/enums look their module up while it loads
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    lines = ["# generated from bridge/_schema.py by bridge/_jar.py: do not edit"]
    lines += [f"{kind.value}={module.spark_ddl(kind)}" for kind in module.Kind]
    return "\n".join(lines) + "\n"


def _pyspark_jars() -> Path | None:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    jars = Path(spec.origin).parent / "jars"
    return jars if jars.is_dir() else None


def build_jar(root: Path, jar: Path) -> str | None:
    """Compile the provider into ``jar`` (written atomically); returns why not, or None when
    built.  ``root``: the source tree (``setup.py``'s directory)."""
    javac = shutil.which("javac") or (
        os.path.join(os.environ["JAVA_HOME"], "bin", "javac") if os.environ.get("JAVA_HOME") else None
    )
    if javac is None or not os.path.exists(javac):
        return "no javac (a JDK 17) on PATH or in JAVA_HOME"
    jars = _pyspark_jars()
    if jars is None:
        return "pyspark is not installed where the package is built"
    try:
        schemas = _schemas(root)
    except ImportError as exc:
        return f"cannot load bridge/_schema.py ({exc})"
    src = root / "bridge" / "jvm" / "src" / "main"
    sources = sorted(str(p) for p in (src / "java").rglob("*.java"))
    with tempfile.TemporaryDirectory(prefix="siftmq-jar-") as tmp:
        classes = Path(tmp) / "classes"
        cmd = [javac, "--release", "17", "-nowarn", "-encoding", "UTF-8", "-cp", f"{jars}/*"]
        cmd += ["-d", str(classes)]
        done = subprocess.run([*cmd, *sources], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return f"javac failed:\n{done.stdout}{done.stderr}"
        jar.parent.mkdir(parents=True, exist_ok=True)
        part = jar.with_name(f".{jar.name}.{os.getpid()}.tmp")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: siftmq setup.py\n\n")
            for base in (classes, src / "resources"):
                for p in sorted(base.rglob("*")):
                    if p.is_file():
                        z.write(p, p.relative_to(base).as_posix())
            z.writestr("org/siftmq/spark/schemas.properties", schemas)
        part.replace(jar)
    return None
