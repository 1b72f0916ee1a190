"""Render a bench_brokers.py JSON run as a markdown section and matplotlib plots.

The section is inserted at the top of the runs in docs/lab/performance-brokers.md (older runs are
kept below it, for history); plots go to docs/lab/img/brokers-<run>-*.png.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["INTRO", "RUNS_MARK", "render", "section"]

RUNS_MARK = "<!-- runs: newest first; bench_brokers.py inserts new runs below this line -->"
BROKER_ORDER = ("siftmq", "mosquitto", "iotcore", "amqtt")
COLORS = {"siftmq": "#1f77b4", "mosquitto": "#2ca02c", "iotcore": "#ff7f0e", "amqtt": "#d62728"}

INTRO = """# Broker performance: siftmq vs mosquitto, iotcore and amqtt

Issue 8. One script starts each broker in turn, drives the same scenarios with the same load
generator, and reports every broker measured **in the same run**, so that ratios stay meaningful
on a noisy shared machine.

- Broker: a fresh process per scenario, pinned to core 0 (`os.sched_setaffinity` in the child),
  descriptor limit raised. mosquitto 2.0 (Debian package, config written under /tmp: loopback
  listener, `persistence false`, `set_tcp_nodelay true`), amqtt (`amqtt -c`, anonymous auth
  plugin only), iotcore (`IotCoreBroker(...).run_forever()`, the rumqttd broker embedded in
  Python), siftmq (`siftmq serve --no-bridge --content-engine hema`).
- Load: `benchmarks/loadgen`, worker processes pinned to core 1, uvloop + raw
  `asyncio.Protocol`, its own MQTT 3.1.1 encoder (pre-encoded PUBLISH blocks, one
  `bytes.join` per block) and frame scanner (~1 µs per received PUBLISH including the latency
  sample). Closed loop: each scenario keeps a window of expected deliveries outstanding and
  refills as they arrive, so it runs at the broker's pace without unbounded queues; the
  `qos0_half` scenario is open loop at half the broker's own QoS 0 maximum.
- Latency: `time.monotonic_ns()` (CLOCK_MONOTONIC, shared by all processes) in every payload,
  read by the subscriber; p50/p99 over the measurement window. In a closed loop latency is
  mostly queueing (window / throughput): compare brokers on `qos0_half`.
- Figures: delivered messages/s in the window; **msgs per broker CPU-second** (delivered / broker
  CPU share) which is what to compare when the machine is oversubscribed; broker CPU (psutil,
  % of one core); RSS once all clients are set up and peak RSS (VmHWM); the generator's own CPU.
  When the generator's CPU is far below 100 % while the broker is the one at its share of the
  core, the generator is not the bottleneck.
- `content`, `partial_unsub`: siftmq semantics (`$filter/<selector>/<topic>`, negative
  entries), n/a for the peers. `content_base` is the same workload without selectors, the
  reference for the "content-filtered >= 50 % of unfiltered" target.

Re-render from a saved JSON without re-running: `.venv/bin/python benchmarks/bench_brokers.py
--render /tmp/brokers-bench.json`.

