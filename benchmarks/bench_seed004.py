"""Seed 004 (HCEM), section 4: REIN vs HCEM on the paper's Table 3 settings.

Experiments (each prints a markdown table; the engines are measured in the same run):

* ``batch``: per-event matching time against the batch size (Fig. 5) at ``--n``;
  rein = :meth:`REIN.match` per event, hcem = :meth:`HCEM.match_batch` (same index);
* ``n``: per-event time against the number of subscriptions (Fig. 6), batch 1,000;
* ``k``: against k with m = 2k (Fig. 7); ``width``: against the predicate width (Fig. 8);
* with ``batch``: insertion time per subscription (including writing the queued inserts
  into the buckets), deletion time (10 % of n, at most 10,000), process RSS growth while
  building the index (the Filter objects are built before and excluded), index numpy bytes.
* ``--reference``: iccounting and hema on the same subscriptions at ``--n``, few events.
* ``--full`` (or ``--figs 4,5,6,7,8``): seed 004's Figs. 4-8 and Table 4 with its four
  algorithms side by side -- tama, htree, rein, hcem -- at the paper's sizes (0.5M-2M
  subscriptions; ``--scale`` shrinks every n for a quick run); plots go to
  docs/performance-content/seed004_fig*.png, raw points to ``--json``
  (benchmarks/_figs004.py describes the protocol).

Usage::

    .venv/bin/python benchmarks/bench_seed004.py --n 100000 --experiments batch,n,k,width
    .venv/bin/python benchmarks/bench_seed004.py --n 1000000 --experiments batch --batches 1,1000
    .venv/bin/python -m benchmarks.bench_seed004 --full            # about an hour
    .venv/bin/python -m benchmarks.bench_seed004 --figs 5,8 --scale 0.05
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload004 import Workload

from content import ENGINES, HCEM, Engine, Filter

BUCKETS = 1000
ROOT = Path(__file__).resolve().parent.parent


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


def build(subs: list[Filter]) -> tuple[HCEM, float, int]:
    """Build the index; returns it, seconds per insert (incl. the bucket flush), RSS growth."""
    gc.collect()
    before = rss()
    engine = HCEM(buckets=BUCKETS)
    gc.disable()
    t0 = time.perf_counter()
    for i, f in enumerate(subs):
        engine.add(i, f)
    engine.match({})  # writes the queued inserts into their buckets
    dt = time.perf_counter() - t0
    gc.enable()
    return engine, dt / len(subs), rss() - before


def index_bytes(engine: HCEM) -> int:
    total = engine._table.alive.nbytes + engine._table.pending.nbytes
    for pair in engine._lists.values():
        for lst in pair:
            total += lst.vals.nbytes + lst.units.nbytes
            if lst.bkt is not None:  # hcem's per-unit bucket index, built by the first batch
                total += lst.bkt.nbytes
    return total


def per_event_rein(engine: HCEM, events: list[dict[str, object]]) -> float:
    t0 = time.perf_counter()
    for e in events:
        engine.match(e)
    return (time.perf_counter() - t0) / len(events)


def per_event_hcem(engine: HCEM, events: list[dict[str, object]], batch: int) -> float:
    t0 = time.perf_counter()
    for k in range(0, len(events), batch):
        engine.match_batch(events[k : k + batch])
    return (time.perf_counter() - t0) / len(events)


def ms(x: float) -> str:
    return f"{x * 1e3:.3f}"


def exp_batch(n: int, batches: list[int], rein_events: int, repeat: int) -> None:
    w = Workload()
    subs = w.subscriptions(n)
    engine, ins, grown = build(subs)
    del subs
    events = w.events(max(batches))
    check = events[:50]
    assert engine.match_batch(check) == [engine.match(e) for e in check]
    print(f"\n### per-event time against batch size (n = {n:,}, m = 20, k = 10, width 0.5, b = {BUCKETS})\n")
    print(f"rein: REIN.match on {rein_events} events; each row measures rein and hcem alternately")
    print(f"{repeat} times and keeps each one's minimum (the machine is shared)\n")
    print("| batch | hcem ms/event | rein ms/event | rein / hcem |")
    print("|---:|---:|---:|---:|")
    for b in batches:
        evs = events[: max(b, min(len(events), 100 if b < 100 else b))]
        hs, rs = [], []
        for _ in range(repeat):
            rs.append(per_event_rein(engine, events[:rein_events]))
            hs.append(per_event_hcem(engine, evs, b))
        h, rein = min(hs), min(rs)
        print(f"| {b} | {ms(h)} | {ms(rein)} | {rein / h:.2f}x |", flush=True)
    update_table(engine, n, ins, grown)


def update_table(engine: HCEM, n: int, ins: float, grown: int) -> None:
    deletes = min(10_000, n // 10)
    victims = random.Random(4).sample(range(n), deletes)
    t0 = time.perf_counter()
    for sid in victims:
        engine.remove(sid)
    engine.match({})
    dele = (time.perf_counter() - t0) / deletes
    mb = index_bytes(engine) / 2**20
    print(f"\n### updates and memory (n = {n:,}, m = 20, k = 10, width 0.5)\n")
    print("| insert us/sub | insert total s | delete us/sub | RSS growth MB | index numpy MB |")
    print("|---:|---:|---:|---:|---:|")
    print(f"| {ins * 1e6:.1f} | {ins * n:.1f} | {dele * 1e6:.1f} | {grown / 2**20:.0f} | {mb:.0f} |")


def exp_n(ns: list[int], events_n: int) -> None:
    print("\n### per-event time against n (m = 20, k = 10, width 0.5, hcem batch 1,000)\n")
    print("| n | rein ms/event | hcem ms/event | rein / hcem | insert us/sub |")
    print("|---:|---:|---:|---:|---:|")
    for n in ns:
        w = Workload()
        engine, ins, _ = build(w.subscriptions(n))
        events = w.events(events_n)
        rein = per_event_rein(engine, events[:100])
        h = per_event_hcem(engine, events, events_n)
        print(f"| {n:,} | {ms(rein)} | {ms(h)} | {rein / h:.2f}x | {ins * 1e6:.1f} |")
        del engine


def exp_k(n: int, ks: list[int], events_n: int) -> None:
    print(f"\n### per-event time against k with m = 2k (n = {n:,}, width 0.5, hcem batch {events_n})\n")
    print("| k | m | rein ms/event | hcem ms/event | rein / hcem |")
    print("|---:|---:|---:|---:|---:|")
    for k in ks:
        w = Workload(m=2 * k, k=k)
        engine, _, _ = build(w.subscriptions(n))
        events = w.events(events_n)
        rein = per_event_rein(engine, events[:100])
        h = per_event_hcem(engine, events, events_n)
        print(f"| {k} | {2 * k} | {ms(rein)} | {ms(h)} | {rein / h:.2f}x |")
        del engine


def exp_width(n: int, widths: list[float], events_n: int) -> None:
    print(
        f"\n### per-event time against predicate width (n = {n:,}, m = 20, k = 10, hcem batch {events_n})\n"
    )
    print("| width | matches/event | rein ms/event | hcem ms/event | rein / hcem |")
    print("|---:|---:|---:|---:|---:|")
    for width in widths:
        w = Workload(width=width)
        engine, _, _ = build(w.subscriptions(n))
        events = w.events(events_n)
        hits = sum(len(engine.match(e)) for e in events[:20]) / 20
        rein = per_event_rein(engine, events[:100])
        h = per_event_hcem(engine, events, events_n)
        print(f"| {width} | {hits:.1f} | {ms(rein)} | {ms(h)} | {rein / h:.2f}x |")
        del engine


def exp_reference(n: int, names: list[str], events_n: int) -> None:
    w = Workload()
    subs = w.subscriptions(n)
    events = w.events(events_n)
    hcem, _, _ = build(subs)
    want = [hcem.match(e) for e in events]
    rein = per_event_rein(hcem, events)
    print(f"\n### reference engines (n = {n:,}, m = 20, k = 10, width 0.5, {events_n} events)\n")
    print("| engine | insert us/sub | ms/event | / rein |")
    print("|---|---:|---:|---:|")
    print(f"| rein | - | {ms(rein)} | 1.00x |")
    del hcem
    for name in names:
        engine: Engine = ENGINES[name]()
        t0 = time.perf_counter()
        for i, f in enumerate(subs):
            engine.add(i, f)
        ins = (time.perf_counter() - t0) / n
        engine.match(events[0])
        t0 = time.perf_counter()
        got = [engine.match(e) for e in events]
        per = (time.perf_counter() - t0) / events_n
        assert got == want, name
        print(f"| {name} | {ins * 1e6:.1f} | {ms(per)} | {per / rein:.2f}x |")
        del engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--experiments", default="batch,n,k,width")
    ap.add_argument("--batches", default="1,10,100,500,1000")
    ap.add_argument("--ns", default="25000,50000,100000")
    ap.add_argument("--ks", default="5,10,15,20")
    ap.add_argument("--widths", default="0.1,0.3,0.5,0.7,0.9")
    ap.add_argument("--rein-events", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3, help="alternating repetitions per batch row")
    ap.add_argument("--reference", default="", help="comma-separated engine names, e.g. iccounting,hema")
    ap.add_argument("--full", action="store_true", help="seed 004 Figs. 4-8 with tama, htree, rein, hcem")
    ap.add_argument("--figs", default="", help="a subset of --full, e.g. 5,8")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every n of --full / --figs")
    ap.add_argument("--outdir", type=Path, default=ROOT / "docs" / "performance-content")
    ap.add_argument("--json", type=Path, default=None, help="write the raw points of --full / --figs here")
    args = ap.parse_args()
    load = psutil.getloadavg()
    print(f"python {platform.python_version()}, {platform.machine()}, {psutil.cpu_count()} cpus, load {load}")
    if args.full or args.figs:
        from _figs004 import run

        figs = [4, 5, 6, 7, 8] if args.full else [int(x) for x in args.figs.split(",")]
        print(f"started {time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
        lines = run(figs, args.scale, args.outdir, args.json)
        print(f"finished {time.strftime('%Y-%m-%d %H:%M:%S')}, load {psutil.getloadavg()}\n")
        print("\n".join(lines))
        return
    exps = args.experiments.split(",")
    if "batch" in exps:
        exp_batch(args.n, [int(x) for x in args.batches.split(",")], args.rein_events, args.repeat)
    if "n" in exps:
        exp_n([int(x) for x in args.ns.split(",")], 1000)
    if "k" in exps:
        exp_k(args.n, [int(x) for x in args.ks.split(",")], 1000)
    if "width" in exps:
        exp_width(args.n, [float(x) for x in args.widths.split(",")], 1000)
    if args.reference:
        exp_reference(args.n, args.reference.split(","), 20)


if __name__ == "__main__":
    main()
