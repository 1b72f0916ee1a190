"""Content routing at fleet scale against client-side filtering (issue 42 item 2).

The question a user asks: *10,000 subscribers each want ~1 % of one telemetry stream; is it
cheaper to let siftmq's content filters pick their messages, or to subscribe to everything on
mosquitto and filter in each client?*  Rows, one broker process at a time, same generator:

* **siftmq** (``siftmq serve --no-bridge --no-persistence --sys-interval 0 --content-engine E``,
  uvloop) for each engine E given (default iccounting, hema, hcem): every connection subscribes
  with an MQTT 5 ``filter`` user property (docs/broker.md, "Content filters"), so only the
  matching messages leave the broker;
* **mosquitto** (Debian's, ``persistence false``): every connection subscribes to the whole
  stream and filters in the client -- ``json.loads`` and a compiled Python predicate (a
  ``lambda`` made with ``eval`` from the same selector), the cheapest a user would write.

Both kinds of client run the very same code per received message: ``json.loads``, the
predicate, and, when it holds, the latency and the count; on siftmq the predicate only
confirms the broker's choice (a delivery it rejects is counted as *false*, and must be 0).

**Scale.** ``--connections`` subscribers (10,000) in ``--workers`` processes (raw asyncio MQTT 5
over uvloop, connections spread over 64 loopback source addresses, descriptor limit raised to
the hard limit) with ``--filters`` content filters each: 1 gives 10,000 filtered
subscriptions, 10 gives 100,000 (10,000 connections x 10 subscriptions: MQTT keys a
subscription by its topic filter, so the ten use ten topic filters that all match the stream,
``fleet/telemetry``, ``fleet/+``, ``fleet/#``, ... -- see ``TOPIC_FILTERS``; a message that
matches several of a client's subscriptions is delivered once, and is useful when it
satisfies any of its selectors).  ``--rows`` lists ``KIND:FILTERS`` (``iccounting:1``,
``mosquitto:10``, ...).

**Stream.** One publisher sends ``--rate`` QoS 0 messages per second to ``fleet/telemetry``
for ``--duration`` seconds, a JSON object of 12 attributes (``telemetry``: device, class of
10, site of 20, temp, humidity, pressure, vibration, battery, rssi, alarm (5 %), fw, plus
``seq`` and ``ts``, the publisher's ``time.time_ns()``), ~205 bytes.  The stream is a pure
function of ``seq``, so every worker knows before the run which messages each of its
subscribers wants (the *expected* matches, computed with the Python predicates).

**Selectors** (``selector``; each about 1 % of the stream, thresholds drawn per subscription so
nearly all selectors are distinct):

====  ====  ===========================================================================
mix   n     template
====  ====  ===========================================================================
30 %  2     ``class = 'pump' AND temp > 90.17``  (equality on the device class, range)
20 %  2     ``site = 'site-07' AND humidity BETWEEN 41.3 AND 61.3``
20 %  3     ``class = 'valve' AND battery < 31 AND rssi > -53``
20 %  4     ``(class = 'fan' AND temp > 95.02) OR (site = 'site-11' AND vibration > 9.01)``
10 %  3     ``class IN ('meter', 'motor') AND pressure > 1044.71 AND alarm = FALSE``
====  ====  ===========================================================================

Before the window, ``--warmup`` messages (seqs -5..-1) are sent and awaited by every worker
(the engines build their indexes at the first match), then the broker's idle CPU is read over
``--idle`` seconds.  **Measured** over the window from the publisher's first message to the
moment every worker has received what it expects (or ``--drain`` seconds after the last
publish), per *useful* delivery (a message that satisfies the subscriber's selector; each counted once per
connection): broker CPU (/proc of the broker, user and system), bytes received by the subscribers (MQTT bytes
read from their sockets: loopback's /proc/net/dev is shared by every process on the machine),
the subscribers' CPU (all worker processes), latency p50/p99 (``ts`` in the payload ->
arrival of a useful message), and delivered as a percentage of the expected matches (plus
duplicates and false deliveries); per stream message, its first useful arrival and the
spread to its last one.  The publisher's CPU is shown beside them.  The broker is pinned to
CPU 0, the workers and the publisher to CPU 1 (``--no-pin`` to leave them free).

    flock /work/bench.lock .venv/bin/python benchmarks/bench_content_fleet.py \\
        --rows iccounting:1,hema:1,hcem:1,mosquitto:1,iccounting:10,hema:10,hcem:10,mosquitto:10 \\
        --duration 30 --rate 2

``--probe`` times only the broker's routing decision in this process (``Router.route``
against ``engine.match``, same subscriptions, no sockets): where the broker's time goes.
``--probe-core`` times the whole sans-IO core per message in this process (routing, every
delivery encoded and queued, one write per receiving connection into a transport that only
counts) and the teardown of every connection (its session ended, its selectors released), by
loop turns of ``MAX_EVENTS`` connections (the poller's reads per turn: the worst turn is the
loop's stall), then the ticks until every released selector left the engine (the worst tick).
The real broker's stalls: ``stall_teardown`` in every row, the longest round trip of a PINGREQ
every 5 ms (one more connection at nice -10 on the subscribers' core, ``pinger_main``) from
the subscribers' DISCONNECTs until the broker's CPU goes quiet; ``stall_stream`` over the window
too with ``--stall-probe-stream`` (off by default: its 200 pings a second cost the broker ~1 s
of CPU over 30 s, which the CPU columns would count).  A ping sent while the fleet leaves waits
behind every socket made ready before it (epoll's ready list is first in, first out), so its
round trip is the read-path work of the whole departure ahead of it, not one loop turn's
(docs/performance-content.md, "A fleet's teardown in the real broker").  ``--leave`` chooses
how the subscribers leave (DISCONNECT then close; close alone: the will path; abort: RST);
``teardown_us_per_connection`` is the broker's CPU from their leaving until it goes quiet,
per connection.  ``--probe-teardown`` runs the real broker (``Broker``, uvloop) in this
process and one subscriber process, and times every callback of the teardown from inside
(``probe_teardown``): the loop's longest stall (a 1-ms timer's lateness), the poller's reads,
the ``connection_lost`` calls, the held departures handled (``drain``), the ticks, the
collector (``--probe-collect``: a full collection first, which makes the broker freeze the
heap), and a live client's PINGREQ round trips over the teardown (``ping``: ``pinger_main``
in its own process, end to end).  Per row also ``heaviest`` (the three
messages with the most useful deliveries: first and last arrival, microseconds per delivery
between them: the 10k p99 is their fan-out) and ``arrival_p50_ms`` / ``arrival_p99_ms`` (the
latency at the read, before the client's parsing, ``json.loads`` and predicate).
``--profile DIR`` samples the broker over the window (``--profile-with py-spy``, ``native``
for the compiled code's C frames, or ``perf``), or over the teardown (``--profile-phase
teardown``; with ``--probe-teardown``: this process over the teardown).

``broker_cpu_s`` counts the broker's CPU from the first stream message until the workers'
results arrive; they send them after their DISCONNECTs, so it also holds whatever part of the
10,000 sessions' teardown the broker did by then (timing-dependent).  ``broker_stream_cpu_s``
stops when every worker holds its deliveries, before the DISCONNECTs (JSON only; the tables
keep ``broker_cpu_s``).

Results: docs/performance-content.md, "Fleet scale: content routing vs client-side filtering".
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import gc
import json
import multiprocessing as mp
import os
import random
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_fleet
from _storm_client import _frame, _str, _varint, source_address

__all__ = [
    "TOPIC",
    "TOPIC_FILTERS",
    "Row",
    "payload",
    "run_row",
    "selector",
    "telemetry",
]

TOPIC = "fleet/telemetry"
#: ten distinct topic filters that all match TOPIC (a client's k-th subscription uses the k-th)
TOPIC_FILTERS = (
    "fleet/telemetry",
    "fleet/+",
    "fleet/#",
    "+/telemetry",
    "+/+",
    "+/#",
    "#",
    "fleet/telemetry/#",
    "+/telemetry/#",
    "+/+/#",
)
CLASSES = ("pump", "valve", "meter", "sensor", "motor", "fan", "heater", "chiller", "compressor", "gateway")
SITES = tuple(f"site-{k:02d}" for k in range(20))
FIRMWARE = ("2.3.1", "2.4.0", "3.0.2")
SEED = 42


# ------------------------------------------------------------------ workload
def telemetry(seq: int) -> dict[str, Any]:
    """The attributes of stream message ``seq`` (deterministic; without ``seq`` and ``ts``)."""
    r = random.Random(SEED * 1_000_003 + seq)
    return {
        "device": f"dev-{r.randrange(100_000):05d}",
        "class": r.choice(CLASSES),
        "site": r.choice(SITES),
        "temp": round(r.uniform(0, 100), 2),
        "humidity": round(r.uniform(0, 100), 2),
        "pressure": round(r.uniform(950, 1050), 2),
        "vibration": round(r.uniform(0, 10), 3),
        "battery": r.randint(0, 100),
        "rssi": r.randint(-100, -30),
        "alarm": r.random() < 0.05,
        "fw": r.choice(FIRMWARE),
    }


def payload(seq: int, ts_ns: int) -> bytes:
    """Message ``seq`` as sent: its attributes plus ``seq`` and ``ts`` (ns since the epoch)."""
    doc = telemetry(seq)
    doc["seq"] = seq
    doc["ts"] = ts_ns
    return json.dumps(doc, separators=(",", ":")).encode()


def selector(conn: int, k: int) -> tuple[str, str]:
    """(SQL selector, Python expression over ``d``) of connection ``conn``'s ``k``-th filter.

    Each is ~1 % of the stream (see the module docstring's table)."""
    r = random.Random(f"{SEED}/{conn}/{k}")
    u = r.random()
    c = r.choice(CLASSES)
    s = r.choice(SITES)
    if u < 0.30:  # P(class) 0.1 x P(temp > t) ~0.1
        t = f"{r.uniform(88, 92):.2f}"
        return f"class = '{c}' AND temp > {t}", f"d['class'] == '{c}' and d['temp'] > {t}"
    if u < 0.50:  # 0.05 x 0.2
        lo = r.uniform(0, 80)
        a, b = f"{lo:.2f}", f"{lo + 20:.2f}"
        return (
            f"site = '{s}' AND humidity BETWEEN {a} AND {b}",
            f"d['site'] == '{s}' and {a} <= d['humidity'] <= {b}",
        )
    if u < 0.70:  # 0.1 x P(battery < b) x P(rssi > q) with the product of the last two ~0.1
        bat = r.randint(20, 50)
        q = round(-30 - 71 * (0.1 / (bat / 101))) - 1
        return (
            f"class = '{c}' AND battery < {bat} AND rssi > {q}",
            f"d['class'] == '{c}' and d['battery'] < {bat} and d['rssi'] > {q}",
        )
    if u < 0.90:  # 0.1 x 0.05 + 0.05 x 0.1
        t = f"{r.uniform(94, 96):.2f}"
        v = f"{r.uniform(8.9, 9.1):.2f}"
        return (
            f"(class = '{c}' AND temp > {t}) OR (site = '{s}' AND vibration > {v})",
            f"(d['class'] == '{c}' and d['temp'] > {t}) or (d['site'] == '{s}' and d['vibration'] > {v})",
        )
    c2 = r.choice([x for x in CLASSES if x != c])  # 0.2 x 0.95 x ~0.053
    p = f"{r.uniform(1044.4, 1045.0):.2f}"
    return (
        f"class IN ('{c}', '{c2}') AND pressure > {p} AND alarm = FALSE",
        f"d['class'] in ('{c}', '{c2}') and d['pressure'] > {p} and d['alarm'] is False",
    )


def predicate(conn: int, filters: int) -> Callable[[dict[str, Any]], bool]:
    """The compiled client-side filter of connection ``conn``: any of its selectors."""
    body = " or ".join(f"({selector(conn, k)[1]})" for k in range(filters))
    return eval(f"lambda d: {body}")  # type: ignore[no-any-return]


# ------------------------------------------------------------------ MQTT bits
def _connect(cid: str) -> bytes:
    body = _str("MQTT") + bytes([5, 0x02]) + struct.pack("!H", 600) + b"\x00"
    return _frame(0x10, body + _str(cid))


def _subscribe(pid: int, topic_filter: str, sel: str | None, qos: int) -> bytes:
    props = b"" if sel is None else b"\x26" + _str("filter") + _str(sel)
    body = struct.pack("!H", pid) + _varint(len(props)) + props + _str(topic_filter) + bytes([qos])
    return _frame(0x82, body)


def _publish(seq: int, qos: int, pid: int) -> bytes:
    body = payload(seq, time.time_ns())
    head = _str(TOPIC) + (struct.pack("!H", pid) if qos else b"") + b"\x00"
    return _frame(0x30 | (qos << 1), head + body)


DISCONNECT = b"\xe0\x00"


# ------------------------------------------------------------------ subscriber workers
@dataclass
class WorkerPlan:
    port: int
    conns: list[int]  # connection numbers of this worker
    filters: int
    mosquitto: bool
    nmax: int  # messages the stream may reach (expected matches precomputed below it)
    qos: int = 0
    drain: float = 30.0
    warmup: int = 5  # messages before the measured stream (seqs -warmup..-1)
    handshakes: int = 25
    addresses: int = 64
    pin: int | None = None
    #: how the subscribers leave at the end (``--leave``): ``disconnect`` (DISCONNECT, then
    #: close), ``close`` (the socket closed without DISCONNECT: the will path), ``abort`` (RST)
    leave: str = "disconnect"


@dataclass
class WorkerResult:
    connected: int = 0
    subscribed: int = 0
    refused: int = 0
    failed: int = 0
    first_error: str = ""
    expected: int = 0  # matches wanted by this worker's connections below the published count
    useful: int = 0  # unique useful deliveries
    duplicates: int = 0
    false: int = 0  # delivered but its selector is false (client-side filtered on mosquitto)
    raw: int = 0  # every PUBLISH received
    raw_expected: int = 0  # mosquitto: every message to every connection
    bytes: int = 0
    cpu_s: float = 0.0
    window_s: float = 0.0
    drained: bool = False
    latencies_ms: list[float] = field(default_factory=list)
    #: the same deliveries from ``ts`` to the read that brought them (``data_received``'s
    #: entry, before the client's frame parsing, ``json.loads`` and predicate)
    arrivals_ms: list[float] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)  # the message of each latency


