"""Descriptor limits of ``siftmq serve`` (issue 27, item 1; docs/operations-fleet.md).

Subprocesses started with a low descriptor limit (``preexec_fn`` sets RLIMIT_NOFILE before
the broker starts): with a low *soft* limit the broker raises it to the hard limit; with a
low *hard* limit and more connections offered than it can hold it stays healthy, closes the
connections beyond its capacity unanswered, counts them in ``$SYS`` and ``/metrics``, and
serves new clients once descriptors are free again. Both event loops (asyncio, uvloop).
"""

from __future__ import annotations

import asyncio
import re
import resource
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from broker.packets import Connack, Connect, Decoder, Publish, ReasonCode, encode
from tests.rawclient import RawClient
from tests.serving import Serve

T = 20.0
HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def _limit(soft: int, hard: int) -> Callable[[], None]:
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@asynccontextmanager
async def serve(limit: Callable[[], None], *flags: str) -> AsyncIterator[Serve]:
    with Serve("--no-bridge", "--no-persistence", *flags, preexec_fn=limit) as s:
        yield s
        assert await asyncio.to_thread(s.stop, T) == 0


def _soft_limit_of(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as fh:
        for line in fh:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError("no 'Max open files' line")


async def test_soft_limit_raised_to_the_hard_limit_and_capacity_warning() -> None:
    """A low soft limit is raised to the hard one; ``max_connections`` above the capacity
    that leaves is a start-up warning."""
    over = HARD + 1000
    async with serve(_limit(256, HARD), "--max-connections", str(over)) as s:
        s.wait_for(r"listening on 127\.0\.0\.1:\d+")
        assert s.wait_for(r"descriptor limit raised from (\d+) to (\d+)").groups() == ("256", str(HARD))
        warning = rf"WARNING.*max_connections {over} is above .* descriptor limit {HARD} .*about (\d+)"
        found = s.wait_for(warning)
        assert HARD - 200 < int(found.group(1)) < HARD
        assert _soft_limit_of(s.proc.pid) == HARD


async def _attempt(port: int, i: int) -> bool:
    """A CONNECT: True when it is CONNACKed (the writer stays open), False when the broker
    closed the connection unanswered."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.write(encode(Connect(f"over{i}", 4, keep_alive=600), 4))
    dec = Decoder(4, server=False)
    try:
        while True:
            data = await reader.read(64)
            if not data:
                writer.close()
                return False
            got = dec.feed(data)
            if got:
                assert isinstance(got[0], Connack) and got[0].reason_code == ReasonCode.SUCCESS
                _open.append(writer)
                return True
    except ConnectionError:
        writer.close()
        return False


_open: list[asyncio.StreamWriter] = []
OFFERED = 300


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_out_of_descriptors_refuses_counts_and_serves_after(loop: str) -> None:
    flags = ["--sys-interval", "0.2", "--metrics-listen", "127.0.0.1:0"]
    flags.append("--no-uvloop" if loop == "asyncio" else "--uvloop")  # light: asyncio's by default
    async with serve(_limit(200, 200), *flags) as s:
        port = s.port()
        metrics = int(s.wait_for(r"metrics on http://127\.0\.0\.1:(\d+)/metrics").group(1))
        watcher, _ = await RawClient.connect(port, "watcher", 5)
        await watcher.subscribe("$SYS/broker/connections/#")
        _open.clear()
        outcomes = await asyncio.wait_for(asyncio.gather(*(_attempt(port, i) for i in range(OFFERED))), T)
        accepted = sum(outcomes)
        refused = OFFERED - accepted
        assert 0 < accepted < OFFERED and refused > 0, (accepted, refused)
        # the refusals are counted, in $SYS and in /metrics (published every 0.2 s)
        seen: dict[str, bytes] = {}

        async def sys_value(topic: str) -> int:
            while True:
                p = await watcher.recv(T)
                if isinstance(p, Publish):
                    seen[p.topic] = p.payload
                    if p.topic == topic and int(p.payload) >= refused:
                        return int(p.payload)

        assert await sys_value("$SYS/broker/connections/refused/descriptors") == refused
        text = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=T).read().decode()
        )
        assert f"siftmq_refused_descriptors_total {float(refused)}" in text
        pauses = re.search(r"^siftmq_accept_pauses_total (\S+)$", text, re.MULTILINE)
        assert pauses is not None and float(pauses.group(1)) >= 1
        assert s.proc.poll() is None
        # descriptors free again: a new client is served, and it routes
        for w in _open:
            w.close()
        _open.clear()
        pub: RawClient | None = None

        async def connect_again() -> None:
            nonlocal pub
            while True:  # until the broker has seen the closes (a refusal closes at once)
                try:
                    pub, ack = await RawClient.connect(port, "after", 5)
                except ConnectionError:
                    await asyncio.sleep(0.05)
                    continue
                assert ack.reason_code == ReasonCode.SUCCESS
                return

        await asyncio.wait_for(connect_again(), T)
        assert pub is not None
        await watcher.subscribe("after/t")
        await pub.publish1("after/t", b"served")
        while True:
            p = await watcher.recv(T)
            if isinstance(p, Publish) and p.topic == "after/t":
                assert p.payload == b"served"
                break
        s.wait_for(r"out of file descriptors \(limit 200")
