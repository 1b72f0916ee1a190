"""Where rein's and htree's time goes on seed 004's workloads (issue 18, docs/fidelity.md).

For each setting (``default``: m = 20, k = 10, width 0.5; ``k5``: m = 10, k = 5; ``w01`` /
``w09``: width 0.1 / 0.9) builds ``rein`` and ``htree`` on the same ``--n`` subscriptions and,
over ``--events`` events, reports per event:

* rein: the time of its negative search (``REIN._mark``: marking every unit that fails a
  constraint, bucket by bucket) and of collecting the answer (``np.flatnonzero`` of the
  survivors + ``REIN._collect``: the set of subscription ids), and the answer size;
* htree: the bucket entries its cells lead to, the distinct candidate units among them (what
  it verifies), and the answer size.

Timings are medians of single events (noisy on a shared machine); counts are exact.

Usage::

    .venv/bin/python -m benchmarks.explain_seed004 --n 1000000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload004 import Workload

from content import REIN
from content._units import EventVector
from content.baselines import HTree

SETTINGS = {
    "default": {},
    "k5": {"m": 10, "k": 5},
    "w01": {"width": 0.1},
    "w09": {"width": 0.9},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--events", type=int, default=50)
    ap.add_argument("--settings", default="default,k5,w09")
    args = ap.parse_args()
    rows: list[str] = []
    for key in args.settings.split(","):
        w = Workload(**SETTINGS[key])  # type: ignore[arg-type]
        subs = w.subscriptions(args.n)
        events = w.events(args.events)
        rein = REIN(buckets=1000)
        for i, f in enumerate(subs):
            rein.add(i, f)
        rein.match({})
        mark_t: list[float] = []
        coll_t: list[float] = []
        sizes: list[int] = []
        for ev in events:
            n = rein._table.n
            fail = np.zeros(n, dtype=np.bool_)
            t0 = time.perf_counter()
            np.logical_not(rein._table.alive[:n], out=fail)
            rein._mark(fail, ev)
            t1 = time.perf_counter()
            got = rein._collect(np.flatnonzero(~fail), ev)
            t2 = time.perf_counter()
            assert got == rein.match(ev)
            mark_t.append(t1 - t0)
            coll_t.append(t2 - t1)
            sizes.append(len(got))
        del rein
        htree = HTree(6, 6)
        for i, f in enumerate(subs):
            htree.add(i, f)
        htree.match({})
        del subs
        entries: list[int] = []
        cands: list[int] = []
        for ev in events:
            keys = htree._keys(EventVector(htree._store, ev))
            start, units = htree._start, htree._units
            got_u = [units[s:e] for s, e in zip(start[keys].tolist(), start[keys + 1].tolist(), strict=True)]
            found = np.concatenate(got_u) if got_u else units[:0]
            entries.append(len(found))
            cands.append(len(np.unique(found)))
        del htree
        row = (
            f"| {key} | {args.n:,} | {statistics.fmean(sizes):,.0f} | "
            f"{statistics.median(mark_t) * 1e3:.2f} | {statistics.median(coll_t) * 1e3:.2f} | "
            f"{statistics.fmean(entries):,.0f} | {statistics.fmean(cands):,.0f} |"
        )
        rows.append(row)
        print(row, flush=True)
    print()
    print(
        "| setting | subscriptions | matches/event | rein mark ms | rein collect ms "
        "| htree bucket entries/event | htree candidates/event |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
