"""Why the seed 003 baselines are as fast as they are: what betree and poset visit per event.

Builds ``betree`` and ``poset`` on the first ``--n`` subscriptions of seed 003's experiment 1
and 2 workloads (the same generator and streams as ``bench_seed003``) and averages, over
``--events`` events, what their ``explain()`` reports: for betree the c-nodes visited and the
candidate expressions verified, for poset the nodes evaluated and edges followed; beside
them the true matches per event, betree's ``placement()`` (where the expressions sit) and
poset's ``stats`` / ``redundant_edges()``.  No timings: counts only, so machine load does not
matter.

Usage::

    .venv/bin/python -m benchmarks.explain_seed003 --n 50000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload003 import EXPERIMENTS, Workload

from content.baselines import BETree, Poset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--experiments", default="1,2")
    ap.add_argument("--engines", default="betree,poset")
    args = ap.parse_args()
    names = args.engines.split(",")
    rows: list[str] = []
    for key in args.experiments.split(","):
        exp = EXPERIMENTS[key]
        w = Workload(exp)
        subs = [w.subscription() for _ in range(args.n)]
        we = Workload(exp, stream=1)
        events = [we.event() for _ in range(args.events)]
        for name in names:
            engine: BETree | Poset = BETree() if name == "betree" else Poset()
            t0 = time.perf_counter()
            for i, f in enumerate(subs):
                engine.add(i, f)
            print(f"exp{key} {name} built in {time.perf_counter() - t0:.1f}s", flush=True)
            matches = statistics.fmean(len(engine.match(ev)) for ev in events)
            ex = [engine.explain(ev) for ev in events]
            avg = {k: statistics.fmean(e[k] for e in ex) for k in ex[0]}
            extra = (
                engine.placement()
                if isinstance(engine, BETree)
                else {"redundant_edges": engine.redundant_edges()}
            )
            stats = engine.stats
            desc = ", ".join(f"{k} {v:,.0f}" for k, v in avg.items())
            struct = ", ".join(f"{k} {v:,}" for k, v in {**stats, **extra}.items())
            rows.append(f"| {key} | {name} | {args.n:,} | {matches:,.1f} | {desc} | {struct} |")
            print(rows[-1], flush=True)
            del engine
    print()
    print("| exp. | engine | subscriptions | matches/event | per event (mean) | structure |")
    print("|---|---|---:|---:|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
