"""Seed 004's four engines under subscription churn (issue 18: seed 003's point, seed 004's engines).

Seed 004 measures rein, hcem, tama and htree on a static index; seed 003's claim is about
matching *while subscriptions change*.  This puts the two together on seed 004's workload
(m = 20, k = 10, width 0.5; ``benchmarks/_workload004.py``): every engine is built on the same
``--n`` subscriptions, then measured while ``rate`` updates/s are applied between matches, for
the rates 0 (the churn-free baseline), 100, 1,000 and 10,000.  An *update* replaces one live
subscription by a fresh one from another stream of the same generator (``engine.add`` on a
live id: a delete plus an insert), as in ``bench_seed003.churn_throughput``; the
replacements are generated before the clock starts.

rein, tama and htree match one event per call; hcem matches ``--batch`` events per
``match_batch`` call (64 by default: HCEM's bit-set word), and the updates due are applied
after each call, so a batch sees the index as it was when the batch started.  Throughput =
events matched / wall time including the updates.  Windows of ``WINDOW`` seconds rotate over
rates and engines (as bench_seed003's), so that a rate and the baseline it is divided by are
measured at the same moments of a shared machine.  Measured first, interleaved the same way:
the update cost alone (replace time per update, no matching), and the time of one match call
with nothing pending against one right after a single replace (an engine that queues its
inserts, as REIN does, pays for writing them at the next match).

Usage::

    .venv/bin/python -m benchmarks.bench_churn004 --n 1000000 --seconds 4
    .venv/bin/python -m benchmarks.bench_churn004 --n 20000 --seconds 1   # smoke run
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload004 import Workload

from content import HCEM, REIN, Engine, Filter
from content.baselines import TAMA, HTree

ENGINES = ("rein", "hcem", "tama", "htree")
RATES = (0, 100, 1000, 10_000)
WINDOW = 0.5  # seconds of one interleaved window

Event = dict[str, object]


def make(name: str) -> Engine:
    if name == "rein":
        return REIN(buckets=1000)
    if name == "hcem":
        return HCEM(buckets=1000)
    if name == "tama":
        return TAMA(levels=13)
    if name == "htree":
        return HTree(6, 6)
    raise ValueError(name)


def matcher(name: str, engine: Engine, batch: int) -> tuple[Callable[[Sequence[Event]], object], int]:
    """(function matching a slice of events, events per call)."""
    if name == "hcem":
        return engine.match_batch, batch

    def one(evs: Sequence[Event], m: Callable[[Event], object] = engine.match) -> object:
        return m(evs[0])

    return one, 1


def window(
    match: Callable[[Sequence[Event]], object],
    per_call: int,
    engine: Engine,
    events: list[Event],
    pool: list[Filter],
    n: int,
    rate: int,
    seconds: float,
    rng: random.Random,
    start: int,
) -> tuple[int, float, int]:
    """(events matched, seconds, updates) in one window; updates due are applied after each call."""
    matched = 0
    done = 0
    n_ev = len(events)
    t0 = time.perf_counter()
    now = t0
    while now - t0 < seconds:
        k = (start + matched) % (n_ev - per_call)
        match(events[k : k + per_call])
        matched += per_call
        now = time.perf_counter()
        due = int(rate * (now - t0)) - done
        for _ in range(due):
            engine.add(rng.randrange(n), pool[rng.randrange(len(pool))])  # replace = delete + insert
            done += 1
        now = time.perf_counter()
    return matched, now - t0, done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000, help="subscriptions (seed 004: 1M)")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--rates", default=",".join(map(str, RATES)), help="updates/s, first 0")
    ap.add_argument("--seconds", type=float, default=3.0, help="per engine and rate, in windows")
    ap.add_argument("--batch", type=int, default=64, help="hcem: events per match_batch call")
    ap.add_argument("--updates", type=int, default=2000, help="replaces timed alone per engine")
    ap.add_argument("--probes", type=int, default=100, help="match calls timed before / after one replace")
    args = ap.parse_args()
    names = args.engines.split(",")
    rates = [int(r) for r in args.rates.split(",")]
    assert rates[0] == 0, "the first rate is the churn-free baseline"
    print(
        f"python {platform.python_version()}, {platform.machine()}, {psutil.cpu_count()} cpus, "
        f"load {psutil.getloadavg()}; n = {args.n:,}, started {time.strftime('%H:%M:%S')}",
        flush=True,
    )
    w = Workload()
    subs = w.subscriptions(args.n)
    events = w.events(2000)
    fresh = Workload(seed=5)
    pool = fresh.subscriptions(max(int(max(rates) * args.seconds * 1.2), args.updates) + 16)
    built: dict[str, Engine] = {}
    build_s: dict[str, float] = {}
    for name in names:
        e = make(name)
        gc.collect()
        t0 = time.perf_counter()
        for i, f in enumerate(subs):
            e.add(i, f)
        e.match({})  # writes queued inserts / builds the index
        if name == "hcem":
            e.match_batch(events[:64])  # warm-up: builds HCEM's per-unit bucket index
        build_s[name] = time.perf_counter() - t0
        built[name] = e
        print(f"{name:6} built in {build_s[name]:.1f}s", flush=True)
    del subs
    gc.collect()
    gc.freeze()  # the built indexes leave the collector's generations (as bench_seed003)
    # answers agree before churn
    want = [built[names[0]].match(ev) for ev in events[:20]]
    for name in names[1:]:
        assert [built[name].match(ev) for ev in events[:20]] == want, name
    # update cost alone, interleaved in chunks of 100
    upd: dict[str, list[float]] = {n: [] for n in names}
    rng = random.Random(1)
    for c in range(max(1, args.updates // 100)):
        for name in names[c % len(names) :] + names[: c % len(names)]:
            e = built[name]
            chunk = [(rng.randrange(args.n), pool[rng.randrange(len(pool))]) for _ in range(100)]
            t0 = time.perf_counter()
            for sid, f in chunk:
                e.add(sid, f)
            upd[name].append((time.perf_counter() - t0) / 100)
    # the first match after one replace against a match with nothing pending, per call
    # (engines that queue inserts pay for writing them at the next match)
    calls = {n: matcher(n, built[n], args.batch) for n in names}
    clean: dict[str, list[float]] = {n: [] for n in names}
    after: dict[str, list[float]] = {n: [] for n in names}
    for c in range(args.probes):
        for name in names[c % len(names) :] + names[: c % len(names)]:
            fn, per = calls[name]
            k = (2 * c * per) % (len(events) - 2 * per)
            t0 = time.perf_counter()
            fn(events[k : k + per])
            clean[name].append(time.perf_counter() - t0)
            built[name].add(rng.randrange(args.n), pool[rng.randrange(len(pool))])
            t0 = time.perf_counter()
            fn(events[k + per : k + 2 * per])
            after[name].append(time.perf_counter() - t0)
    got: dict[tuple[str, int], list[float]] = {(n, r): [0.0, 0.0, 0.0] for n in names for r in rates}
    for k in range(max(1, round(args.seconds / WINDOW))):
        for rate in rates[k % len(rates) :] + rates[: k % len(rates)]:
            for name in names[k % len(names) :] + names[: k % len(names)]:
                fn, per = calls[name]
                m, s, d = window(
                    fn, per, built[name], events, pool, args.n, rate, WINDOW, random.Random(rate + k), 97 * k
                )
                acc = got[name, rate]
                acc[0] += m
                acc[1] += s
                acc[2] += d
        print(f"window round {k + 1} done, load {psutil.getloadavg()[0]:.1f}", flush=True)
    print()
    print(f"n = {args.n:,}, m = 20, k = 10, width 0.5, hcem batch {args.batch}; load {psutil.getloadavg()}")
    print()
    print(
        "| engine | build s | replace us (median of 100-update chunks) | events per match call "
        "| match call ms, nothing pending | match call ms, right after one replace |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        med_u = statistics.median(upd[name]) * 1e6
        med_c, med_a = statistics.median(clean[name]) * 1e3, statistics.median(after[name]) * 1e3
        print(
            f"| {name} | {build_s[name]:.1f} | {med_u:.1f} | {calls[name][1]} | {med_c:.2f} | {med_a:.2f} |"
        )
    print()
    head = "| updates/s | " + " | ".join(f"{n} events/s (kept)" for n in names)
    head += " | " + " | ".join(f"{n} updates/s done" for n in names)
    others = [n for n in names if n != "hcem"] if "hcem" in names else []
    head += "".join(f" | hcem / {n}" for n in others) + " |"
    print(head)
    print("|" + "---:|" * (1 + 2 * len(names) + len(others)))
    thr = {(n, r): got[n, r][0] / got[n, r][1] for n in names for r in rates}
    for rate in rates:
        row = f"| {rate:,} | " + " | ".join(
            f"{thr[n, rate]:.0f} ({thr[n, rate] / thr[n, 0]:.0%})" for n in names
        )
        row += " | " + " | ".join(f"{got[n, rate][2] / got[n, rate][1]:.0f}" for n in names)
        row += "".join(f" | {thr['hcem', rate] / thr[n, rate]:.2f}x" for n in others) + " |"
        print(row)


if __name__ == "__main__":
    main()
