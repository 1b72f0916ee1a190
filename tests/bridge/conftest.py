"""One local Spark session for the whole bridge suite (session scope)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from bridge._analytics import spark_session

    session = spark_session("local[2]", app_name="siftmq-tests")
    # Tests run availableNow over finished data: skip the no-data batches that only evict state.
    session.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    # Tiny inputs: one shuffle partition (one state store per query) halves the tasks.
    session.conf.set("spark.sql.shuffle.partitions", "1")
    yield session
    session.stop()


def spark_call(spark: Any, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with ``spark`` as the JVM's active session of this thread: a Python data
    source is looked up in the active session, and a thread that ``asyncio.to_thread`` runs
    has none (Spark then reports DATA_SOURCE_NOT_FOUND)."""
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    return fn(*args)
