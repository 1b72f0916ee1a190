"""The outbound bridge benchmark's generator and CPU accounting (benchmarks/bench_uplink.py, issue 40).

The published figures rely on three things checked here against a real embedded broker:
the counter counts every message the publishers had acknowledged, once; a publisher's window
never exceeds the broker's Receive Maximum (CONNACK); and an edge's CPU seconds include its
child processes (``cpu_seconds``).  The publishers and the counter run their own event loops
on threads here (the benchmark runs them in processes), the broker in the test's loop.

The counter's pipe is wrapped in :class:`_LatePipe`, which hands it each ``expect`` only when
the parent next waits on the pipe: the latest a counter starved of CPU could take a measure in.
Under load the counter once took it in after the first 20 of 600 PUBLISHes had arrived, which
it acknowledged without counting (580 counted, the broker had delivered all 600): the parent
must not start publishing before the counter answers ``armed`` (``_uplink_load.expect``).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

from broker import Broker

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_uplink
from _uplink_load import Count, counter_main, expect, publish_slice


class _LatePipe:
    """The parent's end of the counter's pipe that holds each ``expect`` back until the parent
    next polls or receives (deterministically the latest moment the counter could read it)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.held: list[Any] = []

    def _flush(self) -> None:
        for msg in self.held:
            self.conn.send(msg)
        self.held.clear()

    def send(self, msg: Any) -> None:
        if msg[0] == "expect":
            self.held.append(msg)
        else:
            self._flush()
            self.conn.send(msg)

    def poll(self, timeout: float = 0.0) -> bool:
        self._flush()
        return self.conn.poll(timeout)

    def recv(self) -> Any:
        self._flush()
        return self.conn.recv()


async def test_every_acknowledged_message_is_counted_once_and_the_window_obeys_receive_maximum() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, receive_maximum=16) as b:
        conn, child = multiprocessing.Pipe()
        parent = cast(Connection, _LatePipe(conn))
        counter = asyncio.create_task(asyncio.to_thread(counter_main, b.port, child))
        assert await asyncio.to_thread(parent.poll, 30) and parent.recv() == "ready"
        await asyncio.to_thread(expect, parent, "t/", 600, 10.0)
        sent = await asyncio.gather(
            *(
                asyncio.to_thread(publish_slice, b.port, f"p{k}", "central/", f"t/{k}", 300, 200)
                for k in range(2)
            )
        )
        count: Count = await asyncio.to_thread(parent.recv)
        parent.send(("stop",))
        await asyncio.wait_for(counter, 30)
    assert [s.acked for s in sent] == [300, 300]
    assert [s.window for s in sent] == [16, 16]  # 200 asked, the broker allows 16
    assert (count.distinct, count.duplicates) == (600, 0)
    assert count.last >= max(s.first for s in sent)
    assert all(s.last >= s.first for s in sent)


async def test_the_benchmark_counts_what_arrives_before_its_counter_reads_the_measure() -> None:
    """bench_uplink's ``Load.measure`` with a counter that reads the ``expect`` late: each of the
    100 acknowledged messages is counted once (before ``armed``, 48 of 100 were: the publishers
    ran while the counter had not taken the measure in; it ignored what came meanwhile)."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        load = await asyncio.to_thread(bench_uplink.Load, b.port, 1, 16)
        try:
            load.pipe = cast(Connection, _LatePipe(load.pipe))
            row = await asyncio.to_thread(load.measure, b.port, "central/", "late/", 100, 0, os.getpid())
        finally:
            await asyncio.to_thread(load.close)
    assert (row.acked, row.delivered, row.duplicates) == (100, 100, 0)


def test_cpu_seconds_include_the_children() -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(60)"
    before = bench_uplink.cpu_seconds(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        deadline = time.monotonic() + 30
        while bench_uplink.cpu_seconds(os.getpid()) - before < 0.25:
            assert time.monotonic() < deadline, "the child's CPU never showed in its parent's"
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()
