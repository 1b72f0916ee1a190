"""The IoT shape (issue 27 item 5): a fleet of devices publishing telemetry, dashboards, commands.

Per broker (siftmq without a store, as clean sessions write nothing anyway; mosquitto 2.0),
one after the other on the same generator (benchmarks/_storm_client.py's raw MQTT 5):

* ``--devices`` devices (``--procs`` processes), each publishing QoS 1 once a second to
  ``fleet/<id>/telemetry`` a JSON object ``{"id", "temp", "ts"}`` (spread evenly over the
  second); the first ``--commanded`` of them also subscribe to ``fleet/<id>/cmd`` (QoS 1);
* 10 dashboards (over ``--watchers`` processes) on ``fleet/+/telemetry`` (QoS 1) with the
  content filter ``temp > 90`` (9 % of the readings): an MQTT 5 ``filter`` user property
  on siftmq; mosquitto has no content filters, so its dashboards receive every reading and drop the others
  themselves (the latency counts the matching ones only);
* one commander sending each commanded device one QoS 1 command every 10 s.

Latency = arrival time - the ``ts`` the sender put in the payload (same machine clock), for
readings at the dashboards and commands at the devices, over ``--duration`` seconds after
every device is connected.  Broker CPU and RSS are read from /proc; the generator's CPU is
its processes' own.

    .venv/bin/python benchmarks/bench_iot_fleet.py --devices 19000 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import resource
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _storm_client import (
    DISCONNECT,
    _frame,
    _Proto,
    _publish_fields,
    _str,
    _varint,
    publish_packet,
    source_address,
)
from bench_restart_storm import Broker, _cpu, _rss

SELECTOR = "temp > 90"
DASHBOARDS = 10


def _connect(cid: str) -> bytes:
    body = _str("MQTT") + bytes([5, 0x02]) + struct.pack("!H", 600) + b"\x00"
    return _frame(0x10, body + _str(cid))


def _subscribe(topic: str, selector: str | None) -> bytes:
    props = b"" if selector is None else b"\x26" + _str("filter") + _str(selector)
    return _frame(0x82, struct.pack("!H", 1) + _varint(len(props)) + props + _str(topic) + b"\x01")


@dataclass
class Part:
    """One generator process's role and outcome."""

    role: str  # "devices" or "watchers" (dashboards + commander)
    ids: list[int]
    port: int
    start_at: float  # wall time at which publishing starts
    duration: float
    commanded: int
    mosquitto: bool
    handshakes: int = 25
    addresses: int = 64
    # outcome
    published: int = 0
    acked: int = 0
    latencies: list[float] = field(default_factory=list)  # ms (a sample)
    received: int = 0
    filtered_out: int = 0
    failed: int = 0
    cpu: float = 0.0


async def _open(part: Part, cid: str, i: int, sem: asyncio.Semaphore, on_pub: Any) -> _Proto:
    loop = asyncio.get_running_loop()
    connack: asyncio.Future[None] = loop.create_future()

    def on_packet(first: int, body: bytes) -> None:
        kind = first >> 4
        if kind == 2 and not connack.done():
            connack.set_result(None)
        elif kind == 4:
            part.acked += 1
        elif kind == 3:
            _t, pid, payload = _publish_fields(first, body)
            if pid:
                proto.send(b"\x40\x02" + struct.pack("!H", pid))
            on_pub(payload)

    proto = _Proto(on_packet)
    async with sem:
        await loop.create_connection(
            lambda: proto, "127.0.0.1", part.port, local_addr=(source_address(i, part.addresses), 0)
        )
        proto.send(_connect(cid))
        await asyncio.wait_for(connack, 60)
    return proto


async def _devices(part: Part) -> None:
    lat = part.latencies

    def on_cmd(payload: bytes) -> None:
        part.received += 1
        lat.append((time.time_ns() - int(payload)) / 1e6)

    sem = asyncio.Semaphore(part.handshakes)
    protos = await asyncio.gather(*(_open(part, f"d{i}", i, sem, on_cmd) for i in part.ids))
    for i, p in zip(part.ids, protos, strict=True):
        if i < part.commanded:
            p.send(_subscribe(f"fleet/{i}/cmd", None))
    await asyncio.sleep(max(0.0, part.start_at - time.time()))
    pids = [0] * len(protos)
    t0 = time.monotonic()
    tick = 0
    slots = 100  # each device publishes in one of 100 slots of the second
    while time.monotonic() - t0 < part.duration:
        for k in range(tick % slots, len(protos), slots):
            pids[k] = pids[k] % 65535 + 1
            i = part.ids[k]
            temp = (i * 7 + tick) % 100
            payload = b'{"id":%d,"temp":%d,"ts":%d}' % (i, temp, time.time_ns())
            protos[k].send(publish_packet(f"fleet/{i}/telemetry", pids[k], payload))
            part.published += 1
        tick += 1
        await asyncio.sleep(max(0.0, t0 + tick / slots - time.monotonic()))
    await asyncio.sleep(1.0)  # the last acknowledgements and commands
    for p in protos:
        p.send(DISCONNECT)
        if p.transport is not None:
            p.transport.close()


