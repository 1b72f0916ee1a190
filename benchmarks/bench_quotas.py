"""Publish quotas under load (issue 39, item 4): a client at 10x its quota is held to it, and the
other clients keep their rate.

One broker in a child process (``Broker`` with a ``[[quotas]]`` rule for client ids ``hog*``;
pinned to ``--broker-cpu`` when given), the load generator in this process (raw MQTT 3.1.1
sockets, asyncio): ``--clients`` ordinary publishers each sending QoS 0 at ``--rate`` msgs/s on
a 10 ms schedule (open loop), and one subscriber on ``b/#`` counting deliveries per publisher
by topic.  Two phases in the same run, each on a fresh broker:

* ``alone``: the ordinary publishers only (the peer);
* ``hog``: the same plus client ``hog-1`` offering ``--overload`` x its quota
  (``--quota`` msgs/s, burst ``--burst`` s) as fast as its socket takes it.

Rates are deliveries/s seen by the subscriber in the window ``[--warmup, --warmup + --duration]``
of each phase.  Reported: the hog's rate / its quota (goal: within 10 %) and the ordinary
publishers' rate in ``hog`` / in ``alone`` (goal: >= 0.90).

Usage::

    flock /work/bench.lock .venv/bin/python benchmarks/bench_quotas.py [--clients 4] \
        [--rate 1000] [--quota 1000] [--overload 10] [--duration 5] [--warmup 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import time

from broker.packets import (
    NO_PROPERTIES,
    Connect,
    Decoder,
    Publish,
    Subscribe,
    SubscriptionRequest,
    encode,
    encode_publish,
)


def _serve(port_q: multiprocessing.Queue[int], quota: float, burst: float, cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    from broker import Broker
    from broker.core._quota import QuotaRule

    async def main() -> None:
        rule = QuotaRule(client_id="hog*", messages_per_second=quota, burst_seconds=burst)
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, quotas=(rule,)) as b:
            port_q.put(b.port)
            await asyncio.Event().wait()

    asyncio.run(main())


async def _open(port: int, client_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode(Connect(client_id, protocol_level=4, keep_alive=0), 4))
    await writer.drain()
    await reader.readexactly(4)  # CONNACK
    return reader, writer


async def _subscriber(port: int, counts: dict[str, list[float]], ready: asyncio.Event) -> None:
    reader, writer = await _open(port, "bench-sub")
    writer.write(encode(Subscribe(1, (SubscriptionRequest("b/#", 0),)), 4))
    await writer.drain()
    dec = Decoder(4, server=False)
    ready.set()
    while True:
        data = await reader.read(65536)
        if not data:
            return
        now = time.monotonic()
        for p in dec.feed(data):
            if isinstance(p, Publish):
                counts.setdefault(p.topic, []).append(now)


async def _paced(port: int, client_id: str, rate: float, stop: float) -> None:
    _, writer = await _open(port, client_id)
    frame = encode_publish(f"b/{client_id}", b"x" * 32, 0, False, False, None, NO_PROPERTIES, 4)
    per_tick = rate / 100
    owed = 0.0
    nxt = time.monotonic()
    while nxt < stop:
        owed += per_tick
        n = int(owed)
        owed -= n
        writer.write(frame * n)
        await writer.drain()
        nxt += 0.01
        await asyncio.sleep(max(0.0, nxt - time.monotonic()))
    writer.close()


async def _phase(a: argparse.Namespace, hog: bool) -> dict[str, float]:
    q: multiprocessing.Queue[int] = multiprocessing.Queue()
    proc = multiprocessing.Process(target=_serve, args=(q, a.quota, a.burst, a.broker_cpu), daemon=True)
    proc.start()
    try:
        port = await asyncio.to_thread(q.get, True, 30)
        counts: dict[str, list[float]] = {}
        ready = asyncio.Event()
        sub = asyncio.create_task(_subscriber(port, counts, ready))
        await ready.wait()
        await asyncio.sleep(0.2)  # the SUBSCRIBE processed before the load (no data race on counts)
        t0 = time.monotonic()
        stop = t0 + a.warmup + a.duration + 0.5
        tasks = [_paced(port, f"c{i}", a.rate, stop) for i in range(a.clients)]
        if hog:
            tasks.append(_paced(port, "hog-1", a.quota * a.overload, stop))
        await asyncio.gather(*tasks)
        await asyncio.sleep(0.5)
        sub.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sub
        lo, hi = t0 + a.warmup, t0 + a.warmup + a.duration
        rates = {t: sum(lo <= x < hi for x in xs) / a.duration for t, xs in counts.items()}
        return rates
    finally:
        proc.kill()
        proc.join()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rate", type=float, default=1000.0, help="msgs/s of each ordinary publisher")
    ap.add_argument("--quota", type=float, default=1000.0, help="the hog's quota, msgs/s")
    ap.add_argument("--burst", type=float, default=1.0, help="its bucket, seconds of the quota")
    ap.add_argument("--overload", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--broker-cpu", type=int, default=None)
    a = ap.parse_args()
    alone = await _phase(a, hog=False)
    with_hog = await _phase(a, hog=True)
    ordinary = [f"b/c{i}" for i in range(a.clients)]
    base = sum(alone.get(t, 0.0) for t in ordinary)
    loaded = sum(with_hog.get(t, 0.0) for t in ordinary)
    hog_rate = with_hog.get("b/hog-1", 0.0)
    result = {
        "ordinary_alone_per_s": base,
        "ordinary_with_hog_per_s": loaded,
        "ordinary_ratio": loaded / base if base else 0.0,
        "hog_offered_per_s": a.quota * a.overload,
        "hog_delivered_per_s": hog_rate,
        "hog_over_quota": hog_rate / a.quota,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
