"""Fan-out under a flooding QoS 0 publisher (issue 31, item 4).

One publisher floods QoS 0 on one topic (as fast as its socket takes it, or ``--rate`` msgs/s
on a 1 ms schedule) to ``--subs`` QoS 0 subscribers; the broker is pinned to
``--broker-cpu``. The generator runs in one of two layouts:

* ``split``: the publisher and the subscribers are separate processes (both on
  ``--load-cpu``, so that the kernel shares that core between them fairly);
* ``same``: one process and one event loop for both (as the issue's first measurement): a
  publisher that its socket never blocks takes the loop from the subscribers.

Each process samples its own counter every 50 ms; rates are taken over the common window
(after ``--warmup``). Reported: published/s (what the publisher handed to its socket),
delivered/s (sum over the subscribers, counted by bytes as ``bench_saturation``'s QoS 0
runs), routed % (delivered / subscribers / published), and the CPU seconds of the broker and of
each generator process in the window. Usage::

    .venv/bin/python benchmarks/bench_fanout_flood.py \\
        --brokers siftmq,siftmq-noshed,siftmq-defaults,mosquitto \\
        --layouts split,same [--rate 0] [--subs 100] [--duration 5]

Bounded in time; every process it starts is stopped; loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_brokers import available
from bench_saturation import VARIANTS, Client, Tally, _bind_counter, _bind_publish_handler, _open, _start
from loadgen._codec import subscribe

SAMPLE = 0.05


def _uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def _subscribers(port: int, n: int) -> tuple[list[Client], Tally]:
    st = Tally()
    subs = []
    for i in range(n):
        s = Client(st, 0, None)
        _bind_publish_handler(s)
        start = _bind_counter(s)
        await _open(port, s, f"ff-s{i}")
        assert s.transport is not None
        s.transport.write(subscribe(1, [("sat/0", 0)]))
        await s.expect(9)
        start()
        subs.append(s)
    return subs, st


async def _flood(p: Client, rate: float, stop: Event) -> None:
    """Open loop: ``rate`` msgs/s on a 1 ms schedule, or (0) whenever the socket buffer is below
    1 MiB (only TCP back-pressure slows it down)."""
    t0 = time.monotonic()
    while not stop.is_set():
        t = p.transport
        if t is None or p.closed:
            return
        if rate:
            k = int((time.monotonic() - t0) * rate) - p.tally.sent
            if k > 0:
                p.send0(k)
            await asyncio.sleep(0.001)
        else:
            if t.get_write_buffer_size() < 1 << 20:
                p.send0(2000)
            await asyncio.sleep(0)


async def _sampler(counter: Any, out: list[tuple[float, int, float]], stop: Event) -> None:
    while not stop.is_set():
        out.append((time.monotonic(), counter(), time.process_time()))
        await asyncio.sleep(SAMPLE)
    out.append((time.monotonic(), counter(), time.process_time()))


def _role(role: str, port: int, a: argparse.Namespace, ready: Event, go: Event, stop: Event, q: Any) -> None:
    """One generator process: ``subs``, ``pub`` or ``both``."""
    os.sched_setaffinity(0, {a.load_cpu})
    _uvloop()

    async def main() -> None:
        samples: dict[str, list[tuple[float, int, float]]] = {}
        tasks = []
        subs: list[Client] = []
        if role in ("subs", "both"):
            subs, st = await _subscribers(port, a.subs)
            samples["delivered"] = []
            tasks.append(asyncio.create_task(_sampler(lambda: st.delivered, samples["delivered"], stop)))
        pub = None
        if role in ("pub", "both"):
            pub = await _open(port, Client(Tally(), 0), "ff-p")
            samples["sent"] = []
        ready.set()
        while not go.is_set():  # noqa: ASYNC110 (a multiprocessing event: polled)
            await asyncio.sleep(0.01)
        if subs:  # latency samples from the start of the flood (the reservoir is uniform)
            st.recording = True
            st.window_start_ns = time.monotonic_ns()
        if pub is not None:
            tasks.append(asyncio.create_task(_sampler(lambda: pub.tally.sent, samples["sent"], stop)))
            tasks.append(asyncio.create_task(_flood(pub, a.rate, stop)))
        while not stop.is_set():  # noqa: ASYNC110 (a multiprocessing event: polled)
            await asyncio.sleep(0.02)
        await asyncio.gather(*tasks)
        for c in [*subs, *([pub] if pub else [])]:
            if c.transport is not None:
                c.transport.close()
        lat = sorted(st.latencies) if subs else []
        pct = {f"p{k}_ms": lat[min(len(lat) - 1, len(lat) * k // 100)] / 1e6 for k in (50, 99)} if lat else {}
        q.put((role, samples, pct))

    asyncio.run(main())


def _waited(pid: int) -> float:
    """Seconds the process's main thread has waited on a run queue (/proc/PID/schedstat)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


