"""The writer process groups rounds of few rows into one commit (issue 42 item 4b).

A commit has a fixed cost (two Parquet files, their fsyncs and renames, the tables' Arrow
conversions) whatever its rows, so ``Bridge(writer="process")`` lets the child *hold* a round of
fewer than ``commit_rows`` rows, for at most ``commit_delay`` seconds of records, and commit the
held rounds as one group, one file per kind (bridge/_writerproc.py).  What is checked here, with
a real child interpreter: the held rounds commit nothing until the group is due, then land as
one file per kind holding exactly the rows the thread writer lands from the same hook calls
(string tables of every round merged, nested and later deliveries kept apart); a child killed
while it holds rounds is sent them again and lands each row once; a broker killed (SIGKILL)
while its child holds rounds loses none of them (the child commits them when the broker's
socket closes); a round of many rows is not held.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from bridge import Bridge, Kind
from bridge._writer import _Sink
from bridge._writerproc import Job, JobError, WriterProcess, fanout_payload
from broker import Message
from broker.packets import NO_PROPERTIES
from tests.bridge.test_writer_transport import _batch, _wait_loaded
from tests.waiting import until

DEADLINE = 60.0  # generous: the suite's workers share the machine
REPO = Path(__file__).resolve().parents[2]


def _wait(condition: Callable[[], bool], what: str) -> None:
    until(condition, DEADLINE, what, pause=0.01)


def _rows(landing: Path, kind: Kind) -> list[dict[str, object]]:
    d = landing / kind.value
    if not any(d.glob("*.parquet")):
        return []
    return sorted(ds.dataset(str(d), format="parquet").to_table().to_pylist(), key=repr)


def _files(landing: Path, kind: Kind) -> list[str]:
    return sorted(p.name for p in (landing / kind.value).glob("*.parquet"))


def _round_of_calls(b: Bridge, k: int, t: float) -> int:
    """Round ``k``'s hook calls: publications with 0-3 deliveries (publishers, subscribers, topics
    and filters partly new in each round, partly seen in earlier ones; a None publisher and
    selector), and a delivery written later (routes -1); returns the message ids used."""
    n = 0
    for j in range(6):
        i = k * 100 + j
        msg = Message(
            f"t/{k % 3}/{j % 2}",
            bytes(10 + j),
            j % 3,
            j == 0,
            NO_PROPERTIES,
            None if j == 1 else f"pub-{(k + j) % 4}",
            i,
            t + i - 0.001 * j,
        )
        entries = [
            (f"sub-{(k * 7 + e) % 5}", f"t/{k % 3}/#", None if e % 2 else f"x > {k}", e % 3, e == 1)
            for e in range(j % 4)
        ]
        b.on_deliveries(t + i, msg, entries, len(entries))
        n += 1
    late = Message("t/late", b"late", 1, False, NO_PROPERTIES, "pub-late", k * 100 + 99, t + k * 100)
    b.on_deliveries(t + k * 100 + 99.5, late, [("sub-late", "t/#", None, 1, False)], -1)
    return n


def _handed_over(b: Bridge, held: int) -> Callable[[], bool]:
    return lambda: b._log.peek_counts() == (0, 0) and not b._jobs and len(b._held) >= held


def test_rounds_of_few_rows_are_held_then_land_as_one_file_per_kind_with_the_same_rows(
    tmp_path: Path,
) -> None:
    t = 1_800_000_000.0
    rounds = 4
    held = Bridge(tmp_path / "held", roll_interval=0.02, commit_delay=3600.0, writer="process")
    with held:
        for k in range(rounds):
            _round_of_calls(held, k, t)
            _wait(_handed_over(held, k + 1), f"round {k} held by the child")
        # every round went to the child and none is committed: one group, held
        assert _files(tmp_path / "held", Kind.DELIVERIES) == []
        stats = held.stats()
        assert stats.written["deliveries"] == stats.written["publications"] == 0
        assert stats.pending["publications"] == rounds * 6
        assert stats.files == 0
    # the graceful stop committed the group: one file per kind
    stats = held.stats()
    assert stats.pending["deliveries"] == stats.pending["publications"] == 0
    assert len(_files(tmp_path / "held", Kind.DELIVERIES)) == 1
    assert len(_files(tmp_path / "held", Kind.PUBLICATIONS)) == 1
    with Bridge(tmp_path / "thread", roll_interval=0.02) as thread:
        for k in range(rounds):
            _round_of_calls(thread, k, t)
    for kind in (Kind.DELIVERIES, Kind.PUBLICATIONS):
        rows = _rows(tmp_path / "held", kind)
        assert rows == _rows(tmp_path / "thread", kind), kind
        assert held.stats().written[kind.value] == len(rows)
    deliveries = _rows(tmp_path / "held", Kind.DELIVERIES)
    assert len(deliveries) == rounds * (0 + 1 + 2 + 3 + 0 + 1 + 1)  # fan-outs 0,1,2,3,0,1 + a late one
    assert {r["publisher_id"] for r in deliveries} >= {None, "pub-late"}
    assert {r["content_filter"] for r in deliveries} >= {None, "x > 3"}


def test_a_group_is_committed_once_it_is_due_and_a_large_round_is_not_held(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    t = 1_800_000_000.0
    with Bridge(landing, roll_interval=0.05, commit_delay=0.3, commit_rows=500, writer="process") as b:
        _round_of_calls(b, 0, t)
        # due after 0.3 s of records at most: committed by a round, without a flush
        _wait(lambda: b.stats().written["publications"] == 6, "the held group committed when due")
        assert len(_files(landing, Kind.PUBLICATIONS)) == 1
        files = b.stats().files
        for i in range(300):  # 600 rows >= commit_rows: committed by its own round
            msg = Message("big", b"x", 1, False, NO_PROPERTIES, "p", 1000 + i, t)
            b.on_deliveries(t + i, msg, [("s", "big", None, 1, False)], 1)
        _wait(lambda: b.stats().written["publications"] == 306, "the large round committed")
        assert not b._held
        assert b.stats().files == files + 2


def _job(sink: _Sink, hold: bool, payload: object = None) -> Job:
    """A fan-out job of 10 publications with one delivery each (``payload``: another)."""
    names = ((Kind.DELIVERIES.value, (sink.next_name(),)), (Kind.PUBLICATIONS.value, (sink.next_name(),)))
    rows = ((Kind.DELIVERIES.value, 10), (Kind.PUBLICATIONS.value, 10))
    body = fanout_payload(_batch(10).take()) if payload is None else payload
    return Job("fanout", body, None, 10**6, names, rows, 20, hold=hold)


def test_a_held_round_is_not_waited_for_and_lands_with_its_group(tmp_path: Path) -> None:
    # session 17: the broker's writer thread sends a held round and goes on (the child does not
    # answer it): with the child stopped, the held rounds are still handed over
    landing = tmp_path / "landing"
    sink = _Sink(landing)
    proc = WriterProcess(str(landing), timeout=DEADLINE)
    try:
        proc.start()
        assert proc.proc is not None
        pid = proc.proc.pid
        _wait_loaded(pid)
        os.kill(pid, signal.SIGSTOP)
        try:
            for _ in range(3):  # main waited for an answer here: its time-out ended the child
                assert proc.run(_job(sink, hold=True)) is None
        finally:
            os.kill(pid, signal.SIGCONT)
        files = proc.run(_job(sink, hold=False))  # the group's one answer
        assert proc.starts == 1 and proc.proc is not None and proc.proc.pid == pid
    finally:
        proc.close()
    assert sorted((kind, rows) for kind, rows, _ in files) == [("deliveries", 40), ("publications", 40)]
    assert len(_files(landing, Kind.DELIVERIES)) == len(_files(landing, Kind.PUBLICATIONS)) == 1
    assert len(_rows(landing, Kind.PUBLICATIONS)) == 40


def test_a_held_round_the_child_cannot_copy_fails_its_groups_answer(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    sink = _Sink(landing)
    proc = WriterProcess(str(landing), timeout=DEADLINE)
    try:
        assert proc.run(_job(sink, hold=True)) is None
        assert proc.run(_job(sink, hold=True, payload={"broken": 1})) is None  # not answered
        with pytest.raises(JobError) as failed:
            proc.run(_job(sink, hold=False))
        assert not failed.value.retry  # a group that cannot become a table: discarded
        assert "KeyError" in str(failed.value)
        files = proc.run(_job(sink, hold=False))  # the next group is whole again
        assert proc.starts == 1
    finally:
        proc.close()
    assert sorted((kind, rows) for kind, rows, _ in files) == [("deliveries", 10), ("publications", 10)]
    assert len(_rows(landing, Kind.PUBLICATIONS)) == 10


def test_a_child_killed_while_it_holds_rounds_is_sent_them_again(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    t = 1_800_000_000.0
    b = Bridge(landing, roll_interval=0.02, commit_delay=3600.0, writer="process")
    with b:
        for k in range(2):
            _round_of_calls(b, k, t)
            _wait(_handed_over(b, k + 1), f"round {k} held")
        first = b._process.proc if b._process is not None else None
        assert first is not None
        first.send_signal(signal.SIGKILL)  # with two rounds held: they die with it
        first.wait()
        _round_of_calls(b, 2, t)
        # the next round finds the child gone, starts another and sends the held rounds again
        _wait(lambda: b.stats().writer_restarts == 1 and _handed_over(b, 3)(), "the rounds held again")
    stats = b.stats()
    assert stats.written["publications"] == 18
    ids = [r["message_id"] for r in _rows(landing, Kind.PUBLICATIONS)]
    assert sorted(ids) == sorted(k * 100 + j for k in range(3) for j in range(6))  # each once
    assert len(_files(landing, Kind.PUBLICATIONS)) == 1


_HOLDER = """
import os, sys, time
from bridge import Bridge
from tests.bridge.test_writer_grouped_commits import _handed_over, _round_of_calls
from tests.waiting import until
b = Bridge(sys.argv[1], roll_interval=0.02, commit_delay=3600.0, writer="process")
b.start_writer()
for k in range(3):
    _round_of_calls(b, k, 1_800_000_000.0)
    until(_handed_over(b, k + 1), 60, "the round handed over", pause=0.01)
