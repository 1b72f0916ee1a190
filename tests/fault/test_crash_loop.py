"""``kill -9`` loop under QoS 1 and QoS 2 load (issue 7, item 5): nothing acknowledged is lost.

A broker subprocess with a file store (``BrokerConfig.store_path``) serves a QoS 1 and a
QoS 2 publisher and a persistent subscriber; it is SIGKILLed at a random moment under load,
restarted on the same database (port 0: the child prints its port), and so on for N cycles.
After a last restart the publishers finish their in-flight messages, and the checker requires:
every message acknowledged at QoS 1 (PUBACK) arrived at least once, every message acknowledged
at QoS 2 (PUBREC) arrived exactly once, and nothing arrived that was never published.

The clients keep their state across broker restarts like Paho does (persistent sessions,
in-flight messages resent with DUP, PUBREL resent), and the subscriber hands a QoS 2 message to
the application when PUBREL arrives (MQTT 5 section 4.3.3, Paho's behaviour).

CI runs ``SIFTMQ_CRASH_CYCLES`` cycles (default 3); by hand:
``.venv/bin/python -m tests.fault.test_crash_loop --cycles 50 --seed 1`` prints the figures
of docs/persistence.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from broker.packets import (
    Connack,
    Connect,
    Decoder,
    Packet,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Will,
    encode,
)
from tests.fault._broker_process import TIMEOUT, start_broker

EXPIRY = Properties(session_expiry_interval=3600)
WINDOW = 16  # messages in flight per publisher
LOST_WAIT = 3.0  # seconds the final check waits for acknowledged messages still on their way


class _Client:
    """A minimal MQTT 5 client whose session state outlives its connections (like Paho)."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.writer: asyncio.StreamWriter | None = None
        self.changed = asyncio.Event()  # set on every packet handled
        self.connected_once = False

    def send(self, p: Packet) -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(encode(p, 5))

    async def run(self, port: int, ready: asyncio.Event) -> None:
        """One connection: CONNECT, resume, then handle packets until the broker goes away."""
        reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        decoder = Decoder(5, server=False)
        try:
            self.send(Connect(self.client_id, 5, clean_start=not self.connected_once, properties=EXPIRY))
            self.connected_once = True
            first = True
            while True:
                try:
                    data = await reader.read(65536)
                except ConnectionError:
                    return
                if not data:
                    return
                for p in decoder.feed(data):
                    if first:
                        assert isinstance(p, Connack) and int(p.reason_code) == 0, p
                        first = False
                        self.resume(p.session_present)
                        ready.set()
                        continue
                    self.handle(p)
                self.changed.set()
        finally:
            self.writer.close()
            self.writer = None

    def resume(self, present: bool) -> None:
        raise NotImplementedError

    def handle(self, p: Packet) -> None:
        raise NotImplementedError


class _Publisher(_Client):
    def __init__(self, client_id: str, qos: int) -> None:
        super().__init__(client_id)
        self.qos = qos
        self.seq = 0
        self.next_pid = 1
        self.inflight: dict[int, list[object]] = {}  # pid -> [payload, 0 PUBLISH sent | 1 PUBREL sent]
        self.acked: set[bytes] = set()
        self.published: set[bytes] = set()
        self.publishing = True

    def resume(self, present: bool) -> None:
        for pid, (payload, state) in self.inflight.items():
            if state == 0:
                assert isinstance(payload, bytes)
                self.send(Publish("load/" + self.client_id, payload, self.qos, packet_id=pid, dup=True))
            else:
                self.send(Pubrel(pid))
        self.fill()

    def fill(self) -> None:
        while self.publishing and len(self.inflight) < WINDOW and self.writer is not None:
            pid = self.next_pid
            self.next_pid = pid % 65535 + 1
            self.seq += 1
            payload = f"{self.client_id}-{self.seq}".encode()
            self.published.add(payload)
            self.inflight[pid] = [payload, 0]
            self.send(Publish("load/" + self.client_id, payload, self.qos, packet_id=pid))

    def handle(self, p: Packet) -> None:
        match p:
            case Puback(packet_id=pid) if pid in self.inflight:
                assert int(p.reason_code) < 0x80, p
                payload = self.inflight.pop(pid)[0]
                assert isinstance(payload, bytes)
                self.acked.add(payload)
            case Pubrec(packet_id=pid) if pid in self.inflight:
                assert int(p.reason_code) < 0x80, p
                entry = self.inflight[pid]
                assert isinstance(entry[0], bytes)
                self.acked.add(entry[0])
                entry[1] = 1
                self.send(Pubrel(pid))
            case Pubcomp(packet_id=pid) if pid in self.inflight:
                del self.inflight[pid]
            case _:
                pass
        self.fill()


