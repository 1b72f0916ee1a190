"""The bridge's writer without Spark: atomic commits, rolling, back-pressure, graceful stop."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from bridge import SCHEMAS, Bridge, Kind
from broker.hooks import CompositeAction, SubscriptionAction
from tests.bridge.records import (
    NO_COMPOSITE,
    change,
    composite_change,
    composite_event,
    composite_loss,
    delivery,
    feed,
    publication,
)

T0 = 1_800_000_000.0


def _read(landing: Path, kind: Kind) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = ds.dataset(landing / kind.value, format="parquet").to_table().to_pylist()
    return rows


def _files(landing: Path, kind: Kind) -> list[str]:
    return sorted(os.listdir(landing / kind.value))


def test_close_commits_every_record_with_exact_values(tmp_path: Path) -> None:
    b = Bridge(tmp_path)
    b.start_writer()
    for i in range(1000):
        feed(b, delivery(i, T0 + i / 1000, cf="x > 1" if i % 4 == 0 else None))
        feed(b, publication(i, T0 + i / 1000, fanout=i % 3))
    b.on_subscription_change(change(T0, "c1", SubscriptionAction.SUBSCRIBE, "a/#", 1))
    b.on_subscription_change(change(T0 + 1, "c1", SubscriptionAction.SESSION_END, None, 0))
    b.close()
    rows = _read(tmp_path, Kind.DELIVERIES)
    assert sorted(r["message_id"] for r in rows) == list(range(1000))
    by_id = {r["message_id"]: r for r in rows}
    r4 = by_id[4]
    assert r4["content_filter"] == "x > 1" and by_id[5]["content_filter"] is None
    assert r4["qos"] == 1 and r4["payload_size"] == 14 and r4["publisher_id"] is None
    assert abs(r4["time"].timestamp() - (T0 + 0.004)) < 1e-5  # type: ignore[attr-defined]
    pubs = _read(tmp_path, Kind.PUBLICATIONS)
    assert sum(int(r["deliveries"]) for r in pubs) == sum(i % 3 for i in range(1000))  # type: ignore[call-overload]
    changes = sorted(_read(tmp_path, Kind.SUBSCRIPTION_CHANGES), key=lambda r: r["time"])  # type: ignore[arg-type, return-value]
    assert [(c["action"], c["topic_filter"], c["qos"]) for c in changes] == [
        ("subscribe", "a/#", 1),
        ("session_end", None, None),
    ]
    s = b.stats()
    assert s.written == {"deliveries": 1000, "publications": 1000, "subscription_changes": 2, **NO_COMPOSITE}
    assert sum(s.dropped.values()) == 0 and sum(s.pending.values()) == 0
    b._check()


def test_files_carry_the_declared_schema_and_no_temporaries_remain(tmp_path: Path) -> None:
    with Bridge(tmp_path) as b:
        feed(b, delivery(1, T0))
    names = _files(tmp_path, Kind.DELIVERIES)
    assert len(names) == 1 and names[0].startswith("part-") and names[0].endswith(".parquet")
    assert pq.read_schema(tmp_path / "deliveries" / names[0]).equals(SCHEMAS[Kind.DELIVERIES])
    assert _files(tmp_path, Kind.PUBLICATIONS) == []


def test_rolls_by_size_into_several_files(tmp_path: Path) -> None:
    b = Bridge(tmp_path, roll_bytes=96 * 100)  # about 100 rows per file
    assert b.roll_rows == 100
    for i in range(1050):
        feed(b, delivery(i, T0 + i))
    b.close()
    names = _files(tmp_path, Kind.DELIVERIES)
    counts = [pq.read_metadata(tmp_path / "deliveries" / n).num_rows for n in names]
    assert sum(counts) == 1050 and max(counts) == 100 and len(names) == 11


def test_rolls_by_time_while_running(tmp_path: Path) -> None:
    """Records become visible without a close: the writer commits every roll_interval."""
    b = Bridge(tmp_path, roll_interval=0.05)
    b.start_writer()
    try:
        for round_ in range(3):
            feed(b, delivery(round_, T0))
            assert b.wait_written(Kind.DELIVERIES, round_ + 1, timeout=30)
            assert len(_read(tmp_path, Kind.DELIVERIES)) == round_ + 1
        assert len(_files(tmp_path, Kind.DELIVERIES)) == 3
    finally:
        b.close()


def test_back_pressure_drops_with_counters_and_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A writer that falls behind (here: not running) never blocks the broker: the rows
    buffered are bounded (deliveries and publications together, changes apart), the overflow
    is dropped, counted per kind, and reported."""
    b = Bridge(tmp_path, max_pending=100)
    for i in range(80):
        feed(b, delivery(i, T0))
    for i in range(30):
        feed(b, publication(i, T0))  # 20 fit
    for i in range(80, 100):
        feed(b, delivery(i, T0))  # all dropped
    for i in range(120):
        b.on_subscription_change(change(T0, f"c{i}", SubscriptionAction.SUBSCRIBE, "t", 1))
    for i in range(105):  # each composite kind has its own bound too
        b.on_composite_event(composite_event(T0 + i))
    b.on_composite_loss(composite_loss(T0))
    b._check()
    s = b.stats()
    assert s.dropped == {"deliveries": 20, "publications": 10, "subscription_changes": 20, **NO_COMPOSITE} | {
        "composite_events": 5
    }
    assert s.pending == {
        "deliveries": 80,
        "publications": 20,
        "subscription_changes": 100,
        "composite_changes": 0,
        "composite_events": 100,
        "composite_losses": 1,
        "messages": 0,
    }
    with caplog.at_level(logging.WARNING, logger="siftmq.bridge"):
        b.close()
    assert "deliveries=20" in caplog.text and "subscription_changes=20" in caplog.text
    assert "composite_events=5" in caplog.text
    assert len(_read(tmp_path, Kind.COMPOSITE_EVENTS)) == 100
    # The kept records are the oldest ones, all committed.
    assert sorted(r["message_id"] for r in _read(tmp_path, Kind.DELIVERIES)) == list(range(80))
    assert sorted(r["message_id"] for r in _read(tmp_path, Kind.PUBLICATIONS)) == list(range(20))
    # Once drained, the buffer accepts records again.
    feed(b, delivery(999, T0))
    b.flush()
    assert b.stats().written["deliveries"] == 81
    b._check()


