"""Smoke benchmark of the broker's sans-IO core: fan-out throughput without sockets.

N subscribers (3.1.1 and 5.0 mixed) on ``bench/#``, half of them with a content filter; M
QoS 0 publishes with JSON payloads go through ``Core.publish`` and the encoded bytes are
counted by the fake transports.  The same workload runs with each content engine named on
the command line, so the ratios between engines are measured in one run.

    .venv/bin/python benchmarks/bench_broker_smoke.py --subscribers 200 --messages 2000
"""

from __future__ import annotations

import argparse
import time

import orjson

from broker._config import BrokerConfig
from broker._router import Message
from broker._session import Connection, Core
from broker.packets import NO_PROPERTIES, Connect, Properties, Subscribe, SubscriptionRequest


def run(engine: str, subscribers: int, messages: int) -> tuple[float, int]:
    core = Core(BrokerConfig(sys_interval=0, content_engine=engine))
    sent = [0]

    def write(data: bytes) -> None:
        sent[0] += 1

    for i in range(subscribers):
        version = 5 if i % 2 else 4
        conn = Connection(core, write, lambda: None, 0.0)
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--subscribers", type=int, default=200)
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--engines", default="brute-force,counting,iccounting")
    args = ap.parse_args()
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