class _Sub(asyncio.Protocol):
    """One subscriber connection: parses MQTT frames, filters, counts (no task per message)."""

    def __init__(self, w: _Worker, pred: Callable[[dict[str, Any]], bool]) -> None:
        self.w = w
        self.pred = pred
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.seen: set[int] = set()
        self.acks = 0
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.want_acks = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"closed before SUBACK: {exc!r}"))

    def data_received(self, data: bytes) -> None:
        w = self.w
        w.read_ns = time.time_ns()
        w.res.bytes += len(data)
        buf = self.buf + data if self.buf else data
        n = len(buf)
        pos = 0
        while n - pos >= 2:
            first = buf[pos]
            i = pos + 1
            rl = mult = 0
            while True:
                if i >= n:
                    self.buf = buf[pos:]
                    return
                d = buf[i]
                rl |= (d & 0x7F) << mult
                mult += 7
                i += 1
                if not d & 0x80:
                    break
            end = i + rl
            if end > n:
                break
            kind = first >> 4
            if kind == 3:
                p = i + 2 + ((buf[i] << 8) | buf[i + 1])
                if first & 0x06:
                    assert self.transport is not None
                    self.transport.write(b"\x40\x02" + buf[p : p + 2])
                    p += 2
                plen = mult = 0
                while True:  # properties length
                    d = buf[p]
                    p += 1
                    plen |= (d & 0x7F) << mult
                    mult += 7
                    if not d & 0x80:
                        break
                w.on_message(self, buf[p + plen : end])
            elif kind in (2, 9):  # CONNACK, SUBACK
                self._ack(kind, buf[i:end])
            pos = end
        self.buf = buf[pos:]

    def _ack(self, kind: int, body: bytes) -> None:
        if kind == 2:
            if body[1] != 0:
                self.w.res.refused += 1
                self._fail(f"CONNACK reason {body[1]:#x}")
            return
        p = 2
        plen = mult = 0
        while True:
            d = body[p]
            p += 1
            plen |= (d & 0x7F) << mult
            mult += 7
            if not d & 0x80:
                break
        codes = body[p + plen :]
        if any(c >= 0x80 for c in codes):
            self.w.res.refused += 1
            self._fail(f"SUBACK {codes.hex()}")
            return
        self.acks += 1
        if self.acks == self.want_acks and not self.ready.done():
            self.ready.set_result(None)

    def _fail(self, why: str) -> None:
        if not self.ready.done():
            self.ready.set_exception(RuntimeError(why))


async def _until(cond: Callable[[], bool], seconds: float) -> bool:
    """Poll ``cond`` every 10 ms until it holds (True) or ``seconds`` pass (False)."""
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


class _Worker:
    def __init__(self, plan: WorkerPlan) -> None:
        self.plan = plan
        self.res = WorkerResult()
        self.protos: list[_Sub] = []
        self.matches: list[list[int]] = []  # per connection: the seqs its selectors want
        self.outstanding = 0  # useful deliveries still expected (after "stop")
        self.raw_outstanding = 0
        self.warm_left = 0  # warm-up deliveries still expected
        self.stopped: asyncio.Event | None = None
        self.read_ns = 0  # when the read being parsed returned (``_Sub.data_received``)

    def on_message(self, proto: _Sub, body: bytes) -> None:
        res = self.res
        d = json.loads(body)
        ok = proto.pred(d)
        seq = d["seq"]
        if seq < 0:  # warm-up
            if ok or self.plan.mosquitto:
                self.warm_left -= 1
            return
        res.raw += 1
        if ok:
            if seq in proto.seen:
                res.duplicates += 1
                return
            proto.seen.add(seq)
            res.useful += 1
            res.latencies_ms.append((time.time_ns() - d["ts"]) / 1e6)
            res.arrivals_ms.append((self.read_ns - d["ts"]) / 1e6)
            res.seqs.append(seq)
            self.outstanding -= 1
        else:
            res.false += 1
        self.raw_outstanding -= 1

    async def open(self, conn: int, sem: asyncio.Semaphore) -> _Sub | None:
        plan = self.plan
        loop = asyncio.get_running_loop()
        proto = _Sub(self, predicate(conn, plan.filters))
        try:
            async with sem:
                await loop.create_connection(
                    lambda: proto,
                    "127.0.0.1",
                    plan.port,
                    local_addr=(source_address(conn, plan.addresses), 0),
                )
                out = [_connect(f"sub{conn}")]
                if plan.mosquitto:
                    out.append(_subscribe(1, TOPIC, None, plan.qos))
                else:
                    out += [
                        _subscribe(k + 1, TOPIC_FILTERS[k], selector(conn, k)[0], plan.qos)
                        for k in range(plan.filters)
                    ]
                proto.want_acks = len(out) - 1
                assert proto.transport is not None
                proto.transport.write(b"".join(out))
                await asyncio.wait_for(proto.ready, 120)
        except (OSError, RuntimeError, ConnectionError, TimeoutError) as exc:
            self.res.failed += 1
            if not self.res.first_error:
                self.res.first_error = f"sub{conn}: {exc!r}"
            if proto.transport is not None:
                proto.transport.close()
            return None
        self.res.connected += 1
        self.res.subscribed += proto.want_acks
        return proto

    async def run(self, pipe: Connection) -> WorkerResult:
        plan = self.plan
        loop = asyncio.get_running_loop()
        # expected matches first (outside the measured window): per connection, the stream's
        # seqs below nmax its predicate accepts
        docs = [telemetry(s) for s in range(plan.nmax)]
        sem = asyncio.Semaphore(plan.handshakes)
        opened = await asyncio.gather(*(self.open(c, sem) for c in plan.conns))
        self.protos = [p for p in opened if p is not None]
        self.matches = [[s for s, d in enumerate(docs) if p.pred(d)] for p in self.protos]
        warm = [telemetry(s) for s in range(-plan.warmup, 0)]
        if plan.mosquitto:
            self.warm_left = len(warm) * len(self.protos)
        else:
            self.warm_left = sum(1 for p in self.protos for d in warm if p.pred(d))
        pipe.send(("ready", self.res.connected, self.res.subscribed, self.res.failed, self.res.first_error))
        await loop.run_in_executor(None, pipe.recv)  # "warm": the warm-up messages were sent
        await _until(lambda: self.warm_left <= 0, 120)
        # the subscribers' state is long-lived: out of the collector's generations, so that a
        # full collection of it never pauses the probe inside the window (either broker)
        gc.collect()
        gc.freeze()
        pipe.send(("warmed", self.warm_left))
        await loop.run_in_executor(None, pipe.recv)  # "go"
        self.res.bytes = 0  # the handshakes' and the warm-up's
        c0 = time.process_time()
        t0 = time.monotonic()
        msg = await loop.run_in_executor(None, pipe.recv)  # ("stop", published)
        published = int(msg[1])
        expected = sum(bisect.bisect_left(m, published) for m in self.matches)
        self.res.expected = expected
        self.outstanding += expected
        if plan.mosquitto:
            self.res.raw_expected = published * len(self.protos)
            self.raw_outstanding += self.res.raw_expected
        self.res.drained = await _until(
            lambda: self.outstanding <= 0 and (not plan.mosquitto or self.raw_outstanding <= 0), plan.drain
        )
        self.res.cpu_s = time.process_time() - c0
        self.res.window_s = time.monotonic() - t0
        # the driver reads the broker's CPU before the teardown too (``broker_stream_cpu_s``)
        pipe.send(("drained", self.res.drained))
        await loop.run_in_executor(None, pipe.recv)  # "close"
        for p in self.protos:
            if p.transport is not None:
                if plan.leave == "abort":
                    p.transport.abort()
                    continue
                if plan.leave == "disconnect":
                    p.transport.write(DISCONNECT)
                p.transport.close()
        return self.res


