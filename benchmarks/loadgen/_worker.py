"""Load-generator worker: one process, one uvloop event loop, raw ``asyncio.Protocol`` sockets.

A worker connects every client of its :class:`WorkerPlan`, performs the setup (SUBSCRIBE /
UNSUBSCRIBE, waiting for each acknowledgement), reports ready, then on "go" runs traffic until the
end of the measurement window and reports a :class:`WorkerResult`.

Hot path: publishers write pre-rendered :class:`Block`s (one ``bytes.join`` per block, one
``transport.write``); subscribers scan frames in ``data_received`` with integer indexing on the
received ``bytes``, read the payload timestamp with one slice + ``int`` and batch QoS 1 PUBACKs
into one write per read. Pacing is closed loop: a group keeps at most ``window`` expected
deliveries outstanding and refills on receipt, so the generator runs at the broker's pace
without building unbounded queues. A watchdog forgives deliveries a broker dropped (counted as
``lost``) so a lossy broker cannot stall a group. Costs: O(1) per received frame, O(bytes) per
sent block.
"""

from __future__ import annotations

import asyncio
import os
import random
import resource
import time
from multiprocessing.connection import Connection

from ._codec import TS_BIAS, Block, ts_bytes
from ._plan import ClientSpec, GroupSpec, RetainedSpec, WorkerPlan, WorkerResult

__all__ = ["worker_main"]

_SAMPLE_MAX = 100_000


class _Stats:
    __slots__ = ("latencies", "recording")

    def __init__(self) -> None:
        self.recording = False
        self.latencies: list[int] = []


class _Group:
    """Pacing state of one :class:`GroupSpec`. O(1) per receive; a refill is O(blocks written)."""

    __slots__ = (
        "blocks",
        "bpos",
        "last_progress",
        "last_received",
        "lost",
        "low",
        "pubs",
        "rate",
        "received",
        "rr",
        "running",
        "sent_expected",
        "sent_msgs",
        "t0",
        "window",
    )

    def __init__(self, spec: GroupSpec) -> None:
        self.pubs: list[_Conn] = []
        self.blocks: list[tuple[Block, ...]] = [p.blocks for p in spec.publishers]
        self.bpos: list[int] = [0] * len(spec.publishers)
        self.window = spec.window
        self.low = spec.window // 2
        self.rate = spec.rate
        self.received = 0
        self.sent_expected = 0
        self.sent_msgs = 0
        self.lost = 0
        self.rr = 0
        self.running = False
        self.t0 = 0
        self.last_received = 0
        self.last_progress = 0

    def _check(self) -> None:
        # received may pass sent_expected after the watchdog forgave late deliveries
        assert self.sent_expected >= 0 and self.lost >= 0 and self.sent_msgs >= 0
        assert len(self.bpos) == len(self.blocks) == (len(self.pubs) or len(self.blocks))
        assert all(0 <= i < len(bl) for i, bl in zip(self.bpos, self.blocks, strict=True))
        assert 0 <= self.low <= self.window

    def _send(self, budget_msgs: int, out_cap: int) -> None:
        pubs = self.pubs
        npubs = len(pubs)
        blocks = self.blocks
        bpos = self.bpos
        ts = ts_bytes(time.monotonic_ns())
        out = self.sent_expected - self.received
        sent = 0
        while out < out_cap and sent < budget_msgs:
            k = self.rr
            self.rr = (k + 1) % npubs
            bl = blocks[k]
            i = bpos[k]
            b = bl[i]
            bpos[k] = (i + 1) % len(bl)
            tr = pubs[k].transport
            assert tr is not None
            tr.write(b.render(ts))
            out += b.expected
            self.sent_expected += b.expected
            sent += b.count
        self.sent_msgs += sent

    def pump(self) -> None:
        """Closed loop: refill to ``window`` once outstanding fell below half of it."""
        if self.running and not self.rate and self.sent_expected - self.received <= self.low:
            self._send(1 << 62, self.window)

    def tick(self) -> None:
        """Open loop: publish what the rate allows so far (1 ms timer)."""
        if not self.running:
            return
        due = int(self.rate * (time.monotonic_ns() - self.t0) / 1e9) - self.sent_msgs
        if due > 0:
            self._send(due, self.window)
        asyncio.get_running_loop().call_later(0.001, self.tick)

    def watchdog(self, now: int) -> None:
        if self.received != self.last_received:
            self.last_received = self.received
            self.last_progress = now
        elif self.sent_expected > self.received and now - self.last_progress > 1_000_000_000:
            self.lost += self.sent_expected - self.received
            self.sent_expected = self.received
            self.last_progress = now
            self.pump()


