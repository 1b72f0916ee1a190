"""Seed 000 experiments 1-5 (section 4.2, Figs. 7-12) and the 100,000-subscription target.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_seed000.py                 # all experiments + target
    .venv/bin/python benchmarks/bench_seed000.py --only 1,5 --scale 0.5 --repeat 1
    .venv/bin/python benchmarks/bench_seed000.py --only target

For every data point the same generated workload (benchmarks/_workload000.py) is loaded into
brute-force, counting, iccounting and rabased; the measured time is the time to match all
E events (iccounting / counting / brute-force one event at a time, rabased the whole set as
one batch, as in the paper), best of ``--repeat`` runs, each on a freshly loaded engine (so every run is
"cold", like the paper's, which matches each event set once).  All engines' answers are checked
equal.  Results are written as markdown (``--out``) with plots next to it.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _workload000 import Params, Workload, generate

from content import ENGINES, Engine, SubId

ENGINE_ORDER = ["brute-force", "counting", "iccounting", "rabased"]

EXPERIMENTS: dict[str, tuple[str, str, list[int], Callable[[int], Params]]] = {
    "1": ("Fig. 7", "attributes per event a_l = a_h", [20, 50, 100, 150, 200],
          lambda x: Params(a_l=x, a_h=x)),
    "2": ("Figs. 8-9", "events E", [500, 1000, 2000, 3000, 4000, 5000], lambda x: Params(E=x)),
    "3": ("Fig. 10", "attribute names A_n", [50, 100, 200, 300, 400, 500], lambda x: Params(A_n=x)),
    "4": ("Fig. 11", "constraints per subscription c_l = c_h", [5, 10, 20, 30, 40, 50],
          lambda x: Params(c_l=x, c_h=x)),
    "5": ("Fig. 12", "subscriptions S", [500, 1000, 2000, 3000, 4000, 5000], lambda x: Params(S=x)),
    "2n": ("Figs. 8-9, narrow values (not in the paper)", "events E, numbers in [-10, 10]",
           [500, 1000, 2000, 3000, 4000, 5000], lambda x: Params(E=x, narrow=True)),
}  # fmt: skip


def load(name: str, w: Workload) -> tuple[Engine, float]:
    engine = ENGINES[name]()
    t0 = time.perf_counter()
    for i, f in enumerate(w.filters):
        engine.add(i, f)
    return engine, time.perf_counter() - t0


def run_match(name: str, engine: Engine, events: list[dict[str, object]]) -> tuple[list[set[SubId]], float]:
    gc.collect()
    t0 = time.perf_counter()
    if name == "rabased":
        out = engine.match_batch(events)
    else:
        match = engine.match
        out = [match(e) for e in events]
    return out, time.perf_counter() - t0


def point(p: Params, repeat: int, seed: int) -> dict[str, float]:
    w = generate(p, seed)
    times: dict[str, float] = {}
    reference: list[set[SubId]] | None = None
    for name in ENGINE_ORDER:
        best = float("inf")
        for _ in range(repeat):
            engine, _ = load(name, w)  # a fresh engine per run: every run is a cold one
            out, dt = run_match(name, engine, w.events)  # type: ignore[arg-type]
            best = min(best, dt)
        if reference is None:
            reference = out
        elif out != reference:
            raise SystemExit(f"{name} disagrees with brute-force on {p}")
        times[name] = best
        del engine
    return times


def scaled(p: Params, scale: float) -> Params:
    return Params(
        E=max(1, round(p.E * scale)), a_l=p.a_l, a_h=p.a_h, A_n=p.A_n, S=max(1, round(p.S * scale)),
        c_l=p.c_l, c_h=p.c_h, narrow=p.narrow,
    )  # fmt: skip


def experiment(key: str, scale: float, repeat: int, seed: int, outdir: Path) -> list[str]:
    fig, label, xs, make = EXPERIMENTS[key]
    lines = [
        f"### Experiment {key} ({fig}): {label}",
        "",
        f"Fixed parameters: {scaled(make(xs[0]), scale)} with the swept one varying.",
        "",
        "| " + label + " | brute-force s | counting s | iccounting s | rabased s "
        "| brute/iccounting | counting/iccounting | iccounting/rabased |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows: list[tuple[int, dict[str, float]]] = []
    for x in xs:
        p = scaled(make(x), scale)
        t = point(p, repeat, seed)
        rows.append((x, t))
        bf, co, ic, ra = (t[n] for n in ENGINE_ORDER)
        cells = [f"{v:.3f}" for v in (bf, co, ic, ra)] + [
            f"{bf / ic:.1f}x",
            f"{co / ic:.1f}x",
            f"{ic / ra:.2f}x",
        ]
        lines.append(f"| {x} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    lines.append("")
    plot(key, fig, label, rows, outdir)
    lines.append(f"![{fig}](performance-content/exp{key}.png)")
    lines.append("")
    return lines


def plot(key: str, fig: str, label: str, rows: list[tuple[int, dict[str, float]]], outdir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    fig_, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    xs = [x for x, _ in rows]
    for ax, names in ((axes[0], ENGINE_ORDER), (axes[1], ENGINE_ORDER[2:])):
        for n in names:
            ax.plot(xs, [t[n] for _, t in rows], marker="o", label=n)
        ax.set_xlabel(label)
        ax.set_ylabel("matching time (s)")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_title(f"seed 000 experiment {key} ({fig})")
    axes[1].set_title("iccounting vs rabased (zoom)")
    fig_.tight_layout()
    fig_.savefig(outdir / f"exp{key}.png", dpi=80)
    plt.close(fig_)


def target(seed: int, n_subs: int, n_ic: int, n_bf: int) -> list[str]:
    """iccounting >= 10x faster than brute-force at 100,000 subscriptions (per event)."""
    w = generate(Params(E=max(n_ic, n_bf), S=n_subs), seed)
    lines = [
        f"### Target: {n_subs:,} subscriptions (seed 000 generator, a = 20-30, A_n = 500, c = 10-15)",
        "",
        "| engine | load s | events timed | median ms/event | mean ms/event "
        "| brute-force / engine (median) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    results: dict[str, tuple[float, int, float, float]] = {}
    answers: dict[str, list[set[SubId]]] = {}
    for name, n in (("brute-force", n_bf), ("counting", n_bf), ("iccounting", n_ic), ("rabased", n_ic)):
        engine, load_s = load(name, w)
        got: list[set[SubId]] = []
        for run in ("cold", "warm"):  # warm: second pass, ordered leaves flattened
            per: list[float] = []
            got = []
            gc.collect()
            for e in w.events[:n]:
                t0 = time.perf_counter()
                got.append(engine.match(e))
                per.append(time.perf_counter() - t0)
            results[f"{name} ({run})"] = (
                load_s,
                n,
                statistics.median(per) * 1e3,
                statistics.fmean(per) * 1e3,
            )
            print(name, run, results[f"{name} ({run})"], flush=True)
            if name in ("brute-force", "counting"):
                break  # no state that warms up
        answers[name] = got
        del engine
    for name in ("counting", "iccounting", "rabased"):
        k = min(len(answers[name]), len(answers["brute-force"]))
        if answers[name][:k] != answers["brute-force"][:k]:
            raise SystemExit(f"{name} disagrees with brute-force at {n_subs} subscriptions")
    bf_med = results["brute-force (cold)"][2]
    for name, (load_s, n, med, mean) in results.items():
        lines.append(f"| {name} | {load_s:.1f} | {n} | {med:.2f} | {mean:.2f} | {bf_med / med:.1f}x |")
    lines.append(
        "cold = first pass over the events after loading; warm = second pass (ordered leaves "
        "have switched to their flattened arrays, see content/_ic_index.py)."
    )
    lines.append("")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="1,2,3,4,5,2n,target", help="comma list of 1-5, 2n, target")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply E and S by this (default 1.0)")
    ap.add_argument("--repeat", type=int, default=1, help="best of N match runs per point")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-subs", type=int, default=100_000)
    ap.add_argument("--out", default="seed000-results.md", help="markdown results file")
    ap.add_argument("--plots", default="docs/performance-content", help="directory for the PNG plots")
    args = ap.parse_args()
    out = Path(args.out)
    outdir = Path(args.plots)
    lines = [
        f"Command: `.venv/bin/python benchmarks/bench_seed000.py {' '.join(sys.argv[1:])}`".rstrip(),
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores shared with "
        f"other jobs, Python {platform.python_version()}; timings are noisy, compare ratios within a row.",
        "",
    ]
    t0 = time.perf_counter()
    for key in args.only.split(","):
        if key == "target":
            lines += target(args.seed, args.target_subs, 200, 20)
        else:
            lines += experiment(key, args.scale, args.repeat, args.seed, outdir)
    lines.append(f"Total benchmark wall time: {time.perf_counter() - t0:.0f} s.")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
