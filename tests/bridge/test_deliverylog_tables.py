"""The delivery log's string columns decode to what was recorded, however clients interleave.

Each batch remembers per publisher its last topic and per subscriber its last topic filter and
selector (broker/core/_deliverylog.py, "Fewer lookups"), so that a row costs fewer dict lookups
when clients interleave.  The indices the reader gets must still point at the right strings of
the batch's tables when a publisher changes topics, a subscriber is delivered through several
subscriptions in turn (with and without a selector), ids are equal strings that are not the same
object, publishers are None, and batches are taken in the middle.  Both forms run: the module as
imported (compiled after ``make build``) and its source loaded as plain Python.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import broker.core
import broker.core._deliverylog as compiled_or_not
from broker import Message
from broker.packets import NO_PROPERTIES


def _interpreted() -> ModuleType:
    source = Path(broker.core.__file__ or "").parent / "_deliverylog.py"
    spec = importlib.util.spec_from_file_location("_deliverylog_tables_interpreted", source)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(params=["as-imported", "interpreted"])
def log_module(request: pytest.FixtureRequest) -> ModuleType:
    return compiled_or_not if request.param == "as-imported" else _interpreted()


Row = tuple[Any, ...]


def _decode(cols: Any) -> tuple[list[Row], list[Row]]:
    """(call rows, delivery rows) with the strings looked up in the batch's tables."""

    def s(table: Any, i: int) -> str | None:
        return None if i < 0 else table.values[i]

    calls = [
        (int(cols.message_id[k]), s(cols.publishers, cols.publisher_id[k]), s(cols.topics, cols.topic[k]))
        for k in range(cols.calls())
    ]
    deliveries = [
        (
            calls[int(cols.call[k])][0],
            s(cols.subscribers, cols.subscriber[k]),
            s(cols.filters, cols.topic_filter[k]),
            s(cols.filters, cols.selector[k]),
        )
        for k in range(cols.deliveries())
    ]
    return calls, deliveries


def _fresh(text: str) -> str:
    """An equal string that is not the same object (as a topic decoded from each packet is)."""
    return "".join(list(text))


def test_interleaved_clients_decode_to_what_was_recorded(log_module: ModuleType) -> None:
    rnd = random.Random(42)
    log = log_module.DeliveryLog(10**9, 10**9)
    publishers: list[str | None] = [f"pub-{i}" for i in range(6)] + [None]
    topics = [f"t/{i}" for i in range(5)]
    subs = [f"sub-{i}" for i in range(6)]
    # each subscriber has several subscriptions: (topic filter, selector or None)
    subscriptions = {
        s: [(f"t/{j}", None if j % 2 else f"x > {j}") for j in rnd.sample(range(5), 3)] for s in subs
    }
    expect_calls: list[Row] = []
    expect_deliveries: list[Row] = []
    got_calls: list[Row] = []
    got_deliveries: list[Row] = []
    for n in range(4000):
        pub = rnd.choice(publishers)
        topic = _fresh(rnd.choice(topics))
        msg = Message(topic, b"{}", 1, False, NO_PROPERTIES, pub, n, 1.0)
        targets = rnd.sample(subs, rnd.randint(0, 3))
        chosen = [(s, *rnd.choice(subscriptions[s])) for s in targets]
        how = rnd.random()
        if how < 0.6:  # a fan-out written delivery by delivery
            outer = log.begin(msg)
            for s, f, sel in chosen:
                sid = s if rnd.random() < 0.5 else _fresh(s)  # equal ids, other objects
                log.delivered(sid, f, sel, 1, False)
            log.end(outer, 2.0, len(chosen))
        elif how < 0.8:  # recorded at once (on_deliveries outside a broker)
            log.record(2.0, msg, [(s, f, sel, 1, False) for s, f, sel in chosen], len(chosen))
        else:  # written after its publication: a call row per delivery
            for s, f, sel in chosen:
                log.delivered_later(2.0, msg, s, f, sel, 1, False)
        if how < 0.8:
            expect_calls.append((n, pub, topic))
        else:
            expect_calls.extend((n, pub, topic) for _ in chosen)
        expect_deliveries.extend((n, s, f, sel) for s, f, sel in chosen)
        if n % 700 == 699:  # a batch taken in the middle: the next one has tables of its own
            cols = log.take()
            cols._check()
            calls, deliveries = _decode(cols)
            got_calls += calls
            got_deliveries += deliveries
    cols = log.take()
    cols._check()
    calls, deliveries = _decode(cols)
    got_calls += calls
    got_deliveries += deliveries
    assert got_calls == expect_calls
    assert got_deliveries == expect_deliveries
    assert len(got_deliveries) > 3000


def test_a_batchs_tables_hold_each_string_once(log_module: ModuleType) -> None:
    log = log_module.DeliveryLog(10**9, 10**9)
    for n in range(300):
        msg = Message(_fresh(f"t/{n % 3}"), b"", 0, False, NO_PROPERTIES, f"p{n % 2}", n, 1.0)
        outer = log.begin(msg)
        log.delivered(f"s{n % 4}", f"t/{n % 3}", None if n % 5 else "a = 1", 0, False)
        log.end(outer, 2.0, 1)
    cols = log.take()
    assert sorted(cols.publishers.values) == ["p0", "p1"]
    assert sorted(cols.topics.values) == ["t/0", "t/1", "t/2"]
    assert sorted(cols.subscribers.values) == ["s0", "s1", "s2", "s3"]
    assert sorted(cols.filters.values) == ["a = 1", "t/0", "t/1", "t/2"]
