"""The restart storm's load generator (benchmarks/bench_restart_storm.py, issue 27 item 4).

Raw MQTT 5 over ``asyncio.Protocol`` (no client library in the way), one process per slice of
the fleet, each connection bound to one of many loopback source addresses (127.0.x.y) so the
ephemeral port range is not the limit, and a window of at most ``window`` open connections
per process, so the broker never holds more descriptors than its limit allows (the waves of
the issue are a sliding window: a finished client frees its slot for the next one).  At most
``handshakes`` connections per process wait for their CONNACK at once: a burst larger than
the listener's accept queue (asyncio's default backlog is 100, mosquitto's too) has its
SYNs and handshake ACKs dropped and retried by the kernel after 1, 3, 7... seconds, which
measures the kernel, not the broker (the connection storm is issue 27 item 3).

Phases (each a function run in a worker process, returning a picklable result):

* ``setup``: client ``s<i>`` connects (a new session) with a Session Expiry Interval,
  subscribes to two filters at QoS 1, waits for the SUBACK and disconnects (session kept).
* ``queue``: one publisher sends ``queued`` QoS 1 messages to each session in the queued set
  (every ``every``-th) and waits for every PUBACK (the messages wait in the sessions' queues).
* ``storm``: every client reconnects with clean start off, checks CONNACK's session present
  flag, acknowledges each PUBLISH it receives, and disconnects once it has the messages
  queued for it (or after ``deadline`` seconds, counted as missing).

Two small helpers the other process-starting benchmarks share: :func:`free_port` and
:func:`wait_port` (the moment a started broker accepts connections).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Slice", "expected", "free_port", "queue_phase", "run_slice", "source_address", "wait_port"]

EXPIRY = 3600  # Session Expiry Interval of every device (seconds)


def source_address(i: int, addresses: int) -> str:
    """The loopback source address of connection ``i`` (127.0.<1..>.<1..250>)."""
    a = i % addresses
    return f"127.0.{1 + a // 250}.{1 + a % 250}"


def expected(i: int, every: int, queued: int) -> int:
    """Messages queued for session ``i`` by :func:`queue_phase`."""
    return queued if every and i % every == 0 else 0


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("!H", len(b)) + b


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        n, d = divmod(n, 128)
        out.append(d | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _frame(first: int, body: bytes) -> bytes:
    return bytes([first]) + _varint(len(body)) + body


def connect_packet(cid: str, clean: bool, expiry: int = EXPIRY) -> bytes:
    props = b"\x11" + struct.pack("!I", expiry)
    body = _str("MQTT") + bytes([5, 0x02 if clean else 0]) + struct.pack("!H", 600)
    return _frame(0x10, body + _varint(len(props)) + props + _str(cid))


def subscribe_packet(pid: int, filters: list[str]) -> bytes:
    body = struct.pack("!H", pid) + b"\x00" + b"".join(_str(f) + b"\x01" for f in filters)
    return _frame(0x82, body)


def publish_packet(topic: str, pid: int, payload: bytes) -> bytes:
    return _frame(0x32, _str(topic) + struct.pack("!H", pid) + b"\x00" + payload)


DISCONNECT = b"\xe0\x00"


def _parse(buf: bytearray) -> list[tuple[int, bytes]]:
    """Complete packets at the head of ``buf`` (removed from it): (first byte, body)."""
    out: list[tuple[int, bytes]] = []
    while len(buf) >= 2:
        n = mult = 0
        i = 1
        while True:
            if i >= len(buf):
                return out
            d = buf[i]
            n += (d & 0x7F) << mult
            mult += 7
            i += 1
            if not d & 0x80:
                break
        if len(buf) < i + n:
            return out
        out.append((buf[0], bytes(buf[i : i + n])))
        del buf[: i + n]
    return out


def _publish_fields(first: int, body: bytes) -> tuple[str, int, bytes]:
    """(topic, packet id, payload) of a v5 PUBLISH body."""
    tlen = struct.unpack_from("!H", body)[0]
    topic = body[2 : 2 + tlen].decode()
    pos = 2 + tlen
    pid = 0
    if first & 0x06:
        pid = struct.unpack_from("!H", body, pos)[0]
        pos += 2
    plen = mult = 0
    while True:
        d = body[pos]
        pos += 1
        plen += (d & 0x7F) << mult
        mult += 7
        if not d & 0x80:
            break
    return topic, pid, body[pos + plen :]


class _Proto(asyncio.Protocol):
    """One connection: ``on_packet(first, body)`` per packet, ``closed`` when it ends."""

    def __init__(self, on_packet: Callable[[int, bytes], None]) -> None:
        self.on_packet = on_packet
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.buf += data
        for first, body in _parse(self.buf):
            self.on_packet(first, body)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)


@dataclass
class Slice:
    """One worker's share of the fleet and its outcome."""

    phase: str
    ids: list[int]
    host: str
    port: int
    window: int
    addresses: int
    every: int = 10
    queued: int = 2
    deadline: float = 60.0
    handshakes: int = 24  # connections between connect() and CONNACK at once
    # outcome
    done: int = 0
    failed: int = 0
    present: int = 0
    not_present: int = 0
    messages: int = 0
    missing: int = 0
    duplicates: int = 0
    unexpected: int = 0
    connack_ms: list[float] = field(default_factory=list)
    first_error: str = ""
    started: float = 0.0
    finished: float = 0.0
    cpu: float = 0.0


