"""The burst pacing of benchmarks/bench_saturation.py (``--burst``, issue 42 item 4).

The loaded-machine figure compares brokers at the same rate *and* the same batch: with
``--burst K`` every publisher sends ``K`` PUBLISHes at a time, all publishers in the same
tick, never ahead of the offered rate.  Here two QoS 1 pairs run for a second against a real
embedded broker (``broker.testing``) with a window far larger than anything the second can
send, so the window never splits a burst: every publisher must have sent whole bursts only,
never more than the schedule allowed, and every message must be delivered once.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from broker import Broker
from broker.testing import broker_fixture

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_saturation as bench

__all__ = ["broker_fixture"]  # the embedded broker (pytest finds it here)


async def test_bursts_are_whole_and_never_ahead_of_the_rate(broker_fixture: Broker) -> None:
    rate, burst, pairs = 2_000.0, 8, 2
    a = argparse.Namespace(
        pairs=pairs, window=100_000, warmup=0.2, duration=1.0, drain=2.0, threads=False, burst=burst
    )
    start = time.monotonic()
    res = await bench.run_paced(broker_fixture.port, a, False, rate=rate)
    elapsed = time.monotonic() - start
    sent = int(res["delivered"])  # type: ignore[call-overload]
    assert res["burst"] == burst * pairs
    assert res["duplicates"] == 0 and res["sub_disconnects"] == 0
    assert res["delivered_pct_of_acked"] == 100.0
    # a tick is one synchronous loop over the publishers: whole bursts of every publisher
    assert sent > 0 and sent % (burst * pairs) == 0
    step = burst * pairs / rate  # seconds between ticks
    assert sent <= burst * pairs * (elapsed / step + 1)  # never ahead of the schedule


def test_burst_larger_than_the_window_is_refused() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(bench.__file__)),
            "--burst",
            "40",
            "--window",
            "32",
            "--paced-rate",
            "1000",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "--burst 40: expected 0 (off) to --window (32)" in proc.stderr and "Traceback" not in proc.stderr


def test_together_measures_the_brokers_over_the_same_window() -> None:
    """``--together``: two real ``siftmq serve`` brokers paced at once; their measured windows
    coincide and each delivers its own clients' messages once."""
    a = argparse.Namespace(
        pairs=2,
        window=32,
        warmup=0.3,
        duration=1.0,
        drain=1.0,
        threads=True,
        burst=8,
        broker_cpu=sorted(os.sched_getaffinity(0))[0],
    )
    got = bench.together(["siftmq-nostore", "siftmq-nostore"], a, 1_000.0)
    assert len(got) == 2
    (s0, e0), (s1, e1) = got[0]["window_s"], got[1]["window_s"]  # type: ignore[misc]
    overlap = min(e0, e1) - max(s0, s1)
    assert overlap >= 0.8 * min(e0 - s0, e1 - s1)
    for res in got:
        assert res["delivered"] == res["acked"] and int(res["delivered"]) > 0  # type: ignore[call-overload]
        assert res["duplicates"] == 0 and res["sub_disconnects"] == 0
        assert "loop" in res["threads"]  # type: ignore[operator]
