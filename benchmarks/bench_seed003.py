"""Seed 003 (HEMA), section 4: experiments 1 and 2 (Table 2, Figs. 6 and 7).

(a)/(b): insert 50,000 subscriptions; every 5,000, the time to insert those 5,000 and to
match 200 events.  (c): match throughput while subscriptions change at 100 to 1,000 updates
per second.  Plus the issue's targets at 100,000 subscriptions of the experiment-2 workload:
median time to match one event, and the throughput kept at 1,000 updates/s.

Engines: hema and its peers measured in the same run (iccounting and counting when they are
registered; brute-force only with ``--brute-force``, on fewer events, as it is slow).  An
*update* replaces one live subscription by a fresh one from the same generator (a delete
plus an insert).  Churn is simulated in one thread, as the broker does it: after each
matched event the updates that are due at the configured rate are applied, so their cost
is paid out of the matching time; throughput = events / wall time.

Garbage collection: after building each engine for (c) the benchmark calls ``gc.freeze()``
(``--no-gc-freeze`` turns this off), as a long-running broker does after start-up.  Without
it, a full collection walks the whole index (~0.7 s at 100,000 subscriptions) at moments
the churn happens to trigger, which swamps the 3-second windows for every engine alike.

Usage::

    .venv/bin/python benchmarks/bench_seed003.py [--quick] [--brute-force] [--out docs/performance-hema.md]
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload003 import EXPERIMENTS, Experiment, Workload

from content import ENGINES, Engine, Filter
from content._hema import HEMA
from content.baselines import BETree

PEERS = ("hema", "iccounting", "counting")
FREEZE_GC = True
WINDOW = 0.5  # seconds of one interleaved churn window


def engines(brute_force: bool) -> list[str]:
    names = [n for n in PEERS if n in ENGINES and _works(n)]
    if brute_force:
        names.append("brute-force")
    return names


def _works(name: str) -> bool:
    try:
        e = ENGINES[name]()
        e.add(0, "a > 1")
        e.match({"a": 2})
    except NotImplementedError:
        return False
    return True


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _match_for(engine: Engine, events: list[dict[str, object]], budget: float) -> tuple[float, int]:
    """Seconds to match ``events`` (stopping early, at >= 5 events, once ``budget`` s are spent)."""
    match = engine.match
    t0 = time.perf_counter()
    done = 0
    for ev in events:
        match(ev)
        done += 1
        if done >= 5 and time.perf_counter() - t0 > budget:
            break
    return time.perf_counter() - t0, done


def experiment_ab(
    exp: Experiment,
    names: list[str],
    total: int,
    step: int,
    n_events: int,
    budget: float,
    keep: dict[str, Engine] | None = None,
) -> list[dict[str, object]]:
    """Figs. 6/7 (a) and (b): per step, seconds to insert ``step`` subs and to match 200 events.

    ``keep``: when given, the engines built up to ``total`` are left there (``--full`` reuses
    them for the churn part, whose subscriptions are the same)."""
    rows: list[dict[str, object]] = []
    subs = _subscriptions(exp, total)
    events = _events(exp, n_events)
    for name in names:
        engine = ENGINES[name]()
        if keep is not None:
            keep[name] = engine
        gc.collect()
        for start in range(0, total, step):
            chunk = subs[start : start + step]

            def insert(chunk: list[Filter] = chunk, start: int = start, engine: Engine = engine) -> None:
                for i, f in enumerate(chunk, start):
                    engine.add(i, f)

            t_ins = _timed(insert)
            t_match, done = _match_for(engine, events, budget)
            t_match *= n_events / done  # a slow engine matches fewer events, scaled to n_events
            rows.append(
                {"engine": name, "subs": start + step, "insert_s": t_ins, "match_s": t_match, "events": done}
            )
            print(f"exp{exp.name} {name:12} {start + step:6} insert {t_ins:7.3f}s  match {t_match:7.3f}s")
    return rows


def _subscriptions(exp: Experiment, n: int) -> list[Filter]:
    w = Workload(exp)
    return [w.subscription() for _ in range(n)]


def _events(exp: Experiment, n: int) -> list[dict[str, object]]:
    w = Workload(exp, stream=1)
    return [w.event() for _ in range(n)]


def latency(engine: Engine, events: list[dict[str, object]], budget: float = 5.0) -> list[float]:
    """Per-event match times (stopping early, at >= 10 events, once ``budget`` s are spent)."""
    out: list[float] = []
    for ev in events:
        t0 = time.perf_counter()
        engine.match(ev)
        out.append(time.perf_counter() - t0)
        if len(out) >= 10 and sum(out) > budget:
            break
    return out


def churn_throughput(
    engine: Engine, fresh: Workload, events: list[dict[str, object]], rate: int, seconds: float, seed: int
) -> tuple[int, float, int]:
    """(events matched, seconds, updates) while ``rate`` updates/s are applied between events.

    The replacement subscriptions are generated before the clock starts (generating one costs
    about as much as an engine update and is not the engine's work)."""
    pool = [fresh.subscription() for _ in range(int(rate * seconds * 1.5) + 16)]
    rng = random.Random(seed)
    ids = list(engine)
    n_ids = len(ids)
    done = 0
    matched = 0
    n_ev = len(events)
    t0 = time.perf_counter()
    now = t0
    while now - t0 < seconds:
        engine.match(events[matched % n_ev])
        matched += 1
        now = time.perf_counter()
        due = int(rate * (now - t0)) - done
        for _ in range(due):
            engine.add(ids[rng.randrange(n_ids)], pool[done % len(pool)])  # replace = delete + insert
            done += 1
        now = time.perf_counter()
    return matched, now - t0, done


def experiment_c(
    exp: Experiment,
    names: list[str],
    n_subs: int,
    rates: list[int],
    seconds: float,
    lat_events: int,
    prebuilt: dict[str, Engine] | None = None,
    prebuilt_s: dict[str, float] | None = None,
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Figs. 6/7 (c) at ``n_subs`` subscriptions, plus per-event latency.

    All engines are built side by side and measured *interleaved*, so that the load of a
    shared machine hits them alike: latency event by event in rotating engine order, churn
    throughput in windows of ``WINDOW`` seconds rotating over rates and engines (``seconds``
    per engine and rate in total; ``rates[0]`` must be 0, the churn-free baseline).
    Brute-force takes part in the latency only (it is far too slow for churn)."""
    subs = _subscriptions(exp, n_subs) if prebuilt is None else []
    events = _events(exp, 1000)
    built: dict[str, Engine] = dict(prebuilt or {})
    build_s: dict[str, float] = dict(prebuilt_s or {})
    for name in names:
        if name in built:
            assert len(built[name]) == n_subs
            print(f"exp{exp.name} {name:12} built by the sweep ({build_s[name]:.1f}s)")
            continue
        engine = ENGINES[name]()

        def build(e: Engine = engine) -> None:
            for i, f in enumerate(subs):
                e.add(i, f)

        build_s[name] = _timed(build)
        built[name] = engine
        print(f"exp{exp.name} {name:12} build {build_s[name]:.1f}s")
    gc.collect()
    if FREEZE_GC:
        gc.freeze()  # the built indexes leave the collector's generations (see module doc)
    lat: dict[str, list[float]] = {n: [] for n in names}
    spent = dict.fromkeys(names, 0.0)
    for k, ev in enumerate(events[:lat_events]):
        for name in names[k % len(names) :] + names[: k % len(names)]:
            if len(lat[name]) >= 10 and spent[name] > 5.0:
                continue  # slow engines: enough samples
            t0 = time.perf_counter()
            built[name].match(ev)
            dt = time.perf_counter() - t0
            lat[name].append(dt)
            spent[name] += dt
    lat_rows: list[dict[str, object]] = []
    for name in names:
        engine = built[name]
        sizes = [len(engine.match(ev)) for ev in events[:10]]
        stats = getattr(engine, "stats", None)
        extra = " ".join(f"{k}={v}" for k, v in stats.items()) if isinstance(stats, dict) else ""
        med = statistics.median(lat[name]) * 1e3
        lat_rows.append(
            {
                "engine": name,
                "build_s": build_s[name],
                "median_ms": med,
                "p90_ms": sorted(lat[name])[int(0.9 * len(lat[name]))] * 1e3,
                "matches": statistics.mean(sizes),
                "events": len(lat[name]),
                "note": extra,
            }
        )
        print(f"exp{exp.name} {name:12} median {med:.3f} ms over {len(lat[name])} events {extra}")
    churners = [n for n in names if n != "brute-force"]
    fresh = {n: Workload(exp, stream=2) for n in churners}  # the same replacements for every engine
    rows: list[dict[str, object]] = []
    n_events = {(n, r): 0.0 for n in churners for r in rates}
    wall = {(n, r): 0.0 for n in churners for r in rates}
    updates = {(n, r): 0 for n in churners for r in rates}
    # windows rotate over rates as well as engines, so that a rate and the churn-free
    # baseline it is divided by are measured at the same moments of a shared machine
    for w in range(max(1, round(seconds / WINDOW))):
        for rate in rates[w % len(rates) :] + rates[: w % len(rates)]:
            for name in churners[w % len(churners) :] + churners[: w % len(churners)]:
                got, took, done = churn_throughput(built[name], fresh[name], events, rate, WINDOW, rate + w)
                n_events[name, rate] += got
                wall[name, rate] += took
                updates[name, rate] += done
    for rate in rates:
        for name in churners:
            thr = n_events[name, rate] / wall[name, rate]
            kept = thr / (n_events[name, rates[0]] / wall[name, rates[0]])
            done = updates[name, rate]
            upd_s = done / wall[name, rate]
            rows.append(
                {
                    "engine": name,
                    "rate": rate,
                    "events_s": thr,
                    "updates": done,
                    "kept": kept,
                    "updates_s": upd_s,
                }
            )
            print(f"exp{exp.name} {name:12} {rate:5}/s  {thr:8.1f} ev/s  kept {kept:6.1%} ({done} updates)")
    for engine in built.values():
        if isinstance(engine, HEMA | BETree):
            engine._check()  # the churned index is still consistent
    built.clear()  # HEMA's structures hold reference cycles: free them before the next experiment
    gc.unfreeze()
    gc.collect()
    return rows, lat_rows


def _match_cell(r: dict[str, object]) -> str:
    scaled = "" if r["events"] == 200 else f" ({r['events']} ev. scaled)"
    return f"{float(str(r['match_s'])):.3f}{scaled}"


def _ratio(a: dict[str, object], b: dict[str, object]) -> float:
    return float(str(a["events_s"])) / float(str(b["events_s"]))


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _ab_section(
    exp: Experiment,
    names: list[str],
    total: int,
    step: int,
    budget: float,
    keep: dict[str, Engine] | None = None,
) -> tuple[list[str], list[dict[str, object]]]:
    md: list[str] = []
    key = exp.name
    ab = experiment_ab(exp, names, total, step, 200, budget, keep)
    steps = sorted({int(str(r["subs"])) for r in ab})
    by = {(r["engine"], r["subs"]): r for r in ab}
    md.append(f"### Experiment {key}: insertion and matching (Figs. {5 + int(key)} (a), (b))\n")
    md.append(
        _md_table(
            [
                "subscriptions",
                *[f"{n} insert {step} (s)" for n in names],
                *[f"{n} match 200 (s)" for n in names],
            ],
            [
                [
                    f"{s:,}",
                    *[f"{by[(n, s)]['insert_s']:.3f}" for n in names],
                    *[_match_cell(by[(n, s)]) for n in names],
                ]
                for s in steps
            ],
        )
    )
    md.append("")
    return md, ab


def _c_section(
    exp: Experiment,
    names: list[str],
    churn: list[dict[str, object]],
    lat: list[dict[str, object]],
    churn_subs: int,
    rates: list[int],
    achieved: bool,
) -> list[str]:
    key = exp.name
    md = [f"### Experiment {key}: {churn_subs:,} subscriptions, one event at a time\n"]
    md.append(
        _md_table(
            ["engine", "build (s)", "events", "median match (ms)", "p90 (ms)", "matches/event", "structure"],
            [
                [
                    str(r["engine"]),
                    f"{r['build_s']:.1f}",
                    str(r["events"]),
                    f"{r['median_ms']:.3f}",
                    f"{r['p90_ms']:.3f}",
                    f"{r['matches']:.0f}",
                    str(r["note"]),
                ]
                for r in lat
            ],
        )
    )
    md.append("")
    md.append(
        f"### Experiment {key}: throughput under churn (Fig. {5 + int(key)} (c)), {churn_subs:,} subs\n"
    )
    cby = {(r["engine"], r["rate"]): r for r in churn}
    cnames = [n for n in names if n != "brute-force"]
    md.append(
        _md_table(
            [
                "updates/s",
                *[f"{n} events/s (kept)" for n in cnames],
                *([f"{n} updates/s done" for n in cnames] if achieved else []),
                *[f"hema / {n}" for n in cnames[1:]],
            ],
            [
                [
                    str(rate),
                    *[f"{cby[(n, rate)]['events_s']:.0f} ({cby[(n, rate)]['kept']:.0%})" for n in cnames],
                    *([f"{float(str(cby[(n, rate)]['updates_s'])):.0f}" for n in cnames] if achieved else []),
                    *[f"{_ratio(cby[('hema', rate)], cby[(n, rate)]):.2f}" for n in cnames[1:]],
                ]
                for rate in rates
            ],
        )
    )
    md.append("")
    return md


def plot(
    exp: Experiment,
    names: list[str],
    ab: list[dict[str, object]],
    churn: list[dict[str, object]],
    rates: list[int],
    outdir: Path,
) -> Path:
    """Figs. 6/7 (a), (b), (c) side by side: docs/performance-content/seed003-exp<k>.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for n in names:
        rows = sorted((r for r in ab if r["engine"] == n), key=lambda r: int(str(r["subs"])))
        xs = [int(str(r["subs"])) for r in rows]
        axes[0].plot(xs, [float(str(r["insert_s"])) for r in rows], marker="o", label=n)
        axes[1].plot(xs, [float(str(r["match_s"])) for r in rows], marker="o", label=n)
        crow = {int(str(r["rate"])): float(str(r["events_s"])) for r in churn if r["engine"] == n}
        axes[2].plot([max(r, 10) for r in rates], [crow[r] for r in rates], marker="o", label=n)
    axes[0].set_title(f"seed 003 exp. {exp.name} (a): insert 5,000 subscriptions")
    axes[0].set_ylabel("seconds")
    axes[1].set_title("(b): match 200 events")
    axes[1].set_ylabel("seconds")
    axes[1].set_yscale("log")
    for ax in axes[:2]:
        ax.set_xlabel("subscriptions")
    axes[2].set_title("(c): throughput under churn (0 plotted at 10)")
    axes[2].set_xlabel("subscription updates per second")
    axes[2].set_ylabel("events matched per second")
    axes[2].set_xscale("log")
    axes[2].set_yscale("log")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = outdir / f"seed003-exp{exp.name}.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


FULL_ENGINES = ("hema", "betree", "poset", "iccounting")
FULL_RATES = [0, 100, 1000, 10_000]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    ap.add_argument(
        "--full",
        action="store_true",
        help="the papers' comparison: hema, betree, poset, iccounting; sweep to 50,000, churn at "
        "50,000 subscriptions and 100 / 1,000 / 10,000 updates/s; plots",
    )
    ap.add_argument("--engines", help="comma-separated engine names (default: the run's set)")
    ap.add_argument("--brute-force", action="store_true", help="also measure brute-force (slow)")
    ap.add_argument("--experiments", default="1,2")
    ap.add_argument("--churn-subs", type=int, default=None, help="default 100,000 (--full: 50,000)")
    ap.add_argument("--rates", help="comma-separated updates/s, first 0 (default 0,100,200,500,1000)")
    ap.add_argument("--seconds", type=float, default=3.0, help="per churn rate and engine")
    ap.add_argument("--skip-ab", action="store_true", help="only the 100,000-subscription part (c)")
    ap.add_argument("--no-gc-freeze", action="store_true", help="leave the built index to the GC")
    ap.add_argument("--budget", type=float, default=2.0, help="max seconds matching per step (then scaled)")
    ap.add_argument(
        "--plots", type=Path, default=Path("docs/performance-content"), help="(--full) plot directory"
    )
    ap.add_argument("--out", type=Path, help="write the markdown results here")
    args = ap.parse_args()
    global FREEZE_GC  # noqa: PLW0603 (a run-wide switch)
    FREEZE_GC = not args.no_gc_freeze
    total, step, seconds = 50_000, 5_000, args.seconds
    churn_subs = args.churn_subs or (50_000 if args.full else 100_000)
    if args.quick:
        total, step, churn_subs, seconds = 5_000, 1_000, args.churn_subs or 5_000, 0.5
    if args.engines:
        names = args.engines.split(",")
    elif args.full:
        names = list(FULL_ENGINES)
    else:
        names = engines(args.brute_force)
    if args.rates:
        rates = [int(r) for r in args.rates.split(",")]
    else:
        rates = FULL_RATES if args.full else [0, 100, 200, 500, 1000]
    assert rates[0] == 0, "the first rate is the churn-free baseline"
    md: list[str] = []
    for key in args.experiments.split(","):
        exp = EXPERIMENTS[key]
        keep: dict[str, Engine] | None = {} if churn_subs == total else None
        ab: list[dict[str, object]] = []
        if not args.skip_ab:
            part, ab = _ab_section(exp, names, total, step, args.budget, keep)
            md.extend(part)
        built_s = {n: sum(float(str(r["insert_s"])) for r in ab if r["engine"] == n) for n in names}
        churn, lat = experiment_c(exp, names, churn_subs, rates, seconds, 300, keep or None, built_s)
        if keep:
            keep.clear()
            gc.collect()
        md.extend(_c_section(exp, names, churn, lat, churn_subs, rates, achieved=args.full))
        if args.full and ab:
            path = plot(exp, names, ab, churn, rates, args.plots)
            md.append(f"![seed 003 experiment {key}]({path.parent.name}/{path.name})\n")
    text = "\n".join(md)
    header = (
        f"Command: `.venv/bin/python -m benchmarks.bench_seed003 {' '.join(sys.argv[1:])}`  \n"
        f"Machine: {platform.machine()}, Python {platform.python_version()}, {platform.system()}; "
        "2 cores shared with other work (timings noisy; compare within a table).\n"
    )
    print(text)
    if args.out:
        args.out.write_text(header + "\n" + text + "\n")


if __name__ == "__main__":
    main()
