"""The bridge's writer in its own process (``Bridge(writer="process")``, bridge/_writerproc.py).

Real brokers and real MQTT clients (aiomqtt); the child is a real interpreter.  Its failure
modes: killed (SIGKILL) between rounds and in the middle of a round -- restarted, every record
landed exactly once; the same job sent twice (what happens when a child dies after committing
but before answering) writes no second file; a full disk (a small tmpfs, root only) -- the
failure said once without a traceback, the records kept and landed once space is back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import pyarrow.dataset as ds
import pytest

from bridge import Bridge, Kind
from bridge._writer import _Sink
from bridge._writerproc import Job, WriterProcess
from broker import Broker
from tests.serving import Serve
from tests.smallfs import fill, small_tmpfs
from tests.waiting import eventually

DEADLINE = 60.0  # generous: the suite's workers share the machine


def _ids(landing: Path, kind: str) -> list[int]:
    d = landing / kind
    if not any(d.glob("*.parquet")):
        return []
    table = ds.dataset(str(d), format="parquet").to_table(columns=["message_id"])
    return sorted(table["message_id"].to_pylist())


async def _publish(port: int, topic: str, n: int, start: int = 0) -> None:
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"pub-{start}") as pub:
        for i in range(start, start + n):
            await pub.publish(topic, b"%d" % i, qos=1)


def _child(bridge: Bridge) -> subprocess.Popen[bytes]:
    proc = bridge._process.proc if bridge._process is not None else None
    assert proc is not None and proc.poll() is None, "no writer process running"
    return proc


#: every round committed, and rounds grouped into commits of up to 0.5 s of records (the child
#: holds them: tests/bridge/test_writer_grouped_commits.py)
GROUPING = pytest.mark.parametrize("commit_delay", [None, 0.5], ids=["every-round", "grouped"])


@GROUPING
async def test_every_record_lands_exactly_once_across_kills_of_the_writer(
    tmp_path: Path, commit_delay: float | None
) -> None:
    landing = tmp_path / "landing"
    bridge = Bridge(landing, roll_interval=0.05, writer="process", commit_delay=commit_delay)
    async with (
        Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[bridge]) as b,
        aiomqtt.Client("127.0.0.1", b.port, identifier="sub") as sub,
    ):
        await sub.subscribe("t/#", qos=1)
        await _publish(b.port, "t/a", 50)
        await eventually(lambda: bridge.stats().written["deliveries"] >= 50, DEADLINE)
        first = _child(bridge)
        first.send_signal(signal.SIGKILL)  # between rounds
        await asyncio.to_thread(first.wait)
        await _publish(b.port, "t/a", 50, start=50)
        await eventually(lambda: bridge.stats().written["deliveries"] >= 100, DEADLINE)
        assert bridge.stats().writer_restarts == 1
        second = _child(bridge)
        assert second.pid != first.pid
        # in the middle of rounds: killed while the publisher keeps going
        task = asyncio.create_task(_publish(b.port, "t/a", 400, start=100))
        await eventually(lambda: bridge.stats().written["deliveries"] > 100, DEADLINE)
        second.send_signal(signal.SIGKILL)
        await task
        await asyncio.to_thread(second.wait)
        # a few more after the kill: the stream may have been committed whole before it
        # (grouped rounds commit up to 0.5 s of records at once), and a dead child is found
        # by the next round that has a job for it
        await _publish(b.port, "t/a", 10, start=500)
        await eventually(lambda: bridge.stats().written["deliveries"] >= 510, DEADLINE)
        assert bridge.stats().writer_restarts == 2
    stats = bridge.stats()
    assert stats.written["deliveries"] == stats.written["publications"] == 510
    assert stats.pending["deliveries"] == stats.pending["publications"] == 0
    assert stats.dropped["deliveries"] == 0
    ids = _ids(landing, "deliveries")
    assert len(ids) == len(set(ids)) == 510  # every delivery once: nothing lost, nothing twice
    assert _ids(landing, "publications") == ids
    assert not [p for p in landing.rglob(".*.tmp")]
    assert bridge._process is not None and bridge._process.proc is None  # ended with the broker


def test_a_job_sent_again_writes_no_second_file(tmp_path: Path) -> None:
    """A child that dies after committing a job's files but before answering: the job is sent
    again under the same names, and the files already there are kept, not written twice."""
    import pyarrow as pa

    from bridge._schema import SCHEMAS

    landing = tmp_path / "landing"
    sink = _Sink(landing)
    schema = SCHEMAS[Kind.SUBSCRIPTION_CHANGES]
    from broker.hooks import SubscriptionAction, SubscriptionChange

    records = [
        SubscriptionChange(
            time=1.0 + i,
            client_id=f"c{i}",
            action=SubscriptionAction.SUBSCRIBE,
            topic_filter="a/#",
            content_filter=None,
            qos=1,
            entries=1,
        )
        for i in range(5)
    ]
    names = tuple(sink.next_name() for _ in range(3))  # 5 rows, 2 per file
    kind = Kind.SUBSCRIPTION_CHANGES.value
    job = Job(kind, records, None, 2, ((kind, names),), (), 0)
    proc = WriterProcess(str(landing))
    try:
        first = proc.run(job)
        d = landing / Kind.SUBSCRIPTION_CHANGES.value
        stamps = {p.name: p.stat().st_mtime_ns for p in d.glob("*.parquet")}
        assert sorted(stamps) == sorted(names)
        again = proc.run(job)
    finally:
        proc.close()
    assert again == first
    assert [n for _, n, _ in first] == [2, 2, 1]
    assert {p.name: p.stat().st_mtime_ns for p in d.glob("*.parquet")} == stamps  # not rewritten
    table = ds.dataset(str(d), format="parquet", schema=schema).to_table()
    assert sorted(table["client_id"].to_pylist()) == [f"c{i}" for i in range(5)]
    assert pa.types.is_timestamp(table.schema.field("time").type)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted under ``tmp_path`` (unmounted after the test)."""
    with small_tmpfs(tmp_path, "4m") as mnt:
        yield mnt


