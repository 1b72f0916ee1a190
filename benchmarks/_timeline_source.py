"""The ``siftmq`` source with a timestamp log in every Python process it runs in (profiling).

Used by ``benchmarks/timeline_spark_source.py``: registered as ``siftmqtimeline``, it appends
``<epoch s> pid=<pid> <event>`` lines to the file named by ``SIFTMQ_TIMELINE`` (set before the
Spark session starts, so its Python processes inherit it): the module's import (with the time
the source module took), the DataSource's schema, the reader's creation and ``partitions``, the
streaming source's offsets, and each task's read (start, first batch, end and batch count).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

_T0 = time.time()

from bridge._datasource import (  # noqa: E402 (the import is what is timed)
    SiftmqDataSource,
    _BatchReader,
    _StreamReader,
)


def log(event: str) -> None:
    """Append one line to the timeline file (a no-op without ``SIFTMQ_TIMELINE``)."""
    path = os.environ.get("SIFTMQ_TIMELINE")
    if path:
        with open(path, "a") as f:
            f.write(f"{time.time():.3f} pid={os.getpid()} {event}\n")


log(f"imported (bridge._datasource: {time.time() - _T0:.3f} s)")


def _timed(batches: Iterator[Any]) -> Iterator[Any]:
    log("read start")
    n = 0
    for b in batches:
        if not n:
            log("first batch")
        n += 1
        yield b
    log(f"read end, {n} batches")


class _Batch(_BatchReader):
    def partitions(self) -> Any:
        log("partitions (batch)")
        return super().partitions()

    def read(self, partition: Any) -> Iterator[Any]:
        return _timed(super().read(partition))


class _Stream(_StreamReader):
    def initialOffset(self) -> dict[str, Any]:
        log("initialOffset")
        return super().initialOffset()

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        log("latestOffset")
        return super().latestOffset(start, limit)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Any:
        log("partitions (stream)")
        return super().partitions(start, end)

    def read(self, partition: Any) -> Iterator[Any]:
        return _timed(super().read(partition))


class TimelineSource(SiftmqDataSource):
    """``format("siftmqtimeline")``: the siftmq source, logging."""

    @classmethod
    def name(cls) -> str:
        return "siftmqtimeline"

    def schema(self) -> Any:
        log("schema")
        return super().schema()

    def reader(self, schema: Any) -> Any:
        log("reader")
        return _Batch(self._plan(schema))

    def streamReader(self, schema: Any) -> Any:
        log("streamReader")
        return _Stream(self._plan(schema))