def worker_main(pipe: Connection, plan: WorkerPlan) -> None:
    """Subscriber worker process: connect and subscribe, "ready", "go", "stop N", results."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if plan.pin is not None:
        os.sched_setaffinity(0, {plan.pin})
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    res = runner(_Worker(plan).run(pipe))
    pipe.send(res)


# ------------------------------------------------------------------ publisher
def publisher_main(
    pipe: Connection, port: int, rate: float, duration: float, qos: int, warmup: int, pin: int | None
) -> None:
    """One QoS ``qos`` publisher: on "warm", ``warmup`` messages (seqs -warmup..-1) at ``rate``;
    on "go", ``rate`` messages per second for ``duration`` s (seqs 0, 1, ...)."""
    if pin is not None:
        os.sched_setaffinity(0, {pin})

    async def run() -> tuple[int, int, float]:
        loop = asyncio.get_running_loop()
        connack: asyncio.Future[None] = loop.create_future()
        acked = 0

        class P(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                nonlocal acked
                if data[0] >> 4 == 2 and not connack.done():
                    connack.set_result(None)
                acked += data.count(b"\x40\x02")  # PUBACKs (approximate; QoS 1 only)

        transport, _ = await loop.create_connection(P, "127.0.0.1", port)
        transport.write(_connect("publisher"))
        await asyncio.wait_for(connack, 60)
        pipe.send("ready")
        await loop.run_in_executor(None, pipe.recv)  # "warm"
        for seq in range(-warmup, 0):
            transport.write(_publish(seq, qos, 1))
            await asyncio.sleep(1 / rate)
        pipe.send("warmed")
        await loop.run_in_executor(None, pipe.recv)  # "go"
        c0 = time.process_time()
        t0 = time.monotonic()
        seq = 0
        while True:
            due = t0 + seq / rate
            if due - t0 >= duration:
                break
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            transport.write(_publish(seq, qos, seq % 65535 + 1))
            seq += 1
        await asyncio.sleep(0.2)
        cpu = time.process_time() - c0
        transport.write(DISCONNECT)
        transport.close()
        return seq, acked, cpu

    pipe.send(asyncio.run(run()))


# ------------------------------------------------------------------ loop-stall probe
PINGREQ = b"\xc0\x00"
PING_EVERY = 0.005


def pinger_main(pipe: Connection, port: int, pin: int | None) -> None:
    """The broker's loop stalls: one more MQTT connection sends a PINGREQ every
    ``PING_EVERY`` s (one outstanding) from "go" to "stop" and returns every (send time
    on the monotonic clock, round trip in ms).  A round trip is the broker's loop latency
    plus this process's own scheduling (it shares the subscribers' core, at nice -10)."""
    if pin is not None:
        os.sched_setaffinity(0, {pin})
    # above the subscribers it shares a core with: at the teardown they close 10,000 sockets
    # at once, and a probe waiting for that core would time its own scheduling
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, -10)

    async def run() -> list[tuple[float, float]]:
        loop = asyncio.get_running_loop()
        connack: asyncio.Future[None] = loop.create_future()
        waiter: list[asyncio.Future[None] | None] = [None]

        class P(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                if not connack.done():
                    connack.set_result(None)
                    return
                f = waiter[0]
                if f is not None and not f.done() and b"\xd0\x00" in data:
                    f.set_result(None)

        transport, _ = await loop.create_connection(P, "127.0.0.1", port)
        transport.write(_connect("pinger"))
        await asyncio.wait_for(connack, 60)
        pipe.send("ready")
        await loop.run_in_executor(None, pipe.recv)  # "go"
        stop = loop.run_in_executor(None, pipe.recv)  # "stop"
        out: list[tuple[float, float]] = []
        while not stop.done():
            t = time.monotonic()
            f = waiter[0] = loop.create_future()
            transport.write(PINGREQ)
            await asyncio.wait({f, stop}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
            if not f.done():
                break
            out.append((t, (time.monotonic() - t) * 1e3))
            await asyncio.sleep(max(0.0, t + PING_EVERY - time.monotonic()))
        transport.close()
        return out

    pipe.send(asyncio.run(run()))


def _stalls(pings: list[tuple[float, float]], t0: float, t1: float) -> dict[str, float]:
    """Max and p99 of the ping round trips sent in [t0, t1) (ms), and how many."""
    xs = [rtt for t, rtt in pings if t0 <= t < t1]
    return {
        "max_ms": round(max(xs, default=float("nan")), 1),
        "p99_ms": round(_pct(xs, 0.99), 2),
        "n": len(xs),
    }


def _until_idle(pid: int, quiet: float = 0.5, seconds: float = 60.0) -> float:
    """Wait until process ``pid`` used under 2 % of a core over ``quiet`` s (the broker done
    with a teardown), at most ``seconds``; the monotonic time it went quiet."""
    deadline = time.monotonic() + seconds
    c = _cpu(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        c1 = _cpu(pid)
        if c1 - c < 0.02 * quiet:
            return time.monotonic() - quiet
        c = c1
    return time.monotonic()


# ------------------------------------------------------------------ driver
@dataclass
class Row:
    kind: str  # an engine name or "mosquitto"
    filters: int  # per connection


def _start(cmd: list[str], port: int, log: Any, pin: bool) -> subprocess.Popen[bytes]:
    """Start a broker (on CPU 0 with ``pin``, descriptor limit at the hard limit) and wait
    until it accepts connections."""

    def pre() -> None:
        if pin:
            os.sched_setaffinity(0, {0})
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pre)  # noqa: PLW1509
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{cmd[0]} did not listen")


def _cpu(pid: int) -> float:
    return sum(_cpu_split(pid))


def _cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tck, int(fields[12]) / tck


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _heaviest(results: list[WorkerResult], k: int) -> list[dict[str, float]]:
    """The ``k`` stream messages with the most useful deliveries, each as its deliveries, the
    first and last arrival (ms after publication, at the read that brought it), the last
    handled (after the client's ``json.loads`` and predicate) and the time per delivery
    between first and last arrival: where a p99 made by one message's fan-out comes from."""
    per: dict[int, list[tuple[float, float]]] = {}
    for r in results:
        for seq, a, h in zip(r.seqs, r.arrivals_ms, r.latencies_ms, strict=True):
            per.setdefault(seq, []).append((a, h))
    out = []
    for seq in sorted(per, key=lambda q: -len(per[q]))[:k]:
        xs = per[seq]
        a0 = min(a for a, _ in xs)
        a1 = max(a for a, _ in xs)
        out.append(
            {
                "seq": seq,
                "deliveries": len(xs),
                "first_ms": round(a0, 2),
                "last_ms": round(a1, 2),
                "last_handled_ms": round(max(h for _, h in xs), 2),
                "us_per_delivery": round((a1 - a0) * 1e3 / max(len(xs) - 1, 1), 1),
            }
        )
    return out


def _profile(pid: int, row: Row, args: argparse.Namespace) -> subprocess.Popen[bytes] | None:
    """``--profile DIR``: sample the broker over the measured window (stopped with SIGINT when
    the workers report): ``--profile-with py-spy`` (the ``bench`` extra, collapsed stacks,
    idle excluded) into ``DIR/<kind>-x<filters>.txt``; ``native``: py-spy with the C frames
    (the compiled hot path is invisible to plain py-spy; this one pauses the broker to sample);
    ``perf``: ``perf record -g`` (C and kernel frames) into ``DIR/<kind>-x<filters>.perf.data``."""
    if not args.profile or row.kind == "mosquitto":
        return None
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{row.kind}-x{row.filters}"
    if args.profile_with == "perf":
        cmd = ["perf", "record", "-F", "999", "-g", "-p", str(pid), "-o", str(out / f"{name}.perf.data")]
    else:
        spy = Path(sys.executable).parent / "py-spy"
        cmd = [str(spy), "record", "--pid", str(pid), "--rate", "500", "--format", "raw"]
        cmd += ["--native"] if args.profile_with == "native" else ["--nonblocking"]
        cmd += ["--output", str(out / f"{name}.txt")]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(spy: subprocess.Popen[bytes]) -> None:
    """Stop a ``--profile`` sampler (it writes its output on SIGINT)."""
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(60)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait()


def run_row(row: Row, args: argparse.Namespace) -> dict[str, Any]:
    """One row: a fresh broker, the subscribers, the stream; the measured figures."""
    mosq = row.kind == "mosquitto"
    serve = [] if mosq else ["--content-engine", row.kind]
    tmp = Path(tempfile.mkdtemp(prefix=f"content-fleet-{row.kind}-"))
    port = bench_fleet.free_port()
    cmd = bench_fleet._command("mosquitto" if mosq else "siftmq-uvloop", port, tmp, False, serve)
    # private like the rest of the data directory, or siftmq warns that it fixed the mode
    log = open(os.open(tmp / "broker.log", os.O_WRONLY | os.O_CREAT, 0o600), "wb")  # noqa: SIM115
    try:
        proc = _start(cmd, port, log, args.pin)
    except BaseException:
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    ctx = mp.get_context("spawn")
    nmax = int(args.rate * args.duration) + 2
    per = -(-args.connections // args.workers)
    pipes: list[Connection] = []
    procs: list[Any] = []
    pin = 1 if args.pin else None
    spy: subprocess.Popen[bytes] | None = None
    try:
        for w in range(args.workers):
            conns = list(range(w * per, min(args.connections, (w + 1) * per)))
            plan = WorkerPlan(
                port,
                conns,
                row.filters,
                mosq,
                nmax,
                args.qos,
                args.drain,
                args.warmup,
                args.handshakes,
                pin=pin,
                leave=args.leave,
            )
            a, b = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(b, plan), daemon=True)
            p.start()
            pipes.append(a)
            procs.append(p)
        t_setup = time.monotonic()
        ready = [a.recv() for a in pipes]
        setup_s = time.monotonic() - t_setup
        if any(r[3] for r in ready):
            print(f"# {row.kind}: connections failed: {[r[3:] for r in ready if r[3]]}", flush=True)
        pa, pb = ctx.Pipe()
        pub = ctx.Process(
            target=publisher_main,
            args=(pb, port, args.rate, args.duration, args.qos, args.warmup, pin),
            daemon=True,
        )
        pub.start()
        procs.append(pub)
        assert pa.recv() == "ready"
        pp, pq = ctx.Pipe()
        pinger = ctx.Process(target=pinger_main, args=(pq, port, pin), daemon=True)
        pinger.start()
        procs.append(pinger)
        assert pp.recv() == "ready"
        pa.send("warm")
        assert pa.recv() == "warmed"
        for a in pipes:
            a.send("warm")
        warm_left = sum(a.recv()[1] for a in pipes)
        # the broker's CPU with every subscriber connected and nothing published
        c = _cpu(proc.pid)
        time.sleep(args.idle)
        idle_cpu = (_cpu(proc.pid) - c) / args.idle
        rss = _rss_mib(proc.pid)
        load = os.getloadavg()[0]
        user0, sys0 = _cpu_split(proc.pid)
        spy = _profile(proc.pid, row, args) if args.profile_phase == "stream" else None
        t0 = time.monotonic()
        for a in pipes:
            a.send("go")
        if args.stall_probe_stream:
            pp.send("go")
        pa.send("go")
        published, _acked, pub_cpu = pa.recv()
        for a in pipes:
            a.send(("stop", published))
        for a in pipes:
            a.recv()  # ("drained", ok): every worker holds what it expects, or gave up
        stream_user, stream_sys = _cpu_split(proc.pid)
        if spy is not None:
            _stop(spy)
            spy = None
        t_drained = time.monotonic()
        if not args.stall_probe_stream:
            pp.send("go")  # the teardown only: over the window its pings cost the broker CPU
        if args.profile_phase == "teardown":
            spy = _profile(proc.pid, row, args)
            time.sleep(1.0)  # the sampler attached
        c_close = _cpu(proc.pid)
        t_close = time.monotonic()
        for a in pipes:
            a.send("close")
        results: list[WorkerResult] = [a.recv() for a in pipes]
        user1, sys1 = _cpu_split(proc.pid)
        broker_user, broker_sys = user1 - user0, sys1 - sys0
        broker_cpu = broker_user + broker_sys
        window = time.monotonic() - t0
        # the teardown: the subscribers closed; the broker ends their sessions (and
        # releases their selectors) until its CPU goes quiet
        t_quiet = _until_idle(proc.pid)
        teardown_cpu = _cpu(proc.pid) - user1 - sys1
        # the whole teardown's broker CPU, from "close" until quiet (``teardown_cpu_s`` starts
        # when the workers' results arrived, after part of it); per connection that left
        close_cpu = _cpu(proc.pid) - c_close
        if spy is not None:
            _stop(spy)
            spy = None
        pp.send("stop")
        pings: list[tuple[float, float]] = pp.recv()
    finally:
        if spy is not None:
            _stop(spy)
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        proc.send_signal(signal.SIGTERM if not mosq else signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        text = (tmp / "broker.log").read_text(errors="replace")
        if text.strip():
            print(f"# {row.kind} broker log (last lines):\n{text[-1500:]}", flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
    lat = [x for r in results for x in r.latencies_ms]
    # per stream message: its first useful arrival and the spread to its last one (a late
    # first arrival is a delay before or inside the broker's routing; a wide spread, the
    # fan-out or the receivers)
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for r in results:
        for seq, x in zip(r.seqs, r.latencies_ms, strict=True):
            first[seq] = min(first.get(seq, x), x)
            last[seq] = max(last.get(seq, x), x)
    spread = [last[q] - first[q] for q in first]
    arrivals = [x for r in results for x in r.arrivals_ms]
    heavy = _heaviest(results, 3)
    useful = sum(r.useful for r in results)
    expected = sum(r.expected for r in results)
    client_cpu = sum(r.cpu_s for r in results)
    total_bytes = sum(r.bytes for r in results)
    per_useful = max(useful, 1)
    out = {
        "kind": row.kind,
        "filters_per_connection": row.filters,
        "subscriptions": sum(r.subscribed for r in results),
        "connections": sum(r.connected for r in results),
        "failed": sum(r.failed for r in results),
        "refused": sum(r.refused for r in results),
        "first_error": next((r.first_error for r in results if r.first_error), ""),
        "setup_s": round(setup_s, 1),
        "rate": args.rate,
        "published": published,
        "expected": expected,
        "useful": useful,
        "delivered_pct": round(100 * useful / expected, 3) if expected else float("nan"),
        "duplicates": sum(r.duplicates for r in results),
        "false": sum(r.false for r in results),
        "raw": sum(r.raw for r in results),
        "raw_expected": sum(r.raw_expected for r in results),
        "drained": all(r.drained for r in results),
        "window_s": round(window, 2),
        "broker_cpu_s": round(broker_cpu, 3),
        "broker_user_s": round(broker_user, 3),
        "broker_sys_s": round(broker_sys, 3),
        # the same up to the moment every worker held its deliveries, before the 10,000
        # DISCONNECTs (broker_cpu_s also counts the part of their teardown the broker did
        # before the workers' results arrived)
        "broker_stream_cpu_s": round(stream_user + stream_sys - user0 - sys0, 3),
        "client_cpu_s": round(client_cpu, 3),
        "publisher_cpu_s": round(pub_cpu, 3),
        "bytes": total_bytes,
        "broker_cpu_us_per_useful": round(broker_cpu * 1e6 / per_useful, 2),
        "client_cpu_us_per_useful": round(client_cpu * 1e6 / per_useful, 2),
        "total_cpu_us_per_useful": round((broker_cpu + client_cpu) * 1e6 / per_useful, 2),
        "bytes_per_useful": round(total_bytes / per_useful, 1),
        "p50_ms": round(_pct(lat, 0.5), 2),
        "p99_ms": round(_pct(lat, 0.99), 2),
        "arrival_p50_ms": round(_pct(arrivals, 0.5), 2),
        "arrival_p99_ms": round(_pct(arrivals, 0.99), 2),
        "heaviest": heavy,
        # the broker's loop stalls (PINGREQ round trips, pinger_main) over the stream and over
        # the teardown (from "close" until the broker's CPU went quiet)
        "stall_stream": _stalls(pings, t0, t_drained),  # only with --stall-probe-stream
        "stall_teardown": _stalls(pings, t_drained, t_quiet + 1e-3),
        "leave": args.leave,
        "teardown_close_cpu_s": round(close_cpu, 3),
        "teardown_us_per_connection": round(close_cpu * 1e6 / max(sum(r.connected for r in results), 1), 1),
        "teardown_close_s": round(t_quiet - t_close, 2),
        "teardown_s": round(t_quiet - t_drained, 2),
        "teardown_cpu_s": round(teardown_cpu, 3),
        "first_arrival_p50_ms": round(_pct(list(first.values()), 0.5), 2),
        "first_arrival_max_ms": round(max(first.values(), default=float("nan")), 2),
        "spread_p50_ms": round(_pct(spread, 0.5), 2),
        "spread_max_ms": round(max(spread, default=float("nan")), 2),
        "broker_rss_mib": round(rss, 1),
        "broker_idle_cpu_per_s": round(idle_cpu, 4),
        "warmup_missing": warm_left,
        "load_before": round(load, 2),
    }
    return out


def probe(engine: str, filters: int, connections: int, messages: int = 60) -> dict[str, Any]:
    """``--probe``: the broker's routing decision alone, in this process (no sockets): a
    ``broker.core._router.Router`` holding the same subscriptions as the row, the CPU time of
    ``Router.route`` per stream message against ``engine.match`` alone (medians after a
    warm-up), and the routes per message.  Shows where the broker's time per message goes.
    ``route_again_ms``: the same messages routed a second time (anything a router keeps
    from a message's first routing is reused: a long-running broker's case); ``*_mean_ms``:
    means, which the CPU per useful delivery pays (a few heavy messages weigh in);
    ``head_ms``: ``Router.route_head`` (the routing a big lone fan-out does before its first
    copy: the match and the first 128 routes; the whole route on a tree without it);
    ``heaviest_*``: the message with the most routes, its times."""
    import statistics

    import content
    from broker.core._router import Router
    from broker.packets import SubscriptionRequest
    from broker.values import Message

    router = Router(engine=engine)
    for c in range(connections):
        sels: dict[str, str] = {}
        for k in range(filters):
            req = SubscriptionRequest(TOPIC_FILTERS[k], 0)
            router.subscribe(f"sub{c}", sels, req, selector(c, k)[0], None)
    msgs = [Message(TOPIC, payload(s, 1), 0, False) for s in range(-5, messages)]
    for m in msgs[:5]:
        router.route(m)
    t_route, t_match, routes = [], [], 0
    for m in msgs[5:]:
        t = time.process_time()
        routes += len(router.route(m))
        t_route.append(time.process_time() - t)
        t = time.process_time()
        router.engine.match(content.attributes(m.payload))
        t_match.append(time.process_time() - t)
    t_again = []  # the same messages once more (warm)
    for m in msgs[5:]:
        t = time.process_time()
        router.route(m)
        t_again.append(time.process_time() - t)
    # the routing a streamed fan-out does before its first copy (Router.route_head: the
    # engine's match and the first EARLY_MIN routes; a tree without it: the whole route)
    head = getattr(router, "route_head", None)
    t_head = []
    for m in msgs[5:]:
        t = time.process_time()
        if head is None:
            router.route(m)
        else:
            head(m, 128, 64)
        t_head.append(time.process_time() - t)
    heavy = max(range(messages), key=lambda i: len(router.route(msgs[5 + i])))
    return {
        "engine": engine,
        "filters_per_connection": filters,
        "subscriptions": connections * filters,
        "route_ms": round(statistics.median(t_route) * 1e3, 3),
        "route_again_ms": round(statistics.median(t_again) * 1e3, 3),
        "engine_match_ms": round(statistics.median(t_match) * 1e3, 3),
        # means: what the CPU per useful delivery pays (a few heavy messages weigh in)
        "route_mean_ms": round(statistics.fmean(t_route) * 1e3, 3),
        "engine_match_mean_ms": round(statistics.fmean(t_match) * 1e3, 3),
        "engine_match_max_ms": round(max(t_match) * 1e3, 3),
        "routes_per_message": round(routes / messages, 1),
        "head_ms": round(statistics.median(t_head) * 1e3, 3),
        "head_max_ms": round(max(t_head) * 1e3, 3),
        # the message with the most routes: its routing, again, its head and its match
        "heaviest_routes": len(router.route(msgs[5 + heavy])),
        "heaviest_route_ms": round(t_route[heavy] * 1e3, 3),
        "heaviest_route_again_ms": round(t_again[heavy] * 1e3, 3),
        "heaviest_head_ms": round(t_head[heavy] * 1e3, 3),
        "heaviest_match_ms": round(t_match[heavy] * 1e3, 3),
    }


def probe_core(engine: str, filters: int, connections: int, messages: int = 60) -> dict[str, Any]:
    """``--probe-core``: the broker's whole work per stream message short of the sockets, in
    this process: a :class:`broker.core.Core` (the config ``siftmq serve --no-bridge
    --no-persistence --sys-interval 0`` gives it) with ``connections`` MQTT 5 connections
    subscribed as in the row, whose transport only counts the bytes; per message the CPU time
    of the publisher's ``Connection.received`` (routing, every delivery's encoding and
    queueing) plus ``Core.flush`` (one ``send_bytes`` per receiving connection), medians
    after the warm-up; ``route_again_ms``: ``Router.route`` of the same message once more
    (the routing's share, with the caches warm); then the teardown (every connection lost: its
    session ended, its selectors released) as the CPU time per connection."""
    import gc
    import statistics

    from broker._config import BrokerConfig
    from broker.core._connection import Callbacks, Connection
    from broker.core._core import Core
    from broker.packets import Connect, Properties, Publish, Subscribe, SubscriptionRequest
    from broker.values import Message

    core = Core(BrokerConfig(sys_interval=0, content_engine=engine))
    sent = [0, 0]  # writes, bytes

    def write(data: bytes) -> None:
        sent[0] += 1
        sent[1] += len(data)

    conns = []
    for c in range(connections):
        conn = Connection(core, Callbacks(write, lambda: None), 0.0, f"sub{c}")
        conn.received([Connect(f"sub{c}", protocol_level=5, keep_alive=0)], 0.0)
        reqs = [
            Subscribe(
                k + 1,
                (SubscriptionRequest(TOPIC_FILTERS[k], 0),),
                Properties(user_properties=(("filter", selector(c, k)[0]),)),
            )
            for k in range(filters)
        ]
        conn.received(reqs, 0.0)
        conns.append(conn)
    pub = Connection(core, Callbacks(write, lambda: None), 0.0, "publisher")
    pub.received([Connect("publisher", protocol_level=5, keep_alive=0)], 0.0)
    core.flush()
    msgs = [Publish(TOPIC, payload(s, 1), 0) for s in range(-5, messages)]
    for m in msgs[:5]:
        pub.received([m], 0.0)
        core.flush()
    gc.collect()
    t_msg, t_route, writes0, bytes0 = [], [], sent[0], sent[1]
    router = core.router
    for m in msgs[5:]:
        t = time.process_time()
        pub.received([m], 0.0)
        core.flush()
        t_msg.append(time.process_time() - t)
        msg = Message(TOPIC, m.payload, 0, False)
        t = time.process_time()
        router.route(msg)
        t_route.append(time.process_time() - t)
    writes = (sent[0] - writes0) / messages
    # the teardown as the broker's loop meets it: the poller reads up to MAX_EVENTS sockets
    # per loop turn (256; 1,024 before issue 42 item 2), so a turn ends up to that many
    # sessions; then the ticks remove the released selectors from the engine, a slice each
    # (Router.settle_selectors)
    from broker.net._lean import MAX_EVENTS

    turn = MAX_EVENTS
    worst_turn = 0.0
    t = time.process_time()
    for i in range(0, len(conns), turn):
        t1 = time.process_time()
        for conn in conns[i : i + turn]:
            conn.lost(0.0)
        core.flush()
        worst_turn = max(worst_turn, time.process_time() - t1)
    teardown = time.process_time() - t
    ticks = 0
    worst_tick = 0.0
    t = time.process_time()
    while getattr(router, "releasing", 0):
        t1 = time.process_time()
        core.tick(1.0 + ticks)
        worst_tick = max(worst_tick, time.process_time() - t1)
        ticks += 1
    settle = time.process_time() - t
    msg_ms = statistics.median(t_msg) * 1e3
    route_ms = statistics.median(t_route) * 1e3
    return {
        "engine": engine,
        "filters_per_connection": filters,
        "subscriptions": connections * filters,
        "message_ms": round(msg_ms, 3),
        "route_again_ms": round(route_ms, 3),
        "writes_per_message": round(writes, 1),
        "bytes_per_write": round((sent[1] - bytes0) / max(sent[0] - writes0, 1), 1),
        "teardown_us_per_connection": round(teardown * 1e6 / connections, 1),
        "teardown_worst_turn_ms": round(worst_turn * 1e3, 1),  # MAX_EVENTS connections ended
        "settle_ticks": ticks,  # ticks until every released selector left the engine
        "settle_worst_tick_ms": round(worst_tick * 1e3, 1),
        "settle_s": round(settle, 3),
    }


def probe_fanout(engine: str, filters: int, args: argparse.Namespace) -> dict[str, Any]:
    """``--probe-fanout``: where a stream message's deliveries wait, timed inside the real
    broker. The broker (:class:`broker.Broker`, uvloop, the installed build, no store) runs in
    this process on CPU 0, the row's subscribers (one ``worker_main`` process) and the
    publisher (``publisher_main``) on CPU 1, as in a row. For every read of the publisher's
    connection (one stream message each at this rate) the probe records, with
    ``time.perf_counter`` and the message's ``ts``: the wait from its publication to the
    broker's read (``read_ms``), from the read to the first write to a subscriber (``route``,
    every delivery routed, encoded and queued: the core does all of it before the flush),
    from the first to the last write (the flush: one ``LeanProtocol.write`` per receiving
    connection), the time inside those writes (``sock.send`` and ``LeanProtocol.write``
    itself), and the collector's runs in that read. Then the same messages are routed once
    more by ``Router.route`` alone (the routing's share of the first interval). Per row:
    the three heaviest messages, and medians over the messages with at least 100 deliveries of
    the microseconds per delivery before the first write and between first and last write."""
    import statistics

    from broker import Broker
    from broker.net import _lean, _transport
    from broker.values import Message

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.pin:
        os.sched_setaffinity(0, {0})
    on = [False]
    cur: list[dict[str, Any] | None] = [None]  # the publisher read being handled
    reads: list[dict[str, Any]] = []
    orig_feed = _transport.MQTTProtocol._feed
    orig_write = _lean.LeanProtocol.write
    perf = time.perf_counter

    def feed(self: Any, data: bytes) -> None:
        conn = self.conn
        if not on[0] or conn is None or conn.client_id != "publisher":
            orig_feed(self, data)
            return
        t_ns = time.time_ns()
        t = perf()
        i = data.find(b'"seq":')
        j = data.find(b'"ts":')
        rec: dict[str, Any] = {
            "seq": int(data[i + 6 : data.index(b",", i)]) if i >= 0 else None,
            "read_ms": (t_ns - int(data[j + 5 : data.index(b"}", j)])) / 1e6 if j >= 0 else None,
            "t": t,
            "writes": 0,
            "first": None,
            "last": None,
            "in_write": 0.0,
            "gc": 0,
            "gc_s": 0.0,
            "gc_gen": [0, 0, 0],  # collections in this read, per generation
            "gc_gen_s": [0.0, 0.0, 0.0],
            "payload": data,
        }
        cur[0] = rec
        try:
            orig_feed(self, data)
        finally:
            rec["end"] = perf()
            cur[0] = None
            reads.append(rec)

    def write(self: Any, data: Any) -> None:
        rec = cur[0]
        if rec is None:
            orig_write(self, data)
            return
        t = perf()
        if rec["first"] is None:
            rec["first"] = t
        orig_write(self, data)
        t1 = perf()
        rec["last"] = t1
        rec["in_write"] += t1 - t
        rec["writes"] += 1

    gc_t = [0.0]
    #: every collection of the stream's window (publisher reads or not): (generation, seconds,
    #: the seq of the read it ran in or None); and per generation over the whole run
    window_gcs: list[tuple[int, float, int | None]] = []
    run_gcs: list[list[float]] = [[], [], []]
    #: every full collection of the run: the phase (connect, warm, window, after), the read's
    #: seq, ms, the objects of generations 0-2 it found (what it walks: the unfrozen heap), the
    #: survivors it left in generation 2 (CPython's ``long_lived_total``, to which the next
    #: automatic full collection compares what generation 1 promotes meanwhile), and in the
    #: window the most common types it walked (diagnostics: listing them costs a walk too)
    phase = ["connect"]
    fulls: list[dict[str, Any]] = []

    def _gen_sizes() -> list[int]:
        return [len(gc.get_objects(g)) for g in range(3)]

    def _top_types(limit: int = 8) -> list[tuple[str, int]]:
        counts: dict[str, int] = {}
        for g in range(3):
            for o in gc.get_objects(g):
                k = type(o).__name__
                counts[k] = counts.get(k, 0) + 1
        return sorted(counts.items(), key=lambda kv: -kv[1])[:limit]

    def on_gc(phase_: str, info: dict[str, Any]) -> None:
        gen = int(info["generation"])
        if phase_ == "start":
            if gen == 2:
                rec = cur[0]
                fulls.append(
                    {
                        "phase": phase[0],
                        "seq": None if rec is None else rec["seq"],
                        "walked": _gen_sizes(),
                        "types": _top_types() if phase[0] == "window" else [],
                    }
                )
            gc_t[0] = perf()
            return
        took = perf() - gc_t[0]
        if gen == 2:
            fulls[-1]["ms"] = round(took * 1e3, 2)
            fulls[-1]["left"] = len(gc.get_objects(2))
        run_gcs[gen].append(took)
        rec = cur[0]
        if on[0]:
            window_gcs.append((gen, took, None if rec is None else rec["seq"]))
        if rec is None:
            return
        rec["gc"] += 1
        rec["gc_s"] += took
        rec["gc_gen"][gen] += 1
        rec["gc_gen_s"][gen] += took

    _transport.MQTTProtocol._feed = feed  # type: ignore[method-assign]
    _lean.LeanProtocol.write = write  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)
    nmax = int(args.rate * args.duration) + 2
    pin = 1 if args.pin else None
    state: dict[str, Any] = {}

    async def run() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        ctx = mp.get_context("spawn")

        async def recv(c: Connection) -> Any:
            return await loop.run_in_executor(None, c.recv)

        async with Broker(host="127.0.0.1", port=0, sys_interval=0, content_engine=engine) as b:
            plan = WorkerPlan(b.port, list(range(args.connections)), filters, False, nmax, pin=pin)
            a, w = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(w, plan), daemon=True)
            proc.start()
            await recv(a)  # ready
            phase[0] = "warm"
            pa, pb = ctx.Pipe()
            pub = ctx.Process(
                target=publisher_main,
                args=(pb, b.port, args.rate, args.duration, 0, args.warmup, pin),
                daemon=True,
            )
            pub.start()
            assert await recv(pa) == "ready"
            pa.send("warm")
            assert await recv(pa) == "warmed"
            a.send("warm")
            await recv(a)  # warmed
            state["at_go"] = {
                "freeze_count": gc.get_freeze_count(),
                "count": gc.get_count(),
                "collections": [g["collections"] for g in gc.get_stats()],
                "sessions": len(b.core.sessions),
                "frozen_sessions": b._frozen_sessions,
                # the broker's own idle collections so far (Broker._idle_freeze) and the
                # last one's pause
                "idle_collections": getattr(b, "idle_collections", None),
                "idle_collection_ms": round(getattr(b, "idle_collection_s", 0.0) * 1e3, 2),
                "unfrozen": _gen_sizes(),
                "unfrozen_types": _top_types(),
            }
            phase[0] = "window"
            on[0] = True
            a.send("go")
            pa.send("go")
            published, _acked, _cpu = await recv(pa)
            a.send(("stop", published))
            await recv(a)  # drained
            on[0] = False
            phase[0] = "after"
            router = b.core.router  # the same messages routed again, the subscribers still there
            again = []
            for rec in reads:
                if rec["seq"] is None:
                    continue
                body = rec["payload"]
                msg = Message(TOPIC, bytes(body[body.index(b"{") :]), 0, False)
                t = time.process_time()
                n = len(router.route(msg))
                again.append((rec["seq"], n, time.process_time() - t))
            a.send("close")
            res: WorkerResult = await recv(a)
            proc.join(10)
            pub.join(10)
            return {"res": res, "again": again}

    try:
        try:
            import uvloop

            out = uvloop.run(run())
        except ImportError:
            out = asyncio.run(run())
    finally:
        gc.callbacks.remove(on_gc)
        _transport.MQTTProtocol._feed = orig_feed  # type: ignore[method-assign]
        _lean.LeanProtocol.write = orig_write  # type: ignore[method-assign]
    route_s = {seq: (n, s) for seq, n, s in out["again"]}
    msgs = []
    for rec in reads:
        if rec["seq"] is None or rec["first"] is None:
            continue
        n = rec["writes"]
        before = (rec["first"] - rec["t"]) * 1e3
        sends = (rec["last"] - rec["first"]) * 1e3
        routes, route_cpu = route_s.get(rec["seq"], (0, 0.0))
        msgs.append(
            {
                "seq": rec["seq"],
                "deliveries": n,
                "read_ms": round(rec["read_ms"], 2),
                "to_first_write_ms": round(before, 2),
                "route_again_ms": round(route_cpu * 1e3, 2),
                "flush_ms": round(sends, 2),
                "in_write_ms": round(rec["in_write"] * 1e3, 2),
                "gc": rec["gc"],
                "gc_ms": round(rec["gc_s"] * 1e3, 2),
                "gc_gen": rec["gc_gen"],
                "gc_gen_ms": [round(x * 1e3, 2) for x in rec["gc_gen_s"]],
                "before_us_per_delivery": round(before * 1e3 / n, 2),
                "route_us_per_delivery": round(route_cpu * 1e6 / max(routes, 1), 2),
                "flush_us_per_delivery": round(sends * 1e3 / max(n - 1, 1), 2),
                "write_us_per_delivery": round(rec["in_write"] * 1e6 / n, 2),
            }
        )
    big = [m for m in msgs if m["deliveries"] >= 100]

    def med(key: str) -> float:
        return round(statistics.median([m[key] for m in big]), 2) if big else float("nan")

    res = out["res"]
    lat = res.latencies_ms
    return {
        "probe": "fanout",
        "engine": engine,
        "filters_per_connection": filters,
        "connections": res.connected,
        "useful": res.useful,
        "expected": res.expected,
        "p50_ms": round(_pct(lat, 0.5), 2),
        "p99_ms": round(_pct(lat, 0.99), 2),
        "client_cpu_us_per_useful": round(res.cpu_s * 1e6 / max(res.useful, 1), 2),
        "messages_100plus": len(big),
        **{
            f"median_{k}": med(k)
            for k in (
                "read_ms",
                "before_us_per_delivery",
                "route_us_per_delivery",
                "flush_us_per_delivery",
                "write_us_per_delivery",
            )
        },
        "heaviest": sorted(msgs, key=lambda m: -m["deliveries"])[:3],
        "heaviest_arrivals": _heaviest([res], 3),
        "first": next((m for m in msgs if m["seq"] == 0), None),
        # the collector: the heap's state at the stream's start, every collection of the
        # window (generation, ms, in the read of seq ...), per generation over the whole run
        # (count, total ms, longest ms)
        "gc_at_go": state.get("at_go"),
        "gc_window": [(g, round(t * 1e3, 2), q) for g, t, q in window_gcs if g > 0 or t > 1e-3],
        "gc_window_gen0": (
            sum(1 for g, _t, _q in window_gcs if g == 0),
            round(sum(t for g, t, _q in window_gcs if g == 0) * 1e3, 2),
        ),
        "gc_run": [
            (len(ts), round(sum(ts) * 1e3, 1), round(max(ts, default=0.0) * 1e3, 2)) for ts in run_gcs
        ],
        "gc_fulls": fulls,
    }


def probe_teardown(
    engine: str, filters: int, connections: int, leave: str, args: argparse.Namespace | None = None
) -> dict[str, Any]:
    """``--probe-teardown``: the real broker's end of a fleet, timed from inside it. The broker
    (:class:`broker.Broker`, uvloop, the installed build, ``--no-persistence``) runs in this
    process; ``connections`` subscribers (one worker process, ``worker_main``) connect and
    subscribe as in the row, then leave at once (``--leave``). Every callback of the
    teardown that the broker's loop runs is timed with ``time.perf_counter``: the poller's
    reads (``Poller._ready``: DISCONNECTs, EOFs, sessions ended), the ``connection_lost``
    calls, the ticks (released selectors leaving the engine), and the collector's runs
    (``gc.callbacks``); a 1-ms timer on the same loop gives the longest loop stall as a
    client would see it. Per connection: the broker's CPU (``time.process_time``, this
    process: the driver only waits) from the leave until every session, selector and
    connection is gone, divided by ``connections``. A live client (``pinger_main``, its own
    process) pings every 5 ms from 0.2 s before the leave: ``ping`` holds its round trips
    sent from the leave until the fleet is gone (the longest, when it was sent, the p99) and
    the longest before the leave. With ``--profile DIR`` the teardown is
    sampled (``--profile-with``; the sampler's pauses then lengthen the stalls)."""
    import broker._broker as broker_mod
    from broker import Broker
    from broker.net import _lean

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    timed: dict[str, list[float]] = {"read": [], "drain": [], "lost": [], "tick": [], "gc": []}

    on = [False]  # timing the teardown

    inside = [""]  # the timed callback running (the collections inside each are counted)
    tick_cpu: list[float] = []  # each tick's CPU time (this thread's)

    def timing(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*a: Any) -> Any:
            if not on[0]:
                return fn(*a)
            t = time.perf_counter()
            c = time.thread_time()
            inside[0] = name
            try:
                return fn(*a)
            finally:
                inside[0] = ""
                timed[name].append(time.perf_counter() - t)
                if name == "tick":  # its CPU too: on a loaded machine a turn's time holds waits
                    tick_cpu.append(time.thread_time() - c)

        return wrapped

    gc_start = [0.0]
    by_generation: list[list[float]] = [[], [], []]  # the collections over the teardown
    in_tick: list[float] = []  # those that ran inside a tick (its selector removals)

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if not on[0]:
            return
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            took = time.perf_counter() - gc_start[0]
            timed["gc"].append(took)
            by_generation[info["generation"]].append(took)
            if inside[0] == "tick":
                in_tick.append(took)

    originals = (_lean.Poller._ready, _lean.LeanProtocol._call_connection_lost, broker_mod.Broker._tick)
    drain = getattr(_lean.Poller, "_drain", None)  # held departures (since session 18)

    # patched before the broker starts: the poller registers its bound ``_ready`` at start
    _lean.Poller._ready = timing("read", originals[0])  # type: ignore[method-assign]
    _lean.LeanProtocol._call_connection_lost = timing("lost", originals[1])  # type: ignore[method-assign]
    broker_mod.Broker._tick = timing("tick", originals[2])  # type: ignore[method-assign]
    if drain is not None:
        _lean.Poller._drain = timing("drain", drain)  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)

    trace = args is not None and args.probe_trace

    async def run() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, content_engine=engine) as b:
            rss_before = _rss_mib(os.getpid())  # the broker started, before the fleet
            if trace:
                tracemalloc.start(8)
                before = tracemalloc.take_snapshot()
            plan = WorkerPlan(b.port, list(range(connections)), filters, False, 1, warmup=0, leave=leave)
            ctx = mp.get_context("spawn")
            a, w = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(w, plan), daemon=True)
            proc.start()
            ready = await loop.run_in_executor(None, a.recv)
            setup_sessions = len(b.core.sessions)
            # a live client over the teardown: a PINGREQ every 5 ms (pinger_main, its own
            # process at nice -10), its round trips from the leave until the fleet is gone
            pq, pw = ctx.Pipe()
            pinger = ctx.Process(target=pinger_main, args=(pw, b.port, None), daemon=True)
            pinger.start()
            await loop.run_in_executor(None, pq.recv)  # "ready"
            a.send("warm")
            await loop.run_in_executor(None, a.recv)  # "warmed"
            a.send("go")
            a.send(("stop", 0))
            await loop.run_in_executor(None, a.recv)  # "drained"
            if args is not None and args.probe_collect:
                gc.collect()  # a full collection first: the broker's tick freezes the heap
            stalls: list[float] = []
            done = [False]

            def lag(due: float) -> None:  # the loop's lateness, every 1 ms
                now = time.perf_counter()
                stalls.append(now - due)
                if not done[0]:
                    loop.call_later(0.001, lag, time.perf_counter() + 0.001)

            spy = None if args is None else _profile(os.getpid(), Row(engine, filters), args)
            if spy is not None:
                await asyncio.sleep(1.0)  # the sampler attached
            pq.send("go")
            await asyncio.sleep(0.2)  # the pinger's first round trips, before the leave
            on[0] = True
            try:
                cpu0 = time.process_time()
                t0 = time.perf_counter()
                m0 = time.monotonic()
                lag(time.perf_counter())
                a.send("close")
                res = await loop.run_in_executor(None, a.recv)
                # the fleet gone: its connections (the pinger's is left), sessions, removals
                while len(b.core.connections) > 1 or len(b.core.sessions) > 1 or b.core.router.releasing:  # noqa: ASYNC110 (broker state, no event)
                    await asyncio.sleep(0.005)
                elapsed = time.perf_counter() - t0
                cpu = time.process_time() - cpu0
                m1 = time.monotonic()
                done[0] = True
            finally:
                on[0] = False
                if spy is not None:
                    _stop(spy)
            pq.send("stop")
            pings = await loop.run_in_executor(None, pq.recv)
            pinger.join(10)
            proc.join(10)
            # the fleet gone and every slice settled: what it left behind (RSS of this
            # process, broker and driver; the broker's dicts as they are)
            rss_after = _rss_mib(os.getpid())
            held = _held_sizes(b)
            traced: list[str] = []
            if trace:
                after = tracemalloc.take_snapshot()
                tracemalloc.stop()
                traced = [str(d) for d in after.compare_to(before, "traceback")[:12]]
                traced += [
                    "\n".join(d.traceback.format()[-8:]) for d in after.compare_to(before, "traceback")[:4]
                ]
            # pings sent from the leave until the fleet was gone; the slowest shown with when
            # it was sent (ms after the leave)
            over = [(t, rtt) for t, rtt in pings if m0 <= t < m1]
            worst = max(over, key=lambda p: p[1], default=(m0, float("nan")))
            return {
                "probe": "teardown",
                "engine": engine,
                "filters_per_connection": filters,
                "leave": leave,
                "connections": res.connected,
                "sessions_before": setup_sessions,
                "ready": list(ready[:4]),
                "max_events": _lean.MAX_EVENTS,
                "teardown_s": round(elapsed, 3),
                "broker_cpu_s": round(cpu, 3),
                "cpu_us_per_connection": round(cpu * 1e6 / max(res.connected, 1), 1),
                "longest_stall_ms": round(max(stalls, default=0.0) * 1e3, 1),
                # a live client's PINGREQ -> PINGRESP over the teardown (end to end, its own
                # process): the longest, when it was sent, the p99 and the pings
                "ping": {
                    **_stalls(pings, m0, m1),
                    "worst_sent_ms": round((worst[0] - m0) * 1e3, 1),
                    "before_ms": _stalls(pings, m0 - 0.2, m0)["max_ms"],
                },
                "rss_before_mib": round(rss_before, 1),
                "rss_after_mib": round(rss_after, 1),
                "held_bytes": held,
                "gc_by_generation": [
                    {"calls": len(g), "max_ms": round(max(g, default=0.0) * 1e3, 1)} for g in by_generation
                ],
                "gc_in_ticks": {"calls": len(in_tick), "total_ms": round(sum(in_tick) * 1e3, 1)},
                # the ticks' longest five (their selector slices), and how many took over 5 ms
                "tick_top_ms": [round(t * 1e3, 1) for t in sorted(timed["tick"])[-5:]],
                "ticks_over_5ms": sum(1 for t in timed["tick"] if t > 0.005),
                "tick_top_cpu_ms": [round(t * 1e3, 1) for t in sorted(tick_cpu)[-5:]],
                **({"traced": traced} if trace else {}),
                **{f"{k}_calls": len(v) for k, v in timed.items()},
                **{f"{k}_total_ms": round(sum(v) * 1e3, 1) for k, v in timed.items()},
                **{f"{k}_max_ms": round(max(v, default=0.0) * 1e3, 1) for k, v in timed.items()},
            }

    try:
        try:
            import uvloop

            return uvloop.run(run())  # type: ignore[no-any-return]
        except ImportError:
            return asyncio.run(run())
    finally:
        gc.callbacks.remove(on_gc)
        _lean.Poller._ready, _lean.LeanProtocol._call_connection_lost, broker_mod.Broker._tick = originals
        if drain is not None:
            _lean.Poller._drain = drain  # type: ignore[method-assign]