def test_failed_write_is_retried_not_lost(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    b = Bridge(tmp_path)
    for i in range(10):
        feed(b, delivery(i, T0))
    target = tmp_path / "deliveries"
    target.rename(tmp_path / "moved")
    target.write_bytes(b"not a directory")  # every write into it fails
    with caplog.at_level(logging.ERROR, logger="siftmq.bridge"):
        b.flush()
    assert "10 records kept for retry" in caplog.text
    assert b.stats().write_errors == 1 and b.stats().pending["deliveries"] == 10
    target.unlink()
    (tmp_path / "moved").rename(target)
    feed(b, delivery(10, T0))
    b.close()
    assert sorted(r["message_id"] for r in _read(tmp_path, Kind.DELIVERIES)) == list(range(11))


def test_stale_temporaries_are_removed_on_start(tmp_path: Path) -> None:
    Bridge(tmp_path)  # creates the directories
    stale = tmp_path / "deliveries" / ".part-0.parquet.tmp"
    stale.write_bytes(b"partial")
    with Bridge(tmp_path) as b:
        feed(b, delivery(1, T0))
    assert not stale.exists()
    assert len(_read(tmp_path, Kind.DELIVERIES)) == 1


def test_concurrent_appends_during_writes_lose_nothing(tmp_path: Path) -> None:
    """The event loop appends while the writer takes prefixes: every record lands once."""
    b = Bridge(tmp_path, roll_interval=0.001, roll_bytes=96 * 500)
    b.start_writer()
    n = 60_000
    for i in range(n):
        feed(b, delivery(i, T0))
    b.close()
    ids = [r["message_id"] for r in _read(tmp_path, Kind.DELIVERIES)]
    assert len(ids) == n and set(ids) == set(range(n))


async def test_async_start_stop_as_a_broker_hook(tmp_path: Path) -> None:
    b = Bridge(tmp_path)
    await b.start()
    feed(b, publication(7, T0, fanout=3))
    await b.stop()
    assert [r["deliveries"] for r in _read(tmp_path, Kind.PUBLICATIONS)] == [3]


def test_invalid_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Bridge(tmp_path, roll_interval=0)
    with pytest.raises(ValueError):
        Bridge(tmp_path, max_pending=0)


def test_composite_records_land_with_exact_values(tmp_path: Path) -> None:
    """The three composite kinds (issue 16): one row per record, the declared schemas."""
    with Bridge(tmp_path) as b:
        b.on_composite_change(composite_change(T0, "c1", "n", CompositeAction.SUBSCRIBE, "(a | b) & c"))
        b.on_composite_change(
            composite_change(
                T0 + 1, "c1", "n", CompositeAction.EXPIRED, "(a | b) & c", window=None, subscriptions=0
            )
        )
        b.on_composite_event(composite_event(T0 + 2, "(a | b) & c", completion=0.25, buffered=3))
        b.on_composite_loss(composite_loss(T0 + 3, "(a | b) & c", "b", expired=2, dropped=1))
    assert b.stats().written == {
        "deliveries": 0,
        "publications": 0,
        "subscription_changes": 0,
        "composite_changes": 2,
        "composite_events": 1,
        "composite_losses": 1,
        "messages": 0,
    }
    for kind in (Kind.COMPOSITE_CHANGES, Kind.COMPOSITE_EVENTS, Kind.COMPOSITE_LOSSES):
        (name,) = _files(tmp_path, kind)
        assert pq.read_schema(tmp_path / kind.value / name).equals(SCHEMAS[kind])
    changes = sorted(_read(tmp_path, Kind.COMPOSITE_CHANGES), key=lambda r: r["time"])  # type: ignore[arg-type, return-value]
    assert [(r["client_id"], r["name"], r["action"], r["window"], r["subscriptions"]) for r in changes] == [
        ("c1", "n", "subscribe", 60.0, 1),
        ("c1", "n", "expired", None, 0),
    ]
    (ev,) = _read(tmp_path, Kind.COMPOSITE_EVENTS)
    assert (ev["expression"], ev["client_ids"], ev["names"], ev["components"], ev["buffered"]) == (
        "(a | b) & c",
        ["c1", "c2"],
        ["n", "m"],
        2,
        3,
    )
    assert ev["completion"] == 0.25
    assert ev["end"].timestamp() - ev["begin"].timestamp() == 0.25  # type: ignore[attr-defined]
    (loss,) = _read(tmp_path, Kind.COMPOSITE_LOSSES)
    assert (loss["element"], loss["expired"], loss["dropped"], loss["node"]) == ("b", 2, 1, None)
