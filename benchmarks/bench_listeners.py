"""Listener costs: MQTT over TCP vs TLS vs WebSocket vs WebSocket+TLS, measured in one run.

    .venv/bin/python benchmarks/bench_listeners.py [--messages 20000] [--connects 200] [--rounds 3]

One broker in a child process (default asyncio loop; ``--uvloop`` for uvloop) with the
four listeners; for each transport a raw subscriber and a raw publisher (broker.packets
codec; ``websockets`` client for ws/wss) in this process stream QoS 0 PUBLISHes of 64 bytes,
``--batch`` (100) packets per write; the time until the subscriber has them all gives
messages/s, and the broker process's CPU time (psutil) over that interval gives the broker's
CPU microseconds per message, which is what the transport costs the broker (the clients may
be the bottleneck of the wall-clock rate).  Connection set-up: mean time of connect +
CONNECT/CONNACK + close, sequentially.  Rounds interleave the transports; the best round
counts.  ``--idle N``: broker RSS growth per idle client with N held (a fresh broker process
per transport).  Ratios are against plain TCP in the same run (the machine is shared:
absolute figures are noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from websockets.asyncio.client import connect as ws_connect

from broker import Broker
from broker._config import BrokerConfig, Listener
from broker.packets import Connect, Decoder, Publish, Subscribe, SubscriptionRequest, encode
from tests.security.helpers import make_certs

Send = Callable[[bytes], Awaitable[None]]
Recv = Callable[[], Awaitable[bytes]]


async def open_client(
    kind: str, port: int, ctx: ssl.SSLContext | None
) -> tuple[Send, Recv, Callable[[], Awaitable[None]]]:
    if kind.startswith("ws"):
        ws = await ws_connect(
            f"{'wss' if ctx else 'ws'}://127.0.0.1:{port}/mqtt", subprotocols=["mqtt"], ssl=ctx
        )  # type: ignore[list-item]

        async def recv_ws() -> bytes:
            data = await ws.recv()
            assert isinstance(data, bytes)
            return data

        return ws.send, recv_ws, ws.close
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)

    async def send(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    async def recv() -> bytes:
        return await reader.read(1 << 16)

    async def close() -> None:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()

    return send, recv, close


async def session(
    kind: str, port: int, ctx: ssl.SSLContext | None, cid: str
) -> tuple[Send, Recv, Callable[[], Awaitable[None]], Decoder]:
    send, recv, close = await open_client(kind, port, ctx)
    await send(encode(Connect(cid, protocol_level=5), 5))
    dec = Decoder(5, server=False)
    while not dec.feed(await recv()):
        pass
    return send, recv, close, dec


async def throughput(kind: str, port: int, ctx: ssl.SSLContext | None, n: int, per_write: int) -> float:
    ssend, srecv, sclose, sdec = await session(kind, port, ctx, f"sub-{kind}")
    await ssend(encode(Subscribe(1, (SubscriptionRequest(f"bench/{kind}", 0),)), 5))
    while not sdec.feed(await srecv()):
        pass
    psend, _, pclose, _ = await session(kind, port, ctx, f"pub-{kind}")
    batch = encode(Publish(f"bench/{kind}", b"x" * 64, 0), 5) * per_write

    async def produce() -> None:
        for _ in range(n // per_write):
            await psend(batch)

    t0 = time.perf_counter()
    task = asyncio.create_task(produce())
    got = 0
    while got < n:
        got += len(sdec.feed(await srecv()))
    elapsed = time.perf_counter() - t0
    await task
    await pclose()
    await sclose()
    return n / elapsed


async def connects(kind: str, port: int, ctx: ssl.SSLContext | None, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        _, _, close, _ = await session(kind, port, ctx, f"c-{kind}-{i}")
        await close()
    return (time.perf_counter() - t0) / n


async def idle_memory(
    kind: str, port: int, ctx: ssl.SSLContext | None, n: int, broker: psutil.Process
) -> float:
    """Broker RSS growth per idle CONNECTed client (bytes), ``n`` clients held at once."""
    before = broker.memory_info().rss
    held = [await session(kind, port, ctx, f"idle-{kind}-{i}") for i in range(n)]
    grown = broker.memory_info().rss - before
    for _, _, close, _ in held:
        await close()
    return grown / n


def serve_child(listeners: tuple[Listener, ...], ports: mp.Queue[list[int]], stop: Any, uvloop: bool) -> None:
    async def run() -> None:
        async with Broker(config=BrokerConfig(listeners=listeners, sys_interval=0)) as b:
            ports.put(b.ports)
            await asyncio.to_thread(stop.wait)

    if uvloop:
        import uvloop as uv

        uv.run(run())
    else:
        asyncio.run(run())


@contextlib.contextmanager
def broker_process(
    listeners: tuple[Listener, ...], uvloop: bool
) -> Iterator[tuple[psutil.Process, list[int]]]:
    spawn = mp.get_context("spawn")
    queue: mp.Queue[list[int]] = spawn.Queue()
    stop = spawn.Event()
    child = spawn.Process(target=serve_child, args=(listeners, queue, stop, uvloop))
    child.start()
    try:
        ports = queue.get(timeout=60)
        yield psutil.Process(child.pid), ports
    finally:
        stop.set()
        child.join(30)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--connects", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle", type=int, default=0, help="also: broker memory per idle client, N held")
    ap.add_argument("--uvloop", action="store_true", help="the broker runs on uvloop (as siftmq serve does)")
    ap.add_argument("--batch", type=int, default=100, help="PUBLISH packets per client write")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        certs = make_certs(Path(d))
        ctx = certs.client_context()
        key = (str(certs.server_cert), str(certs.server_key))
        listeners = (
            Listener("tcp", "127.0.0.1", 0),
            Listener("tcp", "127.0.0.1", 0, *key),
            Listener("ws", "127.0.0.1", 0),
            Listener("ws", "127.0.0.1", 0, *key),
        )
        kinds = [("tcp", None), ("tls", ctx), ("ws", None), ("wss", ctx)]
        rate: dict[str, float] = {}
        cpu: dict[str, float] = {}
        setup: dict[str, float] = {}
        memory: dict[str, float] = {}
        with broker_process(listeners, args.uvloop) as (broker, ports):
            for _ in range(args.rounds):
                for (kind, c), port in zip(kinds, ports, strict=True):
                    t0 = broker.cpu_times()
                    r = await throughput(kind, port, c, args.messages, args.batch)
                    t1 = broker.cpu_times()
                    used = (t1.user + t1.system - t0.user - t0.system) / args.messages
                    rate[kind] = max(rate.get(kind, 0.0), r)
                    cpu[kind] = min(cpu.get(kind, float("inf")), used)
                    s = await connects(kind, port, c, args.connects)
                    setup[kind] = min(setup.get(kind, float("inf")), s)
        for i, (kind, c) in enumerate(kinds if args.idle else []):
            with broker_process(listeners, args.uvloop) as (broker, ports):  # a fresh process per transport
                memory[kind] = await idle_memory(kind, ports[i], c, args.idle, broker)
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)  # noqa: ASYNC221 (once, after the runs)
    print(
        f"commit {git.stdout.strip()}, {args.messages} QoS 0 messages of 64 B, "
        f"{args.batch} per write, best of {args.rounds} rounds, broker loop "
        f"{'uvloop' if args.uvloop else 'asyncio'}\n"
    )
    print(
        "| transport | messages/s | vs tcp | broker CPU/message | vs tcp | connect+CONNACK+close | vs tcp |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, _ in kinds:
        print(
            f"| {kind} | {rate[kind]:,.0f} | {rate[kind] / rate['tcp']:.2f} | "
            f"{cpu[kind] * 1e6:.2f} us | {cpu[kind] / cpu['tcp']:.2f} | "
            f"{setup[kind] * 1e3:.2f} ms | {setup[kind] / setup['tcp']:.1f} |"
        )

    if memory:
        print(f"\n| transport | broker RSS per idle client ({args.idle} held) | vs tcp |\n|---|---:|---:|")
        for kind, _ in kinds:
            print(f"| {kind} | {memory[kind] / 1024:.1f} KiB | {memory[kind] / memory['tcp']:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