@GROUPING
async def test_full_disk_keeps_the_records_and_lands_them_when_space_is_back(
    small_fs: Path, caplog: pytest.LogCaptureFixture, commit_delay: float | None
) -> None:
    caplog.set_level(logging.INFO)
    landing = small_fs / "landing"
    bridge = Bridge(landing, roll_interval=0.05, writer="process", commit_delay=commit_delay)
    async with (
        Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[bridge]) as b,
        aiomqtt.Client("127.0.0.1", b.port, identifier="sub") as sub,
    ):
        await sub.subscribe("t/#", qos=1)
        await _publish(b.port, "t/a", 20)
        await eventually(lambda: bridge.stats().written["deliveries"] >= 20, DEADLINE)
        filler = small_fs / "filler"
        fill(filler)
        await _publish(b.port, "t/a", 200, start=20)
        await eventually(lambda: bridge.stats().write_errors > 0, DEADLINE)
        assert bridge.stats().pending["deliveries"] > 0  # kept, not dropped
        fill(small_fs / "filler-2")  # what the failed write's partial file gave back
        filler.unlink()
        (small_fs / "filler-2").unlink()
        await eventually(lambda: bridge.stats().written["deliveries"] >= 220, DEADLINE)
    stats = bridge.stats()
    assert stats.written["deliveries"] == stats.written["publications"] == 220
    assert stats.writer_restarts == 0  # a failed write is not a dead child
    ids = _ids(landing, "deliveries")
    assert len(ids) == len(set(ids)) == 220
    lines = [r for r in caplog.records if r.getMessage().startswith("bridge: writing")]
    failed = [r for r in lines if " failed (" in r.getMessage()]
    assert len(failed) == 1 and "No space left on device" in failed[0].getMessage()
    assert [r.exc_info for r in lines if r.exc_info] == []  # one line, no traceback
    assert sum(r.getMessage().startswith("bridge: writing resumed") for r in lines) == 1


