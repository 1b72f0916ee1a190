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
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import orjson

import content
from broker._config import BrokerConfig
from broker.core._connection import Callbacks, Connection
from broker.core._core import Core
from broker.core._router import Router
from broker.packets import NO_PROPERTIES, Connect, Properties, Subscribe, SubscriptionRequest
from broker.values import Message, SubOptions


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--subscribers", type=int, default=200)
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--engines", default="brute-force,counting,iccounting")
    ap.add_argument("--router", action="store_true", help="Router.route A/B on the issue-8 workloads")
    ap.add_argument("--engine", default="hema", help="content engine for --router")
    args = ap.parse_args()
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
