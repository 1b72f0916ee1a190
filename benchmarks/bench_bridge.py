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
import math
import os
import platform
import queue
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bridge import Bridge, Kind
from bridge._analytics import _build, landing_streams, spark_session, start_queries
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


@dataclass(frozen=True, slots=True)
class _Probe:
    """Where one probe's delay went (seconds)."""

    total: float  # fed -> its topic visible in the topic_rate output
    roll: float  # fed -> its landing file committed
    wait: float  # committed -> start of the micro-batch that read it
    listing: float  # latestOffset (file source listing) of that batch
    planning: float  # queryPlanning
    execution: float  # addBatch (aggregation, state store, foreachBatch Parquet write)
    commit: float  # walCommit + commitOffsets
    after: float  # end of the batch -> seen by the poller


def _batch_ids(out: Path) -> dict[int, Path]:
    d = out / "topic_rate"
    if not d.is_dir():
        return {}
    return {int(p.name.split("=")[1]): p for p in d.iterdir() if p.name.startswith("batch=")}


def _topics_of(batch_dir: Path) -> set[str] | None:
    """The topics of a committed output batch (None while it is being written)."""
    import pyarrow.parquet as pq

    try:
        names = os.listdir(batch_dir)
        if "_SUCCESS" not in names:
            return None
        topics: set[str] = set()
        for n in names:
            if n.endswith(".parquet") and n[0] not in "._":
                topics.update(pq.read_table(batch_dir / n, columns=["topic"]).column(0).to_pylist())
        return topics
    except FileNotFoundError:
        return None


def spark_delay(probes: int, load_rate: float, roll: float, trigger: float, sink: str) -> list[_Probe]:
    """Feed background deliveries and probes from ONE producer thread (the bridge's hot path is
    single-producer, like the event loop); measure each probe's path into the topic_rate result
    and split it with the query's progress reports.

    ``sink="parquet"``: the analytics' own sink (foreachBatch Parquet under OUTPUT, polled for new
    batches); ``sink="collect"``: the same query with a foreachBatch that collects the batch's
    rows to the driver (an in-memory result, as a dashboard would read it)."""
    spark = spark_session()
    found: list[_Probe] = []
    with tempfile.TemporaryDirectory() as d:
        landing, out = Path(d) / "landing", Path(d) / "out"
        b = Bridge(landing, roll_interval=roll)
        b.start_writer()
        stop = threading.Event()
        requests: queue.SimpleQueue[str] = queue.SimpleQueue()
        fed: queue.SimpleQueue[tuple[str, float, int]] = queue.SimpleQueue()

        def produce() -> None:
            i = 0
            while not stop.is_set():
                for _ in range(100):
                    feed(b, delivery(10_000_000 + i, time.time(), topic="load/x"))
                    i += 1
                while not requests.empty():
                    topic = requests.get()
                    t0 = time.time()
                    feed(b, delivery(1, t0, topic=topic))
                    i += 1
                    fed.put((topic, t0, i))
                stop.wait(100 / load_rate)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        collected: queue.SimpleQueue[tuple[float, int, set[str]]] = queue.SimpleQueue()
        if sink == "parquet":
            query = start_queries(spark, landing, out, trigger=trigger, only=("topic_rate",))[0]
        else:

            def collect(df: Any, batch_id: int) -> None:
                topics = {r[0] for r in df.select("topic").collect()}
                collected.put((time.time(), batch_id, topics))

            frame = _build(landing_streams(spark, landing), "10 seconds", "30 seconds")["topic_rate"]
            query = (
                frame.writeStream.outputMode("update")
                .option("checkpointLocation", str(out / "_checkpoint"))
                .foreachBatch(collect)
                .trigger(processingTime=f"{trigger} seconds")
                .start()
            )
        read: set[int] = set()
        rng = random.Random(6)

        def poll_for(topic: str, timeout: float) -> tuple[float, int] | None:
            """(time, batch id) the topic shows up in a new result batch; reads each batch once."""
            deadline = time.time() + timeout
            if sink != "parquet":
                while True:
                    try:
                        seen_at, bid, topics = collected.get(timeout=max(0.0, deadline - time.time()))
                    except queue.Empty:
                        return None
                    if topic in topics:
                        return seen_at, bid
            while time.time() < deadline:
                for bid, path in sorted(_batch_ids(out).items()):
                    if bid in read:
                        continue
                    written = _topics_of(path)
                    if written is None:
                        continue
                    read.add(bid)
                    if topic in written:
                        return time.time(), bid
                stop.wait(0.01)
            return None

        try:
            requests.put("warmup")
            fed.get(timeout=30)
            assert poll_for("warmup", 180) is not None
            for k in range(probes):
                topic = f"probe/{k}"
                requests.put(topic)
                _, t0, count = fed.get(timeout=30)
                assert b.wait_written(Kind.DELIVERIES, count, timeout=60)
                t1 = time.time()
                seen = poll_for(topic, 60)
                if seen is None:
                    continue
                found.append(_split(query, t0, t1, *seen))
                # Probes apart (each in its own file and batch) at a random phase of the writer's
                # rounds and of the trigger, so the medians are not biased by a locked period.
                stop.wait(0.3 + rng.uniform(0.0, roll + max(trigger, 0.5)))
        finally:
            stop.set()
            producer.join()
            query.stop()
            b.close()
            spark.stop()
    return found