class _Conn(asyncio.Protocol):
    """One MQTT connection; parses frames, counts PUBLISHes, acks QoS 1, resolves control waits."""

    __slots__ = (
        "acks",
        "count",
        "count_target",
        "count_waiter",
        "group",
        "lost_conn",
        "rest",
        "stats",
        "target",
        "transport",
        "v5",
        "waiter",
    )

    def __init__(self, stats: _Stats, group: _Group | None, v5: bool) -> None:
        self.transport: asyncio.Transport | None = None
        self.stats = stats
        self.group = group
        self.v5 = v5
        self.rest = b""
        self.acks = 0  # control acknowledgements seen (CONNACK, SUBACK, UNSUBACK, PUBACK, PINGRESP)
        self.target = 0
        self.waiter: asyncio.Future[None] | None = None
        self.count = 0  # PUBLISH frames received
        self.count_target = 0
        self.count_waiter: asyncio.Future[None] | None = None
        self.lost_conn: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost_conn.done():
            self.lost_conn.set_result(None)
        w = self.waiter
        if w is not None and not w.done():
            w.set_exception(ConnectionError(f"connection lost: {exc}"))

    def wait_acks(self, n: int) -> asyncio.Future[None]:
        """A future done once ``n`` more control acknowledgements arrived."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.target = self.acks + n
        self.waiter = fut
        if self.acks >= self.target:
            fut.set_result(None)
        return fut

    def wait_count(self, n: int) -> asyncio.Future[None]:
        """A future done once ``n`` more PUBLISH frames arrived."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.count_target = self.count + n
        self.count_waiter = fut
        return fut

    def data_received(self, data: bytes) -> None:
        if self.rest:
            data = self.rest + data
            self.rest = b""
        n = len(data)
        i = 0
        got = 0
        acks = 0
        pubacks: list[bytes] | None = None
        lat = self.stats.latencies if self.stats.recording else None
        now = time.monotonic_ns() + TS_BIAS
        v5 = self.v5
        while i + 1 < n:
            b0 = data[i]
            ln = data[i + 1]
            j = i + 2
            if ln >= 128:
                ln &= 0x7F
                mult = 128
                while True:
                    if j >= n:
                        ln = -1
                        break
                    b = data[j]
                    j += 1
                    ln += (b & 0x7F) * mult
                    mult <<= 7
                    if b < 128:
                        break
                if ln < 0:
                    break
            end = j + ln
            if end > n:
                break
            if b0 >> 4 == 3:
                got += 1
                p = j + 2 + ((data[j] << 8) | data[j + 1])
                if b0 & 6:
                    if pubacks is None:
                        pubacks = []
                    pubacks.append(b"\x40\x02" + data[p : p + 2])
                    p += 2
                if v5:
                    p += 1 + data[p]  # property length < 128 (the generator sends none)
                if lat is not None:
                    try:  # noqa: SIM105 - cheaper than contextlib.suppress per message
                        lat.append(now - int(data[p + 6 : p + 25]))
                    except ValueError:  # not one of our payloads
                        pass
            else:
                acks += 1
            i = end
        if i < n:
            self.rest = data[i:]
        if pubacks is not None and self.transport is not None:
            self.transport.write(b"".join(pubacks))
        if got:
            self.count += got
            g = self.group
            if g is not None:
                g.received += got
                g.pump()
        if acks:
            self.acks += acks
            w = self.waiter
            if w is not None and self.acks >= self.target and not w.done():
                w.set_result(None)
        cw = self.count_waiter
        if cw is not None and self.count >= self.count_target and not cw.done():
            cw.set_result(None)


async def _open(
    host: str, port: int, spec_connect: bytes, stats: _Stats, group: _Group | None, v5: bool
) -> _Conn:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(lambda: _Conn(stats, group, v5), host, port)
    assert proto.transport is not None
    fut = proto.wait_acks(1)
    proto.transport.write(spec_connect)
    await asyncio.wait_for(fut, 60)
    return proto


async def _setup(conn: _Conn, spec: ClientSpec) -> None:
    if spec.setup:
        fut = conn.wait_acks(len(spec.setup))
        assert conn.transport is not None
        conn.transport.write(b"".join(spec.setup))
        await asyncio.wait_for(fut, 120)


async def _gather_limited(coros: list, limit: int) -> list:  # type: ignore[type-arg]
    out = []
    for k in range(0, len(coros), limit):
        out.extend(await asyncio.gather(*coros[k : k + limit]))
    return out


