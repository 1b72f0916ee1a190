"""Markdown table and plots of a bench_restart_storm.py run (docs/performance-connections.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["render"]


def _kb(b: float) -> str:
    return f"{b / 1024:,.2f} KiB"


def _per(m: dict[str, Any]) -> str:
    per = m.get("rss_per_session")
    return "n/a" if per is None else f"{per:,} B"


def _plot(run: dict[str, Any], img: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    img.mkdir(parents=True, exist_ok=True)
    name = f"restart-storm-{run['stamp']}.png"
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for kind in sorted({r["broker"] for r in run["results"]}):
        rows = sorted((r for r in run["results"] if r["broker"] == kind), key=lambda r: r["sessions"])
        for mode, style in (("graceful", "-o"), ("kill9", "--x")):
            pts = [(r["sessions"] / 1000, r[mode]) for r in rows if mode in r]
            if not pts:
                continue
            xs = [p[0] for p in pts]
            label = f"{kind} {mode}"
            axes[0].plot(xs, [p[1]["restore_s"] for p in pts], style, label=label)
            axes[1].plot(xs, [p[1]["complete_s"] for p in pts], style, label=label)
            axes[2].plot(xs, [p[1]["rss_restored"] / 2**20 for p in pts], style, label=label)
    for ax, title in zip(
        axes,
        ("restore (start -> port open), s", "storm complete (ready -> all done), s", "RSS restored, MiB"),
        strict=True,
    ):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("persisted sessions (thousands)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(img / name, dpi=90)
    plt.close(fig)
    return name


def render(run: dict[str, Any], img: Path) -> str:
    """The Markdown rows of ``run`` (and its plot, written under ``img``)."""
    a = run["args"]
    lines = [
        f"Run {run['stamp']} UTC, load average {', '.join(f'{x:.1f}' for x in run['load'])}; "
        f"{a['procs']} generator processes x {a['window']} open connections, "
        f"{a['addresses']} source addresses; every {a['every']}th session has {a['queued']} "
        "queued QoS 1 messages.",
        "",
        "| broker | sessions | restart | restore | storm complete | present | delivered / expected "
        "| missing | dup | CONNACK p50 / p99 | RSS restored | per session | broker CPU | generator CPU |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in run["results"]:
        for mode in ("graceful", "kill9"):
            m = r.get(mode)
            if m is None:
                continue
            restore = f"{m['restore_s']:.2f} s"
            if "start_s" in m:
                restore += f" ({m['start_s']:.2f}"
                restore += f", CPU {m['start_cpu_s']:.2f})" if "start_cpu_s" in m else ")"
            lines.append(
                f"| {r['broker']} | {r['sessions']:,} | {mode} | {restore} | {m['complete_s']:.1f} s "
                f"| {m['present']:,} | {m['messages']:,} / {m['expected']:,} | {m['missing']} "
                f"| {m['duplicates']} | {m['connack_p50_ms']:.0f} / {m['connack_p99_ms']:.0f} ms "
                f"| {m['rss_restored'] / 2**20:,.0f} MiB | {_per(m)} "
                f"| {m['broker_cpu_s']:.1f} s | {m['generator_cpu_s']:.1f} s |"
            )
    extra = [
        (r["sessions"], r[mode])
        for r in run["results"]
        if r["broker"] == "siftmq"
        for mode in ("graceful", "kill9")
        if mode in r
    ]
    if extra:
        lines += [
            "",
            "| siftmq sessions | Session object + containers | tick at restore |",
            "|---:|---:|---:|",
        ]
        for n, m in extra:
            lines.append(f"| {n:,} | {m['session_object_bytes']:.0f} B | {m['tick_us']:.1f} us |")
    name = _plot(run, img)
    if name:
        lines += ["", f"![restart storm](lab/img/{name})"]
    return "\n".join(lines)