async def _watchers(part: Part) -> None:
    lat = part.latencies

    def on_reading(payload: bytes) -> None:
        part.received += 1
        doc = json.loads(payload)
        if doc["temp"] > 90:
            lat.append((time.time_ns() - doc["ts"]) / 1e6)
        else:
            part.filtered_out += 1

    sem = asyncio.Semaphore(part.handshakes)
    dash = [await _open(part, f"dash{k}", k, sem, on_reading) for k in part.ids]
    for p in dash:
        p.send(_subscribe("fleet/+/telemetry", None if part.mosquitto else SELECTOR))
    await asyncio.sleep(max(0.0, part.start_at - time.time()))
    if 0 not in part.ids:  # the commander lives with dashboard 0
        await asyncio.sleep(part.duration + 1.0)
        for p in dash:
            p.send(DISCONNECT)
            if p.transport is not None:
                p.transport.close()
        return
    cmd = await _open(part, "commander", 0, sem, lambda _p: None)
    t0 = time.monotonic()
    pid = 0
    step = 0
    per_tick = max(1, part.commanded // 100)  # every commanded device once per 10 s
    while time.monotonic() - t0 < part.duration:
        for _ in range(per_tick):
            i = step % max(1, part.commanded)
            step += 1
            pid = pid % 65535 + 1
            cmd.send(publish_packet(f"fleet/{i}/cmd", pid, b"%d" % time.time_ns()))
            part.published += 1
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)
    for p in [*dash, cmd]:
        p.send(DISCONNECT)
        if p.transport is not None:
            p.transport.close()


def _run_part(part: Part) -> Part:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        import uvloop

        run: Any = uvloop.run
    except ImportError:
        run = asyncio.run
    c0 = time.process_time()
    try:
        run(_devices(part) if part.role == "devices" else _watchers(part))
    except (OSError, TimeoutError) as exc:
        part.failed += 1
        print(f"{part.role}: {exc!r}", flush=True)
    part.cpu = time.process_time() - c0
    lat = sorted(part.latencies)
    part.latencies = lat[:: max(1, len(lat) // 20000)]
    return part


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_broker(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        b = Broker(kind, Path(tmp), store=False)
        b.start()
        assert b.proc is not None
        pid = b.proc.pid
        try:
            start_at = time.time() + args.connect_time
            parts = [
                Part(
                    "devices",
                    list(range(p, args.devices, args.procs)),
                    b.port,
                    start_at,
                    args.duration,
                    args.commanded,
                    kind == "mosquitto",
                )
                for p in range(args.procs)
            ]
            parts += [
                Part("watchers", ids, b.port, start_at, args.duration, args.commanded, kind == "mosquitto")
                for ids in (
                    [k for k in range(DASHBOARDS) if k % args.watchers == w] for w in range(args.watchers)
                )
            ]
            ctx = multiprocessing.get_context("fork")
            with concurrent.futures.ProcessPoolExecutor(len(parts), mp_context=ctx) as pool:
                futs = [pool.submit(_run_part, p) for p in parts]
                delay = start_at - time.time()
                time.sleep(max(0.0, delay))
                rss_connected, _ = _rss(pid)
                cpu0 = _cpu(pid)
                time.sleep(args.duration)
                cpu = _cpu(pid) - cpu0
                done = [f.result() for f in futs]
            _, hwm = _rss(pid)
        finally:
            b.stop(kill=False)
    devices = [p for p in done if p.role == "devices"]
    watchers = [p for p in done if p.role == "watchers"]
    watch = next(p for p in watchers if 0 in p.ids)
    res = {
        "broker": kind,
        "devices": args.devices,
        "late_start": delay < 0,
        "telemetry_published": sum(p.published for p in devices),
        "telemetry_acked": sum(p.acked for p in devices),
        "dashboard_received": sum(p.received for p in watchers),
        "dashboard_filtered_out_by_client": sum(p.filtered_out for p in watchers),
        "telemetry_p50_ms": round(_pct([x for p in watchers for x in p.latencies], 0.5), 2),
        "telemetry_p99_ms": round(_pct([x for p in watchers for x in p.latencies], 0.99), 2),
        "commands_sent": watch.published,
        "commands_received": sum(p.received for p in devices),
        "command_p50_ms": round(_pct([x for p in devices for x in p.latencies], 0.5), 2),
        "command_p99_ms": round(_pct([x for p in devices for x in p.latencies], 0.99), 2),
        "broker_cpu_per_s": round(cpu / args.duration, 3),
        "broker_rss_mib": round(rss_connected / 2**20, 1),
        "broker_peak_mib": round(hwm / 2**20, 1),
        "generator_cpu_s": round(sum(p.cpu for p in done), 1),
        "failed_parts": sum(p.failed for p in done),
    }
    print(json.dumps(res), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=19000)
    ap.add_argument("--commanded", type=int, default=1000)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--connect-time", type=float, default=30.0, help="seconds allowed to connect everyone")
    ap.add_argument("--procs", type=int, default=4, help="device processes")
    ap.add_argument("--watchers", type=int, default=5, help="dashboard processes (10 dashboards)")
    ap.add_argument("--brokers", nargs="+", default=["siftmq", "mosquitto"])
    args = ap.parse_args()
    print(f"load average {os.getloadavg()}", flush=True)
    for kind in args.brokers:
        run_broker(kind, args)
    print(f"load average {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