def test_ctrl_c_to_the_process_group_stops_serve_without_losing_the_writer(tmp_path: Path) -> None:
    """A Ctrl-C in a terminal (or a service manager's stop) signals the whole process group,
    the writer process too: it ignores the signal and commits the broker's last flush."""
    import time

    import paho.mqtt.client as paho

    data = tmp_path / "data"
    # its own process group (setsid), as a shell gives a foreground job; its log read by a
    # thread, so waiting for the port has a deadline (a blocking readline had none)
    with Serve("--data-dir", str(data), cwd=tmp_path, preexec_fn=os.setsid) as serve:
        proc = serve.proc
        deadline = time.monotonic() + DEADLINE
        port = serve.port("tcp", DEADLINE)
        sub = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="sub")
        got: list[bytes] = []
        sub.on_message = lambda _c, _u, msg: got.append(msg.payload)
        sub.connect("127.0.0.1", port)
        sub.loop_start()
        pub = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="pub")
        pub.connect("127.0.0.1", port)
        pub.loop_start()
        try:
            sub.subscribe("t/a", qos=1)[0]
            while not got:  # the subscription is in place once a message arrives
                assert time.monotonic() < deadline, "no delivery"
                pub.publish("t/a", b"probe", qos=1).wait_for_publish(DEADLINE)
                time.sleep(0.05)
            for i in range(100):
                pub.publish("t/a", b"%d" % i, qos=1).wait_for_publish(DEADLINE)
            while len([p for p in got if p != b"probe"]) < 100:
                assert time.monotonic() < deadline, "deliveries missing"
                time.sleep(0.02)
        finally:
            pub.loop_stop()
            pub.disconnect()
            sub.loop_stop()
            sub.disconnect()
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=DEADLINE) == 0
        serve.kill()  # it has ended: the rest of its log is read
    log = "".join(serve.lines)
    assert "writer process" in log and "writer process failed" not in log, log
    table = ds.dataset(str(data / "landing" / "deliveries"), format="parquet").to_table()
    topics = table["topic"].to_pylist()
    assert topics.count("t/a") == len(got)  # every delivery of t/a recorded, the last flush too


async def test_a_writer_process_that_cannot_start_is_said_once_and_the_records_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The child cannot be started (here: no interpreter at ``sys.executable``): one warning
    for the episode, not one per round; the records stay buffered and land once it starts."""
    import sys

    caplog.set_level(logging.INFO)
    landing = tmp_path / "landing"
    bridge = Bridge(landing, roll_interval=0.02, writer="process")
    real = sys.executable
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    async with (
        Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[bridge]) as b,
        aiomqtt.Client("127.0.0.1", b.port, identifier="sub") as sub,
    ):
        await sub.subscribe("t/#", qos=1)
        await _publish(b.port, "t/a", 30)
        await eventually(lambda: bridge.stats().write_errors >= 10, DEADLINE)  # rounds went by
        assert bridge.stats().written["deliveries"] == 0
        assert bridge.stats().pending["deliveries"] == 30
        monkeypatch.setattr(sys, "executable", real)
        await eventually(lambda: bridge.stats().written["deliveries"] >= 30, DEADLINE)
    messages = [r.getMessage() for r in caplog.records if r.name == "siftmq.bridge"]
    assert sum("writer process failed" in m for m in messages) == 1, messages
    assert sum("writer process running again" in m for m in messages) == 1, messages
    assert len(set(_ids(landing, "deliveries"))) == len(_ids(landing, "deliveries")) == 30


def test_every_kind_lands_the_same_through_the_writer_process(tmp_path: Path) -> None:
    """Subscription changes, the three composite kinds and whole messages, written by the
    writer process and by the thread writer from the same hook calls: the same rows."""
    import time

    from broker.hooks import CompositeAction, SubscriptionAction
    from tests.bridge.records import (
        change,
        composite_change,
        composite_event,
        composite_loss,
        delivery,
        feed,
        publication,
    )

    def run(writer: str) -> dict[str, list[dict[str, object]]]:
        landing = tmp_path / writer
        t = 1_800_000_000.0
        with Bridge(landing, messages=["a/#"], writer=writer) as b:
            for i in range(5):
                feed(b, delivery(i, t + i))
                feed(b, publication(i, t + i))  # and its whole message (messages=["a/#"])
            b.on_subscription_change(change(t, "c1", SubscriptionAction.SUBSCRIBE, "a/#", 1))
            b.on_composite_change(composite_change(t, "c1", "n", CompositeAction.SUBSCRIBE))
            for i in range(3):
                b.on_composite_event(composite_event(t + i))
            b.on_composite_loss(composite_loss(t))
            deadline = time.monotonic() + DEADLINE
            while b.stats().written["composite_events"] < 3:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        out = {}
        for kind in Kind:
            d = landing / kind.value
            rows = (
                ds.dataset(str(d), format="parquet").to_table().to_pylist()
                if any(d.glob("*.parquet"))
                else []
            )
            out[kind.value] = sorted(rows, key=repr)
        return out

    process, thread = run("process"), run("thread")
    assert process == thread
    assert {k: len(v) for k, v in process.items()} == {
        "deliveries": 5,
        "publications": 5,
        "subscription_changes": 1,
        "composite_changes": 1,
        "composite_events": 3,
        "composite_losses": 1,
        "messages": 5,
    }
