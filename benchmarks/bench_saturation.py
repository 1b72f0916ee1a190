"""Saturation benchmark (issue 14): publishers that outrun subscribers, all peers in one run.

Closed-loop benchmarks wait for deliveries before publishing more, so they never let
publishers outrun subscribers; this one does. Three scenarios, each on a fresh broker pinned
to ``--broker-cpu`` with this generator (one uvloop process, raw MQTT 3.1.1 sockets) pinned to
``--load-cpu``:

* ``paced``: publisher-paced QoS 1. ``--pairs`` publishers, each keeping ``--window``
  unacknowledged PUBLISHes (a new one per PUBACK, as device SDKs do; no loop on deliveries),
  and as many QoS 1 subscribers (clean sessions, one topic per pair) that acknowledge every
  delivery. After ``--duration`` s the publishers stop and the subscribers drain (up to
  ``--drain`` s without progress). Reported: delivered/s in the window, acknowledged/s,
  delivered as % of acknowledged (unique (pair, sequence) numbers; duplicates apart),
  p50/p99 publish->delivery latency, subscriber disconnects, broker peak RSS (VmHWM).
  ``--paced-rate N[,M...]`` (issue 42 item 4b): the same clients at a fixed offered rate of
  ``N`` msg/s in all: each publisher still keeps at most ``--window`` unacknowledged, but never
  sends ahead of its share of the rate (a 1 ms schedule, :func:`_pace`), so every broker that
  sustains the rate does the same work, and its CPU per delivered message
  (``broker_ns_per_delivery``: the broker's CPU in the window, children included, over its
  deliveries) compares brokers at equal rates, where publisher-paced runs compare each at
  whatever rate the machine gave it (a broker's cost per message falls as its rate rises:
  more messages per wake-up).  One run per rate and broker, the rates outermost (the brokers
  of a rate measured one after the other); ``delivered_pct_of_rate`` says whether the broker
  held the rate (below ~97 % it was publisher-paced at its own rate, and the comparison at that
  rate is not a same-rate one).  With ``--markdown`` a summary gives, per rate, each
  ``<variant>-defaults`` over the ``siftmq-nostore`` of its tree (same ``@tag``).
* ``open0``: open-loop QoS 0 at ``--overload`` x the broker's own QoS 0 capacity (measured
  first in the same run by publishers writing as fast as their sockets take it; for siftmq
  with ``--ingress-shed-bytes 0``, so that the capacity is its routing maximum, not a rate
  reduced by the shedding the flood triggers). Publishers
  send on a 1 ms schedule independent of everything else; latency is from the timestamp
  written into the payload when the frame is handed to the socket. Both QoS 0 scenarios
  build each write as one frame repeated and count deliveries by bytes, sampling a few
  frames per read for latency (``_bind_counter``), so that the generator's one core can
  offer more than the broker's one core takes (the per-message generator could not:
  it reached its own ceiling first).
* ``slow``: ``paced`` with one subscriber that reads at most ``--slow-rate`` msgs/s: the rate
  of the other pairs relative to ``paced`` in the same run, and what happened to the slow one.
* ``hung``: ``paced`` plus one more QoS 1 subscriber, on ``sat/#`` (every pair's messages),
  that reads and acknowledges during the warm-up and stops reading when the window starts
  (a hung consumer, issue 31): the pairs' rate in the window (``others_per_s``, to compare
  with ``paced``) and whether the hung one was disconnected.

Usage: ``.venv/bin/python benchmarks/bench_saturation.py [--brokers siftmq,siftmq-defaults,
mosquitto,iotcore,amqtt] [--scenarios paced,open0,slow,hung] [--out FILE.json] [--markdown]``.
``siftmq serve`` variants (``VARIANTS``) run from another checkout as ``<variant>@base``
(``--base-root DIR``) or ``<variant>@TAG`` (``--roots TAG=DIR,...``), each with its own
``.venv``; the paced figures of any two are comparable in one run.

``--burst K`` (with ``--paced-rate``) holds the batch equal by design: every publisher sends
``K`` PUBLISHes at once and all publishers in the same tick (:func:`_pace`), so a broker finds
about ``K x --pairs`` messages per burst whatever the scheduler does between bursts.
``--together`` runs the paced brokers of a rate at the same time on the broker core, each
with its own clients (:func:`together`), so that the machine's load, which changes from minute
to minute, weighs on all of them alike; ``--repeat N`` measures everything N times (order
reversed every other time) and the summary gives each same-run pair's ratio, their median and
spread.  ``--paced-rate 0`` is publisher-paced.  The loaded-machine figure of issue 42 item 4
(docs/lab/performance-defaults.md, session 19):

    flock /work/bench.lock .venv/bin/python benchmarks/bench_saturation.py --busy 4 \
        --brokers siftmq-nostore,siftmq-defaults,siftmq-nostore@base,siftmq-defaults@base \
        --scenarios paced --paced-rate 10000 --burst 32 --together --repeat 3 --duration 20 \
        --drain 1 --threads --base-root DIR --markdown

Same-rate runs (the command of docs/lab/performance-defaults.md, session 18):

    flock /work/bench.lock .venv/bin/python benchmarks/bench_saturation.py --busy 4 \
        --brokers siftmq-nostore,siftmq-defaults,siftmq-defaults@base,siftmq-nostore@base \
        --scenarios paced --paced-rate 3000,10000,30000 --duration 20 --threads \
        --base-root DIR --markdown
Peers that cannot start are skipped with the reason. Bounded in time; every process it
starts is stopped; loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import random
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_brokers import ROOT, RunningBroker, available, free_port, start_broker
from loadgen._codec import connect, puback, subscribe

TS_BIAS = 10**18
#: latency and backlog samples kept per scenario (a uniform sample of the window)
SAMPLES = 200_000
PAYLOAD_PAD = 20
T = TypeVar("T")


def _payload(seq: int, ts: int) -> bytes:
    return b'{"ts":%d,"seq":%010d,"pad":"%s"}' % (ts + TS_BIAS, seq, b"x" * PAYLOAD_PAD)


_TS_AT = len(b'{"ts":')
_SEQ_AT = _TS_AT + 19 + len(b',"seq":')


def _publish_frame(topic: bytes, payload: bytes, qos: int, pid: int) -> bytes:
    body = struct.pack("!H", len(topic)) + topic + (struct.pack("!H", pid) if qos else b"") + payload
    n = len(body)
    rl = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        rl.append(b | 0x80 if n else b)
        if not n:
            break
    return bytes([0x30 | (qos << 1)]) + bytes(rl) + body


def _frames(buf: bytes) -> tuple[list[tuple[int, int, int]], bytes]:
    """Split ``buf`` into (first byte, body start, body end) triples and the incomplete rest."""
    out = []
    i, n = 0, len(buf)
    while i + 2 <= n:
        mult, length, j = 1, 0, i + 1
        while True:
            if j >= n:
                return out, buf[i:]
            b = buf[j]
            length += (b & 0x7F) * mult
            mult *= 128
            j += 1
            if not b & 0x80:
                break
        if j + length > n:
            return out, buf[i:]
        out.append((buf[i], j, j + length))
        i = j + length
    return out, buf[i:]


class Reservoir(Generic[T]):
    """A uniform sample of at most SAMPLES items of a stream (Algorithm R): a list that stopped
    at SAMPLES would hold only the window's first second or so, at the overload's onset."""

    def __init__(self) -> None:
        self.items: list[T] = []
        self.seen = 0

    def add(self, item: T) -> None:
        self.seen += 1
        if self.seen <= SAMPLES:
            self.items.append(item)
        elif (j := random.randrange(self.seen)) < SAMPLES:
            self.items[j] = item


@dataclass
class Tally:
    acked: int = 0
    sent: int = 0
    delivered: int = 0
    in_window: int = 0
    duplicates: int = 0
    disconnects: int = 0
    recording: bool = False
    window_start_ns: int = 0  # when recording began
    # (second of the window, latency ns) of sampled deliveries, and bytes left in a
    # subscriber's socket at its reads: uniform samples of the whole window
    timed: Reservoir[tuple[int, int]] = field(default_factory=Reservoir)
    unread: Reservoir[int] = field(default_factory=Reservoir)

    def latency(self, now: int, ns: int) -> None:
        self.timed.add(((now - self.window_start_ns) // 1_000_000_000, ns))

    @property
    def latencies(self) -> list[int]:
        return [ns for _, ns in self.timed.items]


class Client(asyncio.Protocol):
    """A raw MQTT 3.1.1 connection: publisher (window of QoS 1 or open-loop QoS 0) or subscriber."""

    def __init__(self, tally: Tally, pair: int, seen: bytearray | None = None) -> None:
        self.tally = tally
        self.pair = pair
        self.topic = b"sat/%d" % pair
        self.transport: asyncio.Transport | None = None
        self.rest = b""
        self.waiter: asyncio.Future[int] | None = None
        self.seen = seen  # subscriber: one byte per sequence number (dups and uniques)
        self.seq = 0
        self.pid = 0
        self.running = False
        self.qos = 1
        self.budget: float | None = None  # slow subscriber: messages per second
        self.window_start = 0.0
        self.handled = 0
        self.closed = False
        self.want = 0
        self.acks = 0  # publisher: PUBACKs received (--paced-rate: its window is sent - acks)

    # -- plumbing
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.seen is not None:
            self.tally.disconnects += 1
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("closed"))

    async def expect(self, first_nibble: int) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        self.want = first_nibble
        await asyncio.wait_for(self.waiter, 30)

    # -- publishing
    def send0(self, k: int) -> None:
        """``k`` QoS 0 PUBLISHes in one write, built as one frame repeated (they share the
        timestamp of this hand-over, and the first one's sequence number): a frame costs the
        generator a memory copy, not Python work, so one core can overload the broker."""
        t = self.transport
        if t is None or self.closed:
            return
        frame = _publish_frame(self.topic, _payload(self.seq + 1, time.monotonic_ns()), 0, 0)
        self.seq += k
        t.write(frame * k)
        self.tally.sent += k

    def send(self, k: int) -> None:
        t = self.transport
        if t is None or self.closed:
            return
        ts = time.monotonic_ns()
        parts = []
        for _ in range(k):
            self.seq += 1
            self.pid = self.pid % 65535 + 1
            parts.append(_publish_frame(self.topic, _payload(self.seq, ts), self.qos, self.pid))
        t.write(b"".join(parts))
        self.tally.sent += k

    # -- receiving (publishers: PUBACKs and control acknowledgements)
    def data_received(self, data: bytes) -> None:
        frames, self.rest = _frames(self.rest + data)
        acks = 0
        for first, _a, _b in frames:
            kind = first >> 4
            if kind == 4:
                acks += 1
            elif self.waiter is not None and kind == self.want and not self.waiter.done():
                self.waiter.set_result(kind)
        if acks:
            self.acks += acks
            self.tally.acked += acks
            if self.running:
                self.send(acks)  # publisher-paced: one new PUBLISH per PUBACK

    def _resume(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()


def _bind_publish_handler(c: Client) -> None:
    """Make ``c`` a subscriber: count unique deliveries, sample latency, acknowledge QoS 1,
    and (``budget``) read no faster than a slow consumer would."""
    tally = c.tally
    seen = c.seen

    def data_received(data: bytes) -> None:
        buf = c.rest + data
        frames, c.rest = _frames(buf)
        out = []
        now = time.monotonic_ns()
        n = 0
        for first, a, _b in frames:
            if first >> 4 != 3:
                if c.waiter is not None and first >> 4 == c.want and not c.waiter.done():
                    c.waiter.set_result(first >> 4)
                continue
            n += 1
            tlen = (buf[a] << 8) | buf[a + 1]
            p = a + 2 + tlen
            if first & 0x06:
                out.append(puback((buf[p] << 8) | buf[p + 1]))
                p += 2
            ts = int(buf[p + _TS_AT : p + _TS_AT + 19]) - TS_BIAS
            seq = int(buf[p + _SEQ_AT : p + _SEQ_AT + 10])
            if seen is not None and seq < len(seen):
                if seen[seq]:
                    tally.duplicates += 1
                    continue
                seen[seq] = 1
            tally.delivered += 1
            if tally.recording:
                tally.in_window += 1
                tally.latency(now, now - ts)
        if out and c.transport is not None:
            c.transport.write(b"".join(out))
        if c.budget is not None and c.transport is not None and n:
            c.handled += n
            ahead = c.handled / c.budget - (time.monotonic() - c.window_start)
            if ahead > 0:
                c.transport.pause_reading()
                asyncio.get_running_loop().call_later(ahead, c._resume)

    c.data_received = data_received  # type: ignore[method-assign]


def _bind_counter(c: Client) -> Callable[[], None]:
    """Make the subscriber ``c``, once the returned function is called (after its SUBACK),
    count QoS 0 deliveries of its fixed-size frames (:meth:`Client.send0`) by bytes, and
    sample the latency of up to 4 frames per read at frame boundaries, checking each sampled
    frame's header and topic: O(1) Python work per read, not per message (``open0`` and the
    capacity flood). Bound before the connection is made: uvloop keeps the protocol's
    ``data_received`` from then on."""
    tally = c.tally
    parse = c.data_received
    counting = [False]
    frame = _publish_frame(c.topic, _payload(0, 0), 0, 0)
    size = len(frame)
    head = frame[: size - len(_payload(0, 0))]
    ts_at = len(head) + _TS_AT
    state = [0]  # bytes of the current frame already received
    fd = [-1]

    def data_received(data: bytes) -> None:
        if not counting[0]:
            parse(data)
            return
        partial = state[0]
        n = len(data)
        k, state[0] = divmod(partial + n, size)
        tally.delivered += k
        if not tally.recording or not k:
            return
        tally.in_window += k
        now = time.monotonic_ns()
        if fd[0] < 0 and c.transport is not None:
            fd[0] = c.transport.get_extra_info("socket").fileno()
        # the generator's own lag: what it has not read yet
        tally.unread.add(struct.unpack("i", fcntl.ioctl(fd[0], termios.FIONREAD, b"\0\0\0\0"))[0])
        first = (size - partial) % size
        step = size * max(1, k // 4)
        for off in range(first, n - size + 1, step):
            if data[off : off + len(head)] != head:
                raise RuntimeError(f"{c.topic!r}: unexpected bytes at a frame boundary")
            tally.latency(now, now - (int(data[off + ts_at : off + ts_at + 19]) - TS_BIAS))

    def start() -> None:
        assert not c.rest, "bytes after the SUBACK"
        counting[0] = True

    c.data_received = data_received  # type: ignore[method-assign]
    return start


async def _open(port: int, c: Client, cid: str) -> Client:
    loop = asyncio.get_running_loop()
    await loop.create_connection(lambda: c, "127.0.0.1", port)
    assert c.transport is not None
    c.transport.write(connect(cid))
    await c.expect(2)
    return c


async def _pairs(
    port: int, pairs: int, tag: str, qos0: bool = False
) -> tuple[list[Client], list[Client], Tally, Tally]:
    """``pairs`` publisher/subscriber pairs; ``qos0``: the subscribers count by bytes
    (:func:`_bind_counter`) for :meth:`Client.send0` publishers."""
    ptally, stally = Tally(), Tally()
    subs, pubs = [], []
    for i in range(pairs):
        s = Client(stally, i, None if qos0 else bytearray(8_000_000))
        _bind_publish_handler(s)
        start = _bind_counter(s) if qos0 else None
        await _open(port, s, f"{tag}-s{i}")
        assert s.transport is not None
        # QoS 0 runs subscribe at QoS 0: iotcore delivers a QoS 0 message at the
        # subscription's QoS 1 (with a packet id), which the byte counter would not frame
        s.transport.write(subscribe(1, [(f"sat/{i}", 0 if qos0 else 1)]))
        await s.expect(9)
        if start is not None:
            start()
        subs.append(s)
        pubs.append(await _open(port, Client(ptally, i), f"{tag}-p{i}"))
    return pubs, subs, ptally, stally


def _pct(xs: list[int], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] / 1e6


def _p99_by_second(st: Tally) -> list[float]:
    """The p99 latency of each second of the window (where in the window the tail is)."""
    by: dict[int, list[int]] = {}
    for second, ns in st.timed.items:
        by.setdefault(second, []).append(ns)
    return [round(_pct(by[k], 0.99), 1) for k in sorted(by)]


async def _drain(stally: Tally, drain: float, cap: float = 20.0) -> None:
    """Wait until ``drain`` s pass without a delivery, or ``cap`` s in all."""
    last, since = stally.delivered, time.monotonic()
    end = since + cap
    while time.monotonic() - since < drain and time.monotonic() < end:
        await asyncio.sleep(0.1)
        if stally.delivered != last:
            last, since = stally.delivered, time.monotonic()


async def _hung_subscriber(port: int) -> Client:
    """A QoS 1 subscriber on every pair's topic (``hung``), with its own tally."""
    h = Client(Tally(), 0, None)
    _bind_publish_handler(h)
    await _open(port, h, "hung-sub")
    assert h.transport is not None
    h.transport.write(subscribe(1, [("sat/#", 1)]))
    await h.expect(9)
    return h