def _split(query: Any, t0: float, t1: float, t2: float, batch_id: int) -> _Probe:
    """Attribute [t1, t2] to the phases of the micro-batch that wrote the probe's result (its
    progress report is posted after its output appears: wait for it)."""
    deadline = time.time() + 10
    while time.time() < deadline:
        progress = [p for p in query.recentProgress if p.batchId == batch_id]
        if progress:
            break
        time.sleep(0.05)  # polling Spark's progress list (no event to wait on from Python)
    for p in progress:
        start = datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")).timestamp()
        ms = p.durationMs
        end = start + ms.get("triggerExecution", 0) / 1000
        return _Probe(
            total=t2 - t0,
            roll=t1 - t0,
            wait=start - t1,
            listing=ms.get("latestOffset", 0) / 1000,
            planning=ms.get("queryPlanning", 0) / 1000,
            execution=ms.get("addBatch", 0) / 1000,
            commit=(ms.get("walCommit", 0) + ms.get("commitOffsets", 0)) / 1000,
            after=t2 - end,
        )
    return _Probe(t2 - t0, t1 - t0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)


def _delay_lines(label: str, probes: list[_Probe]) -> list[str]:
    def med(field: str) -> float:
        vals = [getattr(p, field) for p in probes if not math.isnan(getattr(p, field))]
        return statistics.median(vals) if vals else math.nan

    totals = [p.total for p in probes]
    return [
        f"delivery -> visible in Spark ({label}): p50 {statistics.median(totals):.2f} s, "
        f"max {max(totals):.2f} s over {len(totals)} probes; medians: roll {med('roll'):.3f}, "
        f"wait for batch {med('wait'):.3f}, listing {med('listing'):.3f}, planning {med('planning'):.3f}, "
        f"execution {med('execution'):.3f}, offset/commit logs {med('commit'):.3f}, "
        f"poll {med('after'):.3f}"
    ]


class _ListHook(Hooks):
    """Peer: a hook that only appends the broker's per-record records to a list (no writer)."""

    def __init__(self) -> None:
        self.records: list[object] = []

    def on_delivery(self, delivery: Delivery) -> None:
        self.records.append(delivery)

    def on_publication(self, publication: Publication) -> None:
        self.records.append(publication)


class _BatchedNoopHook(Hooks):
    """Peer: a batched hook that does nothing (the broker's own cost of the batched calls)."""

    def on_deliveries(
        self, time: float, message: Message, deliveries: list[DeliveryEntry], routes: int
    ) -> None:
        return None


class _BatchedListHook(Hooks):
    """Peer: a hook that only appends the batched calls to a list (the bridge minus its writer)."""

    def __init__(self) -> None:
        self.records: list[object] = []

    def on_deliveries(
        self, time: float, message: Message, deliveries: list[DeliveryEntry], routes: int
    ) -> None:
        self.records.append((time, message, deliveries, routes))


async def _broker_rate(hook: str, messages: int, subscribers: int) -> tuple[float, float]:
    """QoS 0 deliveries/s: messages published from code, fanned out to raw TCP subscribers that
    only read (MQTT 3.1.1, topic b/x, 8-byte payload: 15 bytes per PUBLISH)."""
    import asyncio

    from broker import Broker

    with tempfile.TemporaryDirectory() as d:
        choices: dict[str, list[Hooks]] = {
            "none": [],
            "list": [_ListHook()],
            "batched-noop": [_BatchedNoopHook()],
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
            cpu = time.process_time()
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
        # CPU of the whole process (event loop, clients, writer thread) until the broker and its
        # hooks stopped (the bridge's last commit included), per delivery.
        cpu_ns = (time.process_time() - cpu) / (messages * subscribers) * 1e9
        return messages * subscribers / elapsed, cpu_ns


HOOKS = ("none", "list", "batched-noop", "batched-list", "bridge")


def broker_impact(
    messages: int, subscribers: int, rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(deliveries/s, CPU ns per delivery) per hook, per interleaved round."""
    import asyncio

    rates: dict[str, list[float]] = {h: [] for h in HOOKS}
    cpus: dict[str, list[float]] = {h: [] for h in HOOKS}
    for _ in range(rounds):
        for hook in HOOKS:
            rate, cpu = asyncio.run(_broker_rate(hook, messages, subscribers))
            rates[hook].append(rate)
            cpus[hook].append(cpu)
    return rates, cpus


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
    ap.add_argument(
        "--spark-configs",
        default="0.5/1/parquet,0.5/0.25/parquet,0.1/0.25/parquet,0.1/0/parquet,0.1/0.25/collect,0.1/0/collect",
        help="roll seconds/trigger seconds/sink (parquet or collect), comma separated",
    )
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
        r, cpu = broker_impact(20_000 if args.quick else 50_000, 4, rounds)
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
        c = {h: statistics.median(v) for h, v in cpu.items()}
        lines.append(
            "  process CPU per delivery (median): "
            + "; ".join(f"{h} {c[h]:,.0f} ns ({c[h] / c['none']:.3f})" for h in HOOKS)
        )
    if "spark" in parts:
        nprobes = 5 if args.quick else 15
        for config in args.spark_configs.split(","):
            roll_s, trigger_s, sink = config.split("/")
            roll, trigger = float(roll_s), float(trigger_s)
            probes = spark_delay(nprobes, load_rate=5_000, roll=roll, trigger=trigger, sink=sink)
            if probes:
                label = f"roll {roll} s, trigger {trigger} s, {sink} sink, 5k deliveries/s load"
                for line in _delay_lines(label, probes):
                    lines.append(line)
    text = "\n".join(lines)
    if args.md is not None:
        args.md.write_text(text + "\n")


if __name__ == "__main__":
    main()
