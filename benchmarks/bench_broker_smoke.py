"""Smoke benchmark of the broker's sans-IO core: fan-out throughput without sockets.

N subscribers (3.1.1 and 5.0 mixed) on ``bench/#``, half of them with a content filter; M
QoS 0 publishes with JSON payloads go through ``Core.publish`` and the encoded bytes are
counted by the fake transports.  The same workload runs with each content engine named on
the command line, so the ratios between engines are measured in one run.

    .venv/bin/python benchmarks/bench_broker_smoke.py --subscribers 200 --messages 2000

``--router`` instead measures ``Router.route`` alone on the issue-8 load-generator workloads
(``content``: 1,000 clients x 10 selector subscriptions, 100 topic candidates per message;
``content_base``: the same deliveries by 10,000 exact topics; ``wildcard``: 50 clients x 40
wildcard filters over 1,000 topics), against per-message routing (one index match and one
engine match per message, every candidate evaluated: the router before its plan cache),
in the same run, and prints the plan cache's misses.

    .venv/bin/python benchmarks/bench_broker_smoke.py --router

``--core-qos0`` measures the broker's QoS 0 read path without sockets: the real
``MQTTProtocol`` adapter (its ``data_received`` -> the decoder -> ``Connection.received`` ->
``Core.publish`` -> the flush of every dirty connection), fed pre-encoded PUBLISH bytes as the
event loop's reads would be, writing to counting transports. Four workloads (:data:`CORE_QOS0`:
``bench_brokers.py``'s qos0 with reads of ten PUBLISHes and of one, a fan-out to 20 and one to
1,000), interleaved round by round in one process, so that a drift of the machine hits them
all alike; each prints its median ns per delivered message. ``--ab TREE,TREE`` runs that in
alternate processes, one per tree (``env PYTHONPATH=<tree> <tree>/.venv/bin/python``, both
compiled with ``make build``), ``--alternations`` times, and prints per workload each tree's
median and the ratio second / first of each alternation (mean, min-max):

    flock /work/bench.lock .venv/bin/python benchmarks/bench_broker_smoke.py --core-qos0 \
        --ab <tree of 66e167b>,<this tree> --alternations 12
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import socket
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from loadgen import connect, make_payload, publish, subscribe

import broker
import content
from broker._config import BrokerConfig
from broker.core._connection import Callbacks, Connection
from broker.core._core import Core
from broker.core._router import Router
from broker.net._transport import MQTTProtocol
from broker.packets import NO_PROPERTIES, Connect, Properties, Subscribe, SubscriptionRequest
from broker.values import Message, SubOptions

#: ``--core-qos0`` workloads: name -> (publishers, subscribers per publisher's topic, PUBLISHes
#: per read, passes per timed sample: ~10,000 deliveries a sample)
CORE_QOS0 = {
    "pairs10": (50, 1, 10, 20),  # bench_brokers.py's qos0: 50 pairs, reads of 10 PUBLISHes
    "pairs1": (50, 1, 1, 200),  # the same pairs, one PUBLISH per read (``Core.lone`` set)
    "fan20": (1, 20, 1, 500),  # a small fan-out: 20 subscribers of one topic
    "fan1k": (1, 1000, 1, 10),  # bench_brokers.py's fanout: 1,000 subscribers (early writes)
}


def run(engine: str, subscribers: int, messages: int) -> tuple[float, int]:
    core = Core(BrokerConfig(sys_interval=0, content_engine=engine))
    sent = [0]

    def write(data: bytes) -> None:
        sent[0] += 1

    for i in range(subscribers):
        version = 5 if i % 2 else 4
        conn = Connection(core, Callbacks(write, lambda: None), 0.0)
        conn.received([Connect(f"s{i}", protocol_level=version, keep_alive=0)], 0.0)
        flt = "bench/#" if i % 4 < 2 else f"$filter/temp > {i % 50} AND room = 'r{i % 7}'/bench/#"
        props = Properties()
        if version == 5 and i % 4 >= 2:
            flt = "bench/#"
            props = Properties(user_properties=(("filter", f"temp > {i % 50} AND room = 'r{i % 7}'"),))
        conn.received([Subscribe(1, (SubscriptionRequest(flt, 0),), props)], 0.0)
    core.flush()
    sent[0] = 0
    payloads = [orjson.dumps({"temp": j % 100, "room": f"r{j % 7}", "id": j}) for j in range(messages)]
    t0 = time.perf_counter()
    for j, payload in enumerate(payloads):
        core.publish(Message.create(f"bench/{j % 10}", payload, 0, False, NO_PROPERTIES, None, 0.0), 0.0)
        core.flush()
    return time.perf_counter() - t0, sent[0]


def per_message_route(router: Router, msg: Message) -> int:
    """Deliveries of ``msg`` routed without plans (the reference: the router before issue 8)."""
    result = router.index.match(msg.topic)
    sel_ok = router.engine.match(content.attributes(msg.payload))
    n = 0
    for cid, subs in result.clients.items():
        for sub in subs:
            o = sub.options
            if (o.no_local and cid == msg.publisher_id) or (
                o.selector is not None and o.selector not in sel_ok
            ):
                continue
            n += 1
            break
    return n


def _router_workload(name: str, engine: str) -> tuple[Router, list[Message]]:
    r = Router(engine=engine)
    msgs: list[Message] = []
    if name == "wildcard":
        for i in range(50):
            for j in range(20):
                for f in (f"wc/+/{i}/{j}/#", f"wc/{i}/+/{j}/x"):
                    r.index.subscribe(f"w{i}", f, SubOptions(topic_filter=f))
        msgs = [
            Message(f"wc/a/{i}/{j}/z", b"x" * 64) for _ in range(10) for i in range(50) for j in range(20)
        ]
        return r, msgs
    filtered = name == "content"
    for c in range(1000):
        for k in range(10):
            topic = f"cf/{c % 10}/{k}" if filtered else f"cu/{c}/{k}"
            sel = f"id = {c} AND temp > 10" if filtered else None
            if sel is not None:
                r.add_selector(sel, content.compile(sel))
            r.index.subscribe(f"s{c}", topic, SubOptions(selector=sel, topic_filter=topic))
            msgs.append(Message(topic, orjson.dumps({"id": c, "temp": 20 + c % 7, "pad": "x" * 40})))
    return r, msgs


def _rate(f: Callable[[Message], object], msgs: list[Message], reps: int = 2) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for m in msgs:
            f(m)
        best = min(best, time.perf_counter() - t0)
    return len(msgs) / best


def router_ab(engine: str) -> None:
    print(
        f"| workload ({engine}) | per-message routes/s | plan cache routes/s | ratio | plan misses / routes |"
    )
    print("|---|---:|---:|---:|---:|")
    for name in ("content_base", "content", "wildcard"):
        r, msgs = _router_workload(name, engine)
        old = _rate(lambda m, r=r: per_message_route(r, m), msgs)  # type: ignore[misc]
        new = _rate(r.route, msgs)
        print(f"| {name} | {old:,.0f} | {new:,.0f} | {new / old:.2f}x | {r.cache_misses:,} / {r.routed:,} |")


class CountingTransport(asyncio.Transport):
    """The transport of one in-process connection: counts what the broker writes to it."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port
        self.nbytes = 0

    def write(self, data: Any) -> None:
        self.nbytes += len(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", self.port) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False


def _client(core: Core, port: int, setup: list[bytes]) -> tuple[MQTTProtocol, CountingTransport]:
    """A connection of ``core`` through the broker's own adapter, fed its set-up bytes."""
    proto = MQTTProtocol(core)
    t = CountingTransport(port)
    proto.connection_made(t)
    for data in setup:
        proto.data_received(data)
    return proto, t


class CoreQos0:
    """One ``CORE_QOS0`` workload on its own core: ``sample()`` times one batch of reads."""

    def __init__(self, name: str) -> None:
        pubs, subs, per_read, passes = CORE_QOS0[name]
        self.core = core = Core(BrokerConfig(sys_interval=0))
        payload = make_payload(64)  # bench_brokers.py's payload size
        self.reads: list[tuple[MQTTProtocol, bytes]] = []
        self.sinks: list[CountingTransport] = []
        self.expected = 0  # bytes delivered per pass: a 3.1.1 QoS 0 delivery is the PUBLISH's own bytes
        for i in range(pubs):
            topic = f"bench/{name}/{i}"
            for k in range(subs):
                setup = [connect(f"{name}-s{i}-{k}"), subscribe(1, [(topic, 0)])]
                _, t = _client(core, len(self.sinks), setup)
                self.sinks.append(t)
            proto, _ = _client(core, 60000 + i, [connect(f"{name}-p{i}")])
            frame = publish(topic, payload)
            self.expected += len(frame) * per_read * subs
            self.reads.append((proto, frame * per_read))
        core.flush()
        self.passes = passes
        self.deliveries = passes * pubs * per_read * subs  # per sample
        self.base = self._delivered()

    def _delivered(self) -> int:
        return sum(t.nbytes for t in self.sinks)

    def sample(self) -> float:
        """Feed ``passes`` reads to every publisher; CPU ns per delivered message. O(deliveries)."""
        reads = self.reads
        clock = time.thread_time_ns  # CPU time: the machine is shared, a wait is not a cost
        t0 = clock()
        for _ in range(self.passes):
            for proto, data in reads:
                proto.data_received(data)
        dt = clock() - t0
        got = self._delivered() - self.base
        self.base += got
        want = self.passes * self.expected
        assert got == want, f"{got} bytes delivered, {want} expected"
        return dt / self.deliveries


#: ``--core-qos0`` workloads of the lean poller (:class:`LeanReads`): name -> ready publishers
LEAN_READS = {"lean50": 50, "lean500": 500}


def core_qos0(rounds: int, names: list[str]) -> dict[str, float]:
    """The median ns per delivered message of each workload, interleaved round by round."""
    loads = {name: LeanReads(LEAN_READS[name]) if name in LEAN_READS else CoreQos0(name) for name in names}
    gc.collect()
    gc.freeze()  # the set-up's objects, as the broker's restore does (broker/_broker.py)
    for w in loads.values():  # warm-up
        w.sample()
    times: dict[str, list[float]] = {name: [] for name in loads}
    names = list(loads)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # each first in turn
            times[name].append(loads[name].sample())
    return {name: statistics.median(ts) for name, ts in times.items()}


class LeanReads:
    """The lean poller's read path (``broker/net/_lean.py``) with ``publishers`` ready at once.

    Each publisher is a real socket (a Unix socket pair: the poller's ``recv_into`` and epoll
    on it as on TCP) read by a ``LeanProtocol``; its subscriber is a counting transport as in
    :class:`CoreQos0` (the write side is not measured). A sample writes one read of ten QoS 0
    PUBLISHes to every publisher's socket (not timed), then times the poller's turns
    (``Poller._ready``, called as the loop would on the epoll descriptor's readiness) until
    every one was read: with more than ``MAX_EVENTS`` (64) ready, a turn reads 64 and leaves
    the rest for the next turns."""

    def __init__(self, publishers: int) -> None:
        from broker.net._lean import LeanProtocol, Poller

        self.loop = asyncio.new_event_loop()  # never run: the turns are called directly
        self.core = core = Core(BrokerConfig(sys_interval=0))
        self.poller = Poller(self.loop)
        payload = make_payload(64)
        self.clients: list[tuple[socket.socket, bytes]] = []
        self.sinks: list[CountingTransport] = []
        self.keep: list[socket.socket] = []
        for i in range(publishers):
            topic = f"bench/lean/{i}"
            _, t = _client(core, i, [connect(f"lean-s{i}"), subscribe(1, [(topic, 0)])])
            self.sinks.append(t)
            mine, theirs = socket.socketpair()
            mine.setblocking(False)
            LeanProtocol(core, None, self.poller, mine).start()
            theirs.sendall(connect(f"lean-p{i}"))
            self.keep.append(mine)
            self.clients.append((theirs, publish(topic, payload) * 10))
        self.deliveries = publishers * 10
        self.expected = sum(len(data) for _, data in self.clients)
        self._turns()
        for theirs, _ in self.clients:
            theirs.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                theirs.recv(1 << 16)  # the CONNACK
        self.base = sum(t.nbytes for t in self.sinks)

    def _turns(self) -> int:
        ready = self.poller._ready
        ep = self.poller._ep
        assert ep is not None
        turns = 0
        while ep.poll(0, 1):
            ready()
            turns += 1
        return turns

    def sample(self) -> float:
        """CPU ns of the poller's turns per delivered message. O(publishers)."""
        for theirs, data in self.clients:
            theirs.send(data)
        t0 = time.thread_time_ns()
        self._turns()
        dt = time.thread_time_ns() - t0
        got = sum(t.nbytes for t in self.sinks) - self.base
        self.base += got
        assert got == self.expected, f"{got} bytes delivered, {self.expected} expected"
        return dt / self.deliveries


def core_qos0_ab(trees: list[str], alternations: int, rounds: int, workloads: str) -> None:
    """``--core-qos0`` in alternate processes per tree; the ratios second / first per alternation."""
    got: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    for k in range(alternations):
        for tree in trees if k % 2 == 0 else trees[::-1]:  # either first in turn
            py = Path(tree) / ".venv" / "bin" / "python"
            cmd = [str(py), __file__, "--core-qos0", "--json", "--rounds", str(rounds), "--workloads"]
            out = subprocess.run(
                [*cmd, workloads],
                env={**os.environ, "PYTHONPATH": tree},
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            res = json.loads(out.splitlines()[-1])
            assert Path(res["tree"]).resolve() == Path(tree).resolve(), f"measured {res['tree']}, not {tree}"
            got[tree].append(res["ns"])
            print(k, tree, " ".join(f"{n} {v:.0f}" for n, v in res["ns"].items()), flush=True)
    a, b = trees
    print(
        f"\n| workload | CPU ns per delivery, first (median of {alternations}) | second "
        "| ratio second / first: median | mean | min-max |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name in got[a][0]:
        ra = [r[name] for r in got[a]]
        rb = [r[name] for r in got[b]]
        ratios = [y / x for x, y in zip(ra, rb, strict=True)]
        print(
            f"| {name} | {statistics.median(ra):.0f} | {statistics.median(rb):.0f} "
            f"| {statistics.median(ratios):.3f} | {statistics.mean(ratios):.3f} "
            f"| {min(ratios):.3f}-{max(ratios):.3f} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--subscribers", type=int, default=200)
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--engines", default="brute-force,counting,iccounting")
    ap.add_argument("--router", action="store_true", help="Router.route A/B on the issue-8 workloads")
    ap.add_argument("--engine", default="hema", help="content engine for --router")
    ap.add_argument("--core-qos0", action="store_true", help="the QoS 0 read path in process, no sockets")
    ap.add_argument("--rounds", type=int, default=40, help="--core-qos0: timed samples per workload")
    ap.add_argument("--ab", default="", help="--core-qos0: TREE,TREE measured in alternate processes")
    ap.add_argument("--alternations", type=int, default=12, help="--ab: processes per tree")
    ap.add_argument("--json", action="store_true", help="--core-qos0: one JSON line")
    ap.add_argument(
        "--workloads",
        default=",".join([*CORE_QOS0, *LEAN_READS]),
        help="--core-qos0: these of CORE_QOS0 and LEAN_READS",
    )
    args = ap.parse_args()
    if args.core_qos0 and args.ab:
        trees = args.ab.split(",")
        if len(trees) != 2:
            ap.error("--ab: two trees, comma-separated")
        for tree in trees:
            if not (Path(tree) / ".venv" / "bin" / "python").is_file():
                ap.error(f"--ab: {tree}: no .venv/bin/python there (a checkout after `make build`)")
        core_qos0_ab(trees, args.alternations, args.rounds, args.workloads)
        return
    if args.core_qos0:
        ns = core_qos0(args.rounds, args.workloads.split(","))
        tree = str(Path(broker.__file__).resolve().parent.parent)
        if args.json:
            print(json.dumps({"tree": tree, "ns": ns}))
        else:
            print(f"{tree}: " + ", ".join(f"{n} {v:.0f} ns per delivery" for n, v in ns.items()))
        return
    if args.router:
        router_ab(args.engine)
        return
    rows = []
    for engine in args.engines.split(","):
        dt, writes = run(engine, args.subscribers, args.messages)
        rows.append((engine, dt, writes))
    base = rows[0][1]
    print(f"| engine | publishes/s | deliveries/s | time vs {rows[0][0]} |")
    print("|---|---|---|---|")
    for engine, dt, writes in rows:
        print(f"| {engine} | {args.messages / dt:,.0f} | {writes / dt:,.0f} | {dt / base:.2f}x |")


if __name__ == "__main__":
    main()
