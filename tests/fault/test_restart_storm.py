"""The restart storm, small (issue 27 item 4; the 100,000-session run is
benchmarks/bench_restart_storm.py, results in docs/performance-connections.md).

A broker subprocess with a file store (it prints its port-0 port); 1,000 devices connect with
clean start and a Session Expiry Interval, subscribe to two filters at QoS 1 and disconnect; a
publisher queues two QoS 1 messages for every tenth device (acknowledged, so durable).  The
broker is stopped gracefully (SIGTERM) and started again on the same database: every device
reconnects with clean start off, must get session present and exactly its queued messages
(it acknowledges them and disconnects).  Then the same with a ``kill -9`` instead of SIGTERM.
Devices connect through the project's raw client, 200 at a time.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections import Counter
from pathlib import Path

from broker.packets import Disconnect, Properties, Puback, Publish, SubscriptionRequest
from tests.rawclient import RawClient

DEVICES = 1000
EVERY = 10  # every tenth device has queued messages
QUEUED = 2
CONCURRENCY = 200
EXPIRY = Properties(session_expiry_interval=3600)

BROKER = """
import asyncio, signal, sys
from broker import Broker

async def main() -> None:
    b = Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=sys.argv[1])
    await b.start()
    print("PORT", b.port, len(b.core.sessions), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await b.stop()

asyncio.run(main())
"""


class _Broker:
    def __init__(self, db: Path) -> None:
        self.db = db
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self.restored = 0

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", BROKER, str(self.db), stdout=asyncio.subprocess.PIPE
        )
        assert self.proc.stdout is not None
        line = (await asyncio.wait_for(self.proc.stdout.readline(), 30)).split()
        assert line and line[0] == b"PORT", line
        self.port, self.restored = int(line[1]), int(line[2])

    async def stop(self, kill: bool) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), 30)
        assert code == (-signal.SIGKILL if kill else 0), code
        self.proc = None


def _queued(i: int) -> set[bytes]:
    return {f"{i}:{k}".encode() for k in range(QUEUED)} if i % EVERY == 0 else set()


async def _each(fn, n: int) -> list:  # type: ignore[no-untyped-def, type-arg]
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int):  # type: ignore[no-untyped-def]
        async with sem:
            return await fn(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


async def _setup(port: int, i: int) -> None:
    c, ack = await RawClient.connect(port, f"dev{i}", clean_start=True, properties=EXPIRY)
    assert int(ack.reason_code) == 0 and not ack.session_present
    await c.subscribe(SubscriptionRequest(f"fleet/{i}/cmd", 1), SubscriptionRequest(f"fleet/{i}/cfg/#", 1))
    c.send(Disconnect())
    await c.close()


async def _queue(port: int) -> None:
    pub, _ = await RawClient.connect(port, "publisher", clean_start=True)
    for i in range(0, DEVICES, EVERY):
        for payload in sorted(_queued(i)):
            await pub.publish1(f"fleet/{i}/cmd", payload)
    pub.send(Disconnect())
    await pub.close()


async def _resume(port: int, i: int) -> tuple[bool, Counter[bytes]]:
    """Reconnect device ``i`` (clean start off): (session present, messages received)."""
    c, ack = await RawClient.connect(port, f"dev{i}", clean_start=False, properties=EXPIRY)
    assert int(ack.reason_code) == 0, ack
    got: Counter[bytes] = Counter()
    want = _queued(i)
    while not want <= got.keys():
        p = await c.recv()
        assert isinstance(p, Publish) and p.qos == 1, p
        got[p.payload] += 1
        c.send(Puback(p.packet_id or 0))
    if want:  # nothing else was queued for it (the others: the next storm would show it)
        for p in await c.barrier():
            assert isinstance(p, Publish), p
            got[p.payload] += 1
    c.send(Disconnect())
    await c.close()
    return ack.session_present, got


async def _storm(b: _Broker) -> None:
    results = await _each(lambda i: _resume(b.port, i), DEVICES)
    assert b.restored == DEVICES
    assert all(present for present, _ in results), [i for i, (p, _) in enumerate(results) if not p][:10]
    for i, (_, got) in enumerate(results):
        assert set(got) == _queued(i), (i, got)
        assert max(got.values(), default=1) == 1, (i, got)  # queued, never sent: no duplicate


async def test_restart_storm_graceful_and_kill9(tmp_path: Path) -> None:
    b = _Broker(tmp_path / "broker.db")
    await b.start()
    try:
        await _each(lambda i: _setup(b.port, i), DEVICES)
        for kill in (False, True):
            await _queue(b.port)
            await b.stop(kill)
            await b.start()
            await _storm(b)
    finally:
        if b.proc is not None:
            b.proc.kill()
            await b.proc.wait()