async def _client(sl: Slice, i: int, t_ready: float, handshakes: asyncio.Semaphore) -> None:
    loop = asyncio.get_running_loop()
    setup = sl.phase == "setup"
    want = 0 if setup else expected(i, sl.every, sl.queued)
    got: dict[bytes, int] = {}
    connack: asyncio.Future[tuple[bool, int]] = loop.create_future()
    enough: asyncio.Future[None] = loop.create_future()
    if want == 0 and not setup:
        enough.set_result(None)

    def on_packet(first: int, body: bytes) -> None:
        kind = first >> 4
        if kind == 2 and not connack.done():  # CONNACK
            connack.set_result((bool(body[0] & 1), body[1]))
        elif kind == 9 and not enough.done():  # SUBACK
            enough.set_result(None)
        elif kind == 3:  # PUBLISH
            _topic, pid, payload = _publish_fields(first, body)
            if pid:
                proto.send(b"\x40\x02" + struct.pack("!H", pid))
            got[payload] = got.get(payload, 0) + 1
            if len(got) >= want and not enough.done():
                enough.set_result(None)

    proto = _Proto(on_packet)
    src = source_address(i, sl.addresses)
    try:
        async with handshakes:  # the listener's accept queue (backlog) is not overrun
            t0 = time.monotonic()
            await loop.create_connection(lambda: proto, sl.host, sl.port, local_addr=(src, 0))
            # clean start off in both phases: the session is new at setup anyway, and mosquitto
            # 2.0 does not save a session whose CONNECT had clean start on (expiry or not)
            proto.send(connect_packet(f"s{i}", False))
            if setup:
                proto.send(subscribe_packet(1, [f"fleet/{i}/cmd", f"fleet/{i}/cfg/#"]))
            present, rc = await asyncio.wait_for(asyncio.shield(connack), sl.deadline)
        if rc != 0:
            raise RuntimeError(f"CONNACK reason {rc:#x}")
        sl.connack_ms.append((time.monotonic() - t0) * 1000)
        if not setup:
            sl.present += present
            sl.not_present += not present
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(enough), max(0.1, t_ready + sl.deadline - time.monotonic()))
        if setup and not enough.done():
            raise RuntimeError("no SUBACK")
        sl.messages += sum(got.values())
        sl.duplicates += sum(n - 1 for n in got.values())
        wanted = {f"{i}:{k}".encode() for k in range(want)}
        sl.missing += len(wanted - got.keys())
        sl.unexpected += len(got.keys() - wanted)
        proto.send(DISCONNECT)
        sl.done += 1
    except (OSError, RuntimeError, TimeoutError) as exc:
        sl.failed += 1
        sl.missing += want
        if not sl.first_error:
            sl.first_error = f"s{i}: {exc!r}"
    finally:
        if proto.transport is not None:
            proto.transport.close()


async def _run(sl: Slice) -> Slice:
    sem = asyncio.Semaphore(sl.window)
    handshakes = asyncio.Semaphore(sl.handshakes)
    t_ready = time.monotonic()

    async def one(i: int) -> None:
        async with sem:
            await _client(sl, i, time.monotonic() if sl.phase == "setup" else t_ready, handshakes)

    sl.started = time.time()
    await asyncio.gather(*(one(i) for i in sl.ids))
    sl.finished = time.time()
    return sl


def run_slice(sl: Slice) -> Slice:
    """Worker process entry: run one phase over ``sl.ids`` (uvloop when installed)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        import uvloop

        runner: Callable[[Any], Slice] = uvloop.run
    except ImportError:
        runner = asyncio.run
    c0 = time.process_time()
    out = runner(_run(sl))
    out.cpu = time.process_time() - c0
    out.connack_ms = sorted(out.connack_ms)[:: max(1, len(out.connack_ms) // 2000)]  # a sample
    return out


async def _queue(host: str, port: int, targets: list[int], queued: int, window: int) -> int:
    loop = asyncio.get_running_loop()
    free = asyncio.Semaphore(window)
    acked = 0
    all_done: asyncio.Future[None] = loop.create_future()
    total = len(targets) * queued
    connack: asyncio.Future[None] = loop.create_future()

    def on_packet(first: int, body: bytes) -> None:
        nonlocal acked
        kind = first >> 4
        if kind == 2 and not connack.done():
            connack.set_result(None)
        elif kind == 4:
            acked += 1
            free.release()
            if acked == total and not all_done.done():
                all_done.set_result(None)

    proto = _Proto(on_packet)
    await loop.create_connection(lambda: proto, host, port)
    proto.send(connect_packet("storm-publisher", True, 0))
    await asyncio.wait_for(connack, 30)
    pid = 0
    for i in targets:
        for k in range(queued):
            await free.acquire()
            pid = pid % 65535 + 1
            proto.send(publish_packet(f"fleet/{i}/cmd", pid, f"{i}:{k}".encode()))
    if total:
        await asyncio.wait_for(all_done, 120)
    proto.send(DISCONNECT)
    assert proto.transport is not None
    proto.transport.close()
    return acked


def queue_phase(host: str, port: int, n: int, every: int, queued: int) -> int:
    """Publish the queued messages (phase ``queue``); the number acknowledged."""
    targets = [i for i in range(n) if expected(i, every, queued)]
    return asyncio.run(_queue(host, port, targets, queued, 200))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[Any], timeout: float = 120) -> float:
    """Poll (every 5 ms) until ``port`` accepts a TCP connection; the ``time.monotonic()`` it
    did. RuntimeError if ``proc`` exits or ``timeout`` passes first (bench_footprint.py,
    bench_restart_storm.py: a broker's start-up time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return time.monotonic()
        except OSError:
            time.sleep(0.005)
    raise RuntimeError("broker did not open its port")
