"""The delivery log without a lock: a reader thread taking columns while the event loop records.

``DeliveryLog.record`` (and ``begin``/``delivered``) mark themselves busy while they append and
``take`` swaps the columns object and waits while one is busy or a fan-out is open
(broker/core/_deliverylog.py).  Compiled, a record never lets
the GIL go; interpreted it can, between any two appends.  Both forms run here: the module as
imported (compiled after ``make build``) and its source loaded as plain Python, with a tiny
switch interval so the reader preempts records in the middle.  Every row recorded must reach
the reader exactly once, and every batch it takes must be whole (aligned columns, counts that
point at call rows of their own batch).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

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
    seen: list[tuple[list[int], int, list[int], int]] = []
    done = threading.Event()

    def snapshot(cols: object) -> None:
        c: Any = cols
        seen.append((list(c.message_id), len(c.time), list(c.call), len(c.subscriber)))

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
            if i % 2:  # a fan-out: begin, one delivered() per write, end
                outer = log.begin(msg)
                for e in fan:
                    log.delivered(*e)
                log.end(outer, 2.0, len(fan))
            elif i % 4 == 0 and len(fan) == 1:  # one delivery written after its publication
                log.delivered_later(2.0, msg, *fan[0])
            else:  # everything at once
                log.record(2.0, msg, fan, len(fan) if i % 4 else -1)
    finally:
        done.set()
        t.join()
    ids: list[int] = []
    deliveries = 0
    for batch_ids, calls, call_of, rows in seen:
        assert len(batch_ids) == calls  # whole call rows
        assert len(call_of) == rows  # and the delivery rows of each, in their own batch
        assert all(0 <= c < calls for c in call_of)
        per_call = Counter(call_of)
        assert all(per_call[c] == batch_ids[c] % 3 for c in range(calls))  # each call's own rows
        ids.extend(batch_ids)
        deliveries += rows
    assert ids == list(range(RECORDS))  # each call row once, in order
    assert deliveries == sum(i % 3 for i in range(RECORDS))
    assert log.pending == log.rows_in == RECORDS + deliveries - sum(1 for i in range(RECORDS) if i % 4 == 0)


def test_nested_fan_outs_keep_their_own_rows(log_module: ModuleType) -> None:
    """A sink may publish inside a fan-out: each delivery row points at its own publication."""
    log = log_module.DeliveryLog(100, 100)
    outer_msg = Message("a/outer", b"x", 1, False, NO_PROPERTIES, "p", 1, 1.0)
    inner_msg = Message("a/inner", b"y", 1, False, NO_PROPERTIES, "q", 2, 1.0)
    outer = log.begin(outer_msg)
    log.delivered("s1", "a/#", None, 1, False)
    inner = log.begin(inner_msg)
    log.delivered("s2", "a/inner", "x > 1", 0, True)
    log.end(inner, 3.0, 1)
    log.delivered("s3", "a/+", None, 1, False)
    log.end(outer, 4.0, 2)
    log.delivered_later(5.0, inner_msg, "s4", "a/#", None, 1, False)  # e.g. it was queued
    c: Any = log.take()
    c._check()
    assert list(c.message_id) == [1, 2, 2] and list(c.time) == [4.0, 3.0, 5.0]
    assert list(c.routes) == [2, 1, -1] and c.publications() == 2
    assert [c.subscribers.values[i] for i in c.subscriber] == ["s1", "s2", "s3", "s4"]
    assert [c.publishers.values[i] for i in c.publisher_id] == ["p", "q", "q"]
    assert list(c.call) == [0, 1, 0, 2]
    assert [c.filters.values[i] if i >= 0 else None for i in c.selector] == [None, "x > 1", None, None]
    assert list(c.d_flags) == [1, 4, 1, 1]  # QoS | retained << 2
    assert log.pending == 6


def test_a_full_log_refuses_whole_fan_outs_and_counts_them(log_module: ModuleType) -> None:
    log = log_module.DeliveryLog(3, 100)
    msg = Message("a/b", b"x", 1, False, NO_PROPERTIES, "p", 1, 1.0)
    for _ in range(2):
        outer = log.begin(msg)
        log.delivered("s1", "a/#", None, 1, False)
        log.delivered("s2", "a/#", None, 1, False)
        log.end(outer, 2.0, 2)
    assert log.pending == 3  # the first fan-out, whole (a fan-out may overshoot by its own rows)
    assert (log.dropped_publications, log.dropped_deliveries) == (1, 2)