async def _longest_gap(pt: Tally, gaps: list[float]) -> None:
    """Until cancelled: the longest time (s) without a PUBACK to any publisher, in ``gaps[0]``
    (a stall of the publishers is seen directly; the rate also moves with the machine's load)."""
    last, since = pt.acked, time.monotonic()
    while True:
        await asyncio.sleep(0.005)
        now = time.monotonic()
        if pt.acked != last:
            last, since = pt.acked, now
        gaps[0] = max(gaps[0], now - since)


def _tasks(pid: int) -> dict[str, tuple[float, int, int, int]]:
    """CPU seconds, (voluntary, involuntary) context switches and minor page faults of every
    thread of process
    ``pid`` and of its child processes, from ``/proc`` (``--threads``).  Keys: ``loop`` (the
    main thread: the event loop), ``thread-<name>`` (Python's name of the thread, read with
    ``py-spy dump`` when it is there, else its tid), ``child-<tid>`` (a child process's threads,
    the bridge's writer process)."""
    tick = os.sysconf("SC_CLK_TCK")
    names = _thread_names(pid)
    out: dict[str, tuple[float, int, int, int]] = {}

    def one(p: int, tid: int, key: str) -> None:
        try:
            stat = Path(f"/proc/{p}/task/{tid}/stat").read_text()
            status = Path(f"/proc/{p}/task/{tid}/status").read_text()
        except OSError:
            return
        f = stat[stat.rindex(")") + 2 :].split()
        cs = {k: int(v) for k, v in (ln.split(":\t") for ln in status.splitlines() if "ctxt_switches" in ln)}
        prev = out.get(key, (0.0, 0, 0, 0))
        out[key] = (
            prev[0] + (int(f[11]) + int(f[12])) / tick,
            prev[1] + cs.get("voluntary_ctxt_switches", 0),
            prev[2] + cs.get("nonvoluntary_ctxt_switches", 0),
            prev[3] + int(f[7]),  # minflt
        )

    def walk(p: int, child: bool) -> None:
        with contextlib.suppress(OSError):
            for tid in sorted(int(t) for t in os.listdir(f"/proc/{p}/task")):
                if child:
                    one(p, tid, "child" if tid == p else "child-thread")
                else:
                    one(p, tid, "loop" if tid == p else f"thread-{names.get(tid, tid)}")
        with contextlib.suppress(OSError):
            for c in Path(f"/proc/{p}/task/{p}/children").read_text().split():
                walk(int(c), True)

    walk(pid, False)
    return out