print(b._process.proc.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="Linux /proc")
def test_a_broker_killed_while_its_child_holds_rounds_loses_none_of_them(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(landing)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ) as proc:
        try:
            assert proc.stdout is not None
            child = int(proc.stdout.readline())
            assert _files(landing, Kind.PUBLICATIONS) == []  # three rounds held, none committed
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # the orphaned child sees the socket close, commits what it holds and exits
    _wait(lambda: not Path(f"/proc/{child}").exists() or "zombie" in _state(child), "the child's exit")
    ids = [r["message_id"] for r in _rows(landing, Kind.PUBLICATIONS)]
    assert sorted(ids) == sorted(k * 100 + j for k in range(3) for j in range(6))
    assert len(_rows(landing, Kind.DELIVERIES)) == 3 * 8
    assert not list(landing.rglob(".*.tmp"))


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"


def test_grouping_options_are_checked_and_a_short_roll_interval_commits_every_round(tmp_path: Path) -> None:
    assert Bridge(tmp_path / "a", writer="process").commit_delay == 2.0  # 4 rounds of 0.5 s
    assert Bridge(tmp_path / "b", roll_interval=0.1, writer="process").commit_delay == 0.1
    with pytest.raises(ValueError, match="commit_delay"):
        Bridge(tmp_path / "c", roll_interval=0.5, commit_delay=0.2)
    with pytest.raises(ValueError, match="commit_delay"):
        Bridge(tmp_path / "d", commit_delay=float("nan"))
    with pytest.raises(ValueError, match="commit_rows"):
        Bridge(tmp_path / "e", commit_rows=-1)
    with pytest.raises(ValueError, match="commit_delay"):
        Bridge(tmp_path / "f", commit_delay=float("inf"))  # rounds held for good
    with pytest.raises(ValueError, match="roll_interval"):
        Bridge(tmp_path / "g", roll_interval=float("nan"))
    with pytest.raises(ValueError, match="commit_rows"):
        Bridge(tmp_path / "h", commit_rows=1.5)  # type: ignore[arg-type]