"""


def _f(v: Any, fmt: str = "{:,.0f}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return fmt.format(v)


def _eff(r: dict[str, Any]) -> float | None:
    cpu = r.get("broker_cpu_pct") or 0
    return r["delivered_per_s"] / (cpu / 100) if cpu > 1 else None


def _verdict(raw: bool, per_cpu: bool) -> str:
    if raw and per_cpu:
        return "met"
    if raw:
        return "met on delivered/s, missed per CPU-s"
    if per_cpu:
        return "missed on delivered/s, met per CPU-s"
    return "missed"


def _by(run: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in run["results"]:
        out.setdefault(r["scenario"], {})[r["broker"]] = r
    return out


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def _plots(run: dict[str, Any], img: Path, stamp: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img.mkdir(parents=True, exist_ok=True)
    by = _by(run)
    scens = list(by)
    names = []
    ncol = 4
    nrow = math.ceil(len(scens) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 3.2 * nrow), squeeze=False)
    for ax, sc in zip(axes.flat, scens, strict=False):
        rows = [by[sc][b] for b in BROKER_ORDER if b in by[sc] and "failed" not in by[sc][b]]
        xs = [r["broker"] for r in rows]
        ys = [r["delivered_per_s"] for r in rows]
        bars = ax.bar(xs, ys, color=[COLORS[x] for x in xs])
        for bar, r in zip(bars, rows, strict=True):
            p99 = r.get("p99_ms") or r.get("cycle_p99_ms")
            if p99 is not None:
                ax.annotate(
                    f"p99 {p99:.3g} ms",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
        ax.set_title(sc, fontsize=10)
        ax.set_ylabel("delivered msg/s", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(scens) :]:
        ax.axis("off")
    fig.suptitle(f"Delivered messages/s per scenario, broker on 1 core ({run['started']})")
    fig.tight_layout()
    name = f"brokers-{stamp}-scenarios.png"
    fig.savefig(img / name, dpi=90)
    plt.close(fig)
    names.append(name)

    fig, ax = plt.subplots(figsize=(12, 4))
    width = 0.2
    for k, b in enumerate(BROKER_ORDER):
        xs, ys = [], []
        for i, sc in enumerate(scens):
            rb = by[sc].get(b)
            e = _eff(rb) if rb is not None and "failed" not in rb else None
            if e is not None:
                xs.append(i + (k - 1.5) * width)
                ys.append(e)
        if xs:
            ax.bar(xs, ys, width, label=b, color=COLORS[b])
    ax.set_xticks(range(len(scens)), scens, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("delivered msgs per broker CPU-second")
    ax.legend(fontsize=8)
    ax.set_title("Efficiency (robust to a shared machine): deliveries per second of broker CPU")
    fig.tight_layout()
    name = f"brokers-{stamp}-efficiency.png"
    fig.savefig(img / name, dpi=90)
    plt.close(fig)
    names.append(name)
    return names


def section(run: dict[str, Any], images: list[str], source: str) -> str:
    by = _by(run)
    out = [f"## Run {run['started']}", ""]
    out += [
        f"- Command: `{run['command']}`",
        f"- Machine: {run['machine']}; load average at start "
        f"{run.get('loadavg', '?')} (shared by other sessions)",
        f"- Commit: `{run['git']}`",
        f"- Settings: `{run['settings']}`",
        f"- Raw results: `{source}`",
    ]
    for b, why in run.get("unavailable", {}).items():
        out.append(f"- {b}: not measured, {why}")
    out.append("")
    out += [f"![scenarios](img/{images[0]})", "", f"![efficiency](img/{images[1]})", ""]

    sift = by.get("qos0", {}).get("siftmq")
    targets = []
    if sift is not None and "failed" not in sift:
        q = by["qos0"]
        for peer, want in (("amqtt", 20.0), ("mosquitto", 0.5), ("iotcore", 1.0)):
            r = q.get(peer)
            if r is None or "failed" in r:
                continue
            got = sift["delivered_per_s"] / max(r["delivered_per_s"], 1e-9)
            es, er = _eff(sift), _eff(r)
            eff = es / er if es is not None and er else None
            targets.append(
                f"| QoS 0 1:1 siftmq/{peer} >= {want:g}x | {got:.2f}x | {_f(eff, '{:.2f}x')} | "
                f"{_verdict(got >= want, eff is not None and eff >= want)} |"
            )
        half = by.get("qos0_half", {}).get("siftmq")
        if half is not None and half.get("p99_ms") is not None:
            targets.append(
                f"| p99 <= 5 ms at half max rate ({half['target_rate']:,.0f} msg/s) | "
                f"{half['p99_ms']:.2f} ms | | {'met' if half['p99_ms'] <= 5 else 'missed'} |"
            )
        cf, cb = by.get("content", {}).get("siftmq"), by.get("content_base", {}).get("siftmq")
        if cf and cb and "failed" not in cf and "failed" not in cb:
            got = cf["delivered_per_s"] / max(cb["delivered_per_s"], 1e-9)
            ef, eb = _eff(cf), _eff(cb)
            eff = ef / eb if ef is not None and eb else None
            targets.append(
                f"| content-filtered >= 50% of unfiltered | {100 * got:.0f}% | {_f(eff, '{:.0%}')} | "
                f"{_verdict(got >= 0.5, eff is not None and eff >= 0.5)} |"
            )
    if targets:
        out += [
            "### Targets (ratios in this run)",
            "",
            "| target | delivered/s ratio | per broker CPU-s | verdict |",
            "|---|---:|---:|---|",
            *targets,
            "",
        ]

    gen = []
    for b, r in by.get("qos0", {}).items():
        if "failed" not in r and r.get("loadgen_cpu_pct", 0) > 0.5 and r["delivered_per_s"] > 0:
            us = 1e6 * (r["loadgen_cpu_pct"] / 100) / r["delivered_per_s"]
            gen.append(
                f"{b}: {us:.2f} µs generator CPU per delivered message (ceiling "
                f"≈ {1e6 / us:,.0f} msg/s per load core; measured {r['delivered_per_s']:,.0f})"
            )
    if gen:
        fastest = max(
            (r["delivered_per_s"] for rows in by.values() for r in rows.values() if "failed" not in r),
            default=0.0,
        )
        out += [
            "### Load generator ceiling",
            "",
            "Generator CPU (send + receive + latency sample) per delivered message in QoS 0 "
            "one-to-one, and the rate one load core could sustain at that cost:",
            "",
            *[f"- {g}" for g in gen],
            "",
            f"The fastest figure in this run is {fastest:,.0f} msg/s: the generator was not the "
            "bottleneck when its CPU stays well below its core while the broker is at its share.",
            "",
        ]
    out += ["### Per scenario", ""]
    for sc, rows in by.items():
        title = run.get("titles", {}).get(sc, sc)
        out += [
            f"#### {sc}: {title}",
            "",
            "| broker | delivered msg/s | msgs/broker CPU-s | p50 ms | p99 ms | broker CPU % | "
            "generator CPU % | RSS ready MB | peak RSS MB | lost | siftmq/this |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        s = rows.get("siftmq")
        for b in BROKER_ORDER:
            r = rows.get(b)
            if r is None:
                continue
            if "failed" in r:
                out.append(f"| {b} | failed: {r['failed']} |||||||||")
                continue
            p50 = r.get("p50_ms") if r.get("p50_ms") is not None else r.get("cycle_p50_ms")
            p99 = r.get("p99_ms") if r.get("p99_ms") is not None else r.get("cycle_p99_ms")
            ratio = _ratio(s["delivered_per_s"], r["delivered_per_s"]) if s and "failed" not in s else "-"
            out.append(
                f"| {b} | {_f(r['delivered_per_s'])} | {_f(_eff(r))} | {_f(p50, '{:.2f}')} | "
                f"{_f(p99, '{:.2f}')} | {_f(r['broker_cpu_pct'])} | {_f(r['loadgen_cpu_pct'])} | "
                f"{_f(r['rss_ready_mb'], '{:.1f}')} | {_f(r['peak_rss_mb'], '{:.1f}')} | {r['lost']} | "
                f"{ratio} |"
            )
            if r.get("errors"):
                out.append(f"| | errors: {'; '.join(r['errors'])} |||||||||")
        if sc == "retained":
            out += [
                "",
                "Latency columns here: time from SUBSCRIBE to the last of the 10,000 retained "
                "messages (one cycle).",
            ]
        if sc == "conn10k":
            out += [
                "",
                "RSS ready = broker RSS with all 10,040 connections open; setup time: "
                + ", ".join(f"{b} {r.get('setup_s', 0):.1f} s" for b, r in rows.items() if "failed" not in r)
                + ".",
            ]
        for b in ("mosquitto", "iotcore", "amqtt"):
            if sc in ("content", "partial_unsub") and b not in rows:
                out.append(f"| {b} | n/a (siftmq semantics) |||||||||")
        out.append("")
    profiles = dict(run.get("profiles", {}))
    if run.get("profile"):  # runs before per-scenario profiles
        profiles["qos0"] = run["profile"]
    for sc, text in profiles.items():
        out += [f"### py-spy profile of siftmq under `{sc}`", "", text, ""]
    return "\n".join(out) + "\n"


def render(run: dict[str, Any], doc: Path, img: Path, source: str) -> None:
    stamp = run["started"].replace("-", "").replace(":", "").replace(" ", "-").replace("-UTC", "")
    images = _plots(run, img, stamp)
    sec = section(run, images, source)
    text = doc.read_text() if doc.exists() else INTRO + RUNS_MARK + "\n"
    if RUNS_MARK not in text:
        text = text.rstrip() + "\n\n" + RUNS_MARK + "\n"
    head, _, tail = text.partition(RUNS_MARK + "\n")
    marker = f"## Run {run['started']}"
    if marker in tail:  # re-render of the same run replaces it
        before, _, after = tail.partition(marker)
        nxt = after.find("\n## Run ")
        tail = before + (after[nxt + 1 :] if nxt >= 0 else "")
    doc.write_text(head + RUNS_MARK + "\n\n" + sec + "\n" + tail.lstrip("\n"))
