"""Bridge benchmark: hot-path cost, sustained throughput, hard-kill loss window, Spark delay.

Run from the repository root:  .venv/bin/python benchmarks/bench_bridge.py [--quick] [--md FILE]

1. hot path: ns per ``on_delivery`` vs the peer ``list.append`` of the same record (same run);
2. sustained: records/s from the first ``on_delivery`` until every record is committed (writer
   thread running concurrently with the producer), and the writer's own rate (records/s of the
   table-building + Parquet commit);
3. hard kill: a process feeding a Bridge at 20k records/s is SIGKILLed; the window lost is the
   kill time minus the time of the newest committed record (roll interval 0.5 s, several runs);
4. Spark delay: a probe delivery is recorded, the analytics run continuously (topic_rate only,
   trigger as fast as possible); delay = first time the probe's topic appears in the result
   minus the probe's delivery time, p50 over the probes.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bridge import Bridge, Kind
from bridge._analytics import results, spark_session, start_queries
from broker.hooks import Delivery, Hooks, Publication
from tests.bridge.records import delivery
from tests.bridge.test_bridge_hard_kill import kill_feeder


def hot_path(n: int) -> tuple[float, float]:
    recs = [delivery(i, 1.8e9 + i) for i in range(n)]
    peer: list[object] = []
    append = peer.append
    t = time.perf_counter()
    for r in recs:
        append(r)
    t_peer = (time.perf_counter() - t) / n * 1e9
    with tempfile.TemporaryDirectory() as d:
        b = Bridge(d, max_pending=n + 1)
        on = b.on_delivery
        t = time.perf_counter()
        for r in recs:
            on(r)
        t_bridge = (time.perf_counter() - t) / n * 1e9
        b.close()
    return t_bridge, t_peer


def sustained(n: int) -> tuple[float, float]:
    recs = [delivery(i, 1.8e9 + i) for i in range(n)]
    with tempfile.TemporaryDirectory() as d:
        b = Bridge(d)
        b.start_writer()
        on = b.on_delivery
        t = time.perf_counter()
        for r in recs:
            on(r)
        assert b.wait_written(Kind.DELIVERIES, n, timeout=600)
        total = time.perf_counter() - t
        b.close()
        # Writer alone: commit n buffered records.
        b2 = Bridge(Path(d) / "w", max_pending=n + 1)
        for r in recs:
            b2.on_delivery(r)
        t = time.perf_counter()
        b2.flush()
        writer = time.perf_counter() - t
    return n / total, n / writer


def hard_kill(runs: int) -> list[float]:
    windows = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as d:
            killed_at, ids, times = kill_feeder(Path(d) / "landing", roll_interval=0.5, rate=20_000, ticks=30)
            assert sorted(ids) == list(range(len(ids)))
            windows.append(killed_at - max(times))
    return windows


def spark_delay(probes: int, load_rate: float) -> list[float]:
    spark = spark_session()
    delays = []
    with tempfile.TemporaryDirectory() as d:
        landing, out = Path(d) / "landing", Path(d) / "out"
        b = Bridge(landing)
        b.start_writer()
        stop = threading.Event()

        def load() -> None:  # background deliveries on other topics
            i = 0
            while not stop.is_set():
                for _ in range(100):
                    b.on_delivery(delivery(10_000_000 + i, time.time(), topic="load/x"))
                    i += 1
                stop.wait(100 / load_rate)

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        b.on_delivery(delivery(0, time.time(), topic="warmup"))
        queries = start_queries(spark, landing, out, trigger=0.0, only=("topic_rate",))
        try:
            seen: set[str] = set()
            deadline = time.time() + 120
            while "warmup" not in seen and time.time() < deadline:
                rate = results(out, "topic_rate")
                seen = set(rate["topic"]) if not rate.empty else set()
                stop.wait(0.05)
            for k in range(probes):
                topic = f"probe/{k}"
                t0 = time.time()
                b.on_delivery(delivery(k + 1, t0, topic=topic))
                while time.time() - t0 < 60:
                    rate = results(out, "topic_rate")
                    if not rate.empty and topic in set(rate["topic"]):
                        delays.append(time.time() - t0)
                        break
                    stop.wait(0.02)
        finally:
            stop.set()
            for q in queries:
                q.stop()
            b.close()
            spark.stop()
    return delays


class _ListHook(Hooks):
    """Peer: a hook that only appends the broker's records to a list (no writer)."""

    def __init__(self) -> None:
        self.records: list[object] = []

    def on_delivery(self, delivery: Delivery) -> None:
        self.records.append(delivery)

    def on_publication(self, publication: Publication) -> None:
        self.records.append(publication)


