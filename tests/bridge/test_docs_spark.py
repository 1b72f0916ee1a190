"""docs/bridge.md's Spark examples (``<!-- example: spark -->``) run as written, in the suite's
shared Spark session (``getOrCreate`` returns it): the newcomer's path README -> getting
started -> embedding -> Spark (issue 41 item 6). The landing zone they read is made first by
docs/bridge.md's own embedding example; ``node1/`` and ``node2/`` are copies of it (their
relative paths made absolute: the JVM resolves them against its own working directory). The
write example (Spark both ways) publishes to a broker on port 0, in a thread of its own, in
place of the user's 1883, which must receive exactly the messages the page says."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from broker import Broker
from tests.test_docs_examples import ALL


class BrokerThread:
    """A broker on port 0 in a thread of its own (Spark's write blocks this one), recording
    what is published under ``readings/``."""

    def __init__(self) -> None:
        self.port = 0
        self.messages: list[tuple[str, bytes]] = []
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),))

    async def _main(self) -> None:
        self.stopping = asyncio.Event()
        async with Broker(port=0, sys_interval=0) as b, b.subscribe("readings/#") as sub:
            self.port = b.port
            self.ready.set()
            collect = asyncio.ensure_future(self._collect(sub))
            await self.stopping.wait()
            collect.cancel()

    async def _collect(self, sub: Any) -> None:
        async for msg in sub:
            self.messages.append((msg.topic, msg.payload))

    def __enter__(self) -> BrokerThread:
        self.thread.start()
        assert self.ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(30)
        self.loop.close()


def test_bridge_page_has_spark_examples() -> None:
    assert [e.id for e in ALL if e.mark == "spark"], "docs/bridge.md marks its Spark examples"


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding ``siftmq-data/landing``, made by docs/bridge.md's embedding example
    (run once), and its copies ``node1/landing`` and ``node2/landing``."""
    root = tmp_path_factory.mktemp("docs-spark")
    embedding = next(e for e in ALL if e.page == "bridge.md" and not e.mark and "Bridge(" in e.code)
    subprocess.run([sys.executable, "-c", embedding.code], cwd=root, check=True, capture_output=True)
    for node in ("node1", "node2"):
        shutil.copytree(root / "siftmq-data" / "landing", root / node / "landing")
    return root


@pytest.mark.parametrize("example", [e for e in ALL if e.mark == "spark"], ids=lambda e: e.id)
def test_spark_example_runs(example: Any, spark: Any, landing: Path) -> None:
    tmp_path = landing
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    # the JVM resolves a relative path against its own working directory, not this test's
    code = re.sub(
        r'"((?:siftmq-data|node1|node2)/landing)"', lambda m: repr(str(tmp_path / m[1])), example.code
    )
    namespace: dict[str, Any] = {"__name__": "__main__"}
    with BrokerThread() as broker:  # the write example's broker, its port for the user's 1883
        exec(
            compile(code.replace("127.0.0.1:1883", f"127.0.0.1:{broker.port}"), example.id, "exec"), namespace
        )
        deadline = time.monotonic() + 30
        while "rows" in namespace and len(broker.messages) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert namespace["spark"] is spark
    if "rows" in namespace:  # the write example: one message per row, the row as JSON
        assert sorted(broker.messages) == [  # the page says what it publishes, byte for byte
            ("readings/d1", b'{"device":"d1","temp":35.0}'),
            ("readings/d2", b'{"device":"d2","temp":12.5}'),
        ]
    if "both" in namespace:  # the reading example: the kinds' declared schemas, both zones
        assert "topic" in namespace["df"].columns
        assert namespace["both"].count() == 2  # the embedding example's publication, twice
        assert namespace["df"].count() == 0  # its delivery was to an in-process subscriber
        assert namespace["stream"].isStreaming and namespace["several"].isStreaming
