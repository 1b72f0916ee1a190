"""`siftmq analytics --master spark://...` on a real Spark standalone cluster (issue 19 item 3):
a master and one worker started from pyspark's bundled `spark-class`, the analytics job run by
the real CLI over a real bridge output, exact counts checked, the cluster stopped."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge._analytics import SOURCE_ENV, results
from tests.bridge.test_bridge_end_to_end import N, _traffic

pytestmark = pytest.mark.spark


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _start(
    args: list[str], pattern: str, env: dict[str, str], timeout: float = 60
) -> tuple[subprocess.Popen[str], str]:
    """Start a JVM daemon in the foreground; wait for the log line matching ``pattern``."""
    proc = subprocess.Popen(
        [str(_spark_class()), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    out = proc.stdout
    threading.Thread(target=lambda: [lines.put(x) for x in out], daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        if m := re.search(pattern, line):
            return proc, m.group(1)
    proc.kill()
    raise AssertionError(f"{args[0]} did not start")


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    import pyspark

    env = {
        **os.environ,
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_NO_DAEMONIZE": "1",
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
        "PYSPARK_PYTHON": sys.executable,
    }
    procs: list[subprocess.Popen[str]] = []
    try:
        master, url = _start(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
            ],
            r"Starting Spark master at (spark://\S+)",
            env,
        )
        procs.append(master)
        worker, _ = _start(
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                "2",
                "--memory",
                "1g",
                "--webui-port",
                "0",
                url,
            ],
            r"(Successfully registered with master)",
            env,
        )
        procs.append(worker)
        yield url, env
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()


async def test_analytics_on_a_standalone_cluster(
    standalone: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, env = standalone
    landing = tmp_path / "landing"
    await _traffic(landing)  # a broker with its bridge, real clients: 2N + s2 deliveries
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "broker._cli",
        "analytics",
        "--once",
        "--master",
        url,
        "--landing",
        str(landing),
        "--output",
        str(out),
        # the results checked below, and the stateful one whose pickled function the executors
        # import (siftmq on their Python, pyspark's padding warning): 3 queries instead of 13
        "--results",
        "subscriber_rate,top_topics,active_filters",
    ]
    # without the JVM provider's jar: format("siftmq") is the Python data source, registered by
    # bridge.register as "siftmq" (a user's own session without the jar), and the landing
    # zone is read in the executors' Python workers, which import siftmq (the local session
    # of the other Spark tests has the jar)
    env = {**env, SOURCE_ENV: "python"}
    done = await asyncio.to_thread(
        subprocess.run, cmd, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # the Python source's offset (bridge/_landing.py: landing zone -> writer tag -> sequence),
    # not the JVM file stream source's {"logOffset": n}
    offset = (out / "_checkpoints" / "top_topics" / "offsets" / "0").read_text().splitlines()[-1]
    assert list(json.loads(offset)) == [str(landing)]
    # no Python warning from the driver, nor from the executors' Python workers (their stderr
    # is the executor's log; pyspark's padding FutureWarning was printed on every run)
    logs = [done.stderr, *(p.read_text(errors="replace") for p in (tmp_path / "work").glob("app-*/*/stderr"))]
    assert len(logs) > 1, "no executor log"
    warned = [line for text in logs for line in text.splitlines() if re.search(r"\w+Warning: ", line)]
    assert warned == []
    per_sub = results(out, "subscriber_rate").groupby("subscriber_id")["deliveries"].sum().to_dict()
    s2 = sum(1 for i in range(0, N, 2) if i % 10 > 5)
    assert per_sub == {"s0": N, "s1": N, "s2": s2}
    top = results(out, "top_topics").set_index("topic")
    assert top["messages"].to_dict() == {"e/a": N // 2, "e/b": N // 2}