def _rate(samples: list[tuple[float, int, float]], t0: float, t1: float) -> tuple[float, float]:
    """(count/s, CPU s) of a sampled counter over [t0, t1] (nearest samples inside)."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if len(inside) < 2:
        return float("nan"), float("nan")
    (ta, na, ca), (tb, nb, cb) = inside[0], inside[-1]
    return (nb - na) / (tb - ta), cb - ca


def one(name: str, layout: str, a: argparse.Namespace) -> dict[str, object]:
    b = _start(name, a.broker_cpu)
    ctx = mp.get_context("fork")
    ready = [ctx.Event() for _ in range(2)]
    go, stop = ctx.Event(), ctx.Event()
    q = ctx.Queue()
    roles = ["subs", "pub"] if layout == "split" else ["both"]
    procs = []
    try:
        for role, ev in zip(roles, ready, strict=False):
            p = ctx.Process(target=_role, args=(role, b.port, a, ev, go, stop, q))
            p.start()
            procs.append(p)
            if not ev.wait(60):
                raise RuntimeError(f"{role} not ready")
        go.set()
        t_go = time.monotonic()
        time.sleep(a.warmup)
        cpu0, wait0, t0 = b.cpu(), _waited(b.proc.pid), time.monotonic()
        time.sleep(a.duration)
        cpu1, wait1, t1 = b.cpu(), _waited(b.proc.pid), time.monotonic()
        stop.set()
        got: dict[str, list[tuple[float, int, float]]] = {}
        cpus: dict[str, float] = {}
        lat: dict[str, float] = {}
        for _ in procs:
            role, samples, pct = q.get(timeout=60)
            lat.update(pct)
            for k, v in samples.items():
                got[k] = v
                cpus[f"{role}_{k}"] = _rate(v, t0, t1)[1]
        published, _ = _rate(got["sent"], t_go, t1)  # a backlog in the kernel outlasts a window
        delivered, _ = _rate(got["delivered"], t0, t1)
        return {
            "published_per_s": published,
            "delivered_per_s": delivered,
            "routed_pct": 100.0 * delivered / a.subs / published if published else float("nan"),
            "broker_cpu_s": cpu1 - cpu0,
            # the broker's loop thread waiting for its core (other processes on it)
            "broker_runq_wait_s": wait1 - wait0,
            # deliveries per second of broker CPU: comparable across runs of a loaded machine
            "delivered_per_cpu_s": delivered * (t1 - t0) / max(cpu1 - cpu0, 1e-9),
            **lat,
            "gen_cpu_s": {k: round(v, 2) for k, v in cpus.items()},
            "window_s": t1 - t0,
        }
    finally:
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        b.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            b.proc.wait(30)
        b.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", default="siftmq,siftmq-noshed,siftmq-defaults,mosquitto")
    ap.add_argument("--layouts", default="split,same")
    ap.add_argument("--subs", type=int, default=100)
    ap.add_argument("--rate", type=float, default=0.0, help="msgs/s offered (0: as fast as TCP takes)")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--broker-cpu", type=int, default=0)
    ap.add_argument("--load-cpu", type=int, default=1)
    ap.add_argument("--out", default="/tmp/bench-fanout-flood.json")
    a = ap.parse_args()
    results = []
    for name in a.brokers.split(","):
        for layout in a.layouts.split(","):
            why = available("siftmq" if name in VARIANTS else name)
            if why:
                res: dict[str, object] = {"skipped": why}
            else:
                try:
                    res = one(name, layout, a)
                except Exception as exc:  # a peer that fails is reported, the run goes on
                    res = {"skipped": f"{type(exc).__name__}: {exc}"[:200]}
            res.update(broker=name, layout=layout)
            results.append(res)
            print(
                json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in res.items()}),
                flush=True,
            )
    Path(a.out).write_text(json.dumps({"args": vars(a), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
