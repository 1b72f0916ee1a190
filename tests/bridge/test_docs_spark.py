"""docs/bridge.md's Spark examples (``<!-- example: spark -->``) run as written, in the suite's
shared Spark session (``getOrCreate`` returns it): the newcomer's path README -> getting
started -> embedding -> Spark (issue 41 item 6). The landing zone they read is made first by
docs/bridge.md's own embedding example; ``node1/`` and ``node2/`` are copies of it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.test_docs_examples import ALL


def test_bridge_page_has_spark_examples() -> None:
    assert [e.id for e in ALL if e.mark == "spark"], "docs/bridge.md marks its Spark examples"


@pytest.mark.parametrize("example", [e for e in ALL if e.mark == "spark"], ids=lambda e: e.id)
def test_spark_example_runs(
    example: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    embedding = next(e for e in ALL if e.page == "bridge.md" and not e.mark and "Bridge(" in e.code)
    exec(compile(embedding.code, embedding.id, "exec"), {"__name__": "__main__"})
    for node in ("node1", "node2"):
        shutil.copytree("siftmq-data/landing", f"{node}/landing")
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(example.code, example.id, "exec"), namespace)
    assert namespace["spark"] is spark
    if "both" in namespace:  # the reading example: the kinds' declared schemas
        assert "topic" in namespace["df"].columns and "topic" in namespace["both"].columns
        assert namespace["stream"].isStreaming and namespace["several"].isStreaming
