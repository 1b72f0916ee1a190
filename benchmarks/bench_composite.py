"""Benchmark of the composite-subscription engine (issue 16; seed 001 section 5, Fig. 10).

Workload (the paper's, seeded): every composite subscription is ``(A|B)&(C|D)`` — three
composite elements (the whole, ``A|B``, ``C|D``) and four atoms — with A, B, C, D four distinct
kinds drawn uniformly from 100 atom kinds (topic filters ``kind/0`` .. ``kind/99``); one
subscriber key per subscription; 5,000 to 50,000 subscriptions.

Measured, library level (no broker):

* **Stored entries** (Fig. 10's y axis): one entry per distinct element with sharing
  (``EngineStats.stored_entries``), against every subscription storing its own 7 elements
  (``unshared_entries``, the paper's s(m+n)); also the paper's scheme, which replicates every
  composite element on alpha = 10 brokers and stores each atom once (alpha x composite + atoms).
* **Memory per composite subscription**: ``tracemalloc`` while the engine is built, divided by
  the subscriptions (expression strings and keys are the caller's and made before tracing).
* **subscribe / unsubscribe p50, p99** on the full engine: 2,000 random keys unsubscribed one
  by one, then subscribed again (parse cache cleared first, so parsing is included); and the
  subscribe calls of the build itself.
* **offer()**: a stream of 1 ms apart offers (window 60 s, cap 64), in two shapes: *uniform*
  over the 100 kinds (every subscription completes every few of its atoms: hundreds of composite
  events per offer at 50,000) and *hot atom* (every offer to the same kind: after the first,
  that atom is present for all its users).  The peer, in the same run, is the paper's Fig. 8
  taken literally: every subscription using the atom gets a copy in its own buffer and is
  re-evaluated (``EagerEngine`` below, same semantics, same generated shape test).

Measured, broker level (``--broker N``; broker/core/_composite.py): the QoS 0 rate of
publications that match atoms through the compiled sans-IO core: a publisher ``Connection``
is fed decoded PUBLISH packets, the core routes them (plan cache, topic index, the engine's
offer) and every delivery -- the plain one and each composite event -- is encoded by the
receiver's ``Connection`` and written to a transport that counts the writes.  N composite
subscriptions of the workload above (SUBSCRIBE packets on 100 names per connection, half
MQTT 3.1.1 with the expression in the filter, half MQTT 5 with the user property) against
the same core with none; both cores also have one plain subscriber ``kind/#`` that receives
every publication.  The two cores are measured alternately in the same process (``--rounds``
rounds of ``--pubs`` publications each; the rate is total publications / total time).  Two
streams, one publication 1 ms after the other (window 60 s):

* *uniform*: topics uniform over the 100 kinds.  At 50,000 subscriptions almost every
  subscription completes whenever both of its sides have an instance: each publication yields
  hundreds of composite events, each one a delivery.  Completions are the common case.
* *one kind*: every publication on the same kind (``kind/7``): its atom is present for all its
  users after the first, so completions are rare (the first publication only).

Over loopback (``--wire N``): two brokers in this process on uvloop, one with N composite
subscriptions held by in-process subscribers (``Broker.subscribe_composite``, queues of one
message: the events beyond are counted as dropped, so a composite event costs its creation
and its delivery to a sink, not a socket write), the other with none; a child process
connects a plain MQTT 3.1.1 subscriber on ``kind/#`` and a publisher to each and sends QoS 0
publications ``--chunk`` (100) at a time, the next chunk once the subscriber has received
the previous one; the two brokers alternate per round.  The rate is publications received
by the subscriber per second.  The engine's clock is the wall clock here, so *one kind* runs
first, on empty buffers (run after *uniform*, it would pair with the components *uniform*
left buffered for the next 60 s).

``--uniform-pubs`` sets the uniform stream's publications per round apart (it is thousands of
times slower); *one kind* needs rounds long enough for a steady state: its first publication
makes every user of ``kind/7`` evaluate its expression (about 2,000 at 50,000 subscriptions,
a fixed cost of a millisecond or two), the prefix counts of its atom are rebased every
32,000 offers, and with ``--store`` a ``--broker`` round ends with a commit (an fsync:
milliseconds) that a short round charges to a few publications.

``--store`` adds, in the same run, the same two brokers (two cores with ``--broker``) with a
store (SQLite files in a temporary directory) whose sessions are persisted: every composite
subscription is journalled and so is every offer to its atoms (broker/core/_composite_log.py).
With ``--broker`` a round of a store variant ends when the store has committed everything, so
the writer thread's time counts; with ``--wire`` the store's back-pressure applies as in
service (``Journal.bound``), and the composite subscriptions belong to persisted in-process
sessions (a sink: deliveries are not stored) instead of ``subscribe_composite``.

``--broker`` also times one snapshot of the composite state as the broker writes it, on the
event loop (``Composites.dump``, as at start and at a graceful stop) and in a forked child
(``broker/_composite_saver.py``: the event loop pays the ``fork``), and its restore.

For ``--broker``, no sockets and no decoding of the incoming bytes: the rate is the core's
plus the encoding of every outgoing PUBLISH; the socket reads and writes would add the same
cost per publication to both cores, and a cost per composite event delivered to the one with
composite subscriptions.

Garbage collection is frozen after each build (``gc.freeze()``), as a long-running broker does.

Usage::

    .venv/bin/python benchmarks/bench_composite.py [--sizes 5000,10000,20000,30000,40000,50000]
        [--offers 1000] [--out docs/composite.md] [--plot docs/img/composite-fig10.png]
    .venv/bin/python benchmarks/bench_composite.py --broker 50000 [--pubs 2000] [--rounds 3]
        [--store] [--out docs/composite.md]
    .venv/bin/python benchmarks/bench_composite.py --wire 50000 [--pubs 2000] [--uniform-pubs N]
        [--rounds 3] [--chunk 100] [--store] [--out docs/composite.md]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker._config import BrokerConfig
from composite import Atom, Component, CompositeEngine, Expr, parse
from composite._syntax import parse as _parse_cached

KINDS = 100
ALPHA = 10
PAPER_RATIO = {5_000: "5x", 50_000: "~2x"}


def workload(n: int, seed: int = 10) -> list[str]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        a, b, c, d = rnd.sample(range(KINDS), 4)
        out.append(f"(kind/{a} | kind/{b}) & (kind/{c} | kind/{d})")
    return out


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def build(exprs: list[str]) -> tuple[CompositeEngine, list[float]]:
    eng = CompositeEngine(window=60.0, max_buffer=64)
    times = []
    for key, e in enumerate(exprs):
        t0 = time.perf_counter_ns()
        eng.subscribe(key, e)
        times.append(time.perf_counter_ns() - t0)
    return eng, times


def memory_per_sub(exprs: list[str]) -> float:
    gc.collect()
    _parse_cached.cache_clear()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    eng = CompositeEngine()
    for key, e in enumerate(exprs):
        eng.subscribe(key, e)
    _parse_cached.cache_clear()  # the canonical expressions the engine keeps stay counted
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del eng
    return used / len(exprs)


# ---------------------------------------------------------------- the peer: Fig. 8 eagerly


class EagerEngine:
    """Fig. 8 literally: per subscription, per atom, a deque of (arrival, component); an
    offer appends to every subscription using the atom and re-evaluates each one.  Same
    semantics as the engine (window, cap, maximal witness, oldest first), no counters."""

    def __init__(self, window: float, cap: int) -> None:
        self.window, self.cap = window, cap
        self.users: dict[str, list[tuple[_ESub, int]]] = {}

    def subscribe(self, text: str) -> None:
        expr = parse(text)
        atoms = expr.atoms()
        sub = _ESub(expr, atoms)
        for i, a in enumerate(atoms):
            self.users.setdefault(a.text, []).append((sub, i))

    def offer(self, atom: str, comp: Component, now: float) -> int:
        lim = now - self.window
        events = 0
        for sub, i in self.users.get(atom, ()):
            buf = sub.bufs[i]
            buf.append((now, comp))
            if len(buf) > self.cap:
                buf.popleft()
            for b in sub.bufs:
                while b and b[0][0] < lim:
                    b.popleft()
            if sub.holds(sub.expr):
                parts = [(sub.bufs[j].popleft(), sub.atoms[j].text) for j in sorted(sub.witness(sub.expr))]
                parts.sort(key=lambda p: p[0][0])
                events += 1
        return events


class _ESub:
    def __init__(self, expr: Expr, atoms: tuple[Atom, ...]) -> None:
        self.expr = expr
        self.atoms = atoms
        self.index = {a.text: i for i, a in enumerate(atoms)}
        self.bufs: list[deque[tuple[float, Component]]] = [deque() for _ in atoms]

    def holds(self, x: Expr) -> bool:
        if isinstance(x, Atom):
            return bool(self.bufs[self.index[x.text]])
        if x.op == "&":
            return all(self.holds(y) for y in x.operands)
        return any(self.holds(y) for y in x.operands)

    def witness(self, x: Expr) -> set[int]:
        if isinstance(x, Atom):
            return {self.index[x.text]}
        out: set[int] = set()
        for y in x.operands:
            if x.op == "&" or self.holds(y):
                out |= self.witness(y)
        return out


_CLOCK = [1000.0]  # the stream's time, continued from one measurement to the next


def offers(
    eng: CompositeEngine, eager: EagerEngine | None, stream: list[int], seconds: float
) -> tuple[float, float, float, float]:
    """(engine offers/s, events per offer, engine µs per event, eager offers/s or 0)."""
    start = _CLOCK[0]
    ids = {a.element: a.id for a in eng.atoms()}
    names = [f"kind/{k}" for k in stream]
    comp = Component("kind/x", b'{"v": 1}', 0)
    now = start
    events = 0
    t0 = time.perf_counter()
    done = 0
    for name in names:
        now += 0.001
        events += len(eng.offer(ids[name], comp, now))
        done += 1
        if time.perf_counter() - t0 > seconds:
            break
    dt = time.perf_counter() - t0
    rate = done / dt
    per_event = dt / events * 1e6 if events else float("nan")
    eager_rate = 0.0
    if eager is not None:
        now = start
        t0 = time.perf_counter()
        edone = 0
        for name in names:
            now += 0.001
            eager.offer(name, comp, now)
            edone += 1
            if time.perf_counter() - t0 > seconds:
                break
        eager_rate = edone / (time.perf_counter() - t0)
    _CLOCK[0] = now + 1.0
    return rate, events / done, per_event, eager_rate


def broker_core(
    exprs: list[str], per_client: int = 100, store: Any = None, wall: Any = None
) -> tuple[Any, Any, list[int]]:
    """A sans-IO core with real ``Connection`` objects on counting transports: a publisher, a
    plain subscriber on ``kind/#``, and the composite subscriptions (``per_client`` names per
    connection, half MQTT 3.1.1 with the expression in the filter, half MQTT 5 with the user
    property); returns (core, publisher, [writes to the plain subscriber, writes to the others]).
    With ``store`` (a ``Store``) every session is persisted (expiry 3600 s): the composite
    subscriptions are journalled, and so is every offer to their atoms.  ``wall``: the core's
    wall clock from the start (the engine's time is the largest it has seen, so a clock
    installed after the subscriptions would stay behind the real time they were made at)."""
    from broker.core._connection import Callbacks, Connection
    from broker.core._core import Core
    from broker.packets import Connect, Properties, Subscribe, SubscriptionRequest

    held: list[tuple[Any, tuple[Any, ...]]] = []  # acknowledgements released by the store
    expiry = Properties(session_expiry_interval=3600) if store is not None else Properties()

    counts = [0, 0]

    def plain(data: bytes) -> None:
        counts[0] += 1

    def comp(data: bytes) -> None:
        counts[1] += 1

    def ignore(data: bytes) -> None:
        pass

    core = Core(BrokerConfig(sys_interval=0, max_subscriptions_per_client=per_client))
    if wall is not None:
        core.clock.wall = wall
    if store is not None:
        core.journal.store = store
        core.journal.call_threadsafe = lambda fn, *a: held.append((fn, a))
    pub = Connection(core, Callbacks(ignore, lambda: None), 0.0)
    pub.received([Connect("pub", protocol_level=5, keep_alive=0)], 0.0)
    sub = Connection(core, Callbacks(plain, lambda: None), 0.0)
    sub.received([Connect("plain", protocol_level=5, keep_alive=0, properties=expiry)], 0.0)
    sub.received([Subscribe(1, (SubscriptionRequest("kind/#", 0),))], 0.0)
    for c in range(0, len(exprs), per_client):
        v5 = (c // per_client) % 2 == 1
        conn = Connection(core, Callbacks(comp, lambda: None), 0.0)
        level, props = (5, expiry) if v5 else (4, Properties())
        clean = store is None or v5  # 3.1.1: a persistent session is CleanSession 0
        conn.received([Connect(f"c{c}", level, clean, 0, properties=props)], 0.0)
        for j, e in enumerate(exprs[c : c + per_client]):
            if v5:
                props = Properties(user_properties=(("composite", e),))
                req = SubscriptionRequest(f"$composite/n{j}", 0)
            else:
                props = Properties()
                req = SubscriptionRequest(f"$composite/n{j}/{e}", 0)
            conn.received([Subscribe(j + 1, (req,), props)], 0.0)
    if store is not None:
        store.sync().result()
        while held:
            fn, a = held.pop(0)
            fn(*a)
    core.flush()
    assert core.composite.engine.stats().subscribers == len(exprs), core.composite.refused
    counts[0] = counts[1] = 0
    return core, pub, counts


def broker_rates(
    n: int, pubs: int, rounds: int, store: bool, uniform_pubs: int
) -> list[tuple[str, str, float, float, float, float]]:
    """Per stream and store variant: (stream, variant, rate without, rate with, composite events
    per publication (one PUBLISH each: one subscriber per composite subscription), plain
    writes per publication).  Variant "none": no store; "store": every session persisted in a
    SQLite store (a temporary directory), the composite subscriptions journalled; a round of it
    ends when the store has committed everything (the writer thread's time is counted)."""
    import tempfile

    from broker.durability._store import Store
    from broker.packets import Publish

    tmp = tempfile.mkdtemp(prefix="bench-composite-")
    clock = [1.0]

    def wall() -> float:
        return clock[0]

    variants: dict[str, tuple[Any, Any, Any]] = {}  # variant -> (store, base, full)
    for variant in ["none", "store"] if store else ["none"]:
        st_b = st_f = None
        if variant == "store":
            st_b, st_f = Store(f"{tmp}/base.db"), Store(f"{tmp}/full.db")
        base = broker_core([], store=st_b, wall=wall)
        variants[variant] = (st_f, base, broker_core(workload(n), store=st_f, wall=wall))
    gc.collect()
    gc.freeze()
    rnd = random.Random(5)
    streams = {
        "uniform": [f"kind/{rnd.randrange(KINDS)}" for _ in range(uniform_pubs)],
        "one kind": ["kind/7"] * pubs,
    }
    # the engine's clock: one publication every 1 ms

    def run(c: Any, p: Any, topics_: list[str]) -> float:
        packets = [Publish(t, b'{"v": 1}', 0) for t in topics_]
        received = p.received
        flush = c.flush
        st = c.journal.store
        t0 = time.perf_counter()
        for packet in packets:
            clock[0] += 0.001
            received([packet], 0.0)
            flush()
        if st is not None:
            st.sync().result()
        return time.perf_counter() - t0

    out = []
    for name, stream in streams.items():
        clock[0] += 120.0  # past every window: each stream starts with empty buffers
        times = {v: [0.0, 0.0] for v in variants}
        marks = {v: (f[0].composite.events, f[2][0]) for v, (_, _, f) in variants.items()}
        for _ in range(rounds):
            for v, (_, (base, base_pub, _), (core, pub, _)) in variants.items():
                times[v][0] += run(base, base_pub, stream)
                times[v][1] += run(core, pub, stream)
        total = len(stream) * rounds
        for v, (_, (_, _, bc), (core, _, counts)) in variants.items():
            tb, tw = times[v]
            before, plain_before = marks[v]
            assert bc[1] == 0
            out.append(
                (
                    name,
                    v,
                    total / tb,
                    total / tw,
                    (core.composite.events - before) / total,
                    (counts[0] - plain_before) / total,
                )
            )
    gc.unfreeze()
    # persistence: a snapshot of all 50,000 as the broker takes it, on the event loop (as at a
    # graceful stop) and in a forked child (compaction while serving); and its restore
    from broker._composite_saver import _fork_dump, _wait

    core = variants["none"][2][0]
    comps = core.composite
    t0 = time.perf_counter()
    raw = comps.dump(lambda key: True)
    SNAPSHOT[:] = [time.perf_counter() - t0, float(len(raw))]
    pauses: list[float] = []
    totals: list[float] = []
    for _ in range(3):
        t0 = time.perf_counter()
        pid = _fork_dump(lambda: comps.dump(lambda key: True), f"{tmp}/fork.composite")
        pauses.append(time.perf_counter() - t0)
        assert _wait(pid)
        totals.append(time.perf_counter() - t0)
    SNAPSHOT.extend([min(pauses), max(pauses), statistics.median(totals)])
    t0 = time.perf_counter()
    comps.load(raw, [], lambda cid: True)
    SNAPSHOT.append(time.perf_counter() - t0)
    for st, _, _ in variants.values():
        if st is not None:
            st.close()
    return out


#: [dump seconds, bytes, fork pause min, fork pause max, forked snapshot seconds, load seconds]
SNAPSHOT: list[float] = []


# ---------------------------------------------------------------- over sockets (--wire)


def _frame(ptype: int, body: bytes) -> bytes:
    n = len(body)
    rl = bytearray()
    while True:
        byte, n = n % 128, n // 128
        rl.append(byte | (0x80 if n else 0))
        if not n:
            break
    return bytes([ptype]) + bytes(rl) + body


def _s(text: str) -> bytes:
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


class _Reader:
    """Counts the PUBLISH packets of a blocking socket's stream (MQTT 3.1.1)."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.buf = b""

    def packets(self) -> list[int]:
        """The packet types of the complete packets read by one recv."""
        self.buf += self.sock.recv(1 << 20)
        out = []
        buf, i = self.buf, 0
        while True:
            j, mult, rl = i + 1, 1, 0
            while j < len(buf):
                rl += (buf[j] & 0x7F) * mult
                mult *= 128
                j += 1
                if not buf[j - 1] & 0x80:
                    break
            else:
                break
            if j + rl > len(buf):
                break
            out.append(buf[i] & 0xF0)
            i = j + rl
        self.buf = buf[i:]
        return out


def wire_client(ports: list[int], pubs: int, rounds: int, chunk: int, uniform_pubs: int) -> None:
    """The client side of ``--wire`` (a separate process): per broker a subscriber on
    ``kind/#`` and a publisher (MQTT 3.1.1, QoS 0); publications are sent ``chunk`` at a
    time, each chunk after the subscriber received the previous one (no loss, no pacing by
    sleeps); prints JSON {stream: [[seconds per port] per round]}."""
    import json
    import socket

    conns = []
    for k, port in enumerate(ports):
        pair = []
        for role in ("sub", "pub"):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(_frame(0x10, _s("MQTT") + b"\x04\x02\x00\x00" + _s(f"{role}{k}")))
            r = _Reader(sock)
            while 0x20 not in r.packets():
                pass
            pair.append((sock, r))
        sub, sr = pair[0]
        sub.sendall(_frame(0x82, b"\x00\x01" + _s("kind/#") + b"\x00"))
        while 0x90 not in sr.packets():
            pass
        conns.append(pair)
    rnd = random.Random(5)
    uniform = [f"kind/{rnd.randrange(KINDS)}" for _ in range(uniform_pubs)]
    # "one kind" first: on empty buffers (the wall clock is the engine's here, and components
    # the uniform stream leaves buffered would pair with kind/7 for the next 60 s)
    streams = {"one kind": ["kind/7"] * pubs, "uniform": uniform}
    if os.environ.get("BENCH_COMPOSITE_ONE_KIND"):  # while developing: the uniform stream is slow
        del streams["uniform"]
    out: dict[str, list[list[float]]] = {}
    for name, topics_ in streams.items():
        data = [_frame(0x30, _s(t) + b'{"v": 1}') for t in topics_]
        chunks = [b"".join(data[i : i + chunk]) for i in range(0, len(data), chunk)]
        sizes = [len(data[i : i + chunk]) for i in range(0, len(data), chunk)]
        out[name] = []
        for _ in range(rounds):
            row = []
            for (_sub, sr), (pub, _) in conns:
                t0 = time.perf_counter()
                for blob, size in zip(chunks, sizes, strict=True):
                    pub.sendall(blob)
                    got = 0
                    while got < size:
                        got += sr.packets().count(0x30)
                row.append(time.perf_counter() - t0)
            out[name].append(row)
        print(json.dumps({name: out[name]}), flush=True)  # the broker counts events per stream


async def wire_rates(
    n: int, pubs: int, rounds: int, chunk: int, store: bool, uniform_pubs: int
) -> list[tuple[str, str, float, float, float]]:
    """Two brokers in this process (uvloop), one with ``n`` in-process composite
    subscriptions; the clients in a child process.  With ``store`` two more, with a store on
    disk (a temporary directory), whose composite subscriptions belong to persisted sessions
    (journalled: every offer to their atoms is a journal row).  Per stream and variant:
    (stream, variant, rate without, rate with, composite events per publication)."""
    import asyncio
    import json
    import tempfile

    from broker import Broker
    from broker.core._session import Session

    tmp = tempfile.mkdtemp(prefix="bench-composite-wire-")
    pairs: dict[str, tuple[Any, Any]] = {}
    subs = []
    for variant in ["none", "store"] if store else ["none"]:
        kw: dict[str, Any] = {}
        if variant == "store":
            kw = {"store_path": f"{tmp}/base.db"}
        base = Broker(host="127.0.0.1", port=0, sys_interval=0, **kw)
        if variant == "store":
            kw = {"store_path": f"{tmp}/full.db"}
        full = Broker(host="127.0.0.1", port=0, sys_interval=0, **kw)
        await base.start()
        await full.start()
        pairs[variant] = (base, full)
        exprs = workload(n)
        if variant == "none":
            for i, e in enumerate(exprs):
                sub = full.subscribe_composite(e, qos=0, name=f"n{i}", maxsize=1)
                await sub.__aenter__()
                subs.append(sub)
            continue
        for c in range(0, n, 100):  # persisted sessions whose deliveries go to a sink
            s = Session(f"durable{c}", 3600)
            s.persisted = True
            s.sink = lambda msg, route: None
            full.core.sessions[s.client_id] = s
            for j, e in enumerate(exprs[c : c + 100]):
                full.core.composite.add(s.client_id, f"n{j}", e, 0)
        assert len(full.core.composite.log.keys) == n
        assert full.composite_saver is not None
        await full.composite_saver.snapshot()  # the subscriptions' journal rows compacted now
    gc.collect()
    gc.freeze()
    ports = ",".join(f"{b.port},{f.port}" for b, f in pairs.values())
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--wire-client",
        ports,
        "--pubs",
        str(pubs),
        "--uniform-pubs",
        str(uniform_pubs),
        "--rounds",
        str(rounds),
        "--chunk",
        str(chunk),
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    times: dict[str, list[list[float]]] = {}
    events: dict[tuple[str, str], int] = {}
    mark = {v: f.core.composite.events for v, (_, f) in pairs.items()}
    while line := await proc.stdout.readline():  # one line per stream, when it is done
        ((name, rows),) = json.loads(line).items()
        times[name] = rows
        for v, (_, f) in pairs.items():
            events[(name, v)] = f.core.composite.events - mark[v]
            mark[v] = f.core.composite.events
    await proc.wait()
    for sub in subs:
        await sub.__aexit__(None, None, None)
    for b, f in pairs.values():
        await b.stop()
        await f.stop()
    gc.unfreeze()
    out = []
    for name, rows in times.items():
        total = (uniform_pubs if name == "uniform" else pubs) * rounds
        for k, v in enumerate(pairs):
            tb = sum(r[2 * k] for r in rows)
            tw = sum(r[2 * k + 1] for r in rows)
            out.append((name, v, total / tb, total / tw, events[(name, v)] / total))
    return out


def wire_main(args: argparse.Namespace) -> None:
    import uvloop

    n = args.wire
    rows = uvloop.run(
        wire_rates(n, args.pubs, args.rounds, args.chunk, args.store, args.uniform_pubs or args.pubs)
    )
    lines = [
        f"#### Broker over loopback: QoS 0 publications matching atoms, {n:,} composite "
        "subscriptions vs none",
        "",
        "| stream | completions | store | publications/s, no composite subscriptions | "
        f"publications/s, {n:,} composite subscriptions | with / without | target | "
        "composite events per publication |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, variant, without, with_, epp in rows:
        kind = "common" if epp >= 1 else "rare"
        store = "journalled" if variant == "store" else "none"
        lines.append(
            f"| {name} | {kind} | {store} | {without:,.0f} | {with_:,.0f} | {with_ / without:.2%} | >= 50 % "
            f"| {epp:,.2f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        write_block(args.out, "<!-- bench_composite wire table -->", text)


def write_block(out: Path, marker: str, text: str) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    cmd = "    .venv/bin/python benchmarks/bench_composite.py " + " ".join(sys.argv[1:])
    machine = (
        f"{platform.processor() or platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.system()}"
    )
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    block = (
        f"{marker}\nCommand ({when}, commit {commit}):\n\n{cmd}\n\nMachine: {machine} "
        f"(2 cores shared with other jobs; timings are noisy, ratios are measured in the same "
        f"run).\n\n{text}\n{marker}"
    )
    body = out.read_text() if out.exists() else ""
    if marker in body:
        pre, _, rest = body.partition(marker)
        _, _, post = rest.partition(marker)
        body = pre + block + post
    else:
        body = body + "\n" + block + "\n"
    out.write_text(body)


def broker_main(args: argparse.Namespace) -> None:
    n = args.broker
    rows = broker_rates(n, args.pubs, args.rounds, args.store, args.uniform_pubs or args.pubs)
    lines = [
        f"#### Broker: QoS 0 publications matching atoms, {n:,} composite subscriptions vs none",
        "",
        "| stream | completions | store | publications/s, no composite subscriptions | "
        f"publications/s, {n:,} composite subscriptions | with / without | target | "
        "composite events (PUBLISHes) per publication |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, variant, without, with_, epp, _ in rows:
        kind = "common" if epp >= 1 else "rare"
        store = "journalled" if variant == "store" else "none"
        lines.append(
            f"| {name} | {kind} | {store} | {without:,.0f} | {with_:,.0f} | {with_ / without:.2%} | >= 50 % "
            f"| {epp:,.2f} |"
        )
    dump, size, pause_lo, pause_hi, forked, load = SNAPSHOT
    lines += [
        "",
        f"Snapshot of the {n:,} composite subscriptions ({size / 1e6:.1f} MB): on the event loop "
        f"(`Composites.dump`, as at start and at a graceful stop) {dump:.2f} s; in a forked child "
        f"(compaction while serving, `broker/_composite_saver.py`) the event loop paused "
        f"{pause_lo * 1e3:.1f}-{pause_hi * 1e3:.1f} ms (the `fork`, 3 runs) and the child wrote it in "
        f"{forked:.2f} s (median); restore (`Composites.load`, at start): {load:.2f} s.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        write_block(args.out, "<!-- bench_composite broker table -->", text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", type=int, default=0, help="only the broker part, with N subscriptions")
    ap.add_argument("--pubs", type=int, default=2000, help="publications per stream per round")
    ap.add_argument(
        "--uniform-pubs",
        type=int,
        default=0,
        help="publications per round of the uniform stream (default --pubs)",
    )
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per stream (--broker)")
    ap.add_argument("--wire", type=int, default=0, help="only the loopback part, with N subscriptions")
    ap.add_argument("--chunk", type=int, default=100, help="publications in flight (--wire)")
    ap.add_argument(
        "--store", action="store_true", help="also with a store and persisted sessions (--broker, --wire)"
    )
    ap.add_argument("--wire-client", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="5000,10000,20000,30000,40000,50000")
    ap.add_argument("--offers", type=int, default=1000, help="offers per uniform stream")
    ap.add_argument("--seconds", type=float, default=20.0, help="time cap per offer measurement")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args()
    if args.wire_client is not None:
        ports = [int(p) for p in args.wire_client.split(",")]
        wire_client(ports, args.pubs, args.rounds, args.chunk, args.uniform_pubs or args.pubs)
        return
    if args.wire:
        wire_main(args)
        return
    if args.broker:
        broker_main(args)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    rnd = random.Random(3)

    entries = []  # (n, subscriptions, atoms, composites, shared, unshared)
    for n in sizes:
        eng, _ = build(workload(n))
        s = eng.stats()
        entries.append(
            (n, s.subscriptions, s.atoms, s.composite_elements, s.stored_entries, s.unshared_entries)
        )
        del eng
        gc.collect()

    big = max(sizes)
    small = min(sizes)
    mem = {n: memory_per_sub(workload(n)) for n in sorted({small, big})}

    timing_rows = []
    offer_rows = []
    for n in sorted({small, big}):
        exprs = workload(n)
        gc.collect()
        eng, build_times = build(exprs)
        gc.freeze()
        keys = rnd.sample(range(n), min(2000, n))
        ut, st = [], []
        for k in keys:
            t0 = time.perf_counter_ns()
            eng.unsubscribe(k)
            ut.append(time.perf_counter_ns() - t0)
        _parse_cached.cache_clear()
        for k in keys:
            t0 = time.perf_counter_ns()
            eng.subscribe(k, exprs[k])
            st.append(time.perf_counter_ns() - t0)
        timing_rows.append((n, build_times, st, ut))
        eager = EagerEngine(60.0, 64)
        for e in exprs:
            eager.subscribe(e)
        gc.freeze()
        uniform = [rnd.randrange(KINDS) for _ in range(args.offers)]
        hot = [rnd.randrange(KINDS)] * (args.offers * 200)
        offer_rows.append((n, "uniform", *offers(eng, eager, uniform, args.seconds)))
        offer_rows.append((n, "hot atom", *offers(eng, eager, hot, args.seconds)))
        del eng, eager
        gc.unfreeze()
        gc.collect()

    lines = ["#### Stored entries (Fig. 10)", ""]
    lines.append(
        "| composite subscriptions | distinct | atoms | composite elements | entries, shared | "
        "entries, unshared (7 each) | shared / unshared | paper's scheme, alpha = 10 | "
        "paper's scheme / unshared | paper reports |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for n, subs, atoms, comps, shared, unshared in entries:
        replicated = ALPHA * comps + atoms
        lines.append(
            f"| {n:,} | {subs:,} | {atoms} | {comps:,} | {shared:,} | {unshared:,} | "
            f"{shared / unshared:.3f} | {replicated:,} | {replicated / unshared:.2f}x | "
            f"{PAPER_RATIO.get(n, '')} |"
        )
    lines += ["", "#### Memory, subscribe, unsubscribe", ""]
    lines.append("| subscriptions | measure | value | target |")
    lines.append("|---|---|---|---|")
    for n in sorted(mem):
        lines.append(
            f"| {n:,} | memory per composite subscription (tracemalloc) | {mem[n]:,.0f} B | <= 2 KB |"
        )
    for n, bt, st, ut in timing_rows:
        lines.append(
            f"| {n:,} | subscribe while building, p50 / p99 | "
            f"{pct(bt, 0.5) / 1e3:.1f} µs / {pct(bt, 0.99) / 1e3:.1f} µs | |"
        )
        lines.append(
            f"| {n:,} | subscribe on the full engine, p50 / p99 ({len(st):,} keys) | "
            f"{pct(st, 0.5) / 1e3:.1f} µs / {pct(st, 0.99) / 1e3:.1f} µs | p50 <= 100 µs |"
        )
        lines.append(
            f"| {n:,} | unsubscribe, p50 / p99 ({len(ut):,} keys) | "
            f"{pct(ut, 0.5) / 1e3:.1f} µs / {pct(ut, 0.99) / 1e3:.1f} µs | p50 <= 100 µs |"
        )
    lines += ["", "#### offer()", ""]
    lines.append(
        "| composite subscriptions | stream | offers/s | composite events per offer | "
        "µs per composite event | Fig. 8 eagerly, offers/s | engine / eager |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for n, kind, rate, epo, per_event, eager_rate in offer_rows:
        per = f"{per_event:.2f}" if epo >= 1 else "—"
        lines.append(
            f"| {n:,} | {kind} | {rate:,.0f} | {epo:,.2f} | {per} | {eager_rate:,.0f} | "
            f"{rate / eager_rate:.1f}x |"
        )
    text = "\n".join(lines)
    print(text)

    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        xs = [e[0] for e in entries]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(xs, [e[5] for e in entries], "o-", label="no sharing: s(m+n)")
        ax.plot(xs, [ALPHA * e[3] + e[2] for e in entries], "s-", label=f"paper's scheme (alpha={ALPHA})")
        ax.plot(xs, [e[4] for e in entries], "^-", label="siftmq (shared, one broker)")
        ax.set_xlabel("composite subscriptions")
        ax.set_ylabel("stored entries")
        ax.set_title("Fig. 10 workload: (A|B)&(C|D), 100 atom kinds")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)

    if args.out is not None:
        write_block(args.out, "<!-- bench_composite table -->", text)


if __name__ == "__main__":
    main()
