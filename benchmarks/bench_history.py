"""What the dashboard's server-side history costs (issue 38, item 5; docs/dashboard.md).

The recorder (``Dashboard.record``) runs every ``dashboard_history_interval`` seconds (5) for
the broker's whole life, page open or not, so its cost is per call divided by 5 s. Measured
in one process on an embedded broker with ``--clients`` raw MQTT 3.1.1 connections (each
subscribed), against the peer measured in the same run: the live sample
(``Dashboard.sample``) that an open page triggers every second (O(connections): the ``$SYS``
values and the overview JSON). CPU time of this thread (``time.thread_time``), the median of
``--rounds`` rounds of ``--calls`` calls each.

    .venv/bin/python benchmarks/bench_history.py [--clients 1000] [--calls 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker import Broker
from broker.packets import Connect, Subscribe, SubscriptionRequest, encode


async def _client(port: int, i: int) -> asyncio.StreamWriter:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode(Connect(client_id=f"h{i}", protocol_level=4, keep_alive=0), 4))
    writer.write(encode(Subscribe(1, (SubscriptionRequest(f"c/{i}/#", 0),)), 4))
    await writer.drain()
    await reader.read(9)  # CONNACK (4 bytes) and SUBACK (5 bytes), or part of them
    return writer


def _per_call(fn: object, calls: int) -> float:
    call = fn  # a bound method
    t0 = time.thread_time()
    for _ in range(calls):
        call()  # type: ignore[operator]
    return (time.thread_time() - t0) / calls


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0") as b:
        dash = b.dashboard
        assert dash is not None
        writers = [await _client(b.port, i) for i in range(args.clients)]
        while b.core.connected < args.clients:  # noqa: ASYNC110 (polls the broker's state)
            await asyncio.sleep(0.05)
        record, sample = [], []
        for _ in range(args.rounds):
            record.append(_per_call(dash.record, args.calls))
            sample.append(_per_call(dash.sample, max(1, args.calls // 10)))
            await asyncio.sleep(0)
        dash.recorded._check()
        for w in writers:
            w.close()
    rec, smp = statistics.median(record), statistics.median(sample)
    interval = dash.recorded.interval
    print(f"clients connected: {args.clients}; rounds: {args.rounds}")
    print(f"record (history point): {rec * 1e6:.1f} us/call  rounds {[round(x * 1e6, 1) for x in record]}")
    print(f"sample (live, peer):    {smp * 1e6:.1f} us/call  rounds {[round(x * 1e6, 1) for x in sample]}")
    print(f"record / sample: {rec / smp:.3f}")
    share = rec / interval * 100
    print(f"history recorder CPU share at one point per {interval:g} s: {share:.5f} % of a core")


if __name__ == "__main__":
    asyncio.run(main())
