"""Fleet connection generator (issue 27, item 6): many idle devices, many source addresses.

One worker process opens ``FleetPlan.count`` MQTT connections, each bound to one of the
plan's loopback source addresses (``127.0.x.y``: all of 127.0.0.0/8 is local on Linux), so
the ephemeral port range (~28,000 ports per source/destination pair) is not the limit; it
raises its own descriptor limit to the hard limit. The driver runs several workers so that
no process holds more than its descriptors allow and the generator is not the bottleneck
(each worker reports its CPU time, shown beside the broker's).

A device: TCP (or TLS) connect, CONNECT (clean session, keep-alive), on CONNACK 0 one
SUBSCRIBE to ``<prefix>/<index>/cmd``, then idle. All of a worker's devices start at once
on "go" (a storm); the worker reports per device the CONNACK latency from the start of its
TCP connect, refusals by reason code, and failures (closed or reset before CONNACK), then
holds the connections until "close". One uvloop loop per worker, raw protocols, no task
per device after the connect.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import ssl
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

__all__ = ["FleetPlan", "FleetResult", "fleet_main", "sources"]


def sources(n: int) -> tuple[str, ...]:
    """``n`` loopback source addresses 127.0.1.1, 127.0.1.2, ... (x.y never 0 or 255)."""
    out = []
    for i in range(n):
        out.append(f"127.0.{1 + i // 250}.{1 + i % 250}")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class FleetPlan:
    port: int
    first: int  # index of the worker's first device
    count: int
    sources: tuple[str, ...]
    tls: bool = False
    keep_alive: int = 600
    subscribe: bool = True
    prefix: str = "dev"
    deadline: float = 120.0  # seconds after "go" by which every device must be decided


@dataclass(slots=True)
class FleetResult:
    connack_s: list[float] = field(default_factory=list)  # accepted devices: seconds to CONNACK
    refused: dict[int, int] = field(default_factory=dict)  # CONNACK reason code -> devices
    failed: int = 0  # closed, reset or not answered before the deadline
    errors: dict[str, int] = field(default_factory=dict)  # why they failed
    subscribed: int = 0
    first_start: float = 0.0  # wall clock of the storm's start and of its last CONNACK
    last_connack: float = 0.0
    cpu_s: float = 0.0  # this worker's user + system CPU during the storm


def _connect(client_id: str, keep_alive: int) -> bytes:
    cid = client_id.encode()
    var = b"\x00\x04MQTT\x04\x02" + keep_alive.to_bytes(2, "big")
    body = var + len(cid).to_bytes(2, "big") + cid
    return bytes([0x10, len(body)]) + body


def _subscribe(topic: str) -> bytes:
    t = topic.encode()
    body = b"\x00\x01" + len(t).to_bytes(2, "big") + t + b"\x01"
    return bytes([0x82, len(body)]) + body


class _Device(asyncio.Protocol):
    __slots__ = ("fleet", "hello", "state", "sub", "t0", "transport")

    def __init__(self, fleet: _Fleet, hello: bytes, sub: bytes | None) -> None:
        self.fleet = fleet
        self.hello = hello
        self.sub = sub
        self.t0 = time.perf_counter()
        self.state = 0  # 0 connecting, 1 CONNACKed, 2 subscribed / done, -1 failed
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(self.hello)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        fleet = self.fleet
        if self.state == 0 and data[0] == 0x20 and len(data) >= 4:
            rc = data[3]
            if rc:
                fleet.result.refused[rc] = fleet.result.refused.get(rc, 0) + 1
                self.state = -2
                fleet.decided()
                return
            now = time.perf_counter()
            fleet.result.connack_s.append(now - self.t0)
            fleet.result.last_connack = time.time()
            self.state = 1
            if self.sub is None:
                self.state = 2
                fleet.decided()
                return
            assert self.transport is not None
            self.transport.write(self.sub)
            data = data[4:]
            if not data:
                return
        if self.state == 1 and data[:1] == b"\x90":
            self.state = 2
            fleet.result.subscribed += 1
            fleet.decided()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state in (0, 1):
            self.state = -1
            self.fleet.failed(f"closed after connect: {exc!r}"[:80])


class _Fleet:
    def __init__(self, plan: FleetPlan) -> None:
        self.plan = plan
        self.result = FleetResult()
        self.pending = plan.count
        self.all_decided = asyncio.Event()
        self.devices: list[_Device] = []

    def failed(self, why: str) -> None:
        self.result.failed += 1
        self.result.errors[why] = self.result.errors.get(why, 0) + 1
        self.decided()

    def decided(self) -> None:
        self.pending -= 1
        if self.pending <= 0:
            self.all_decided.set()

    async def open(self, i: int, ctx: ssl.SSLContext | None) -> None:
        plan = self.plan
        n = plan.first + i
        dev = _Device(
            self,
            _connect(f"{plan.prefix}{n}", plan.keep_alive),
            _subscribe(f"{plan.prefix}/{n}/cmd") if plan.subscribe else None,
        )
        self.devices.append(dev)
        src = plan.sources[n % len(plan.sources)]
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            # the socket bound here: create_connection(local_addr=...) would resolve both
            # addresses in the loop's thread pool, one device at a time
            sock.setblocking(False)
            sock.bind((src, 0))
            await loop.sock_connect(sock, ("127.0.0.1", plan.port))
            await loop.create_connection(
                lambda: dev, sock=sock, ssl=ctx, server_hostname="localhost" if ctx else None
            )
        except OSError as exc:
            sock.close()
            if dev.state == 0:
                dev.state = -1
                self.failed(f"connect: {exc!r}"[:80])


async def _run(pipe: Connection, plan: FleetPlan) -> None:
    loop = asyncio.get_running_loop()
    ctx: ssl.SSLContext | None = None
    if plan.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    fleet = _Fleet(plan)
    pipe.send("ready")
    await loop.run_in_executor(None, pipe.recv)  # "go"
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    fleet.result.first_start = time.time()
    tasks = [loop.create_task(fleet.open(i, ctx)) for i in range(plan.count)]
    try:
        await asyncio.wait_for(fleet.all_decided.wait(), plan.deadline)
    except TimeoutError:
        undecided = sum(1 for d in fleet.devices if d.state in (0, 1)) + plan.count - len(fleet.devices)
        fleet.result.failed += undecided
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    fleet.result.cpu_s = ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime
    pipe.send(fleet.result)
    await loop.run_in_executor(None, pipe.recv)  # "close"
    for t in tasks:
        t.cancel()
    for d in fleet.devices:
        if d.transport is not None:
            d.transport.abort()
    pipe.send("closed")


def fleet_main(pipe: Connection, plan: FleetPlan) -> None:
    """Worker process entry: ``ready`` -> wait "go" -> storm -> FleetResult -> wait "close"."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        import uvloop

        uvloop.run(_run(pipe, plan))
    except ImportError:
        asyncio.run(_run(pipe, plan))
