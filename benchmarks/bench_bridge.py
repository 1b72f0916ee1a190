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
from broker import Message
from broker.hooks import Delivery, DeliveryEntry, Hooks, Publication
from broker.packets import NO_PROPERTIES
from tests.bridge.records import delivery, feed
from tests.bridge.test_bridge_hard_kill import kill_feeder


def _calls(n: int, fanout: int) -> list[tuple[float, Message, list[DeliveryEntry], int]]:
    """n publications on b/x fanned out to ``fanout`` subscribers, as the broker passes them."""
    out = []
    for i in range(n):
        msg = Message("b/x", b"01234567", 0, False, NO_PROPERTIES, None, i, 1.8e9 + i)
        fan: list[DeliveryEntry] = [(f"sub{k}", "b/x", None, 0, False) for k in range(fanout)]
        out.append((1.8e9 + i + 0.001, msg, fan, fanout))
    return out


def hot_path(n: int, fanout: int) -> tuple[float, float]:
    """ns per on_deliveries call (one publication) vs the peer list.append of the same tuple."""
    calls = _calls(n, fanout)
    peer: list[object] = []
    append = peer.append
    t = time.perf_counter()
    for c in calls:
        append(c)
    t_peer = (time.perf_counter() - t) / n * 1e9
    with tempfile.TemporaryDirectory() as d:
        b = Bridge(d, max_pending=n * (fanout + 1) + 1)
        on = b.on_deliveries
        t = time.perf_counter()
        for c in calls:
            on(*c)
        t_bridge = (time.perf_counter() - t) / n * 1e9
        b.close()
    return t_bridge, t_peer


def sustained(n: int, fanout: int) -> tuple[float, float]:
    """Rows (deliveries + publications) per second: producer + writer thread, and writer alone."""
    calls = _calls(n, fanout)
    rows = n * (fanout + 1)
    with tempfile.TemporaryDirectory() as d:
        b = Bridge(d, max_pending=rows + 1)
        b.start_writer()
        on = b.on_deliveries
        t = time.perf_counter()
        for c in calls:
            on(*c)
        assert b.wait_written(Kind.DELIVERIES, n * fanout, timeout=600)
        assert b.wait_written(Kind.PUBLICATIONS, n, timeout=600)
        total = time.perf_counter() - t
        b.close()
        # Writer alone: commit the buffered calls.
        b2 = Bridge(Path(d) / "w", max_pending=rows + 1)
        for c in calls:
            b2.on_deliveries(*c)
        t = time.perf_counter()
        b2.flush()
        writer = time.perf_counter() - t
    return rows / total, rows / writer


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
                    feed(b, delivery(10_000_000 + i, time.time(), topic="load/x"))
                    i += 1
                stop.wait(100 / load_rate)

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        feed(b, delivery(0, time.time(), topic="warmup"))
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
                feed(b, delivery(k + 1, t0, topic=topic))
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
    """Peer: a hook that only appends the broker's per-record records to a list (no writer)."""

    def __init__(self) -> None:
        self.records: list[object] = []

    def on_delivery(self, delivery: Delivery) -> None:
        self.records.append(delivery)

    def on_publication(self, publication: Publication) -> None:
        self.records.append(publication)


class _BatchedListHook(Hooks):
    """Peer: a hook that only appends the batched calls to a list (the bridge minus its writer)."""

    def __init__(self) -> None:
        self.records: list[object] = []

    def on_deliveries(
        self, time: float, message: Message, deliveries: list[DeliveryEntry], routes: int
    ) -> None:
        self.records.append((time, message, deliveries, routes))


async def _broker_rate(hook: str, messages: int, subscribers: int) -> float:
    """QoS 0 deliveries/s: messages published from code, fanned out to raw TCP subscribers that
    only read (MQTT 3.1.1, topic b/x, 8-byte payload: 15 bytes per PUBLISH)."""
    import asyncio

    from broker import Broker

    with tempfile.TemporaryDirectory() as d:
        choices: dict[str, list[Hooks]] = {
            "none": [],
            "list": [_ListHook()],
            "batched-list": [_BatchedListHook()],
            "bridge": [Bridge(d)],
        }
        hooks = choices[hook]
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


HOOKS = ("none", "list", "batched-list", "bridge")


def broker_impact(messages: int, subscribers: int, rounds: int) -> dict[str, list[float]]:
    import asyncio

    rates: dict[str, list[float]] = {h: [] for h in HOOKS}
    for _ in range(rounds):  # interleaved rounds
        for hook in HOOKS:
            rates[hook].append(asyncio.run(_broker_rate(hook, messages, subscribers)))
    return rates


class _Lines(list[str]):
    """Result lines, echoed as they come (a long run shows progress)."""

    def append(self, line: str) -> None:
        print(line, flush=True)
        super().append(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--md", type=Path, default=None)
    ap.add_argument("--parts", default="hot,sustained,kill,broker,spark")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n = 200_000 if args.quick else 1_000_000
    lines = _Lines()
    lines.append(f"machine: {platform.platform()}, {platform.python_version()}, shared 2-core VM (noisy)")
    parts = set(args.parts.split(","))
    fanout = 4
    if "hot" in parts:
        hb, hp = hot_path(n // fanout, fanout)
        lines.append(
            f"hot path: on_deliveries (1 publication, fan-out {fanout}) {hb:.0f} ns/call vs "
            f"list.append peer {hp:.0f} ns (ratio {hb / hp:.2f}); {hb / fanout:.0f} ns per delivery"
        )
    if "sustained" in parts:
        total, writer = sustained(n // fanout, fanout)
        lines.append(
            f"sustained (producer + writer thread, {n // fanout} publications x {fanout} deliveries): "
            f"{total:,.0f} rows/s; writer alone {writer:,.0f} rows/s"
        )
    if "kill" in parts:
        windows = hard_kill(3 if args.quick else 6)
        lines.append(
            "hard kill at roll_interval 0.5 s: lost window "
            + ", ".join(f"{w:.3f}" for w in windows)
            + f" s (max {max(windows):.3f} s)"
        )
    if "broker" in parts:
        rounds = args.rounds
        r = broker_impact(20_000 if args.quick else 50_000, 4, rounds)
        best = {h: max(v) for h, v in r.items()}
        med = {h: statistics.median(v) for h, v in r.items()}
        lines.append(
            f"broker QoS 0 deliveries/s (4 raw subscribers, publish from code, {rounds} interleaved "
            "rounds; best / median, ratio to no hook):"
        )
        for h in HOOKS:
            lines.append(
                f"  {h}: {best[h]:,.0f} ({best[h] / best['none']:.3f}) / {med[h]:,.0f} "
                f"({med[h] / med['none']:.3f})"
            )
        per_round = [r["bridge"][i] / r["none"][i] for i in range(rounds)]
        lines.append("  bridge / no hook per round: " + ", ".join(f"{x:.3f}" for x in per_round))
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
