"""What persistence costs the broker: QoS 1 publish throughput with and without a store.

    .venv/bin/python benchmarks/bench_persistence.py [--messages 20000] [--publishers 4] [--rounds 3]

Each configuration runs in each round, interleaved, on the same machine in the same process:
a broker (``store_path=None``, the peer, or a fresh file store with ``synchronous=FULL``),
``--publishers`` raw MQTT 5 publishers that keep ``--window`` QoS 1 PUBLISHes in flight each
(like Paho's max_inflight), and one subscriber that acknowledges what it receives:

* ``clean sub``: the subscriber has a clean session (nothing is stored: the store must cost
  nothing);
* ``persistent sub``: the subscriber's session outlives its connection (each message is
  stored before its PUBACK leaves, and deleted when the subscriber's PUBACK arrives).

Two rates per run, both from the first PUBLISH: *acknowledged* = publishes per second until
the last PUBACK; *delivered* = messages per second until the subscriber has received the
last one.  Without a store a PUBACK says nothing about delivery, and the publishers finish
while the subscriber is still behind (its backlog sits in the broker's queue), so the
acknowledged rate of the peer outruns what it delivers; with a persistent subscriber and a
store, a PUBACK leaves once the subscriber acknowledged the message (or once it is
committed), so both rates are nearly the same.  The delivered rate compares the same work
(every message delivered) and is the one the target is read on; both are printed.  Clients
and broker share one event loop, so absolute figures understate a broker with remote
clients; read the ratios against the peer measured in the same round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from broker import Broker
from broker.packets import (
    Connack,
    Connect,
    Decoder,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscriptionRequest,
    encode,
)

PAYLOAD = b'{"temp": 21.5, "room": "b7-f3-r12"}'
EXPIRY = Properties(session_expiry_interval=3600)


async def _connect(
    port: int, cid: str, clean: bool
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Decoder]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    props = Properties() if clean else EXPIRY
    writer.write(encode(Connect(cid, 5, clean_start=True, keep_alive=0, properties=props), 5))
    dec = Decoder(5, server=False)
    while True:
        packets = dec.feed(await reader.read(65536))
        if packets:
            assert isinstance(packets[0], Connack)
            return reader, writer, dec


async def _subscriber(port: int, clean: bool, total: int, ready: asyncio.Event) -> None:
    reader, writer, dec = await _connect(port, "bench-sub", clean)
    writer.write(encode(Subscribe(1, (SubscriptionRequest("bench/#", 1),)), 5))
    got = 0
    while got < total:
        data = await reader.read(1 << 16)
        if not data:
            break
        acks = []
        for p in dec.feed(data):
            if isinstance(p, Suback):
                ready.set()
            elif isinstance(p, Publish):
                got += 1
                acks.append(encode(Puback(p.packet_id or 0), 5))
        if acks:
            writer.write(b"".join(acks))
    writer.close()


async def _publisher(port: int, n: int, cid: str, window: int) -> None:
    reader, writer, dec = await _connect(port, cid, True)
    frames = [encode(Publish("bench/" + cid, PAYLOAD, 1, packet_id=(i % 65535) + 1), 5) for i in range(n)]
    sent = min(window, n)
    writer.write(b"".join(frames[:sent]))
    acked = 0
    while acked < n:
        data = await reader.read(1 << 16)
        if not data:
            raise ConnectionError("broker closed the connection")
        k = sum(1 for p in dec.feed(data) if isinstance(p, Puback))
        acked += k
        more = frames[sent : sent + k]
        sent += len(more)
        if more:
            writer.write(b"".join(more))
    writer.close()


async def run_one(
    store: str | None, clean_sub: bool, messages: int, publishers: int, window: int
) -> tuple[float, float]:
    """(acknowledged/s, delivered/s) of one run."""
    async with Broker(
        host="127.0.0.1", port=0, sys_interval=0, store_path=store, max_queued_messages=10**6
    ) as b:
        ready = asyncio.Event()
        sub = asyncio.create_task(_subscriber(b.port, clean_sub, messages, ready))
        await ready.wait()
        each = messages // publishers
        t0 = time.perf_counter()
        await asyncio.gather(*(_publisher(b.port, each, f"pub{i}", window) for i in range(publishers)))
        acked = time.perf_counter() - t0
        await sub
        delivered = time.perf_counter() - t0
    return each * publishers / acked, each * publishers / delivered


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    configs = [
        ("no store (peer)", False, True),
        ("file store", True, True),
        ("no store (peer)", False, False),
        ("file store", True, False),
    ]
    results: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, use_store, clean in configs:
                store = str(Path(tmp) / f"r{r}-{clean}" / "broker.db") if use_store else None
                rates = asyncio.run(run_one(store, clean, args.messages, args.publishers, args.window))
                results.setdefault((name, clean), []).append(rates)
                print(
                    f"round {r}: {name:16} {'clean' if clean else 'persistent'} sub: "
                    f"acknowledged {rates[0]:9.0f} msg/s, delivered {rates[1]:9.0f} msg/s"
                )
    print()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}"
    )
    print(
        f"messages {args.messages}, publishers {args.publishers}, window {args.window}, rounds {args.rounds}"
    )
    print("| subscriber | rate | no store (msg/s) | file store (msg/s) | store / no store |")
    print("|---|---|---:|---:|---:|")
    for clean in (True, False):
        label = "clean session" if clean else "persistent session"
        for k, kind in reversed(list(enumerate(("acknowledged", "delivered")))):
            base = statistics.median(x[k] for x in results["no store (peer)", clean])
            st = statistics.median(x[k] for x in results["file store", clean])
            print(f"| {label} | {kind} | {base:,.0f} | {st:,.0f} | {st / base:.2f} |")


if __name__ == "__main__":
    main()
