"""A nemesis run (issue 30): nodes, clients, faults chosen at random from a seed, the history,
and the checker's report.  ``tests/nemesis/test_nemesis.py`` runs a short one in CI,
``benchmarks/nemesis.py`` the long ones by hand.

Per cycle one fault is drawn (``random.Random(seed)``), held for ``fault_s`` seconds, healed,
and the cluster is left ``settle_s`` seconds; a retained value is published at a random live
node in every cycle.  Faults:

``isolate``      one node cut from every other
``halves``       the nodes split in two halves
``isolate-min``  the node with the smallest ID cut off (the core of a composite group whose
                 CSSU it is in: the smallest ID is the core)
``partial``      A-B and B-C up, A-C down
``one-way``      what A sends to B dropped, B to A delivered
``kill``         ``kill -9``, restarted with its data directory at the heal
``pause``        SIGSTOP, SIGCONT at the heal
``leave``        stopped with SIGTERM (leaves), started again at the heal (joins)

After each heal, fresh subscribers at every node read the retained topic in rounds until every
node gives the cycle's value (``retained_converged`` events: seconds after the heal, or None
if not within ``settle_s``).  After the last cycle the publishers stop, the run waits
(bounded) until every acknowledged message reached the subscribers that must have it, reads
the retained topic at every node, and checks the history (:mod:`tests.nemesis._checker`).
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.nemesis._checker import Report, check
from tests.nemesis._cluster import (
    Cluster,
    History,
    Publisher,
    Subscriber,
    _close,
    first_retained,
    publish_retained,
    read_retained,
)
from tests.nemesis._net import Network

FAULTS = ("isolate", "halves", "isolate-min", "partial", "one-way", "kill", "pause", "leave")
RETAINED_TOPIC = "jepr/t"


@dataclass
class Options:
    nodes: int = 3
    cycles: int = 3
    seed: int = 1
    fault_s: float = 3.0
    settle_s: float = 3.0
    rate: float = 20.0  # messages per second per publisher
    faults: tuple[str, ...] = FAULTS
    serve: str = "cluster_refresh = 0.5\ncluster_failure_timeout = 1.0\ncluster_peer_expiry = 120\n"
    final_wait_s: float = 30.0
    #: more ``[broker]`` lines.  A subscriber's session queue holds ``max_queued_messages``
    #: (1,000 by default) and drops beyond it, counted and logged, as on one broker; a node
    #: that restarts receives at once what the peers' link sessions held for it, so its
    #: subscribers' queues must hold (rate x publishers x longest outage): with 5 nodes at 25
    #: msg/s per publisher a 5 s restart is 1,250 messages.  The run reports the overflows.
    broker: str = "max_queued_messages = 100000\n"
    composite: bool = True  # a composite subscription jc/a & jc/b and its atom publishers
    #: paho's own client, without ``PahoClient``'s fix of its QoS 2 resend after failed
    #: reconnects (the PUBLISH again after its PUBREL: duplicates no broker can prevent)
    stock_paho: bool = False
    log: Callable[[str], None] = lambda _s: None


@dataclass
class Result:
    report: Report
    history: History
    schedule: list[tuple[float, str, list[int]]]
    tracebacks: list[str]
    wall_s: float
    converged_s: float  # from the last heal to every acknowledged message delivered
    queue_overflows: int = 0  # QoS 1/2 dropped at a full session queue, every node


def run(root: Path, opts: Options) -> Result:
    start = time.monotonic()
    rng = random.Random(opts.seed)
    h = History()
    net = Network(opts.nodes)
    cluster = Cluster(net, root, serve=opts.serve, broker=opts.broker, stock_paho=opts.stock_paho)
    subs: list[Subscriber] = []
    pubs: list[Publisher] = []
    schedule: list[tuple[float, str, list[int]]] = []
    retained_values: set[str] = set()
    groups: dict[str, list[str]] = {"g": []}
    try:
        cluster.start_all(opts.nodes)
        _wait_links(cluster, h)
        n = opts.nodes
        for i in range(n):
            subs.append(Subscriber(cluster, i, f"sub{i}", "jep/#", h))
        for i in (0, n - 1):
            cid = f"shared{i}"
            groups["g"].append(cid)
            subs.append(Subscriber(cluster, i, cid, "$share/g/jep/#", h))
        _wait_routes(cluster, subs, h)
        if opts.composite:  # a composite subscriber at the last node, its atoms from nodes 0 and 1
            subs.append(Subscriber(cluster, n - 1, "comp", "$composite/pair/jc/a & jc/b", h))
        for i in range(n):
            pubs.append(Publisher(cluster, i, f"p{i}q1", 1, opts.rate, h))
            pubs.append(Publisher(cluster, i, f"p{i}q2", 2, opts.rate, h))
        if opts.composite:
            pubs.append(Publisher(cluster, 0, "ca", 1, 2.0, h, topic="jc/a"))
            pubs.append(Publisher(cluster, 1 % n, "cb", 1, 2.0, h, topic="jc/b"))
        min_node = min(range(n), key=lambda i: cluster.nodes[i].node_id)
        for cycle in range(opts.cycles):
            fault = rng.choice(opts.faults)
            undo = _apply(fault, cluster, rng, min_node)
            unhealthy = undo[1]
            h.add("fault", name=fault, unhealthy=unhealthy, cycle=cycle)
            schedule.append((time.monotonic() - start, fault, unhealthy))
            opts.log(f"cycle {cycle}: {fault} {unhealthy}")
            live = [i for i in range(n) if i not in unhealthy or fault in ("isolate", "halves", "partial")]
            node = rng.choice(live)
            value = f"n{node}c{cycle}"
            retained_values.add(value)
            publish_retained(cluster, node, RETAINED_TOPIC, value, h)
            time.sleep(opts.fault_s)  # the fault's duration: the nemesis's clock, not a wait
            undo[0]()
            healed_at = time.monotonic()
            h.add("heal", cycle=cycle)
            after = _retained_converged(cluster, value, healed_at + opts.settle_s)
            h.add("retained_converged", cycle=cycle, fault=fault, after=after)
            time.sleep(max(0.0, healed_at + opts.settle_s - time.monotonic()))
        for p in pubs:
            p.stop()
        healed = h.of("heal")[-1][0] if h.of("heal") else 0.0
        converged = _wait_delivered(h, groups, opts.final_wait_s)
        readers = [
            threading.Thread(target=read_retained, args=(cluster, i, RETAINED_TOPIC, h)) for i in range(n)
        ]
        for t in readers:
            t.start()
        for t in readers:
            t.join()
        report = check(h, groups, retained_values)
        return Result(
            report,
            h,
            schedule,
            cluster.tracebacks(),
            time.monotonic() - start,
            max(0.0, converged - healed),
            cluster.queue_overflows(),
        )
    finally:
        for c in [*pubs, *subs]:
            with contextlib.suppress(Exception):  # a client of a dead node: nothing to close
                c.close()
        cluster.close()
        net.close()


def _apply(
    fault: str, cluster: Cluster, rng: random.Random, min_node: int
) -> tuple[Callable[[], None], list[int]]:
    """Apply ``fault``; (the heal, the nodes it makes unhealthy)."""
    net = cluster.net
    n = len(cluster.nodes)
    order = list(range(n))
    rng.shuffle(order)
    a, b, c = order[0], order[1], order[2 % n]
    if fault in ("isolate", "isolate-min"):
        victim = min_node if fault == "isolate-min" else a
        net.split([victim])
        return net.heal, [victim]
    if fault == "halves":
        side = order[: n // 2]
        net.split(side)
        return net.heal, sorted(side)
    if fault == "partial":
        net.cut(a, c)
        return net.heal, [a, c]
    if fault == "one-way":
        net.drop_one_way(a, b)
        return net.heal, [a, b]
    if fault == "kill":
        cluster.kill(a, signal.SIGKILL)
        return (lambda: cluster.start(a)), [a]
    if fault == "pause":
        cluster.signal(a, signal.SIGSTOP)
        return (lambda: cluster.signal(a, signal.SIGCONT)), [a]
    if fault == "leave":
        cluster.kill(a, signal.SIGTERM)
        return (lambda: cluster.start(a)), [a]
    raise ValueError(f"unknown fault {fault!r}")


def _retained_converged(cluster: Cluster, value: str, deadline: float) -> float | None:
    """Seconds from now until a fresh subscriber at every node gets ``value`` (the cycle's
    retained publication, the newest: every node must end with it) as the retained message,
    read in rounds (one reader per node at once); None if not by ``deadline``.  The time is
    taken at the end of the round that saw every node agree (an upper bound)."""
    start = time.monotonic()
    n = len(cluster.nodes)
    while time.monotonic() < deadline:
        got: list[str | None] = [None] * n
        readers = [threading.Thread(target=_read_into, args=(cluster, i, got)) for i in range(n)]
        for t in readers:
            t.start()
        for t in readers:
            t.join()
        if all(v == value for v in got):
            return time.monotonic() - start
    return None


def _read_into(cluster: Cluster, node: int, got: list[str | None]) -> None:
    got[node] = first_retained(cluster, node, RETAINED_TOPIC)


def _wait_links(cluster: Cluster, h: History, timeout: float = 30.0) -> None:
    """Until every node logged a link up to every other node."""
    n = len(cluster.nodes)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(
            sum("cluster link to" in line and " up " in line for line in node.log) >= n - 1
            for node in cluster.nodes
        ):
            h.add("links_up")
            return
        time.sleep(0.05)
    raise AssertionError("cluster links never all up")


def _wait_routes(cluster: Cluster, subs: list[Subscriber], h: History, timeout: float = 20.0) -> None:
    """Until a probe message published at every node reaches every plain subscriber (the
    subscriptions are held everywhere)."""
    probe = Probe(cluster, subs)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe.round():
            h.add("routes_ready")
            return
    raise AssertionError("subscriptions never held at every node")


class Probe:
    """Publishes ``jep/probe`` QoS 1 at every node and checks every plain subscriber got the
    round's probes (not part of the checked history: payloads ``probe:<round>:<node>``)."""

    def __init__(self, cluster: Cluster, subs: list[Subscriber]) -> None:
        self.cluster, self.subs, self.n = cluster, subs, 0

    def round(self) -> bool:
        self.n += 1
        tag = f"probe:{self.n}"
        for i in range(len(self.cluster.nodes)):
            _publish_qos0(self.cluster, i, f"{tag}:{i}")
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            if all(self._has(s, tag) for s in self.subs if s.filter == "jep/#"):
                return True
            time.sleep(0.05)
        return False

    def _has(self, s: Subscriber, tag: str) -> bool:
        want = {f"{tag}:{i}" for i in range(len(self.cluster.nodes))}
        got = {
            f["payload"] for _t, f in s.h.of("recv") if f["client"] == s.cid and f["payload"].startswith(tag)
        }
        return want <= got


