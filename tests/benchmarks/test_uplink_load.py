"""The outbound bridge benchmark's generator and CPU accounting (benchmarks/bench_uplink.py, issue 40).

The published figures rely on three things checked here against a real embedded broker:
the counter counts every message the publishers had acknowledged, once; a publisher's window
never exceeds the broker's Receive Maximum (CONNACK); and an edge's CPU seconds include its
child processes (``cpu_seconds``).  The publishers and the counter run their own event loops
on threads here (the benchmark runs them in processes), the broker in the test's loop.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

from broker import Broker

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_uplink
from _uplink_load import Count, counter_main, publish_slice


async def test_every_acknowledged_message_is_counted_once_and_the_window_obeys_receive_maximum() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, receive_maximum=16) as b:
        parent, child = multiprocessing.Pipe()
        counter = asyncio.create_task(asyncio.to_thread(counter_main, b.port, child))
        assert await asyncio.to_thread(parent.poll, 30) and parent.recv() == "ready"
        parent.send(("expect", "t/", 600, 10.0))
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
