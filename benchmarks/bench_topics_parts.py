"""Where SubscriptionIndex's time goes at 1M subscriptions (issue 42 item 3, third pass): two
probes of ``bench_topics.py``'s workload, for the rows of docs/performance-topics.md that the
full benchmark does not print.

* ``prefetch``: ``match`` p50 / p99 with and without the C loop's prefetch of the dict lookups
  (``topics._gather.set_dict_prefetch``), one index built by the restore path, the two
  settings timed in alternating slices of 5,000 random topics (12 slices), after ``gc.freeze()``.
* ``gc``: ``subscribe`` one at a time with the default collector, this index against the same
  ``topics/_index.py`` without its C module (``bench_topics.pure_index``), each built twice in
  alternating order: process CPU time, the part of it spent in the collector (``gc.callbacks``),
  collections per generation, and how many objects the collector tracks afterwards.

Usage (under the bench lock)::

    flock /work/bench.lock .venv/bin/python benchmarks/bench_topics_parts.py prefetch [--scale 1.0]
    flock /work/bench.lock .venv/bin/python benchmarks/bench_topics_parts.py gc [--scale 1.0]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_topics as bt

import topics._index as index_module


def prefetch(scale: float) -> None:
    from topics import _gather

    w = bt.Workload(scale)
    ix = bt.restore(index_module.SubscriptionIndex, w.saved())
    gc.collect()
    gc.freeze()
    sample = [w.topic() for _ in range(60_000)]
    clock = time.perf_counter_ns
    res: dict[str, list[int]] = {"prefetched": [], "not prefetched": []}
    names = list(res)
    try:
        for r in range(12):
            part = sample[r * 5_000 : (r + 1) * 5_000]
            for name in names if r % 2 == 0 else names[::-1]:
                _gather.set_dict_prefetch(name == "prefetched")
                match, ts = ix.match, res[name]
                for t in part:
                    a = clock()
                    match(t)
                    ts.append(clock() - a)
    finally:
        _gather.set_dict_prefetch(True)
    for name, v in res.items():
        v.sort()
        print(f"{name}: match p50 {v[len(v) // 2] / 1000:.2f} us p99 {v[int(len(v) * 0.99)] / 1000:.2f} us")


def collector(scale: float) -> None:
    pure = bt.pure_index()
    w = bt.Workload(scale)
    spent = [0.0]

    def cb(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            spent.append(time.process_time())
        else:
            spent[0] += time.process_time() - spent.pop()

    flavours = [("C module", index_module), ("pure", pure)]
    for r in range(2):
        for name, mod in flavours if r == 0 else flavours[::-1]:
            gc.collect()
            base = len(gc.get_objects())
            before = [d["collections"] for d in gc.get_stats()]
            spent[:] = [0.0]
            gc.callbacks.append(cb)
            t0 = time.process_time()
            ix = w.build(mod.SubscriptionIndex)
            t1 = time.process_time()
            gc.callbacks.remove(cb)
            runs = [d["collections"] - b for d, b in zip(gc.get_stats(), before, strict=True)]
            print(
                f"{name}: subscribe one at a time CPU {t1 - t0:.2f} s, "
                f"of which in the collector {spent[0]:.2f} s; "
                f"collections per generation {runs}; objects tracked after: {len(gc.get_objects()) - base:,}",
                flush=True,
            )
            del ix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probe", choices=("prefetch", "gc"))
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args()
    if args.probe == "prefetch":
        prefetch(args.scale)
    else:
        collector(args.scale)


if __name__ == "__main__":
    main()