def _publish_qos0(cluster: Cluster, node: int, payload: str) -> None:
    import paho.mqtt.client as mqtt

    from tests.nemesis._net import in_namespace

    c = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, f"probe-{node}-{time.monotonic_ns()}", protocol=mqtt.MQTTv5
    )
    c.username_pw_set("nemesis")

    def go() -> None:
        c.connect(cluster.net.addresses[node], cluster.nodes[node].port)
        c.loop_start()

    in_namespace(cluster.net.namespaces[node], go)
    try:
        c.publish("jep/probe", payload, qos=1).wait_for_publish(5)
    finally:
        _close(c)


def _wait_delivered(h: History, groups: dict[str, list[str]], timeout: float) -> float:
    """Until the checker finds nothing lost (or ``timeout``); the history time it was so."""
    deadline = time.monotonic() + timeout
    while True:
        rep = check(h, groups, set())
        if not rep.lost and not rep.lost_shared:
            return time.monotonic() - h.t0
        if time.monotonic() > deadline:
            return time.monotonic() - h.t0
        time.sleep(0.2)


def summary(res: Result, opts: Options) -> dict[str, Any]:
    return {
        "nodes": opts.nodes,
        "cycles": opts.cycles,
        "seed": opts.seed,
        "fault_s": opts.fault_s,
        "settle_s": opts.settle_s,
        "rate per publisher": opts.rate,
        "clients": "paho-mqtt (stock)" if opts.stock_paho else "paho-mqtt with the QoS 2 resend fix",
        "schedule": [(round(t, 1), f, u) for t, f, u in res.schedule],
        "wall_s": round(res.wall_s, 1),
        "all delivered after the last heal (s)": round(res.converged_s, 2),
        "tracebacks": len(res.tracebacks),
        "queue overflows (max_queued_messages)": res.queue_overflows,
        **res.report.summary(),
    }