def probe_removals(engine: str, filters: int, connections: int) -> dict[str, Any]:
    """``--probe-removals``: the CPU time (``time.thread_time``: a wall clock on a shared
    machine holds waits for a core) of each ``engine.remove`` of the fleet's distinct
    selectors, one by one, after the engine held them all: what a time-bounded settle slice
    (``Router.settle_selectors``'s budget) can overrun its budget by is one removal."""
    import content

    sels = list(dict.fromkeys(selector(c, k)[0] for c in range(connections) for k in range(filters)))
    e = content.ENGINES[engine]()
    for s in sels:
        e.add(s, content.compile(s))
    e.match({"class": CLASSES[0], "temp": 90.0})  # any lazy index built
    took = []
    clock = time.thread_time
    for s in sels:
        t = clock()
        e.remove(s)
        took.append(clock() - t)
    took.sort()
    return {
        "probe": "removals",
        "engine": engine,
        "selectors": len(sels),
        "total_ms": round(sum(took) * 1e3, 1),
        "mean_us": round(sum(took) / len(took) * 1e6, 1),
        "p99_us": round(took[int(0.99 * len(took))] * 1e6, 1),
        "longest_ms": [round(t * 1e3, 2) for t in took[-5:]],
    }


def probe_settle(engine: str, filters: int, connections: int) -> dict[str, Any]:
    """``--probe-settle``: the CPU (``time.process_time``) of settling a departed fleet in a
    sans-IO :class:`Core`, slices counted in removals (512, main's until session 19) against
    slices bounded by time (``Router.settle_selectors`` with the broker's budget), alternating
    twice in this process on fresh fleets: whether the time-bounded slices cost more work."""
    from broker._broker import SETTLE_BUDGET, SETTLE_SLICE
    from broker._config import BrokerConfig
    from broker.core._connection import Callbacks, Connection
    from broker.core._core import Core
    from broker.packets import Connect, Disconnect, Properties, Subscribe, SubscriptionRequest

    def departed() -> Core:
        core = Core(BrokerConfig(sys_interval=0, content_engine=engine))
        conns = []
        for i in range(connections):
            c = Connection(core, Callbacks(lambda d: None, lambda: None), 0.0, f"c{i}")
            c.received([Connect(f"c{i}", protocol_level=5, keep_alive=0)], 0.0)
            for k in range(filters):
                props = Properties(user_properties=(("filter", selector(i, k)[0]),))
                c.received([Subscribe(k + 1, (SubscriptionRequest(f"fleet/{k}/#", 0),), props)], 0.0)
            conns.append(c)
        core.flush()
        for c in conns:
            c.received([Disconnect()], 1.0)
        core.flush()
        return core

    out: dict[str, Any] = {"probe": "settle", "engine": engine, "connections": connections}
    for run, (mode, limit, budget) in enumerate(
        [("count", 512, 0.0), ("time", SETTLE_SLICE, SETTLE_BUDGET)] * 2
    ):
        router = departed().router
        slices = 0
        cpu = time.process_time()
        while router.releasing:
            router.settle_selectors(limit, budget)
            slices += 1
        out[f"{mode}{run // 2 + 1}"] = {
            "cpu_ms": round((time.process_time() - cpu) * 1e3, 1),
            "slices": slices,
        }
    return out


