"""Benchmark of ``topics.SubscriptionIndex`` (issue 2): one million IoT-shaped subscriptions.

Workload (seeded, ``--scale`` multiplies the numbers of clients and devices):
* 100,000 clients x 10 subscriptions = 1,000,000 subscriptions; topics are
  ``tenant/site/device/metric`` (50 tenants x 20 sites x 33 devices = 33,000 devices, 8 metrics,
  264,000 topic names, about 10 subscriptions each); a client watches devices of one tenant.
* 85 % exact filters ``t/s/d/m``; 10 % with '+' (half ``t/s/d/+``: all metrics of a device, half
  ``t/+/d/m``: one metric of device d in every site); 5 % with '#' (``t/s/d/#``).
* 5 % of the clients (every 20th) hold a negative entry: their first subscription is
  ``t/s/d/#`` followed by a partial unsubscribe of ``t/s/d/<metric>``.

Measured in one run, for the index (``topics.SubscriptionIndex``) and for today's index, the
topic tree it replaced (``benchmarks/_topics_legacy.py``, main before issue 42 item 3) on the
same workload, the same topics and the same updates: build time, wall-clock and process CPU
time (the machine is shared), three ways: the restore path (the same operations as per-client
saved lists, ``SubscriptionIndex.replay`` per client with the collector paused, as
``Broker._open_store`` restores a store; today's index, without ``replay``, one call per
entry), ``subscribe`` one at a time with the default collector, and with it disabled; memory per live entry
(tracemalloc, on its own build: the traced bytes the index holds, excluding the filter strings,
which the caller owns and the index only references); publish match time p50/p99 over random
topic names (and how many subscriptions they match); subscribe / unsubscribe / partial-unsubscribe
time p50/p99 on the full index; and the peer: a linear scan that tests every filter with
``topics.matches`` (what amqtt does, with a regex per subscription) timed on a sample of topics,
as a ratio.  Both indexes must give the same matches for the sampled topics (asserted).

Where match time goes (issue 42 item 3, item 1 of its brief): match p50 over the same random
topics binned by how many subscriptions each matched (the cost per matched subscription);
one topic repeated (its dict slots and records in the CPU caches: the instruction cost
alone); and the index's dict lookups alone (the topic and one key per wildcard shape, no
record read, no result built).

Garbage collection is frozen after the builds (``gc.freeze()``), as a long-running broker does
after start-up, so that full collections over a million objects do not land inside samples.
The indexes are built one after the other, then matched in turns on slices of the same
topics (``match_phase``), so that the machine's load moves all of them alike;
``--peer-index FILE`` adds a third, another copy of ``topics/_index.py`` (main's, to measure a
change in the same run).

The index runs ``match``'s loop and makes its records with its C module (``topics/_gather.c``,
built by ``make build``; the rest of ``topics._index`` is Python, not in ``broker/_build.py``
HOT_MODULES); today's index and a ``--peer-index`` copy are plain Python modules.
``--pure-peer`` adds the same ``topics/_index.py`` loaded again with its C module hidden (what
``SIFTMQ_PURE=1`` or a machine without a compiler runs): the same structure, the loop in Python.

Usage::

    .venv/bin/python benchmarks/bench_topics.py [--scale 1.0] [--out docs/performance-topics.md]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import platform
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _topics_legacy

import topics

METRICS = ("temp", "hum", "co2", "volt", "curr", "rssi", "batt", "state")
BINS = ("0-4", "5-9", "10-14", "15-19", "20 or more")  # subscriptions matched by a topic


class Workload:
    def __init__(self, scale: float, seed: int = 2) -> None:
        rnd = random.Random(seed)
        self.tenants = 50
        self.sites = 20
        self.devices = max(1, round(33 * scale))
        self.n_clients = max(20, round(100_000 * scale))
        self.subs_per_client = 10
        tn = [f"tenant{i:02d}" for i in range(self.tenants)]
        sn = [f"site{i:02d}" for i in range(self.sites)]
        dn = [f"dev{i:04d}" for i in range(self.devices)]
        self.names = (tn, sn, dn)
        # (client, filter, is_negative) in the order they are applied
        ops: list[tuple[str, str, bool]] = []
        for c in range(self.n_clients):
            cid = f"client-{c:06d}"
            t = tn[c % self.tenants]
            k0 = 0
            if c % 20 == 0:
                s, d = rnd.choice(sn), rnd.choice(dn)
                ops.append((cid, f"{t}/{s}/{d}/#", False))
                ops.append((cid, f"{t}/{s}/{d}/{rnd.choice(METRICS)}", True))
                k0 = 1
            for _ in range(k0, self.subs_per_client):
                s, d, m = rnd.choice(sn), rnd.choice(dn), rnd.choice(METRICS)
                r = rnd.random()
                if r < 0.85:
                    f = f"{t}/{s}/{d}/{m}"
                elif r < 0.90:
                    f = f"{t}/{s}/{d}/+"
                elif r < 0.95:
                    f = f"{t}/+/{d}/{m}"
                else:
                    f = f"{t}/{s}/{d}/#"
                ops.append((cid, f, False))
        self.ops = ops
        self.rnd = rnd

    def saved(self) -> list[tuple[str, list[topics.Entry[int]]]]:
        """The same operations as per-client saved lists (what a store restores): a
        subscription is a positive entry, a partial unsubscribe a negative one."""
        per: dict[str, list[topics.Entry[int]]] = {}
        for cid, f, neg in self.ops:
            per.setdefault(cid, []).append(topics.Entry(f, not neg, None if neg else 1))
        return list(per.items())

    def topic(self) -> str:
        tn, sn, dn = self.names
        r = self.rnd
        return f"{r.choice(tn)}/{r.choice(sn)}/{r.choice(dn)}/{r.choice(METRICS)}"

    def build(self, cls: type[Any] = topics.SubscriptionIndex) -> Any:
        ix = cls()
        sub = ix.subscribe
        unsub = ix.unsubscribe
        for cid, f, neg in self.ops:
            if neg:
                unsub(cid, f)
            else:
                sub(cid, f, 1)
        return ix


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def us(ns: float) -> str:
    return f"{ns / 1000:.1f} µs"


def restore(cls: type[Any], saved: list[tuple[str, list[topics.Entry[int]]]]) -> Any:
    """Build as the broker's restore does (``broker.store.replay_entries`` per session, the
    collector paused by ``Broker._open_store``): ``replay`` per client where the index has
    it, else one ``subscribe`` / ``unsubscribe`` per entry (today's index, and
    ``replay_entries`` before ``replay``)."""
    ix = cls()
    replay = getattr(ix, "replay", None)
    if replay is not None:
        for cid, entries in saved:
            replay(cid, entries)
        return ix
    sub, unsub = ix.subscribe, ix.unsubscribe
    for cid, entries in saved:
        for e in entries:
            if e.positive:
                sub(cid, e.topic_filter, e.options)
            else:
                unsub(cid, e.topic_filter)
    return ix


def timed(fn: Any) -> tuple[Any, float, float]:
    """``fn()``, its wall-clock and its process CPU time (the machine is shared: CPU time is
    what this process spent, wall-clock adds the time other processes held the cores)."""
    w0, c0 = time.perf_counter(), time.process_time()
    got = fn()
    return got, time.perf_counter() - w0, time.process_time() - c0


def lookups_of(ix: Any) -> Any:
    """The dict lookups of ``SubscriptionIndex.match`` alone (the topic, then one key per
    wildcard shape through ``_Shapes.keys``), without reading a record or building the
    result: what match costs before its result (benchmark only; reads the index's insides)."""
    buckets = ix._subs.buckets
    keys = ix._subs.shapes.keys

    def lookups(topic: str) -> int:
        n = buckets.get(topic) is not None
        for key in keys(topic, topic.split("/")):
            n += buckets.get(key) is not None
        return n

    return lookups


def measure(
    name: str, cls: type[Any], w: Workload, sample: list[str], args: argparse.Namespace
) -> tuple[dict[str, Any], Any]:
    """Memory and build timings of one index class on the workload; returns them and the
    index built with the default collector (matched and updated by the callers)."""
    out: dict[str, Any] = {}
    # memory: build under tracemalloc (filter strings already exist: owned by the workload)
    gc.collect()
    tracemalloc.start()
    ix = w.build(cls)
    mem_bytes, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    n_entries = len(ix)  # live entries (a client may draw the same filter twice: replaced)
    if args.scale <= 0.05:
        ix._check()
    del ix
    gc.collect()
    out["entries"] = n_entries
    out["mem"] = mem_bytes / n_entries
    print(f"{name}: memory {out['mem']:.0f} bytes per entry ({n_entries:,} live entries)", flush=True)

    # build time: the restore path (collector paused), without the garbage collector, then
    # with the default one; wall-clock and CPU time
    saved = w.saved()
    gc.collect()
    gc.disable()
    ix, *out["restore"] = timed(lambda: restore(cls, saved))
    gc.enable()
    assert len(ix) == n_entries
    del ix
    saved = []  # the entries go (the lambda above holds the name)
    gc.collect()
    gc.disable()
    ix, *out["build_nogc"] = timed(lambda: w.build(cls))
    gc.enable()
    del ix
    gc.collect()
    ix, *out["build"] = timed(lambda: w.build(cls))
    print(
        f"{name}: build {out['build'][0]:.1f} s ({out['build_nogc'][0]:.1f} s with gc disabled, "
        f"restore path {out['restore'][0]:.1f} s; CPU {out['build'][1]:.1f} / {out['build_nogc'][1]:.1f} / "
        f"{out['restore'][1]:.1f} s)",
        flush=True,
    )
    assert len(ix) == n_entries
    return out, ix


def match_phase(runs: list[tuple[str, dict[str, Any], Any]], sample: list[str], rounds: int = 4) -> None:
    """Match timings of the built indexes, interleaved: the sample in ``rounds`` slices, each
    slice timed on every index in turn (the order alternating), so that a change in the
    machine's load lands on all of them alike.  Then one topic repeated and the lookups
    alone, interleaved the same way."""
    gc.collect()
    gc.freeze()
    clock = time.perf_counter_ns
    times: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    counts: dict[str, list[int]] = {name: [] for name, _, _ in runs}
    found: dict[str, list[set[tuple[str, str]]]] = {name: [] for name, _, _ in runs}
    same: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    look: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    step = max(1, len(sample) // rounds)
    for r in range(rounds):
        part = sample[r * step : (r + 1) * step]
        order = runs if r % 2 == 0 else runs[::-1]
        for name, _, ix in order:
            match = ix.match
            ts, cs, fs = times[name], counts[name], found[name]
            for topic in part:
                a = clock()
                res = match(topic)
                b = clock()
                ts.append(b - a)
                cs.append(sum(map(len, res.clients.values())))
                if len(fs) < 2_000:
                    fs.append({(c, s.topic_filter) for c, subs in res.clients.items() for s in subs})
            for topic in part[:5]:
                for _ in range(250):
                    a = clock()
                    match(topic)
                    same[name].append(clock() - a)
            if hasattr(ix, "_subs"):
                lookups = lookups_of(ix)
                for topic in part:
                    a = clock()
                    lookups(topic)
                    look[name].append(clock() - a)
    for name, out, _ in runs:
        out["m50"], out["m99"] = pct(times[name], 0.5), pct(times[name], 0.99)
        out["matched"] = statistics.fmean(counts[name])
        out["found"] = found[name]
        # p50 by how many subscriptions a topic matched (the cost per matched subscription)
        bins: dict[str, list[float]] = {}
        for t, c in zip(times[name], counts[name], strict=True):
            bins.setdefault(BINS[min(len(BINS) - 1, c // 5)], []).append(t)
        out["by_matched"] = {k: pct(v, 0.5) for k, v in bins.items() if len(v) >= 100}
        out["same50"] = pct(same[name], 0.5)
        if look[name]:
            out["look50"] = pct(look[name], 0.5)
        print(
            f"{name}: match p50 {us(out['m50'])} p99 {us(out['m99'])}, {out['matched']:.1f} matched",
            flush=True,
        )


def update_phase(name: str, out: dict[str, Any], ix: Any, w: Workload, args: argparse.Namespace) -> None:
    """Subscribe / unsubscribe / partial unsubscribe timings on the full index."""
    clock = time.perf_counter_ns
    tn, sn, _ = w.names
    r = random.Random(7)
    new = []
    for i in range(args.updates):
        cid = f"client-{r.randrange(w.n_clients):06d}"
        f = f"{r.choice(tn)}/{r.choice(sn)}/new{i}/{r.choice(METRICS)}"
        new.append((cid, f))
    st: list[float] = []
    for cid, f in new:
        a = clock()
        ix.subscribe(cid, f, 2)
        st.append(clock() - a)
    ut: list[float] = []
    for cid, f in new:
        a = clock()
        ix.unsubscribe(cid, f)
        ut.append(clock() - a)
    # partial unsubscribe: a metric of a device the client watches with t/s/d/#
    hashers = [(cid, f) for cid, f, neg in w.ops if not neg and f.endswith("/#")][: args.updates]
    pt: list[float] = []
    for cid, f in hashers:
        g = f[:-1] + "extra"
        a = clock()
        ix.unsubscribe(cid, g)
        pt.append(clock() - a)
    out["sub"] = (pct(st, 0.5), pct(st, 0.99))
    out["unsub"] = (pct(ut, 0.5), pct(ut, 0.99))
    out["partial"] = (pct(pt, 0.5), pct(pt, 0.99))
    print(
        f"{name}: subscribe p50 {us(out['sub'][0])} p99 {us(out['sub'][1])}; unsubscribe p50 "
        f"{us(out['unsub'][0])} p99 {us(out['unsub'][1])}; partial unsubscribe p50 {us(out['partial'][0])} "
        f"p99 {us(out['partial'][1])}",
        flush=True,
    )


def pure_index() -> Any:
    """``topics/_index.py`` loaded again as module ``pure_index``, its C module hidden (the
    import of ``topics._gather`` fails as without a compiler): the pure-Python paths."""
    spec = importlib.util.spec_from_file_location("pure_index", Path(topics.__file__).parent / "_index.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["pure_index"] = mod  # dataclasses look their module up
    hidden = sys.modules.get("topics._gather")
    sys.modules["topics._gather"] = None  # type: ignore[assignment]
    saved = topics.__dict__.pop("_gather", None)
    try:
        spec.loader.exec_module(mod)
    finally:
        if hidden is not None:
            sys.modules["topics._gather"] = hidden
        if saved is not None:
            topics._gather = saved  # type: ignore[attr-defined]
    assert mod._native is None
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--matches", type=int, default=20_000, help="timed publish matches")
    ap.add_argument("--updates", type=int, default=20_000, help="timed subscribes / unsubscribes")
    ap.add_argument("--scan-topics", type=int, default=3, help="topics for the linear-scan peer")
    ap.add_argument("--no-legacy", action="store_true", help="skip today's index (the peer)")
    ap.add_argument(
        "--peer-index",
        type=Path,
        default=None,
        help="another copy of topics/_index.py (e.g. `git show main:topics/_index.py > /tmp/ix.py`), "
        "built and timed in the same run, interleaved (printed, not in the table)",
    )
    ap.add_argument(
        "--pure-peer",
        action="store_true",
        help="this same topics/_index.py loaded a second time without its C module (topics._gather): "
        "the same structure with match's loop, the records and the buckets in Python (what "
        "SIFTMQ_PURE=1 runs), built and timed in the same run (printed, not in the table)",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    t0 = time.perf_counter()
    w = Workload(args.scale)
    n_subs = sum(1 for _, _, neg in w.ops if not neg)
    n_negs = len(w.ops) - n_subs
    print(
        f"workload: {n_subs:,} subscriptions, {n_negs:,} negative entries, {w.n_clients:,} clients "
        f"({time.perf_counter() - t0:.1f} s to generate)",
        flush=True,
    )
    filter_bytes = statistics.fmean(sys.getsizeof(f) for _, f, _ in w.ops[:10_000])
    sample = [w.topic() for _ in range(args.matches)]
    runs = [("index", *measure("index", topics.SubscriptionIndex, w, sample, args))]
    if not args.no_legacy:
        runs.append(
            ("today's index", *measure("today's index", _topics_legacy.SubscriptionIndex, w, sample, args))
        )
    if args.peer_index is not None:
        spec = importlib.util.spec_from_file_location("peer_index", args.peer_index)
        assert spec is not None and spec.loader is not None
        peer = importlib.util.module_from_spec(spec)
        sys.modules["peer_index"] = peer  # dataclasses look their module up
        spec.loader.exec_module(peer)
        runs.append(("peer index", *measure("peer index", peer.SubscriptionIndex, w, sample, args)))
    if args.pure_peer:
        runs.append(("pure index", *measure("pure index", pure_index().SubscriptionIndex, w, sample, args)))
    match_phase(runs, sample)
    for name, out, ix in runs:
        update_phase(name, out, ix, w, args)
    new = runs[0][1]
    old = None if args.no_legacy else runs[1][1]
    for name, p, _ in runs[1:]:
        if name not in ("peer index", "pure index"):
            continue
        assert p["found"] == new["found"], f"the {name} disagrees on a sampled topic"
        print(
            f"{name} / index: match p50 {p['m50'] / new['m50']:.2f}x (p99 {p['m99'] / new['m99']:.2f}x), "
            f"one topic repeated {p['same50'] / new['same50']:.2f}x; build CPU: restore path "
            f"{p['restore'][1] / new['restore'][1]:.2f}x, subscribe {p['build'][1] / new['build'][1]:.2f}x, "
            f"without the collector {p['build_nogc'][1] / new['build_nogc'][1]:.2f}x; subscribe p50 "
            f"{p['sub'][0] / new['sub'][0]:.2f}x",
            flush=True,
        )
    gc.unfreeze()
    del runs, ix
    gc.collect()
    if old is not None:
        assert new["found"] == old["found"], "the two indexes disagree on a sampled topic"
        assert new["entries"] == old["entries"]

    # linear-scan peer on a sample of the same topics
    filters = [f for _, f, neg in w.ops if not neg]
    scan: list[float] = []
    mt = topics.matches
    clock = time.perf_counter_ns
    for topic in sample[: args.scan_topics]:
        a = clock()
        hits = [f for f in filters if mt(f, topic)]
        b = clock()
        scan.append(b - a)
        assert len(hits) >= 0
    scan50 = statistics.median(scan)
    print(
        f"linear scan: median {scan50 / 1e6:.0f} ms per topic, ratio {scan50 / new['m50']:,.0f}x", flush=True
    )

    def pair(key: str, fmt: Any) -> tuple[str, str]:
        a = fmt(new[key])
        return a, ("" if old is None else fmt(old[key]))

    def ratio(key: str) -> str:
        if old is None:
            return ""
        a, b = new[key], old[key]
        if isinstance(a, tuple):
            a, b = a[0], b[0]
        return f"{b / a:.1f}x"

    def secs(v: list[float]) -> str:
        return f"{v[0]:.1f} s ({v[1]:.1f} s)"

    def cpu_ratio(key: str) -> str:
        return "" if old is None else f"{old[key][1] / new[key][1]:.1f}x"

    rows = [
        (
            "subscribe operations / partial unsubscribes / clients",
            (f"{n_subs:,} / {n_negs:,} / {w.n_clients:,}", ""),
            f"{new['entries']:,} live entries",
            "",
        ),
        (
            "build, restore path (collector paused, `replay` per client): wall (CPU), ratio of CPU",
            pair("restore", secs),
            cpu_ratio("restore"),
            "<= 3 s",
        ),
        (
            "build, `subscribe` one at a time, default collector: wall (CPU), ratio of CPU",
            pair("build", secs),
            cpu_ratio("build"),
            "",
        ),
        (
            "build, `subscribe` one at a time, collector disabled: wall (CPU), ratio of CPU",
            pair("build_nogc", secs),
            cpu_ratio("build_nogc"),
            "",
        ),
        (
            "memory per live entry (tracemalloc)",
            pair("mem", lambda v: f"{v:.0f} bytes"),
            ratio("mem"),
            "<= 150 bytes",
        ),
        ("match p50", pair("m50", us), ratio("m50"), "<= 5 µs"),
        ("match p99", pair("m99", us), ratio("m99"), ""),
        ("match p50, one topic repeated (in the CPU caches)", pair("same50", us), ratio("same50"), ""),
        ("its dict lookups alone p50 (no record read, no result)", (us(new["look50"]), ""), "", ""),
        *[
            (
                f"match p50, topics matching {k} subscriptions",
                (us(new["by_matched"][k]), "" if old is None else us(old["by_matched"].get(k, 0))),
                ""
                if old is None or k not in old["by_matched"]
                else f"{old['by_matched'][k] / new['by_matched'][k]:.1f}x",
                "",
            )
            for k in BINS
            if k in new["by_matched"]
        ],
        ("subscriptions matched per topic (mean)", pair("matched", lambda v: f"{v:.1f}"), "", "about 10"),
        ("subscribe p50 / p99", pair("sub", lambda v: f"{us(v[0])} / {us(v[1])}"), ratio("sub"), "<= 20 µs"),
        (
            "unsubscribe p50 / p99",
            pair("unsub", lambda v: f"{us(v[0])} / {us(v[1])}"),
            ratio("unsub"),
            "<= 20 µs",
        ),
        (
            "partial unsubscribe p50 / p99",
            pair("partial", lambda v: f"{us(v[0])} / {us(v[1])}"),
            ratio("partial"),
            "",
        ),
        (f"linear scan, median of {len(scan)} topics", (f"{scan50 / 1e6:,.0f} ms", ""), "", ""),
        (
            "linear scan / match p50",
            (f"{scan50 / new['m50']:,.0f}x", "" if old is None else f"{scan50 / old['m50']:,.0f}x"),
            "",
            ">= 1,000x",
        ),
    ]
    table = ["| measure | index | today's index | today's / index | target |", "|---|---|---|---|---|"]
    table += [f"| {a} | {b[0]} | {b[1]} | {c} | {d} |" for a, b, c, d in rows]
    text = "\n".join(table)
    print(text)
    if args.out is not None:
        cmd = "    .venv/bin/python benchmarks/bench_topics.py " + " ".join(sys.argv[1:])
        machine = (
            f"{platform.processor() or platform.machine()}, {platform.python_implementation()} "
            f"{platform.python_version()}, {platform.system()}"
        )
        body = args.out.read_text() if args.out.exists() else ""
        marker = "<!-- bench_topics table -->"
        block = (
            f"{marker}\nCommand:\n\n{cmd}\n\nMachine: {machine} (2 cores shared with other jobs; "
            f"timings are noisy, the ratios are measured in the same run). Filter strings average "
            f"{filter_bytes:.0f} bytes each and are not counted (the caller owns them).\n\n{text}\n{marker}"
        )
        if marker in body:
            pre, _, rest = body.partition(marker)
            _, _, post = rest.partition(marker)
            body = pre + block + post
        else:
            body = body + "\n" + block + "\n"
        args.out.write_text(body)


if __name__ == "__main__":
    main()
