"""How the bridge's rows cross to its writer process (bridge/_writerproc.py, issue 42 item 4).

The broker's socket to the child is blocking with the kernel's time-outs (one ``sendmsg`` per
frame, the GIL released once, not twice per socket buffer); the child reads each frame into a
buffer it keeps from round to round (:class:`Arena`) and runs under ``SCHED_BATCH``.  What
must hold whatever the transport: a frame larger than any socket buffer arrives whole and in
order, a reused buffer never mixes two frames, a child that stops answering is still given up
after the time-out (and the next job starts a new one), and every row lands.  Real processes
and sockets; the child is a real interpreter.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pytest

from bridge import Kind
from bridge._writer import _Sink
from bridge._writerproc import Arena, Job, WriterProcess, fanout_payload, receive, send
from broker.ext import DeliveryLog
from broker.values import Message

DEADLINE = 60.0  # generous: the suite's workers share the machine


def _batch(n: int) -> DeliveryLog:
    """A delivery log holding ``n`` publications with one delivery each (10 pairs)."""
    log = DeliveryLog(10 * n + 10, 10 * n + 10)
    msgs = [Message(f"t/{i}", b"x" * 20, 1, False, publisher_id=f"p{i}", received=1.0) for i in range(10)]
    for k in range(n):
        outer = log.begin(msgs[k % 10])
        log.delivered(f"s{k % 10}", f"t/{k % 10}", None, 1, False)
        log.end(outer, 2.0 + k * 1e-6, 1)
    return log


def _exchange(frames: list[object]) -> tuple[list[object], list[bytearray]]:
    """Send ``frames`` over a socketpair from a thread; receive them with one arena, each
    frame's buffers copied out before the next is read (as the child uses them).  Returns
    the frames received and the arena's buffer after each."""
    a, b = socket.socketpair()
    arena = Arena()
    got: list[object] = []
    bufs: list[bytearray] = []

    def send_all() -> None:
        for f in frames:
            send(a, f)

    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    try:
        for _ in frames:
            obj = receive(b, arena)
            got.append(
                {k: bytes(v) if isinstance(v, memoryview) else v for k, v in obj.items()}
                if isinstance(obj, dict)
                else obj
            )
            bufs.append(arena.buf)
        sender.join(DEADLINE)
    finally:
        a.close()
        b.close()
    return got, bufs


def test_frames_larger_than_the_socket_buffer_arrive_whole_and_the_arena_is_reused() -> None:
    arrays: list[np.ndarray[Any, Any]] = [
        np.arange(3_000_000, dtype=np.int64),  # 24 MB: more than any socket buffer
        np.arange(1_000_000, 2_000_000, dtype=np.int64),  # 8 MB: read into the same buffer
        np.arange(7, 11, dtype=np.int32),  # far smaller: the buffer's memory goes back
    ]
    frames: list[object] = [
        {
            "x": pickle.PickleBuffer(a.data),
            "y": pickle.PickleBuffer(a[::-1].copy().data),
            "tag": i,
        }
        for i, a in enumerate(arrays)
    ]
    frames.append({"x": b"in band", "tag": 3})
    got, bufs = _exchange(frames)
    expected = [{"x": a.tobytes(), "y": a[::-1].tobytes(), "tag": i} for i, a in enumerate(arrays)]
    assert got == [*expected, {"x": b"in band", "tag": 3}]
    assert bufs[1] is bufs[0] and len(bufs[0]) > 2 * arrays[0].nbytes  # reused, not reallocated
    assert len(bufs[2]) < 1 << 20 and bufs[3] is bufs[2]


def test_the_arena_gives_back_memory_after_a_burst() -> None:
    arena = Arena()
    arena.get(64 << 20)
    first = arena.buf
    view = arena.get(1 << 20)
    assert arena.buf is not first and len(arena.buf) == 1 << 20 and len(view) == 1 << 20
    again = arena.get(1000)
    assert arena.buf is not first and len(again) == 1000  # small enough to keep: no new buffer
    assert len(arena.buf) == 1 << 20


