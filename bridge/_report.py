"""``siftmq analytics report``: the latest analytics results as one self-contained HTML page.

Reads the results the Spark jobs wrote (:func:`bridge._analytics.results`, pyarrow + pandas; no
Spark needed) and draws them with matplotlib (Agg backend) as PNG images inlined as base64
``data:`` URIs, so the page has no external reference and can be mailed or archived.
Sections: totals, message rate per topic over time, fan-out histogram, subscription churn per
window, active subscriptions per filter over time, broker latency percentiles, top topics and
content-filter selectivity tables, and composite subscriptions (events and time to completion
per subscription as a plot, then a table with occupancy, expiries, drops and changes;
``bridge/_composite.py``).  Empty results render as a short "no data yet" note ("no composite
data" for the composite section, e.g. over results from before issue 16).
"""

from __future__ import annotations

import base64
import html
import io
import time
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]

from bridge._analytics import results, selectivity
from bridge._composite import composite_view

__all__ = ["render_report", "write_report"]

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222}
h1{font-size:1.6em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
.cards{display:flex;gap:1em}.card{background:#f4f6fa;border-radius:8px;padding:.8em 1.2em}
.card b{display:block;font-size:1.6em}table{border-collapse:collapse}
td,th{padding:.2em .8em;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left}img{max-width:100%}.empty{color:#888}
"""


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(title: str, draw: Any, data: pd.DataFrame) -> str:
    if data.empty:
        return f'<h2>{html.escape(title)}</h2><p class="empty">no data yet</p>'
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.2))
    draw(ax, data)
    ax.grid(alpha=0.3)
    alt = html.escape(title)
    return f'<h2>{alt}</h2><img alt="{alt}" src="data:image/png;base64,{_png(fig)}">'


def _time_axis(ax: Any, times: pd.Series) -> None:
    """Concise time labels; a few seconds of margin so a single window is not a lone dot in years."""
    import matplotlib.dates

    mdates: Any = matplotlib.dates  # its constructors are untyped
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    lo, hi = times.min(), times.max()
    margin = max((hi - lo) * 0.05, pd.Timedelta(seconds=5))
    ax.set_xlim(lo - margin, hi + margin)


def _rate(ax: Any, df: pd.DataFrame) -> None:
    seconds = (df["window_end"] - df["window_start"]).dt.total_seconds()
    df = df.assign(rate=df["deliveries"] / seconds)
    top = df.groupby("topic")["deliveries"].sum().nlargest(8).index
    for topic in top:
        part = df[df["topic"] == topic].sort_values("window_start")
        ax.plot(part["window_start"], part["rate"], marker=".", label=str(topic))
    ax.set_ylabel("deliveries / s")
    _time_axis(ax, df["window_start"])
    ax.legend(fontsize="small", loc="upper left")


def _fanout(ax: Any, df: pd.DataFrame) -> None:
    from matplotlib.ticker import MaxNLocator

    df = df.sort_values("deliveries")
    ax.bar(df["deliveries"].astype(int), df["messages"], width=0.8, color="#4c72b0")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # fan-outs are whole numbers
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("deliveries per message")
    ax.set_ylabel("messages")


def _churn(ax: Any, df: pd.DataFrame) -> None:
    table = df.pivot_table(index="window_start", columns="action", values="changes", aggfunc="sum").fillna(0)
    bottom = None
    for action in table.columns:
        ax.bar(table.index, table[action], bottom=bottom, width=0.8 * _width(table.index), label=str(action))
        bottom = table[action] if bottom is None else bottom + table[action]
    ax.set_ylabel("changes per window")
    _time_axis(ax, pd.Series(table.index))
    ax.legend(fontsize="small")


def _width(index: Any) -> float:
    if len(index) < 2:
        return 1 / 86400 * 10
    steps = pd.Series(index).sort_values().diff().dropna()
    return float(steps.min().total_seconds()) / 86400


def _active(ax: Any, df: pd.DataFrame) -> None:
    """Active subscriptions per filter as stacked steps (equal counts never hide each other)."""
    df = df.assign(filter=df["topic_filter"].astype(str)).sort_values("time")
    top = list(df.groupby("filter")["delta"].apply(lambda s: s.cumsum().max()).nlargest(8).index)
    times = pd.Series(sorted(df["time"].unique()))
    lower = pd.Series(0.0, index=range(len(times)))
    for name in top:
        part = df[df["filter"] == name].groupby("time")["delta"].sum()
        level = part.reindex(times.values, fill_value=0).cumsum().reset_index(drop=True).astype(float)
        upper = lower + level
        ax.fill_between(times, lower, upper, step="post", alpha=0.8, label=name)
        lower = upper
    ax.set_ylabel("active subscriptions (stacked)")
    _time_axis(ax, df["time"])
    ax.legend(fontsize="small", loc="upper left")


def _latency(ax: Any, df: pd.DataFrame) -> None:
    df = df.sort_values("window_start")
    for col in ("p50", "p90", "p99"):
        ax.plot(df["window_start"], df[col] * 1e3, marker=".", label=col)
    ax.set_ylabel("broker latency (ms)")
    _time_axis(ax, df["window_start"])
    ax.set_yscale("log")
    ax.legend(fontsize="small")


def _short(text: str, n: int = 36) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _composite(ax: Any, df: pd.DataFrame) -> None:
    """Events per composite subscription (bars, left) and their time to completion p50/p99
    (markers, right axis), the 8 subscriptions with the most events."""
    from matplotlib.ticker import MaxNLocator

    df = df.sort_values(["events", "expression"], ascending=[False, True]).head(8).reset_index(drop=True)
    x = list(range(len(df)))
    ax.bar(x, df["events"], width=0.6, color="#4c72b0", label="events")
    ax.set_ylabel("composite events")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xticks(x)
    ax.set_xticklabels([_short(str(e)) for e in df["expression"]], fontsize="small", rotation=15, ha="right")
    right = ax.twinx()
    for col, marker, color in (("completion_p50", "o", "#dd8452"), ("completion_p99", "^", "#c44e52")):
        values = pd.to_numeric(df[col], errors="coerce")
        right.plot(
            x, values, linestyle="none", marker=marker, color=color, label=col.replace("completion_", "")
        )
    right.set_ylabel("time to completion (s)")
    top = pd.to_numeric(df["completion_p99"], errors="coerce").max()
    right.set_ylim(0, float(top) * 1.15 if pd.notna(top) and top > 0 else 1.0)
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = right.get_legend_handles_labels()
    ax.legend(handles + more, labels + more_labels, fontsize="small", loc="upper right")


def _composite_section(view: dict[str, Any]) -> str:
    """Plot + table of :func:`bridge._composite.composite_view`, or "no composite data"."""
    subs = view["subscriptions"]
    title = "Composite subscriptions"
    if not subs:
        return f'<h2>{title}</h2><p class="empty">no composite data</p>'
    df = pd.DataFrame(subs)
    plot = _figure(f"{title}: events and time to completion", _composite, df[df["events"] > 0])

    def cell(v: Any, seconds: bool = False) -> str:
        if v is None or (isinstance(v, float) and pd.isna(v)):
            return "—"
        if seconds:
            return f"{float(v):.3f}"
        if isinstance(v, float):
            return str(int(v)) if v.is_integer() else f"{v:.3g}"
        return str(v)

    table = pd.DataFrame(
        {
            "expression": df["expression"],
            "window (s)": [cell(v) for v in df["window"]],
            "max buffer": [cell(v) for v in df["max_buffer"]],
            "events": df["events"],
            "p50 (s)": [cell(v, True) for v in df["completion_p50"]],
            "p99 (s)": [cell(v, True) for v in df["completion_p99"]],
            "buffered max": [cell(v) for v in df["buffered_max"]],
            "buffered mean": [cell(v) for v in df["buffered_mean"]],
            "expired": df["expired"],
            "dropped": df["dropped"],
            **{f"{a}s": [c.get(a, 0) for c in df["changes"]] for a in ("subscribe", "unsubscribe")},
            "ended": [c.get("session_end", 0) + c.get("expired", 0) for c in df["changes"]],
        }
    )
    o = view["overall"]
    note = (
        f'<p id="composite-overall">{o["events"]} composite events over {o["subscriptions"]} composite '
        f"subscriptions; time to completion p50 {cell(o['completion_p50'], True)} s, p99 "
        f"{cell(o['completion_p99'], True)} s; buffered after an event: max {cell(o['buffered_max'])}, "
        f"mean {cell(o['buffered_mean'])}; components expired {o['expired']}, dropped {o['dropped']}.</p>"
    )
    return "\n".join(
        (plot, note, _table("Composite subscriptions (per subscription)", table, list(table.columns)))
    )


def _table(title: str, df: pd.DataFrame, columns: list[str]) -> str:
    if df.empty:
        return f'<h2>{html.escape(title)}</h2><p class="empty">no data yet</p>'
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    rows = []
    for rec in df[columns].itertuples(index=False):
        cells = "".join(
            f"<td>{v:.3f}</td>" if isinstance(v, float) else f"<td>{html.escape(str(v))}</td>" for v in rec
        )
        rows.append(f"<tr>{cells}</tr>")
    return f"<h2>{html.escape(title)}</h2><table><tr>{head}</tr>{''.join(rows)}</table>"


def render_report(output: str | Path, include_sys: bool = False) -> str:
    """The HTML page (a string) for the results under ``output`` (``include_sys``: keep the
    broker's own ``$SYS/...`` topics in "Top topics")."""
    topic = results(output, "topic_rate")
    top = results(output, "top_topics")
    if not include_sys and not top.empty:
        top = top[~top["topic"].astype(str).str.startswith("$SYS/")]
    churn = results(output, "churn")
    fan = results(output, "fanout")
    active = results(output, "active_filters")
    lat = results(output, "latency")
    sel = selectivity(output)
    nodes = results(output, "node_rate")
    per_node = (
        nodes[nodes["node"] != ""].groupby("node", as_index=False)[["deliveries", "bytes"]].sum()
        if not nodes.empty and "node" in nodes
        else pd.DataFrame()
    )
    deliveries = int(topic["deliveries"].sum()) if not topic.empty else 0
    messages = int(top["messages"].sum()) if not top.empty else 0
    changes = int(churn["changes"].sum()) if not churn.empty else 0
    composite = composite_view(output)
    per_subscriber = results(output, "subscriber_rate")
    subscribers = int(per_subscriber["subscriber_id"].nunique()) if not per_subscriber.empty else 0
    cards = "".join(
        f'<div class="card"><b id="{key}">{value}</b>{label}</div>'
        for key, value, label in (
            ("total-deliveries", deliveries, "deliveries"),
            ("total-messages", messages, "messages"),
            ("total-subscribers", subscribers, "subscribers"),
            ("total-changes", changes, "subscription changes"),
            *(
                (("composite-events", composite["overall"]["events"], "composite events"),)
                if composite["subscriptions"]
                else ()
            ),
        )
    )
    ranked = (
        top.sort_values(["messages", "topic"], ascending=[False, True]).head(10) if not top.empty else top
    )
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>siftmq analytics</title>",
        f"<style>{_CSS}</style></head><body><h1>siftmq analytics</h1>",
        f"<p>Results from <code>{html.escape(str(output))}</code>, rendered "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}.</p>",
        f'<div class="cards">{cards}</div>',
        _figure("Message rate per topic", _rate, topic),
        _figure("Fan-out", _fanout, fan),
        _figure("Subscription churn", _churn, churn),
        _figure("Active subscriptions per filter", _active, active),
        _figure("Broker latency", _latency, lat),
        _table("Top topics", ranked, ["topic", "messages", "deliveries", "bytes"]) if not top.empty else "",
        _table("Deliveries per cluster node", per_node, ["node", "deliveries", "bytes"])
        if not per_node.empty
        else "",
        _table(
            "Content-filter selectivity",
            sel,
            [
                "subscriber_id",
                "subscription_filter",
                "content_filter",
                "deliveries",
                "candidates",
                "selectivity",
            ],
        )
        if not sel.empty
        else "",
        _composite_section(composite),
        "</body></html>",
    ]
    return "\n".join(parts)


def write_report(output: str | Path, html_path: str | Path, include_sys: bool = False) -> Path:
    """Render the report and write it atomically to ``html_path``; returns the path."""
    path = Path(html_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(render_report(output, include_sys), encoding="utf-8")
    tmp.replace(path)
    return path
