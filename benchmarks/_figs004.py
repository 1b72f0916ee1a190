"""Seed 004's Figs. 4-8 with its four algorithms side by side: tama, htree, rein, hcem.

Used by ``benchmarks/bench_seed004.py --full`` (or ``--figs 4,5``).  Settings are seed 004's
(section 4, Table 3): m = 20 attributes per event, k = 10 range constraints per
subscription, width 0.5, b = 1,000 buckets, 500 events arriving together unless the figure
varies it; TAMA with gamma = 13 levels, H-Tree with tau = delta = 6 (the paper's settings).

* Fig. 4: hcem (and rein, same index) against the number of buckets b, n = 2M;
* Fig. 5: the four engines against the batch size (events arriving together), n = 1M;
* Fig. 6: against n = 0.5M .. 2M, plus Table 4 (min / max / std over those points);
* Fig. 7: against k with m = 2k, n = 1M;  Fig. 8: against the predicate width, n = 1M.

Protocol per point: the workload (subscriptions, then events) is generated once; each
engine is built in turn (insertion plus the build of its index, timed together), warmed up
(hcem: one batch, which builds its per-unit bucket index), matches the same events, and is
dropped before the next one is built.  rein = ``REIN.match`` per
event and hcem = ``HCEM.match_batch`` on the same index (HCEM subclasses REIN); tama and
htree match event by event (their papers have no batch mode; their ``match_batch`` is a
loop).  hcem's batch is passed in consecutive slices of 64 events -- HCEM's bit-set word,
so the work is exactly one call on the whole batch -- and answers are reduced to (size,
sum of ids) right away, so that half a million answer sets never sit in memory at once;
the four engines' reductions are asserted equal for every event.  Times are per event
(total time / events); the paper's "HCEM is x times faster" ratios are ratios of these.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from _workload004 import Workload

from content import HCEM, Engine
from content.baselines import TAMA, HTree

ENGINES = ("tama", "htree", "rein", "hcem")
CHUNK = 64  # HCEM's word: events per match_batch call
TAMA_LEVELS = 13
HTREE_CELLS = HTREE_LEVELS = 6
BUCKETS = 1000

Event = dict[str, object]
Answer = tuple[int, int]


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


def reduce(answers: Sequence[set[object]]) -> list[Answer]:
    return [(len(a), sum(a)) for a in answers]  # type: ignore[arg-type]


@dataclass
class Point:
    """Measurements of one x value: per-event ms, build s, RSS growth MB per engine."""

    x: float
    n: int = 0
    ms: dict[str, float] = field(default_factory=dict)
    build_s: dict[str, float] = field(default_factory=dict)
    rss_mb: dict[str, float] = field(default_factory=dict)
    entries: dict[str, int] = field(default_factory=dict)
    matches: float = 0.0
    load: float = 0.0


def build(engine: Engine, subs: Sequence[object]) -> tuple[float, float]:
    """Insert every subscription and build the index; returns (seconds, RSS growth MB)."""
    gc.collect()
    before = rss()
    gc.disable()
    t0 = time.perf_counter()
    for i, f in enumerate(subs):
        engine.add(i, f)  # type: ignore[arg-type]
    engine.match({})  # writes queued inserts / builds the index
    dt = time.perf_counter() - t0
    gc.enable()
    return dt, (rss() - before) / 2**20


def per_event(
    match: Callable[[Sequence[Event]], list[set[object]]], events: Sequence[Event], batch: int
) -> tuple[float, list[Answer]]:
    """Per-event ms over ``events`` fed ``batch`` at a time (each batch in slices of CHUNK)."""
    out: list[Answer] = []
    t0 = time.perf_counter()
    for k in range(0, len(events), batch):
        group = events[k : k + batch]
        for c in range(0, len(group), CHUNK):
            out.extend(reduce(match(group[c : c + CHUNK])))
    return (time.perf_counter() - t0) * 1e3 / len(events), out


def single(engine: Engine) -> Callable[[Sequence[Event]], list[set[object]]]:
    def run(evs: Sequence[Event]) -> list[set[object]]:
        return [engine.match(e) for e in evs]

    return run


def measure(
    w: Workload, n: int, events_n: int, batches: Sequence[int], x: float, engines: Sequence[str] = ENGINES
) -> list[Point]:
    """Build every engine on one workload and time it at each batch size (one Point each)."""
    subs = w.subscriptions(n)
    events = w.events(max(events_n, *batches, 100))
    points = [Point(x=b if len(batches) > 1 else x, n=n) for b in batches]
    load = psutil.getloadavg()[0]
    want: list[Answer] | None = None

    def check(got: list[Answer]) -> None:
        nonlocal want
        if want is None or len(got) > len(want):
            m = 0 if want is None else len(want)
            assert want is None or got[:m] == want, "engines disagree"
            want = got
        assert got == want[: len(got)], "engines disagree"

    if "rein" in engines or "hcem" in engines:
        hcem = HCEM(buckets=BUCKETS)
        dt, grown = build(hcem, subs)
        hcem.match_batch(events[:CHUNK])  # warm-up: builds HCEM's per-unit bucket index
        for p, b in zip(points, batches, strict=True):
            evs = events[: max(events_n, b, 100)]
            if "rein" in engines:
                p.ms["rein"], got = per_event(single(hcem), evs, 1)
                check(got)
                p.build_s["rein"], p.rss_mb["rein"] = dt, grown
            if "hcem" in engines:
                p.ms["hcem"], got = per_event(hcem.match_batch, evs, b)
                check(got)
                p.build_s["hcem"], p.rss_mb["hcem"] = dt, grown
        del hcem
    for name in ("tama", "htree"):
        if name not in engines:
            continue
        engine: TAMA | HTree = (
            TAMA(levels=TAMA_LEVELS) if name == "tama" else HTree(HTREE_CELLS, HTREE_LEVELS)
        )
        dt, grown = build(engine, subs)
        stats = engine.stats()
        for p, b in zip(points, batches, strict=True):
            evs = events[: max(events_n, b, 100)]
            p.ms[name], got = per_event(single(engine), evs, 1)
            check(got)
            p.build_s[name], p.rss_mb[name], p.entries[name] = dt, grown, stats["entries"]
        del engine
    assert want is not None
    for p in points:
        p.matches = statistics.fmean(a for a, _ in want)
        p.load = load
    del subs
    gc.collect()
    return points


# -- figures --------------------------------------------------------------------------


def fig4(n: int, buckets: Sequence[int], events_n: int) -> list[Point]:
    """hcem and rein against b: one index, rebucketed for every b (same entries)."""
    w = Workload()
    subs = w.subscriptions(n)
    events = w.events(events_n)
    hcem = HCEM(buckets=buckets[0])
    build_s, grown = build(hcem, subs)
    del subs
    points = []
    for b in buckets:
        for low, high in hcem._lists.values():
            for lst in (low, high):
                lst.max_buckets = b
                lst.rebucket()
        hcem.match_batch(events[:CHUNK])  # warm-up: rebuilds the per-unit bucket index
        p = Point(x=b, n=n, load=psutil.getloadavg()[0])
        p.ms["hcem"], got = per_event(hcem.match_batch, events, events_n)
        p.ms["rein"], again = per_event(single(hcem), events, 1)
        assert got == again
        p.matches = statistics.fmean(a for a, _ in got)
        p.build_s["hcem"], p.rss_mb["hcem"] = build_s, grown
        points.append(p)
        print(f"  b = {b}: hcem {p.ms['hcem']:.3f} ms, rein {p.ms['rein']:.3f} ms", flush=True)
    return points


def fig5(n: int, batches: Sequence[int]) -> list[Point]:
    return measure(Workload(), n, 0, batches, 0)


def sweep(make: Callable[[float], tuple[Workload, int]], xs: Sequence[float], events_n: int) -> list[Point]:
    points = []
    for x in xs:
        w, n = make(x)
        (p,) = measure(w, n, events_n, [events_n], x)
        print(f"  x = {x}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in p.ms.items()), flush=True)
        points.append(p)
    return points


# -- output ---------------------------------------------------------------------------


def table(title: str, xlabel: str, points: Sequence[Point], engines: Sequence[str] = ENGINES) -> list[str]:
    cols = [e for e in engines if e in points[0].ms]
    lines = [f"### {title}", ""]
    head = f"| {xlabel} | " + " | ".join(f"{e} ms/event" for e in cols)
    ratios = [e for e in ("tama", "htree", "rein") if e in cols and "hcem" in cols]
    head += "".join(f" | {e} / hcem" for e in ratios) + " | matches/event | load |"
    lines += [head, "|" + "---:|" * (1 + len(cols) + len(ratios) + 2)]
    for p in points:
        row = f"| {p.x:g} | " + " | ".join(f"{p.ms[e]:.3f}" for e in cols)
        row += "".join(f" | {p.ms[e] / p.ms['hcem']:.2f}x" for e in ratios)
        row += f" | {p.matches:.1f} | {p.load:.1f} |"
        lines.append(row)
    if any(p.build_s for p in points):
        lines += ["", "Build (insert every subscription + build the index), RSS growth, index entries:", ""]
        lines += [
            "| " + xlabel + " | engine | build s | us/sub | RSS MB | entries |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        seen: set[tuple[float, float]] = set()
        for p in points:
            for e, s in p.build_s.items():
                if e == "rein" or (s, p.rss_mb[e]) in seen:
                    continue
                seen.add((s, p.rss_mb[e]))
                name = "rein/hcem" if e == "hcem" else e
                us = s / p.n * 1e6
                lines.append(
                    f"| {p.x:g} | {name} | {s:.1f} | {us:.1f} | {p.rss_mb[e]:.0f} | {p.entries.get(e, '-')} |"
                )
    lines.append("")
    return lines


def plot(path: Path, title: str, xlabel: str, points: Sequence[Point], logx: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    xs = [p.x for p in points]
    for e in ENGINES:
        if e in points[0].ms:
            ax.plot(xs, [p.ms[e] for p in points], marker="o", label=e)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("matching time per event (ms)")
    ax.set_yscale("log")
    if logx:
        ax.set_xscale("log")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def table4(points: Sequence[Point]) -> list[str]:
    """Seed 004 Table 4: min, max and standard deviation of the matching time over Fig. 6."""
    lines = ["### Table 4: stability over Fig. 6's points (per-event ms)", ""]
    lines += ["| engine | min | max | max - min | std | std / hcem's |", "|---|---:|---:|---:|---:|---:|"]
    hstd = statistics.pstdev(p.ms["hcem"] for p in points)
    for e in ENGINES:
        vals = [p.ms[e] for p in points]
        std = statistics.pstdev(vals)
        lo, hi = min(vals), max(vals)
        lines.append(f"| {e} | {lo:.3f} | {hi:.3f} | {hi - lo:.3f} | {std:.3f} | {std / hstd:.2f}x |")
    lines.append("")
    return lines


def run(figs: Sequence[int], scale: float, outdir: Path, json_path: Path | None) -> list[str]:
    """Run the figures; returns the markdown; writes the plots (and the raw points as JSON)."""

    def sc(n: int) -> int:
        return max(1000, round(n * scale))

    out: list[str] = []
    raw: dict[str, list[dict[str, object]]] = {}
    events_n = 500  # seed 004: "500 events arrive together" unless the figure varies it
    if 4 in figs:
        n = sc(2_000_000)
        print(f"Fig. 4 (n = {n:,})", flush=True)
        pts = fig4(n, [100, 300, 500, 1000, 2000, 5000], events_n)
        out += table(
            f"Fig. 4: buckets b (n = {n:,}, m = 20, k = 10, width 0.5, batch 500)", "b", pts, ("rein", "hcem")
        )
        plot(
            outdir / "seed004_fig4.png", f"seed 004 Fig. 4: buckets (n = {n:,})", "buckets b", pts, logx=True
        )
        out.append("![Fig. 4](performance-content/seed004_fig4.png)\n")
        raw["fig4"] = [p.__dict__ for p in pts]
    if 5 in figs:
        n = sc(1_000_000)
        print(f"Fig. 5 (n = {n:,})", flush=True)
        pts = fig5(n, [1, 10, 100, 250, 500, 1000])
        out += table(f"Fig. 5: batch size (n = {n:,}, m = 20, k = 10, width 0.5, b = 1,000)", "batch", pts)
        plot(
            outdir / "seed004_fig5.png",
            f"seed 004 Fig. 5: batch size (n = {n:,})",
            "events per batch",
            pts,
            logx=True,
        )
        out.append("![Fig. 5](performance-content/seed004_fig5.png)\n")
        raw["fig5"] = [p.__dict__ for p in pts]
    if 6 in figs:
        print("Fig. 6", flush=True)
        ns = [sc(x) for x in (500_000, 1_000_000, 1_500_000, 2_000_000)]
        pts = sweep(lambda x: (Workload(), int(x)), ns, events_n)
        out += table("Fig. 6: subscriptions n (m = 20, k = 10, width 0.5, batch 500)", "n", pts)
        out += table4(pts)
        plot(outdir / "seed004_fig6.png", "seed 004 Fig. 6: subscriptions", "subscriptions n", pts)
        out.append("![Fig. 6](performance-content/seed004_fig6.png)\n")
        raw["fig6"] = [p.__dict__ for p in pts]
    if 7 in figs:
        n = sc(1_000_000)
        print(f"Fig. 7 (n = {n:,})", flush=True)
        pts = sweep(lambda k: (Workload(m=2 * int(k), k=int(k)), n), [5, 10, 15, 20], events_n)
        out += table(f"Fig. 7: constraints k with m = 2k (n = {n:,}, width 0.5, batch 500)", "k", pts)
        plot(outdir / "seed004_fig7.png", f"seed 004 Fig. 7: constraints k = m/2 (n = {n:,})", "k", pts)
        out.append("![Fig. 7](performance-content/seed004_fig7.png)\n")
        raw["fig7"] = [p.__dict__ for p in pts]
    if 8 in figs:
        n = sc(1_000_000)
        print(f"Fig. 8 (n = {n:,})", flush=True)
        pts = sweep(lambda wd: (Workload(width=wd), n), [0.1, 0.3, 0.5, 0.7, 0.9], events_n)
        out += table(f"Fig. 8: predicate width (n = {n:,}, m = 20, k = 10, batch 500)", "width", pts)
        plot(outdir / "seed004_fig8.png", f"seed 004 Fig. 8: predicate width (n = {n:,})", "width", pts)
        out.append("![Fig. 8](performance-content/seed004_fig8.png)\n")
        raw["fig8"] = [p.__dict__ for p in pts]
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(raw, indent=1))
    return out