def _held_sizes(b: Any) -> dict[str, int]:
    """``sys.getsizeof`` of the broker's registries a fleet grows (a dict keeps its table
    after its keys are deleted): the sessions, connections, the router's departure and
    selector tables, the poller's list of connections."""
    core = b.core
    router = core.router
    out = {"sessions": sys.getsizeof(core.sessions), "connections": sys.getsizeof(core.connections)}
    for name in ("_selector_refs", "_releasing", "_departed", "_seen"):
        value = getattr(router, name, None)
        if value is not None:
            out[f"router.{name}"] = sys.getsizeof(value)
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    """The results table, with ratios against the mosquitto row of the same filter count."""
    peer = {r["filters_per_connection"]: r for r in rows if r["kind"] == "mosquitto"}
    peer1 = peer.get(1)
    lines = [
        "| row | subscriptions | useful delivered / expected | broker CPU / useful | client CPU / useful "
        "| total CPU / useful | bytes / useful | p50 / p99 | bytes, CPU vs mosquitto |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ref = peer.get(r["filters_per_connection"], peer1)
        ratio = ""
        if ref is not None and r is not ref:
            ratio = (
                f"{ref['bytes_per_useful'] / max(r['bytes_per_useful'], 1e-9):.1f}x fewer, "
                f"{ref['total_cpu_us_per_useful'] / max(r['total_cpu_us_per_useful'], 1e-9):.1f}x less"
            )
        lines.append(
            f"| {r['kind']} x{r['filters_per_connection']} | {r['subscriptions']:,} "
            f"| {r['useful']:,} / {r['expected']:,} ({r['delivered_pct']:.2f} %) "
            f"| {r['broker_cpu_us_per_useful']:,.1f} us | {r['client_cpu_us_per_useful']:,.1f} us "
            f"| {r['total_cpu_us_per_useful']:,.1f} us | {r['bytes_per_useful']:,.0f} B "
            f"| {r['p50_ms']:.1f} / {r['p99_ms']:.1f} ms | {ratio} |"
        )
    return "\n".join(lines)


def parse_rows(text: str) -> list[Row]:
    """``--rows``: ``KIND[:FILTERS]``, comma-separated; KIND a content engine or mosquitto,
    FILTERS a positive count (argparse's one-line error and exit 2 otherwise)."""
    import content  # the engines' names (the generator processes import none of content)

    out = []
    for item in text.split(","):
        kind, _, n = (part.strip() for part in item.partition(":"))
        if kind != "mosquitto" and kind not in content.ENGINES:
            raise argparse.ArgumentTypeError(
                f"{kind!r}: expected mosquitto or one of {', '.join(content.ENGINES)}"
            )
        if not (n or "1").isdigit() or int(n or 1) < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: FILTERS must be a positive count")
        out.append(Row(kind, int(n or 1)))
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--rows",
        type=parse_rows,
        default=parse_rows("iccounting:1,hema:1,hcem:1,mosquitto:1"),
        help="KIND:FILTERS, comma-separated",
    )
    ap.add_argument("--connections", type=int, default=10_000)
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help="subscriber processes, on one core (4 before: they contended for it, ~4 us more "
        "per delivery in a fan-out's tail)",
    )
    ap.add_argument("--rate", type=float, default=2.0, help="stream messages per second")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of stream")
    ap.add_argument("--qos", type=int, default=0, choices=(0, 1))
    ap.add_argument("--warmup", type=int, default=5, help="messages sent (and awaited) before the window")
    ap.add_argument("--idle", type=float, default=3.0, help="seconds of idle broker CPU measured before it")
    ap.add_argument("--drain", type=float, default=30.0, help="seconds allowed after the last publish")
    ap.add_argument("--handshakes", type=int, default=25, help="CONNACKs awaited at once per worker")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin broker / generator")
    ap.add_argument(
        "--stall-probe-stream",
        action="store_true",
        help="ping the broker (loop stalls) over the stream too, not only over the teardown "
        "(200 PINGREQs a second: ~0.8-1 s of broker CPU over a 30 s window, in the CPU columns)",
    )
    ap.add_argument("--json", default="", help="append the rows (JSON lines) to this file")
    ap.add_argument("--profile", default="", help="sample the siftmq broker over the window into DIR")
    ap.add_argument("--profile-with", default="py-spy", choices=("py-spy", "native", "perf"))
    ap.add_argument(
        "--profile-phase",
        default="stream",
        choices=("stream", "teardown"),
        help="what --profile samples: the stream's window, or the teardown (from the "
        "subscribers' leaving until the broker's CPU goes quiet)",
    )
    ap.add_argument(
        "--leave",
        default="disconnect",
        choices=("disconnect", "close", "abort"),
        help="how the subscribers leave at the end: DISCONNECT then close, close without "
        "DISCONNECT (FIN: the will path), or abort (RST)",
    )
    ap.add_argument("--probe-core", action="store_true", help="time the sans-IO core in-process (probe_core)")
    ap.add_argument("--probe", action="store_true", help="only time Router.route in-process (see probe)")
    ap.add_argument(
        "--probe-fanout",
        action="store_true",
        help="time each stream message's fan-out inside the real broker, in-process (probe_fanout)",
    )
    ap.add_argument(
        "--probe-teardown",
        action="store_true",
        help="time the real broker's teardown from inside it (probe_teardown)",
    )
    ap.add_argument(
        "--probe-collect",
        action="store_true",
        help="--probe-teardown: a full collection before the teardown (the broker then "
        "freezes the heap; without it, the collector runs as it happens to, as in siftmq serve)",
    )
    ap.add_argument(
        "--probe-trace",
        action="store_true",
        help="--probe-teardown: tracemalloc from before the fleet to after it left (slower: "
        "for what the fleet leaves behind, not for timing)",
    )
    ap.add_argument(
        "--probe-removals",
        action="store_true",
        help="the CPU time of each engine removal of the fleet's selectors (probe_removals)",
    )
    ap.add_argument(
        "--probe-settle",
        action="store_true",
        help="the CPU of settling a departed fleet, count- against time-bounded slices (probe_settle)",
    )
    args = ap.parse_args(argv)
    probes: dict[str, Callable[[Row], dict[str, Any]]] = {
        "probe_settle": lambda r: probe_settle(r.kind, r.filters, args.connections),
        "probe_removals": lambda r: probe_removals(r.kind, r.filters, args.connections),
        "probe_teardown": lambda r: probe_teardown(r.kind, r.filters, args.connections, args.leave, args),
        "probe_fanout": lambda r: probe_fanout(r.kind, r.filters, args),
        "probe_core": lambda r: probe_core(r.kind, r.filters, args.connections),
        "probe": lambda r: probe(r.kind, r.filters, args.connections),
    }
    for flag, run_probe in probes.items():  # the first probe asked for runs, on siftmq's rows only
        if getattr(args, flag):
            out = []
            for row in args.rows:
                if row.kind != "mosquitto":
                    out.append(run_probe(row))
                    print(json.dumps(out[-1]), flush=True)
            return out
    print(f"# load average {os.getloadavg()}; {vars(args)}", flush=True)
    rows = []
    for row in args.rows:
        if (
            row.kind == "mosquitto"
            and shutil.which("mosquitto") is None
            and not Path("/usr/sbin/mosquitto").exists()
        ):
            print("# mosquitto not installed: row skipped", flush=True)
            continue
        r = run_row(row, args)
        rows.append(r)
        print(json.dumps(r), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(r) + "\n")
    print(markdown(rows), flush=True)
    print(f"# load average {os.getloadavg()}", flush=True)
    return rows


if __name__ == "__main__":
    main()