async def _broker_rate(hook: str, messages: int, subscribers: int) -> float:
    """QoS 0 deliveries/s: messages published from code, fanned out to raw TCP subscribers that
    only read (MQTT 3.1.1, topic b/x, 8-byte payload: 15 bytes per PUBLISH)."""
    import asyncio

    from broker import Broker

    with tempfile.TemporaryDirectory() as d:
        hooks: list[Hooks] = {"none": [], "list": [_ListHook()], "bridge": [Bridge(d)]}[hook]
        async with Broker(host="127.0.0.1", port=0, hooks=hooks) as b:
            streams = []
            for k in range(subscribers):
                reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
                cid = f"sub{k}".encode()
                var = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(cid).to_bytes(2, "big") + cid
                writer.write(bytes([0x10, len(var)]) + var)
                await reader.readexactly(4)  # CONNACK
                sub = b"\x00\x01" + b"\x00\x03b/x" + b"\x00"
                writer.write(bytes([0x82, len(sub)]) + sub)
                await reader.readexactly(5)  # SUBACK
                streams.append((reader, writer))

            async def drain(reader: asyncio.StreamReader) -> None:
                await reader.readexactly(15 * messages)

            t = time.perf_counter()
            tasks = [asyncio.create_task(drain(r)) for r, _ in streams]
            payload = b"01234567"
            for i in range(messages):
                await b.publish("b/x", payload, qos=0)
                if i % 200 == 0:
                    await asyncio.sleep(0)
            await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - t
            for _, w in streams:
                w.close()
        return messages * subscribers / elapsed


def broker_impact(messages: int, subscribers: int, rounds: int) -> dict[str, float]:
    import asyncio

    best: dict[str, float] = {}
    for _ in range(rounds):  # interleaved, best of each
        for hook in ("none", "list", "bridge"):
            rate = asyncio.run(_broker_rate(hook, messages, subscribers))
            best[hook] = max(best.get(hook, 0.0), rate)
    return best


class _Lines(list[str]):
    """Result lines, echoed as they come (a long run shows progress)."""

    def append(self, line: str) -> None:
        print(line, flush=True)
        super().append(line)

    def __iadd__(self, lines: object) -> _Lines:
        for line in lines:  # type: ignore[attr-defined]
            self.append(line)
        return self


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--md", type=Path, default=None)
    ap.add_argument("--parts", default="hot,sustained,kill,broker,spark")
    args = ap.parse_args()
    n = 200_000 if args.quick else 1_000_000
    lines = _Lines()
    lines += [f"machine: {platform.platform()}, {platform.python_version()}, shared 2-core VM (noisy)", ""]
    parts = set(args.parts.split(","))
    if "hot" in parts:
        hb, hp = hot_path(n)
        lines.append(
            f"hot path: on_delivery {hb:.0f} ns/record vs list.append peer {hp:.0f} ns (ratio {hb / hp:.2f})"
        )
    if "sustained" in parts:
        total, writer = sustained(n)
        lines.append(
            f"sustained (producer + writer thread, {n} records): {total:,.0f} records/s; "
            f"writer alone {writer:,.0f} records/s"
        )
    if "kill" in parts:
        windows = hard_kill(3 if args.quick else 6)
        lines.append(
            "hard kill at roll_interval 0.5 s: lost window "
            + ", ".join(f"{w:.3f}" for w in windows)
            + f" s (max {max(windows):.3f} s)"
        )
    try:
        if "broker" not in parts:
            raise ImportError("not selected")
        r = broker_impact(20_000 if args.quick else 50_000, 4, 3)
        lines.append(
            f"broker QoS 0 deliveries/s (4 raw subscribers, publish from code, best of 3): no hook "
            f"{r['none']:,.0f}; list-append hook {r['list']:,.0f} ({r['list'] / r['none']:.3f}); "
            f"bridge {r['bridge']:,.0f} ({r['bridge'] / r['none']:.3f}; vs list hook "
            f"{r['bridge'] / r['list']:.3f})"
        )
    except ImportError as exc:
        lines.append(f"broker impact: not measured ({exc})")
    delays = spark_delay(5 if args.quick else 20, load_rate=5_000) if "spark" in parts else []
    if delays:
        lines.append(
            f"delivery -> visible in Spark result (topic_rate, roll 0.5 s, trigger 0): p50 "
            f"{statistics.median(delays):.2f} s, max {max(delays):.2f} s over {len(delays)} probes"
        )
    text = "\n".join(lines)
    if args.md is not None:
        args.md.write_text(text + "\n")


if __name__ == "__main__":
    main()