class _Subscriber(_Client):
    def __init__(self, client_id: str) -> None:
        super().__init__(client_id)
        self.delivered: dict[int, Counter[bytes]] = {1: Counter(), 2: Counter()}
        self.awaiting: dict[int, bytes] = {}  # QoS 2 pid -> message until PUBREL (method B)
        self.subscribed = False

    def resume(self, present: bool) -> None:
        if not present:  # a kill before the commit of our session: subscribe again (as apps do)
            self.subscribed = False
        if not self.subscribed:
            self.send(Subscribe(1, (SubscriptionRequest("load/#", 2),)))

    def handle(self, p: Packet) -> None:
        match p:
            case Suback():
                self.subscribed = True
            case Publish(qos=1, packet_id=pid):
                self.delivered[1][p.payload] += 1
                self.send(Puback(pid or 0))
            case Publish(qos=2, packet_id=pid):
                self.awaiting[pid or 0] = p.payload
                self.send(Pubrec(pid or 0))
            case Pubrel(packet_id=pid):
                payload = self.awaiting.pop(pid, None)
                if payload is not None:
                    self.delivered[2][payload] += 1
                self.send(Pubcomp(pid))
            case _:
                pass


@dataclass
class CrashReport:
    cycles: int = 0
    kills_after: list[float] = field(default_factory=list, repr=False)
    published: dict[int, int] = field(default_factory=dict)
    acked: dict[int, int] = field(default_factory=dict)
    delivered: dict[int, int] = field(default_factory=dict)
    duplicates: dict[int, int] = field(default_factory=dict)
    lost: dict[int, int] = field(default_factory=dict)
    unknown: int = 0

    def ok(self) -> bool:
        return not any(self.lost.values()) and not self.duplicates[2] and not self.unknown


async def _start(db: Path) -> tuple[asyncio.subprocess.Process, int]:
    # queue bound out of the way: this test is about crashes, not about queue overflow
    return await start_broker(db, max_queued_messages=10**6)


