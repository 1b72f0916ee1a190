"""Spark's Python workers from a bare ``.venv/bin/python`` (issue 38 item 8): no virtual
environment activated, no ``PYSPARK_PYTHON``, ``.venv/bin`` not on PATH.  Spark would start
the ``python3`` of PATH for its workers, which cannot import ``bridge``, and every read of
the Python data source failed in a worker with a truncated traceback.  Now
``bridge.with_spark_jar`` sets ``spark.pyspark.python`` to the running interpreter and
``bridge.register`` applies it, so README.md's Spark snippet, run as pasted in such a process
over a small landing zone, shows its rows; and a session whose workers would run an
interpreter that cannot import ``bridge`` (``PYSPARK_PYTHON`` naming one) is refused by
``bridge.register`` with one error naming ``PYSPARK_PYTHON``.  One JVM for both."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bridge import Bridge
from tests.bridge.records import delivery, feed

pytestmark = pytest.mark.spark

README = Path(__file__).resolve().parents[2] / "README.md"
#: an interpreter that cannot import bridge (the one python3 on PATH runs, without pyarrow)
OTHER = shutil.which(
    "python3", path=os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if ".venv" not in p)
)

REFUSED = """
spark.stop()
import os
os.environ["PYSPARK_PYTHON"] = {other!r}
spark = SparkSession.builder.master("local[1]").getOrCreate()
try:
    bridge.register(spark)
except bridge.WorkerPythonError as exc:
    print("REFUSED:", exc)
"""


def _bare_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"}
    }
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if ".venv" not in p)
    return env


def test_readme_spark_snippet_from_a_bare_venv_python(tmp_path: Path) -> None:
    if OTHER is None:
        pytest.skip("no python3 outside the venv on PATH")
    if subprocess.run([OTHER, "-c", "import pyarrow"], capture_output=True, check=False).returncode == 0:
        pytest.skip(f"{OTHER} imports pyarrow: it is no interpreter that cannot run the workers")
    snippet = next(
        b
        for b in re.findall(r"^```python\n(.*?)^```$", README.read_text(), re.S | re.M)
        if "bridge.register" in b
    )
    with Bridge(tmp_path / "siftmq-data" / "landing") as b:  # where the snippet reads (./siftmq-data)
        for i in range(3):
            feed(b, delivery(i, 1.8e9 + i, topic=f"sensors/{i}"))
    done = subprocess.run(
        [sys.executable, "-c", snippet + REFUSED.format(other=OTHER)],
        cwd=tmp_path,
        env=_bare_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if re.search(r"\| *sensors/\d", line)]
    assert len(rows) == 3, done.stdout
    refused = [line for line in done.stdout.splitlines() if line.startswith("REFUSED: ")]
    assert len(refused) == 1 and "PYSPARK_PYTHON" in refused[0] and "cannot import bridge" in refused[0], (
        done.stdout
    )
