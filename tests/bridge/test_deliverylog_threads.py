"""The delivery log without a lock: a reader thread taking columns while the event loop records.

``DeliveryLog.record`` marks itself busy while it appends and ``take`` swaps the columns object
and waits while a record is busy (broker/core/_deliverylog.py).  Compiled, a record never lets
the GIL go; interpreted it can, between any two appends.  Both forms run here: the module as
imported (compiled after ``make build``) and its source loaded as plain Python, with a tiny
switch interval so the reader preempts records in the middle.  Every row recorded must reach
the reader exactly once, and every batch it takes must be whole (aligned columns, counts that
add up to the delivery rows).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import broker.core
import broker.core._deliverylog as compiled_or_not
from broker import Message
from broker.packets import NO_PROPERTIES

RECORDS = 20_000


def _interpreted() -> ModuleType:
    source = Path(broker.core.__file__ or "").parent / "_deliverylog.py"
    spec = importlib.util.spec_from_file_location("_deliverylog_interpreted", source)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(params=["as-imported", "interpreted"])
def log_module(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the reader preempts the recorder as often as it can
    try:
        yield compiled_or_not if request.param == "as-imported" else _interpreted()
    finally:
        sys.setswitchinterval(old)


def test_reader_takes_every_row_once_and_whole(log_module: ModuleType) -> None:
    log = log_module.DeliveryLog(10 * RECORDS, 10 * RECORDS)
    # what the reader saw at the moment it took each batch (a row appended to a batch after it
    # was taken would be lost in the bridge, which converts the batch at once)
    seen: list[tuple[list[int], int, int, int]] = []
    done = threading.Event()

    def snapshot(cols: object) -> None:
        c = cols
        seen.append((list(c.message_id), len(c.time), sum(c.count), len(c.subscriber)))  # type: ignore[attr-defined]

    def reader() -> None:
        while not done.is_set():
            snapshot(log.take())
            log.peek_counts()
        snapshot(log.take())

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(RECORDS):
            msg = Message(f"a/{i % 5}", b"x", 1, False, NO_PROPERTIES, "p", i, 1.0)
            fan = [(f"s{j}", "a/+", None, 1, False) for j in range(i % 3)]
            log.record(2.0, msg, fan, len(fan) if i % 4 else -1)
    finally:
        done.set()
        t.join()
    ids: list[int] = []
    deliveries = 0
    for batch_ids, calls, counted, rows in seen:
        assert len(batch_ids) == calls  # whole call rows
        assert counted == rows  # and the delivery rows of each
        ids.extend(batch_ids)
        deliveries += rows
    assert ids == list(range(RECORDS))  # each call row once, in order
    assert deliveries == sum(i % 3 for i in range(RECORDS))
    assert log.pending == log.rows_in == RECORDS + deliveries - sum(1 for i in range(RECORDS) if i % 4 == 0)