def test_a_round_larger_than_the_socket_buffer_lands_whole_through_the_child(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    sink = _Sink(landing)
    n = 200_000  # ~13 MB of columns: more than one socket buffer
    cols = _batch(n).take()
    names = (
        (Kind.DELIVERIES.value, (sink.next_name(),)),
        (Kind.PUBLICATIONS.value, (sink.next_name(),)),
    )
    job = Job("fanout", fanout_payload(cols), None, 10**6, names, (), 0)
    proc = WriterProcess(str(landing))
    try:
        files = proc.run(job)
    finally:
        proc.close()
    assert sorted((kind, rows) for kind, rows, _ in files) == [("deliveries", n), ("publications", n)]
    table = ds.dataset(str(landing / "deliveries"), format="parquet").to_table()
    assert sorted(table["subscriber_id"].to_pylist()[:10]) == [f"s{i}" for i in range(10)]
    assert table.num_rows == n


def _wait_loaded(pid: int) -> None:
    """Until the child ``pid`` has loaded pyarrow (it then waits for its first job)."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if "libarrow" in Path(f"/proc/{pid}/maps").read_text():
            return
        time.sleep(0.05)
    raise AssertionError("the writer process did not load pyarrow")


def test_a_stopped_child_is_given_up_after_the_time_out_and_replaced(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    sink = _Sink(landing)

    def job() -> Job:
        names = (
            (Kind.DELIVERIES.value, (sink.next_name(),)),
            (Kind.PUBLICATIONS.value, (sink.next_name(),)),
        )
        return Job("fanout", fanout_payload(_batch(10).take()), None, 10**6, names, (), 0)

    proc = WriterProcess(str(landing), timeout=1.0)
    try:
        proc.start()
        assert proc.proc is not None
        stopped = proc.proc.pid
        _wait_loaded(stopped)  # waiting for its first job: stopped now, it never answers
        os.kill(stopped, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(OSError):
            proc.run(job())
        assert time.monotonic() - t0 >= 0.9  # it was the 1-s time-out that ended the call
        assert proc.proc is None  # ended (killed), not left behind
        with pytest.raises(ProcessLookupError):
            os.kill(stopped, 0)
        proc.timeout = DEADLINE  # the new child loads numpy and pyarrow before it answers
        files = proc.run(job())  # a new child
        assert proc.starts == 2
    finally:
        proc.close()
    assert sorted(rows for _, rows, _ in files) == [10, 10]


def test_the_child_runs_as_a_batch_task(tmp_path: Path) -> None:
    if not hasattr(os, "SCHED_BATCH"):
        pytest.skip("no SCHED_BATCH here")
    proc = WriterProcess(str(tmp_path / "landing"))
    try:
        proc.start()
        assert proc.proc is not None
        pid = proc.proc.pid
        deadline = time.monotonic() + DEADLINE
        while os.sched_getscheduler(pid) != os.SCHED_BATCH and time.monotonic() < deadline:
            time.sleep(0.05)  # set by the child itself, first thing after its imports
        assert os.sched_getscheduler(pid) == os.SCHED_BATCH
        assert os.sched_getscheduler(0) != os.SCHED_BATCH  # the broker's own policy untouched
    finally:
        proc.close()


def test_the_child_runs_the_brokers_bridge_not_one_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # session 18: ``python -c`` puts the working directory first on sys.path, so a broker started
    # from a directory holding another ``bridge`` package (another checkout) ran that package's
    # child; it must run its own (``-P``)
    other = tmp_path / "elsewhere"
    (other / "bridge").mkdir(parents=True)
    (other / "bridge" / "__init__.py").write_text("")
    (other / "bridge" / "_writerchild.py").write_text(
        "import pathlib, sys\n"
        "def main():\n"
        f"    pathlib.Path({str(tmp_path / 'wrong')!r}).write_text('x')\n"
        "    return 3\n"
    )
    monkeypatch.chdir(other)
    landing = tmp_path / "landing"
    sink = _Sink(landing)
    names = ((Kind.DELIVERIES.value, (sink.next_name(),)), (Kind.PUBLICATIONS.value, (sink.next_name(),)))
    proc = WriterProcess(str(landing), timeout=DEADLINE)
    try:
        files = proc.run(Job("fanout", fanout_payload(_batch(10).take()), None, 10**6, names, (), 0))
        assert proc.starts == 1
    finally:
        proc.close()
    assert not (tmp_path / "wrong").exists()
    assert sorted(rows for _, rows, _ in files) == [10, 10]


def test_the_child_runs_the_tree_the_broker_imported_its_bridge_from(tmp_path: Path) -> None:
    # session 18: a broker whose bridge comes from another tree (a checkout run without an
    # install, PYTHONPATH choosing a tree) starts that tree's child, not the installed one
    repo = Path(__file__).resolve().parents[2]
    tree = tmp_path / "tree"
    shutil.copytree(repo / "bridge", tree / "bridge", ignore=shutil.ignore_patterns("__pycache__"))
    marker = tmp_path / "marker"
    child = tree / "bridge" / "_writerchild.py"
    child.write_text(
        child.read_text() + f"\n_main = main\n\n\ndef main(argv=None):  # noqa\n"
        f"    open({str(marker)!r}, 'w').write(__file__)\n    return _main(argv)\n"
    )
    program = textwrap.dedent(
        """
        import os, sys, time
        sys.path.insert(0, sys.argv[1])  # this tree's bridge, as a broker run from it imports it
        from bridge._writerproc import WriterProcess
        p = WriterProcess(sys.argv[2])
        p.start()
        deadline = time.monotonic() + 60
        while not os.path.exists(sys.argv[3]) and time.monotonic() < deadline:
            time.sleep(0.05)
        p.close()
        """
    )
    landing = tmp_path / "landing"
    subprocess.run(
        [sys.executable, "-c", program, str(tree), str(landing), str(marker)],
        cwd=tmp_path,
        check=True,
        timeout=DEADLINE,
    )
    assert marker.read_text() == str(child)  # main: the installed tree's child, no marker