async def _retained_loop(
    conn: _Conn, spec: RetainedSpec, res: WorkerResult, stats: _Stats, stop: asyncio.Event
) -> None:
    """SUBSCRIBE again and again to the same filter: each one re-sends every matching retained
    message (MQTT 3.1.1 [MQTT-3.8.4-3], 5.0 Retain Handling 0), so no UNSUBSCRIBE is needed."""
    tr = conn.transport
    assert tr is not None
    while not stop.is_set():
        t0 = time.monotonic_ns()
        start = conn.count
        flood = conn.wait_count(spec.expected)
        fut = conn.wait_acks(1)
        tr.write(spec.subscribe)
        await fut
        try:
            await asyncio.wait_for(flood, 10)
        except TimeoutError:  # the broker sent fewer than all retained messages
            if stats.recording:
                res.lost += spec.expected - (conn.count - start)
            continue
        if stats.recording:
            res.cycle_ns.append(time.monotonic_ns() - t0)


async def _run(plan: WorkerPlan, host: str, port: int, pipe: Connection, ready: list[bool]) -> WorkerResult:
    loop = asyncio.get_running_loop()
    stats = _Stats()
    res = WorkerResult()
    t_setup = time.perf_counter()
    groups: list[_Group] = []
    conns: list[_Conn] = []
    for gs in plan.groups:
        g = _Group(gs)
        groups.append(g)
        subs = await _gather_limited(
            [_open(host, s.port or port, s.connect, stats, g, s.version == 5) for s in gs.subscribers], 200
        )
        pubs = await _gather_limited(
            [_open(host, s.port or port, s.connect, stats, None, s.version == 5) for s in gs.publishers], 200
        )
        g.pubs = pubs
        conns += subs + pubs
        await _gather_limited([_setup(c, s) for c, s in zip(subs, gs.subscribers, strict=True)], 200)
    idle = await _gather_limited([_open(host, port, c, stats, None, False) for c in plan.idle], 500)
    conns += idle
    rsubs: list[_Conn] = []
    if plan.retained is not None:
        rs = plan.retained
        quiet = _Stats()  # retained payloads carry stale timestamps: never sampled
        pre = await _open(host, port, rs.prefill.connect, quiet, None, False)
        await _setup(pre, rs.prefill)
        conns.append(pre)
        rsubs = await _gather_limited(
            [_open(host, port, s.connect, quiet, None, False) for s in rs.subscribers], 200
        )
        conns += rsubs
    res.connections = len(conns)
    res.setup_s = time.perf_counter() - t_setup
    pipe.send(("ready", res.setup_s, res.connections))
    ready[0] = True
    msg = await loop.run_in_executor(None, pipe.recv)
    _, t_start, t_end = msg
    stop = asyncio.Event()
    for g in groups:
        g.running = True
        g.t0 = time.monotonic_ns()
        g.last_progress = g.t0
        if g.rate:
            g.tick()
        else:
            g.pump()
    tasks = []
    if plan.retained is not None:
        tasks = [asyncio.ensure_future(_retained_loop(c, plan.retained, res, stats, stop)) for c in rsubs]

    async def watchdog() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.1)
            now = time.monotonic_ns()
            for g in groups:
                g.watchdog(now)

    wd = asyncio.ensure_future(watchdog())
    await asyncio.sleep(max(0.0, (t_start - time.monotonic_ns()) / 1e9))
    d0 = sum(g.received for g in groups) + sum(c.count for c in rsubs)
    p0 = sum(g.sent_msgs for g in groups)
    l0 = sum(g.lost for g in groups)
    c0 = time.process_time()
    w0 = time.monotonic_ns()
    stats.recording = True
    await asyncio.sleep(max(0.0, (t_end - time.monotonic_ns()) / 1e9))
    stats.recording = False
    res.window_s = (time.monotonic_ns() - w0) / 1e9
    res.cpu_s = time.process_time() - c0
    res.delivered = sum(g.received for g in groups) + sum(c.count for c in rsubs) - d0
    res.published = sum(g.sent_msgs for g in groups) - p0
    res.lost += sum(g.lost for g in groups) - l0
    stop.set()
    for g in groups:
        g.running = False
    for t in tasks:
        t.cancel()
    wd.cancel()
    lat = stats.latencies
    if len(lat) > _SAMPLE_MAX:
        lat = random.Random(1).sample(lat, _SAMPLE_MAX)
    res.latencies_ns = lat
    for c in conns:
        if c.transport is not None:
            c.transport.write(b"\xe0\x00")  # DISCONNECT
            c.transport.close()
    return res


def worker_main(plan: WorkerPlan, host: str, port: int, cpus: list[int], pipe: Connection) -> None:
    """Process entry point: pin to ``cpus``, raise the descriptor limit, run the plan."""
    if cpus:
        os.sched_setaffinity(0, set(cpus))
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ready = [False]
    try:
        import uvloop

        res = uvloop.run(_run(plan, host, port, pipe, ready))
    except Exception as e:  # reported to the driver, which prints it
        res = WorkerResult(error=f"{type(e).__name__}: {e}")
        if not ready[0]:
            pipe.send(("ready", 0.0, 0))
    pipe.send(("result", res))