_NAMES: dict[int, dict[int, str]] = {}


def _thread_names(pid: int) -> dict[int, str]:
    """tid -> Python thread name of ``pid`` (``py-spy dump``, once per broker; {} without it)."""
    if pid in _NAMES:
        return _NAMES[pid]
    names: dict[int, str] = {}
    spy = ROOT / ".venv" / "bin" / "py-spy"
    if spy.exists():
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            dump = subprocess.run(
                [str(spy), "dump", "--pid", str(pid), "--nonblocking"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            ).stdout
            for line in dump.splitlines():
                # 'Thread 12345 (idle): "siftmq-store"' (the OS thread id, then the name)
                if line.startswith("Thread ") and '"' in line:
                    with contextlib.suppress(ValueError):
                        names[int(line.split()[1], 0)] = line.split('"')[1]
    _NAMES[pid] = names
    return names


def _task_delta(
    before: dict[str, tuple[float, int, int, int]],
    after: dict[str, tuple[float, int, int, int]],
    delivered: int,
) -> dict[str, object]:
    """Per thread over the window: CPU s, ns per delivered message, context switches
    (voluntary / involuntary) and minor page faults per 1,000 delivered."""
    out: dict[str, object] = {}
    for key, (c1, v1, n1, f1) in sorted(after.items()):
        c0, v0, n0, f0 = before.get(key, (0.0, 0, 0, 0))
        d = max(1, delivered)
        out[key] = {
            "cpu_s": round(c1 - c0, 3),
            "ns_per_msg": round((c1 - c0) * 1e9 / d),
            "vcs_per_1k": round((v1 - v0) * 1000 / d, 2),
            "ivcs_per_1k": round((n1 - n0) * 1000 / d, 2),
            "minflt_per_1k": round((f1 - f0) * 1000 / d, 2),
        }
    return out


async def _pace(pubs: list[Client], rate: float, window: int, burst: int = 0) -> None:
    """Until cancelled (``--paced-rate``): every 1 ms, each publisher sends what its share of
    ``rate`` (msg/s in all) makes due since the start, at most what keeps its unacknowledged
    PUBLISHes within ``window`` (so a broker that falls behind is publisher-paced, no faster
    than its acknowledgements).  What a publisher could not send when due is sent when its
    window opens (never more than ``window`` at once).  O(publishers) per tick.

    ``burst`` > 0 (``--burst``): the batch held equal by design.  Every ``burst * publishers /
    rate`` seconds all publishers send ``burst`` PUBLISHes each, one write per publisher, one
    after the other in the same tick (the rate is the same); the broker finds about
    ``burst * publishers`` messages per burst whatever the scheduler does between bursts, so
    its loop's wake-ups per delivery (a few per burst) no longer decide its CPU per delivery."""
    per_pub = rate / len(pubs)
    step = burst / per_pub if burst > 0 else 0.001
    t0 = time.monotonic()
    tick = 0
    while True:
        if burst > 0:
            tick = int((time.monotonic() - t0) / step) + 1
            due = tick * burst
        else:
            due = int((time.monotonic() - t0) * per_pub)
        for p in pubs:
            k = min(due - p.seq, window - (p.seq - p.acks))
            if k > 0:
                p.send(k)
        if burst > 0:
            await asyncio.sleep(max(0.0, t0 + tick * step - time.monotonic()))
        else:
            await asyncio.sleep(0.001)


async def run_paced(
    port: int,
    a: argparse.Namespace,
    slow: bool,
    hung: bool = False,
    cpu: Callable[[], float] | None = None,
    pid: int = 0,
    rate: float = 0.0,
) -> dict[str, object]:
    """``cpu``: the broker's CPU seconds so far, read at the window's start and end (the
    window's CPU of the broker, its threads included, and of this generator are reported).
    ``pid`` (with ``--threads``): the broker's process, whose threads and children are read
    from ``/proc`` at the window's start and end (:func:`_tasks`).  ``rate`` > 0: the offered
    rate in msg/s (``--paced-rate``, :func:`_pace`) instead of a new PUBLISH per PUBACK."""
    pubs, subs, pt, st = await _pairs(port, a.pairs, "slow" if slow else "hung" if hung else "paced")
    if slow:
        subs[0].budget = a.slow_rate
        subs[0].window_start = time.monotonic()
    h = await _hung_subscriber(port) if hung else None
    pacer = asyncio.create_task(_pace(pubs, rate, a.window, a.burst)) if rate > 0 else None
    for p in pubs if pacer is None else ():
        p.running = True
        p.send(a.window)
    await asyncio.sleep(a.warmup)
    if h is not None and h.transport is not None:
        h.transport.pause_reading()  # hung from now on: its socket takes nothing more
    st.recording = True
    st.window_start_ns = time.monotonic_ns()
    acked0, t0 = pt.acked, time.monotonic()
    if pid and a.threads:
        _thread_names(pid)  # before the window: py-spy pauses nothing (--nonblocking) but costs CPU
    tasks0 = _tasks(pid) if pid and a.threads else {}
    bcpu0, gcpu0 = (cpu() if cpu else 0.0), time.process_time()
    slow_seen0 = _unique(subs[0].seen) if slow else 0
    gaps = [0.0]
    watch = asyncio.create_task(_longest_gap(pt, gaps))
    await asyncio.sleep(a.duration)
    watch.cancel()
    st.recording = False
    dt = time.monotonic() - t0
    bcpu, gcpu = (cpu() if cpu else 0.0) - bcpu0, time.process_time() - gcpu0
    tasks1 = _tasks(pid) if pid and a.threads else {}
    acked_window = pt.acked - acked0
    slow_window = (_unique(subs[0].seen) - slow_seen0) if slow else 0
    for p in pubs:
        p.running = False
    if pacer is not None:
        pacer.cancel()
    if h is not None and h.transport is not None and not h.transport.is_closing():
        h.transport.resume_reading()  # reads what waits, then sees whether it was disconnected
    await _drain(st, a.drain)
    delivered = st.delivered
    res: dict[str, object] = {
        "delivered_per_s": st.in_window / dt,
        "window_s": [round(t0, 3), round(t0 + dt, 3)],  # monotonic start and end (--together)
        "acked_per_s": acked_window / dt,
        "acked": pt.acked,
        "delivered": delivered,
        "delivered_pct_of_acked": 100.0 * delivered / pt.acked if pt.acked else float("nan"),
        "duplicates": st.duplicates,
        "p50_ms": _pct(st.latencies, 0.5),
        "p99_ms": _pct(st.latencies, 0.99),
        "sub_disconnects": sum(1 for s in subs if s.closed),
        "longest_ack_gap_ms": gaps[0] * 1000,
        # CPU in the window: the broker's (all its threads) and this generator's, and the
        # deliveries per broker CPU second (less sensitive to a shared machine than the rate)
        "window_broker_cpu_s": bcpu,
        "window_loadgen_cpu_s": gcpu,
        "delivered_per_broker_cpu_s": st.in_window / bcpu if bcpu > 0 else float("nan"),
        # the same as CPU per delivered message (what --paced-rate compares at equal rates)
        "broker_ns_per_delivery": bcpu * 1e9 / st.in_window if st.in_window else float("nan"),
    }
    if rate > 0:
        res["paced_rate"] = rate
        res["delivered_pct_of_rate"] = 100.0 * st.in_window / dt / rate
        if a.burst > 0:
            res["burst"] = a.burst * len(pubs)  # messages sent together per tick
    if tasks1:
        res["threads"] = _task_delta(tasks0, tasks1, st.in_window)
    if slow:
        others = st.in_window - slow_window
        res["others_per_s"] = others / dt
        res["slow_per_s"] = slow_window / dt
        res["slow_disconnected"] = subs[0].closed
    if h is not None:
        res["others_per_s"] = st.in_window / dt
        res["hung_got"] = h.tally.delivered  # in all, including after it read again
        res["hung_disconnected"] = h.closed
    for c in pubs + subs + ([h] if h is not None else []):
        if c.transport is not None:
            c.transport.close()
    return res


def _unique(seen: bytearray | None) -> int:
    return 0 if seen is None else seen.count(1)


async def run_flood(
    port: int, a: argparse.Namespace, cpu: Callable[[], float] | None = None, out: list[float] | None = None
) -> float:
    """QoS 0 capacity: publishers write whenever their socket buffer is below 1 MiB.  ``out``
    gets its deliveries per broker CPU second (``cpu``, children included) over the 3 s measured."""
    pubs, subs, _pt, st = await _pairs(port, a.pairs, "cap", qos0=True)
    stop = time.monotonic() + a.warmup + 3.0
    t_rec = time.monotonic() + a.warmup
    while time.monotonic() < stop:
        if not st.recording and time.monotonic() >= t_rec:
            st.recording = True
            st.window_start_ns = time.monotonic_ns()
            n0, t0 = st.in_window, time.monotonic()
            c0 = cpu() if cpu else 0.0
        for p in pubs:
            if p.transport is not None and p.transport.get_write_buffer_size() < 1 << 20:
                p.send0(2000)
        await asyncio.sleep(0)
    rate = (st.in_window - n0) / (time.monotonic() - t0)
    if out is not None and cpu is not None:
        out.append((st.in_window - n0) / max(1e-9, cpu() - c0))
    for c in pubs + subs:
        if c.transport is not None:
            c.transport.close()
    return rate


async def run_open0(
    port: int, a: argparse.Namespace, capacity: float, cpu: Callable[[], float] | None = None
) -> dict[str, object]:
    """``cpu``: the broker's CPU seconds (children included), read at the window's start and end."""
    pubs, subs, pt, st = await _pairs(port, a.pairs, "open", qos0=True)
    rate = a.open_rate or a.overload * capacity
    per_pub = rate / len(pubs)
    t0 = time.monotonic()
    end = t0 + a.warmup + a.duration
    sent_by: list[float] = [0.0] * len(pubs)
    rec_t0 = 0.0
    while (now := time.monotonic()) < end:
        if not st.recording and now - t0 >= a.warmup:
            st.recording = True
            st.window_start_ns = time.monotonic_ns()
            rec_t0 = now
            c0 = cpu() if cpu else 0.0
        due = (now - t0) * per_pub
        for i, p in enumerate(pubs):
            k = int(due - sent_by[i])
            if k > 0:
                p.send0(k)
                sent_by[i] += k
        await asyncio.sleep(0.001)
    st.recording = False
    dt = time.monotonic() - rec_t0
    bcpu = (cpu() - c0) if cpu else 0.0
    await _drain(st, a.drain)
    res = {
        "capacity_per_s": capacity,
        # the window's broker CPU (children included) and the deliveries per CPU second
        "window_broker_cpu_s": bcpu,
        "delivered_per_broker_cpu_s": st.in_window / bcpu if bcpu > 0 else float("nan"),
        "offered_per_s": rate,
        "delivered_per_s": st.in_window / dt,
        "delivered_pct_of_capacity": 100.0 * st.in_window / dt / capacity,
        "sent": pt.sent,
        "delivered": st.delivered,
        "delivered_pct_of_sent": 100.0 * st.delivered / pt.sent if pt.sent else float("nan"),
        "p50_ms": _pct(st.latencies, 0.5),
        "p99_ms": _pct(st.latencies, 0.99),
        "p99_by_second_ms": _p99_by_second(st),
        "generator_buffered_mb": sum(p.transport.get_write_buffer_size() for p in pubs if p.transport) / 1e6,
        # bytes the generator's subscribers had not read yet, as time at their delivery rate:
        # latency that is the generator's, not the broker's
        "generator_unread_p99_ms": _pct(st.unread.items, 0.99)
        * 1e6
        / len(_publish_frame(b"sat/0", _payload(0, 0), 0, 0))
        / max(1.0, st.in_window / dt / len(subs))
        * 1e3,
    }
    for c in pubs + subs:
        if c.transport is not None:
            c.transport.close()
    return res


# `siftmq serve` variants beside plain `siftmq` (bench_brokers.py's: `--no-bridge` with a
# `--data-dir`, so its store is *on*; a store costs nothing to clean sessions, which write
# nothing): the defaults (store and bridge on), each half of them, and neither.
VARIANTS: dict[str, list[str]] = {
    "siftmq-defaults": [],
    # the defaults with the bridge's writer in a thread of the broker (before issue 42's writer
    # process; `siftmq serve --bridge-writer thread`)
    "siftmq-thread": ["--bridge-writer", "thread"],
    "siftmq-nostore": ["--no-bridge", "--no-persistence"],
    # the same on asyncio's own loop (issue 42 item 1: uvloop and the OpenSSL it loads cost ~6 MB)
    "siftmq-nouvloop": ["--no-bridge", "--no-persistence", "--no-uvloop"],
    "siftmq-store": ["--no-bridge"],
    "siftmq-bridge": ["--no-persistence"],
    # plain siftmq without ingress load shedding (docs/broker.md, "Flow control")
    "siftmq-noshed": ["--no-bridge", "--no-persistence", "--ingress-shed-bytes", "0"],
    # plain siftmq without hung-consumer detection (the grace time alone, as before issue 31)
    "siftmq-nohung": ["--no-bridge", "--no-persistence", "--hung-consumer-time", "0"],
}

#: variants that differ by their environment (issue 42 item 4b: glibc's malloc thresholds, which
#: the bridge may fix with ``mallopt`` when it starts, set from the start instead, in the broker
#: and in its writer process, which inherits them; ``MALLOC_PERTURB_=0`` is glibc's default and
#: only tells a bridge that leaves an operator's malloc settings alone to leave them)
VARIANT_ENV: dict[str, tuple[str, dict[str, str]]] = {
    "siftmq-defaults-m4": (
        "siftmq-defaults",
        {"MALLOC_MMAP_THRESHOLD_": str(4 << 20), "MALLOC_TRIM_THRESHOLD_": str(16 << 20)},
    ),
    "siftmq-defaults-m0": ("siftmq-defaults", {"MALLOC_PERTURB_": "0"}),
}

#: ``--base-root DIR`` / ``--roots TAG=DIR,...``: other checkouts, each with its own ``.venv``
#: (e.g. the commit before a change); a variant named ``<variant>@TAG`` (``@base`` for
#: ``--base-root``) runs that checkout's ``siftmq serve`` in the same run
ROOTS: dict[str, Path] = {}


def _variant(name: str) -> tuple[Path, list[str], dict[str, str]] | None:
    """(checkout, serve flags, environment) of a `siftmq serve` variant, None for the other
    brokers (or a ``@TAG`` without its checkout)."""
    variant, _, tag = name.partition("@")
    root = ROOTS.get(tag) if tag else ROOT
    env: dict[str, str] = {}
    if variant in VARIANT_ENV:
        variant, env = VARIANT_ENV[variant]
    flags = VARIANTS.get(variant)
    if flags is None or root is None:
        return None
    return root, flags, env


def _start(name: str, cpu: int, extra: tuple[str, ...] = ()) -> RunningBroker:
    """Start ``name`` on ``cpu``; ``extra``: more `siftmq serve` flags (siftmq and its variants)."""
    variant = _variant(name)
    if variant is None:
        if not extra:
            return start_broker(name, cpu, "hema")
        before = os.environ.get("SIFTMQ_SERVE_ARGS", "")
        os.environ["SIFTMQ_SERVE_ARGS"] = " ".join((before, *extra))
        try:
            return start_broker(name, cpu, "hema")
        finally:
            os.environ["SIFTMQ_SERVE_ARGS"] = before
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    port = free_port()
    with open(tmp / "broker.log", "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [
                str(variant[0] / ".venv" / "bin" / "siftmq"),
                "serve",
                "--port",
                str(port),
                "--data-dir",
                str(tmp / "data"),
                *variant[1],
                *extra,
            ],
            cwd=tmp,
            env={**os.environ, **variant[2]},
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),  # noqa: PLW1509 - no threads here
        )
    deadline = time.monotonic() + 60
    import socket

    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((tmp / "broker.log").read_text()[-2000:])
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return RunningBroker(name, proc, port, tmp)
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{name} did not listen")