async def _until(cond: Callable[[], bool], clients: list[_Client], timeout: float = TIMEOUT) -> bool:
    """Wait (event-driven) until ``cond()`` holds; False if it still does not after ``timeout``."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            while not cond():
                waits = [asyncio.ensure_future(c.changed.wait()) for c in clients]
                for c in clients:
                    c.changed.clear()
                if cond():
                    for w in waits:
                        w.cancel()
                    break
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
    return cond()


async def crash_loop(cycles: int, data_dir: Path, seed: int) -> CrashReport:
    """Run ``cycles`` kill -9 cycles plus a final drain; return the figures."""
    rng = random.Random(seed)
    db = data_dir / "broker.db"
    sub = _Subscriber("sub")
    pubs = [_Publisher("q1", 1), _Publisher("q2", 2)]
    clients: list[_Client] = [sub, *pubs]
    report = CrashReport(cycles=cycles)
    for cycle in range(cycles + 1):
        proc, port = await _start(db)
        try:
            ready = [asyncio.Event() for _ in clients]
            sub_task = asyncio.create_task(sub.run(port, ready[0]))
            await asyncio.wait_for(ready[0].wait(), TIMEOUT)
            assert await _until(lambda: sub.subscribed, clients)
            tasks = [sub_task] + [
                asyncio.create_task(p.run(port, ev)) for p, ev in zip(pubs, ready[1:], strict=True)
            ]
            for ev in ready:
                await asyncio.wait_for(ev.wait(), TIMEOUT)
            if cycle < cycles:
                delay = rng.uniform(0.05, 0.6)
                report.kills_after.append(delay)
                await asyncio.sleep(delay)  # load runs for a random time: the kill point
            else:  # last start: finish what is in flight and let the subscriber receive it
                for p in pubs:
                    p.publishing = False
                assert await _until(lambda: all(not p.inflight for p in pubs), clients)
                # then wait a little for acknowledged messages still on their way; the report
                # says what is missing after that
                await _until(
                    lambda: all(m in sub.delivered[p.qos] for p in pubs for m in p.acked),
                    clients,
                    LOST_WAIT,
                )
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
            await proc.wait()
        await asyncio.gather(*tasks, return_exceptions=True)
    for p in pubs:
        got = sub.delivered[p.qos]
        report.published[p.qos] = len(p.published)
        report.acked[p.qos] = len(p.acked)
        report.delivered[p.qos] = sum(got.values())
        report.duplicates[p.qos] = sum(n - 1 for n in got.values() if n > 1)
        report.lost[p.qos] = len(p.acked - set(got))
        report.unknown += len(set(got) - p.published)
    return report


async def test_kill_9_loop_loses_no_acknowledged_message(tmp_path: Path) -> None:
    cycles = int(os.environ.get("SIFTMQ_CRASH_CYCLES", "3"))
    seed = int(os.environ.get("SIFTMQ_CRASH_SEED", str(random.randrange(1 << 30))))
    report = await crash_loop(cycles, tmp_path, seed)
    assert report.acked[1] > 0 and report.acked[2] > 0, report
    assert report.lost == {1: 0, 2: 0}, (seed, report)
    assert report.duplicates[2] == 0, (seed, report)
    assert report.unknown == 0, (seed, report)
    # after the final drain every published message was acknowledged
    assert report.acked == report.published, (seed, report)


async def _raw(port: int, connect: Connect) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode(connect, 5))
    ack = Decoder(5, server=False).feed(await asyncio.wait_for(reader.read(65536), TIMEOUT))
    assert ack and isinstance(ack[0], Connack) and int(ack[0].reason_code) == 0, ack
    return reader, writer


async def test_will_of_a_client_connected_at_kill_9_is_published_after_its_delay(tmp_path: Path) -> None:
    db = tmp_path / "broker.db"
    will = Will("wills/w", b"w died", 1, False, Properties(will_delay_interval=1))
    proc, port = await _start(db)
    try:
        _, w = await _raw(port, Connect("w", 5, clean_start=True, will=will, properties=EXPIRY))
        reader, watcher = await _raw(port, Connect("watch", 5, clean_start=True, properties=EXPIRY))
        watcher.write(encode(Subscribe(1, (SubscriptionRequest("wills/#", 1),)), 5))
        # the SUBACK of a persisted session comes after the commit that stored the subscription
        # (and the CONNACKs after the commits of the sessions and the will)
        dec = Decoder(5, server=False)
        seen: list[Packet] = []
        while not any(isinstance(p, Suback) for p in seen):
            data = await asyncio.wait_for(reader.read(65536), TIMEOUT)
            assert data, "broker closed the connection"
            seen += dec.feed(data)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    w.close()
    watcher.close()
    proc, port = await _start(db)
    try:
        reader, watcher = await _raw(port, Connect("watch", 5, clean_start=False, properties=EXPIRY))
        dec = Decoder(5, server=False)
        wills: list[Publish] = []
        while not wills:  # the will comes once its delay has run after the restart
            data = await asyncio.wait_for(reader.read(65536), TIMEOUT)
            assert data, "broker closed the connection"
            wills += [p for p in dec.feed(data) if isinstance(p, Publish) and p.topic == "wills/w"]
        assert [(p.topic, p.payload) for p in wills] == [("wills/w", b"w died")]
        watcher.close()
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-dir", type=Path, default=None)
    args = ap.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        report = asyncio.run(crash_loop(args.cycles, args.data_dir or Path(tmp), args.seed))
    print(report)
    for qos in (1, 2):
        print(
            f"QoS {qos}: published {report.published[qos]}, acknowledged {report.acked[qos]}, "
            f"delivered {report.delivered[qos]}, duplicates {report.duplicates[qos]}, "
            f"acknowledged but lost {report.lost[qos]}"
        )
    print("OK" if report.ok() else "FAILED")
    sys.exit(0 if report.ok() else 1)


if __name__ == "__main__":
    main()
