"""Smoke test of benchmarks/bench_content_fleet.py (issue 42 item 2) at a tiny scale.

The benchmark's full run (10,000 subscribers against mosquitto, docs/performance-content.md,
"Fleet scale") is run by hand; here 60 subscribers with one and with three content filters
each receive a one-second stream from a real siftmq process, and every delivery the selectors
call for must arrive, once, and nothing else (the benchmark's own accounting, which the
published figures rely on).  The client-side predicates the benchmark builds from the same
selectors must answer like the broker's language (``content``'s brute-force engine).
"""

from __future__ import annotations

import sys
from pathlib import Path

import content

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_content_fleet as bench


def test_python_predicates_answer_like_the_selectors() -> None:
    engine = content.ENGINES["brute-force"]()
    conns = range(300)
    for c in conns:
        engine.add(c, bench.selector(c, 0)[0])
    preds = {c: bench.predicate(c, 1) for c in conns}
    hits = 0
    for seq in range(400):
        doc = bench.telemetry(seq)
        want = {c for c in conns if preds[c](doc)}
        assert engine.match(content.attributes(bench.payload(seq, 1))) == want, seq
        hits += len(want)
    # about 1 % of the stream per selector (the benchmark's calibration)
    assert 0.006 < hits / (300 * 400) < 0.014


def test_every_expected_match_is_delivered_once_and_nothing_else() -> None:
    rows = bench.main(
        [
            "--rows",
            "iccounting:1,iccounting:3",
            "--connections",
            "60",
            "--workers",
            "1",
            "--rate",
            "100",
            "--duration",
            "1",
            "--drain",
            "30",
            "--no-pin",
        ]
    )
    assert [r["kind"] for r in rows] == ["iccounting", "iccounting"]
    assert [r["subscriptions"] for r in rows] == [60, 180]
    for r in rows:
        assert r["connections"] == 60 and r["failed"] == 0, r
        assert r["published"] == 100, r
        assert r["expected"] > 0, r
        assert r["useful"] == r["expected"], r
        assert r["drained"], r
        assert r["duplicates"] == 0 and r["false"] == 0, r
        assert r["raw"] == r["useful"], r  # the broker sent nothing the selectors reject
        assert r["bytes"] > 0 and r["p99_ms"] > 0, r
        # read before the DISCONNECTs, the other after the results: never more
        assert 0 <= r["broker_stream_cpu_s"] <= r["broker_cpu_s"], r


def test_probe_core_counts_the_deliveries_of_the_selectors() -> None:
    """``--probe-core``: the sans-IO core's writes per message are the expected matches."""
    (row,) = bench.main(["--probe-core", "--rows", "iccounting:3", "--connections", "200"])
    wanted = [bench.predicate(c, 3) for c in range(200)]
    docs = [bench.telemetry(s) for s in range(60)]
    assert row["writes_per_message"] == round(sum(p(d) for p in wanted for d in docs) / 60, 1)
    assert row["message_ms"] > 0 and row["route_again_ms"] > 0 and row["teardown_us_per_connection"] > 0


def test_probe_fanout_times_every_delivery_of_the_real_broker() -> None:
    """``--probe-fanout``: the real broker in-process; each message's writes are its useful
    deliveries, timed in order (read, first write, last write)."""
    (row,) = bench.main(
        [
            "--probe-fanout",
            "--rows",
            "iccounting:3",
            "--connections",
            "60",
            "--rate",
            "50",
            "--duration",
            "1",
            "--no-pin",
        ]
    )
    assert row["connections"] == 60 and row["expected"] > 0, row
    assert row["useful"] == row["expected"], row
    heavy = row["heaviest"]
    assert heavy and heavy[0]["deliveries"] == row["heaviest_arrivals"][0]["deliveries"], row
    for m in heavy:
        assert m["to_first_write_ms"] > 0 and m["flush_ms"] >= m["in_write_ms"] >= 0, m
        assert m["route_again_ms"] >= 0 and m["read_ms"] is not None, m
