"""A hard kill (SIGKILL) of a process running a Bridge loses only the uncommitted tail."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq

from bridge import Bridge, Kind
from tests.bridge.records import delivery, feed

REPO = Path(__file__).resolve().parents[2]


def kill_feeder(
    landing: Path, roll_interval: float, rate: float, ticks: int
) -> tuple[float, list[int], list[float]]:
    """Run the feeder, SIGKILL it at its ``ticks``-th tick; returns (kill time, ids, times)."""
    with subprocess.Popen(
        [sys.executable, "-m", "tests.bridge.feeder", str(landing), str(roll_interval), str(rate)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ) as proc:
        try:
            assert proc.stdout is not None
            for _ in range(ticks):
                line = proc.stdout.readline()
                assert line.startswith("tick"), line
            killed_at = time.time()
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    table = ds.dataset(landing / Kind.DELIVERIES.value, format="parquet").to_table(
        columns=["message_id", "time"]
    )
    ids = table.column("message_id").to_pylist()
    times = [t.timestamp() for t in table.column("time").to_pylist()]
    return killed_at, ids, times


def test_hard_kill_keeps_a_complete_prefix(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    killed_at, ids, times = kill_feeder(landing, roll_interval=0.2, rate=20_000, ticks=8)
    assert every_final_file_is_complete(landing)
    # What was committed is exactly the records 0..m-1: no gap, no duplicate, no torn file.
    assert len(ids) >= 1000
    assert sorted(ids) == list(range(len(ids)))
    # The lost tail is what the feeder produced after the last commit (measured by the benchmark).
    assert max(times) <= killed_at
    # A restarted bridge removes the killed writer's temporaries and appends after them.
    with Bridge(landing) as b:
        feed(b, delivery(len(ids), time.time()))
    assert not [n for n in os.listdir(landing / "deliveries") if n.startswith(".")]
    assert ds.dataset(landing / "deliveries", format="parquet").count_rows() == len(ids) + 1


def every_final_file_is_complete(landing: Path) -> bool:
    """Every final (non-dot) file is a complete Parquet file."""
    for name in os.listdir(landing / "deliveries"):
        if not name.startswith("."):
            pq.read_metadata(landing / "deliveries" / name)
    return True