def _profile(
    b: RunningBroker, scenario: str, a: argparse.Namespace, rate: float = 0.0
) -> subprocess.Popen[bytes] | None:
    """``--profile DIR``: py-spy (the ``bench`` extra) samples the broker's threads and its child
    processes (the bridge's writer process) over the warm-up and the window into
    ``DIR/<broker>-<scenario>.txt`` (collapsed stacks, idle excluded)."""
    if not a.profile or not b.name.startswith("siftmq"):
        return None
    out = Path(a.profile)
    out.mkdir(parents=True, exist_ok=True)
    if rate > 0:
        scenario = f"{scenario}{rate:.0f}"
    secs = str(int(a.warmup + a.duration))
    if a.profile_native:  # perf: C frames too (the compiled hot path, pyarrow), per thread
        data = str(out / f"{b.name}-{scenario}.perf.data")
        # the broker and its children (the bridge's writer process, started with the broker)
        pids = ",".join(str(p) for p in (b.proc.pid, *(c.pid for c in b.ps.children(recursive=True))))
        return subprocess.Popen(
            ["perf", "record", "-F", "499", "-g", "-p", pids, "-o", data, "--", "sleep", secs],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    spy = ROOT / ".venv" / "bin" / "py-spy"
    return subprocess.Popen(
        [
            str(spy),
            "record",
            "--pid",
            str(b.proc.pid),
            "--duration",
            str(int(a.warmup + a.duration)),
            "--rate",
            "250",
            "--format",
            "raw",
            "--threads",
            "--subprocesses",  # the bridge's writer process too (issue 42 item 4b)
            "--nonblocking",
            "--output",
            str(out / f"{b.name}-{scenario}.txt"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def one(
    name: str, scenario: str, a: argparse.Namespace, capacity: dict[str, float], rate: float = 0.0
) -> dict[str, object]:
    b = _start(name, a.broker_cpu)
    spy = _profile(b, scenario, a, rate) if scenario != "open0" else None
    cpu0 = time.process_time()
    try:
        if scenario == "paced":
            paced = run_paced(b.port, a, False, cpu=b.cpu, pid=b.proc.pid, rate=rate)
            res = asyncio.run(asyncio.wait_for(paced, 300))
        elif scenario == "slow":
            res = asyncio.run(asyncio.wait_for(run_paced(b.port, a, True), 300))
        elif scenario == "hung":
            res = asyncio.run(asyncio.wait_for(run_paced(b.port, a, False, hung=True), 300))
        else:
            if name not in capacity:
                # siftmq's routing maximum: without ingress shedding (which the flood
                # would trigger); the open-loop run that follows has the defaults
                b.stop()
                siftmq = name == "siftmq" or _variant(name) is not None
                b = _start(name, a.broker_cpu, ("--ingress-shed-bytes", "0") if siftmq else ())
                flood_cpu: list[float] = []
                capacity[name] = asyncio.run(asyncio.wait_for(run_flood(b.port, a, b.cpu, flood_cpu), 120))
                capacity[name + " per cpu"] = flood_cpu[0] if flood_cpu else float("nan")
                b.stop()
                b = _start(name, a.broker_cpu)
            res = asyncio.run(asyncio.wait_for(run_open0(b.port, a, capacity[name], b.cpu), 300))
            # the flood's capacity per broker CPU second (3 s window; ingress shedding off)
            res["capacity_per_broker_cpu_s"] = capacity.get(name + " per cpu", float("nan"))
        res["peak_rss_mb"] = b.hwm() / 1e6
        res["broker_cpu_s"] = b.cpu()
        res["children_cpu_s"] = b.children_cpu()  # of broker_cpu_s: the bridge's writer process
        res["loadgen_cpu_s"] = time.process_time() - cpu0
        if spy is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(30)
        b.proc.send_signal(signal.SIGTERM)  # a graceful stop: the bridge commits its buffers
        with contextlib.suppress(subprocess.TimeoutExpired):
            b.proc.wait(30)
        res.update(_bridge_rows(b))
        return res
    finally:
        b.stop()


def together(names: list[str], a: argparse.Namespace, rate: float) -> list[dict[str, object]]:
    """``--together``: the paced scenario on every broker of ``names`` at once, all pinned to
    ``--broker-cpu``, each with its own clients (in this one generator) at ``rate``: their
    windows coincide, so whatever else the machine runs meanwhile (``--busy``, other users)
    weighs on all of them alike, where one after the other each met its own moment of the
    load.  The brokers also share their core with each other (a burst of one may wait behind
    another's): symmetric, each broker's pacer starting on its own tick.  ``window_loadgen_cpu_s``
    is then the generator's CPU for all of them."""
    bs: list[RunningBroker] = []
    try:
        for name in names:
            bs.append(_start(name, a.broker_cpu))

        async def all_paced() -> list[dict[str, object]]:
            return list(
                await asyncio.gather(
                    *(run_paced(b.port, a, False, cpu=b.cpu, pid=b.proc.pid, rate=rate) for b in bs)
                )
            )

        results = asyncio.run(asyncio.wait_for(all_paced(), 300))
        for b, res in zip(bs, results, strict=True):
            res["peak_rss_mb"] = b.hwm() / 1e6
            res["broker_cpu_s"] = b.cpu()
            res["children_cpu_s"] = b.children_cpu()
            b.proc.send_signal(signal.SIGTERM)  # a graceful stop: the bridge commits its buffers
        for b, res in zip(bs, results, strict=True):
            with contextlib.suppress(subprocess.TimeoutExpired):
                b.proc.wait(30)
            res.update(_bridge_rows(b))
        return results
    finally:
        for b in bs:
            b.stop()


def _bridge_rows(b: RunningBroker) -> dict[str, object]:
    """Rows the bridge committed (deliveries, and drops it logged) for the variants with it on:
    the recorder must stay exact under the load, not only cheap."""
    variant = _variant(b.name)
    if variant is None or "--no-bridge" in variant[1]:
        return {}
    import pyarrow.parquet as pq

    landing = b.tmp / "data" / "landing" / "deliveries"
    files = [f for f in landing.glob("*.parquet")] if landing.exists() else []
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    log = (b.tmp / "broker.log").read_text(errors="replace")
    # files: the child's commits of deliveries (rounds of few rows are grouped, issue 42 item 4b)
    return {
        "bridge_deliveries": rows,
        "bridge_files": len(files),
        "bridge_drop_warnings": log.count("dropped so far"),
    }


def markdown(results: list[dict[str, object]]) -> str:
    lines = []
    for scen, cols in (
        (
            "paced",
            [
                "delivered_per_s",
                "acked_per_s",
                "delivered_pct_of_acked",
                "duplicates",
                "p50_ms",
                "p99_ms",
                "sub_disconnects",
                "longest_ack_gap_ms",
                "peak_rss_mb",
                "window_broker_cpu_s",
                "window_loadgen_cpu_s",
                "delivered_per_broker_cpu_s",
                "paced_rate",
                "delivered_pct_of_rate",
                "broker_ns_per_delivery",
            ],
        ),
        (
            "slow",
            [
                "others_per_s",
                "slow_per_s",
                "delivered_pct_of_acked",
                "slow_disconnected",
                "p99_ms",
                "peak_rss_mb",
            ],
        ),
        (
            "hung",
            [
                "others_per_s",
                "delivered_pct_of_acked",
                "hung_got",
                "hung_disconnected",
                "longest_ack_gap_ms",
                "p99_ms",
                "peak_rss_mb",
            ],
        ),
        (
            "open0",
            [
                "capacity_per_s",
                "capacity_per_broker_cpu_s",
                "offered_per_s",
                "delivered_per_s",
                "delivered_pct_of_capacity",
                "delivered_pct_of_sent",
                "delivered_per_broker_cpu_s",
                "p50_ms",
                "p99_ms",
                "generator_unread_p99_ms",
                "peak_rss_mb",
                "p99_by_second_ms",
            ],
        ),
    ):
        rows = [r for r in results if r["scenario"] == scen]
        if not rows:
            continue
        lines.append(f"\n**{scen}**\n")
        lines.append("| broker | " + " | ".join(cols) + " |")
        lines.append("|---|" + "---|" * len(cols))
        for r in rows:
            if "skipped" in r:
                lines.append(f"| {r['broker']} | skipped: {r['skipped']} |" + " |" * (len(cols) - 1))
                continue
            cells = []
            for c in cols:
                v = r.get(c)
                cells.append(f"{v:,.1f}" if isinstance(v, float) else str(v))
            lines.append(f"| {r['broker']} | " + " | ".join(cells) + " |")
    lines.extend(_ratios(results))
    return "\n".join(lines)


def _ratios(results: list[dict[str, object]]) -> list[str]:
    """Per paced rate (0: publisher-paced) and repetition (``--repeat``), each defaults-like
    variant's CPU per delivered message against the ``siftmq-nostore`` of its tree (same
    ``@tag``) measured in the same repetition: the no-store broker's ns per delivery over the
    variant's (= deliveries per broker CPU second, variant over no-store; issue 42 item 4's
    figure), with each event loop's deliveries per wake-up (voluntary context switches of the
    loop thread, ``--threads``); then per rate and variant the ratios' median and spread."""
    ns: dict[tuple[float, int, str], float] = {}
    per_wake: dict[tuple[float, int, str], str] = {}
    for r in results:
        if r["scenario"] == "paced" and "skipped" not in r:
            key = (float(r.get("paced_rate", 0.0)), int(r.get("rep", 0)), str(r["broker"]))  # type: ignore[arg-type]
            ns[key] = float(r["broker_ns_per_delivery"])  # type: ignore[arg-type]
            vcs = r.get("threads", {}).get("loop", {}).get("vcs_per_1k")  # type: ignore[attr-defined]
            per_wake[key] = f"{1000 / vcs:,.0f}" if isinstance(vcs, (int, float)) and vcs > 0 else ""
    out: list[str] = []
    by: dict[tuple[float, str], list[float]] = {}
    for (rate, rep, name), v in ns.items():
        variant, _, tag = name.partition("@")
        nostore = (rate, rep, "siftmq-nostore" + (f"@{tag}" if tag else ""))
        peer = ns.get(nostore)
        if variant == "siftmq-nostore" or not variant.startswith("siftmq") or peer is None:
            continue
        if not out:
            out += ["\n**over no-store of the same tree (CPU per delivery, no-store / variant)**\n"]
            out += [
                "| rate | run | broker | ns/delivery | no-store ns | ratio "
                "| deliveries per loop wake-up (it / no-store) |",
                "|---|---:|---|---:|---:|---:|---:|",
            ]
        label = f"{rate:,.0f}" if rate else "publisher-paced"
        woke = f"{per_wake.get((rate, rep, name), '')} / {per_wake.get(nostore, '')}"
        out.append(f"| {label} | {rep + 1} | {name} | {v:,.0f} | {peer:,.0f} | {peer / v:.2f} | {woke} |")
        by.setdefault((rate, name), []).append(peer / v)
    if any(len(v) > 1 for v in by.values()):
        out += ["\n**ratios over the repetitions**\n"]
        out += ["| rate | broker | ratios | median | spread (max - min) / 2 / median |"]
        out += ["|---|---|---|---:|---:|"]
        for (rate, name), v in by.items():
            m = statistics.median(v)
            label = f"{rate:,.0f}" if rate else "publisher-paced"
            spread = (max(v) - min(v)) / 2 / m * 100
            out.append(
                f"| {label} | {name} | {', '.join(f'{x:.2f}' for x in v)} | {m:.2f} | +-{spread:.1f} % |"
            )
    return out


def _rounded(res: dict[str, object]) -> dict[str, object]:
    return {
        k: (round(v, 2) if isinstance(v, float) else v)
        for k, v in res.items()
        if k not in ("broker", "scenario")
    }


def _paced_rates(text: str) -> list[float]:
    """``--paced-rate``: comma-separated offered rates in msg/s, each > 0, or 0 for
    publisher-paced (argparse's one-line error and exit 2 otherwise); empty: publisher-paced
    (``[0.0]``)."""
    try:
        rates = [float(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected rates in msg/s, e.g. 3000,10000") from None
    if any(not r >= 0 or r == float("inf") for r in rates):
        raise argparse.ArgumentTypeError(
            f"{text!r}: every rate must be a positive number of msg/s (0: publisher-paced)"
        )
    return rates or [0.0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", default="siftmq,siftmq-defaults,mosquitto,iotcore")
    ap.add_argument("--scenarios", default="paced,slow,open0")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--window", type=int, default=32, help="unacknowledged QoS 1 PUBLISHes per publisher")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--drain", type=float, default=3.0, help="seconds without a delivery that end the drain")
    ap.add_argument("--overload", type=float, default=2.0, help="open-loop rate as a multiple of capacity")
    ap.add_argument(
        "--open-rate", type=float, default=0.0, help="open-loop msg/s for every broker (0: --overload)"
    )
    ap.add_argument("--slow-rate", type=float, default=200.0, help="msgs/s the slow subscriber reads")
    ap.add_argument("--broker-cpu", type=int, default=0)
    ap.add_argument("--load-cpu", type=int, default=1)
    ap.add_argument("--out", default="/tmp/bench-saturation.json")
    ap.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    ap.add_argument("--profile", default="", help="py-spy the brokers (siftmq) into this directory")
    ap.add_argument("--profile-native", action="store_true", help="--profile with perf (C frames)")
    ap.add_argument(
        "--threads",
        action="store_true",
        help="paced: CPU and context switches per thread of the broker and its children in the "
        "window (/proc; thread names from py-spy dump), per delivered message",
    )
    ap.add_argument("--base-root", default="", help="checkout whose siftmq runs the '<variant>@base' brokers")
    ap.add_argument(
        "--roots", default="", help="TAG=DIR,...: checkouts whose siftmq runs the '<variant>@TAG' brokers"
    )
    ap.add_argument(
        "--paced-rate",
        type=_paced_rates,
        default=[0.0],
        help="paced at these offered rates (msg/s in all, comma-separated; 0: publisher-paced; "
        "each broker once per rate, the rates outermost) instead of publisher-paced",
    )
    ap.add_argument(
        "--burst",
        type=int,
        default=0,
        help="with --paced-rate: every publisher sends this many PUBLISHes at once, all of them "
        "in the same tick (the loop's batch held equal by design; at most --window)",
    )
    ap.add_argument(
        "--together",
        action="store_true",
        help="paced only: run the brokers of a rate at the same time, each with its own clients "
        "(their windows coincide: the machine's load weighs on all alike)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each rate's brokers this many times, the order reversed every other time "
        "(the summary gives each pair's ratio, their median and spread)",
    )
    ap.add_argument(
        "--busy",
        type=int,
        default=0,
        help="a loaded machine (issue 42 item 4): this many busy-loop processes (any core) run "
        "through the whole benchmark; the load average is recorded with every result",
    )
    ap.add_argument(
        "--min-load",
        type=float,
        default=4.0,
        help="with --busy: wait (3 min at most) for this load average",
    )
    a = ap.parse_args()
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(a.busy)
    ]
    try:
        if busy:
            deadline = time.monotonic() + 180
            while os.getloadavg()[0] < a.min_load and time.monotonic() < deadline:
                time.sleep(1)
            print(f"{len(busy)} busy processes, load average {os.getloadavg()[0]:.2f}", flush=True)
        return _main(a)
    finally:
        for p in busy:
            p.kill()
            p.wait()


def _main(a: argparse.Namespace) -> int:
    if a.base_root:
        ROOTS["base"] = Path(a.base_root).resolve()
    for spec in filter(None, a.roots.split(",")):
        tag, _, path = spec.partition("=")
        if not tag or not path:
            sys.exit(f"--roots {spec!r}: expected TAG=DIR")
        ROOTS[tag] = Path(path).resolve()
    for tag, root in ROOTS.items():  # a wrong checkout would measure another tree silently
        if not (root / ".venv" / "bin" / "siftmq").exists():
            sys.exit(f"checkout for '@{tag}' has no .venv/bin/siftmq: {root} (make setup there)")
    for name in a.brokers.split(","):
        tag = name.partition("@")[2]
        if tag and tag not in ROOTS:
            sys.exit(f"broker {name!r}: no checkout for '@{tag}' (--base-root, --roots {tag}=DIR)")
    if a.burst < 0 or a.burst > a.window:
        sys.exit(f"--burst {a.burst}: expected 0 (off) to --window ({a.window})")
    if a.repeat < 1:
        sys.exit(f"--repeat {a.repeat}: expected 1 or more")
    os.sched_setaffinity(0, {a.load_cpu})
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    results: list[dict[str, object]] = []
    capacity: dict[str, float] = {}
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=False
    )
    rates: list[float] = a.paced_rate
    brokers = a.brokers.split(",")
    runs = [
        (rate, rep, name, scenario)
        for rate in rates  # the brokers of one rate one after the other
        for rep in range(a.repeat)  # then again, in the reverse order every other time
        for name in (brokers if rep % 2 == 0 else brokers[::-1])  # one broker's scenarios back
        for scenario in a.scenarios.split(",")  # to back: the same conditions
        if (rate == rates[0] and rep == 0) or scenario == "paced"  # the others have no rate
    ]
    if a.together:
        if a.scenarios != "paced":
            sys.exit("--together: only with --scenarios paced")
        for name in brokers:
            why = available("siftmq" if _variant(name) is not None else name)
            if why:
                sys.exit(f"--together: {name} cannot run: {why}")
        for rate in rates:
            for rep in range(a.repeat):
                names = brokers if rep % 2 == 0 else brokers[::-1]
                try:
                    got = together(names, a, rate)
                except Exception as exc:  # reported, the run goes on
                    got = [{"skipped": f"{type(exc).__name__}: {exc}"[:200]} for _ in names]
                for name, res in zip(names, got, strict=True):
                    res.update(broker=name, scenario="paced", loadavg=round(os.getloadavg()[0], 2), rep=rep)
                    if rate:
                        res["paced_rate"] = rate
                    results.append(res)
                    print(f"{name:16} paced  " + json.dumps(_rounded(res)), flush=True)
        runs = []
    for rate, rep, name, scenario in runs:
        why = available("siftmq" if _variant(name) is not None else name)
        if why:
            results.append({"broker": name, "scenario": scenario, "skipped": why, "paced_rate": rate})
            print(f"{name:16} {scenario:6} skipped: {why}", flush=True)
            continue
        try:
            res = one(name, scenario, a, capacity, rate if scenario == "paced" else 0.0)
        except Exception as exc:  # a peer that fails is reported, the run goes on
            res = {"skipped": f"{type(exc).__name__}: {exc}"[:200]}
        res.update(broker=name, scenario=scenario, loadavg=round(os.getloadavg()[0], 2), rep=rep)
        if rate and scenario == "paced":
            res["paced_rate"] = rate
        results.append(res)
        print(f"{name:16} {scenario:6} " + json.dumps(_rounded(res)), flush=True)
    meta = {"commit": commit.stdout.strip(), "date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(a)}
    Path(a.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    if a.markdown:
        print(
            f"\ncommit {meta['commit']}, {meta['date']}, {a.pairs} pairs, window {a.window}, {a.duration} s"
        )
        print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
