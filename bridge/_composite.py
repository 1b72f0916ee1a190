"""The composite view of the analytics (issue 16 item 5): Spark jobs over the composite record
kinds, and the view the CLI, the console summary and the HTML report show.

Sources (``bridge/_schema.py``): ``composite_events`` (one row per composite event the engine
produced, with its completion time ``end - begin`` and the subscription's buffer occupancy after
it), ``composite_losses`` (components counted as expired or dropped, per subscription and atom;
the sum over rows is exact) and ``composite_changes`` (subscribe, unsubscribe, session_end,
expired per client and name).  A *composite subscription* is (canonical expression, window,
max_buffer), as in the engine (docs/composite.md): subscribers of the same triple share it.

Jobs (streaming aggregations in update mode, like ``top_topics``; keys in :data:`COMPOSITE_KEYS`):

=======================  ==========================================================  ================
result                   computation                                                 key
=======================  ==========================================================  ================
composite_subscriptions  events, components, completion p50/p99 (percentile_approx),  expression, window,
                         mean and max, buffered max and mean after the events         max_buffer
composite_overall        the same over every composite event                         scope (= "all")
composite_losses         expired and dropped components (sums)                       + element
composite_churn          composite subscription changes per action                   expression, window,
                                                                                     max_buffer, action
=======================  ==========================================================  ================

``buffered`` is sampled after each event (what the subscription still holds then), so its mean
is a mean over events, not over time.  Percentiles are Spark's ``percentile_approx`` with
accuracy 10,000 (exact for up to 10,000 events per key; a value of the data otherwise within
1/10,000 of the rank).

:func:`composite_view` joins the latest results into plain data (JSON-able): one entry per
composite subscription (events, completion, occupancy, expiries, drops, changes) and the
totals.  Landing zones and outputs from before these kinds give an empty view.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bridge._results import COMPOSITE_KEYS, results
from bridge._schema import Kind

__all__ = ["COMPOSITE_KEYS", "build_composite", "composite_summary", "composite_view"]

_SUB = ("expression", "window", "max_buffer")

#: the integer columns of the event statistics (the others are floats)
_INTS: dict[str, type[int]] = {"events": int, "components": int, "buffered_max": int}

#: change actions in the order the view lists them
ACTIONS = ("subscribe", "unsubscribe", "session_end", "expired")


def build_composite(streams: dict[Kind, Any]) -> dict[str, Any]:
    """The composite jobs' DataFrames over the landing streams."""
    from pyspark.sql import functions as F

    ev = streams[Kind.COMPOSITE_EVENTS]

    def stats(grouped: Any) -> Any:
        return (
            grouped.agg(
                F.count("*").alias("events"),
                F.sum("components").alias("components"),
                F.percentile_approx("completion", [0.5, 0.99], 10000).alias("q"),
                F.avg("completion").alias("completion_mean"),
                F.max("completion").alias("completion_max"),
                F.max("buffered").alias("buffered_max"),
                F.avg("buffered").alias("buffered_mean"),
            )
            .withColumn("completion_p50", F.col("q")[0])
            .withColumn("completion_p99", F.col("q")[1])
            .drop("q")
        )

    return {
        "composite_subscriptions": stats(ev.groupBy(*_SUB)),
        "composite_overall": stats(ev.withColumn("scope", F.lit("all")).groupBy("scope")),
        "composite_losses": streams[Kind.COMPOSITE_LOSSES]
        .groupBy(*_SUB, "element")
        .agg(F.sum("expired").alias("expired"), F.sum("dropped").alias("dropped")),
        "composite_churn": streams[Kind.COMPOSITE_CHANGES]
        .groupBy(*_SUB, "action")
        .agg(F.count("*").alias("changes")),
    }


def _num(value: Any, kind: type[int] | type[float] = float) -> float | int | None:
    """A JSON-able number of type ``kind`` (None for null / NaN)."""
    if value is None:
        return None
    x = float(value)
    if math.isnan(x):
        return None
    return int(x) if kind is int else x


def _key(row: Any) -> tuple[str, float | None, int | None]:
    w = _num(row["window"])
    c = _num(row["max_buffer"], int)
    return str(row["expression"]), None if w is None else float(w), None if c is None else int(c)


def composite_view(output: str | Path) -> dict[str, Any]:
    """The composite view of the latest results: ``{"subscriptions": [...], "overall": {...}}``
    (plain data, JSON-able).  Each subscription: expression, window, max_buffer, events,
    components, completion_p50/p99/mean/max (seconds), buffered_max/mean, expired, dropped,
    changes per action.  ``overall``: the same over all (percentiles over every event), and
    ``subscriptions`` (how many).  Empty (no subscriptions, zero totals) without composite data."""
    subs = results(output, "composite_subscriptions")
    overall = results(output, "composite_overall")
    losses = results(output, "composite_losses")
    churn = results(output, "composite_churn")
    rows: dict[tuple[str, float | None, int | None], dict[str, Any]] = {}

    def entry(key: tuple[str, float | None, int | None]) -> dict[str, Any]:
        if key not in rows:
            rows[key] = {
                "expression": key[0],
                "window": key[1],
                "max_buffer": key[2],
                "events": 0,
                "components": 0,
                "completion_p50": None,
                "completion_p99": None,
                "completion_mean": None,
                "completion_max": None,
                "buffered_max": None,
                "buffered_mean": None,
                "expired": 0,
                "dropped": 0,
                "changes": dict.fromkeys(ACTIONS, 0),
            }
        return rows[key]

    stat_cols = (
        "events",
        "components",
        "completion_p50",
        "completion_p99",
        "completion_mean",
        "completion_max",
        "buffered_max",
        "buffered_mean",
    )
    for _, r in subs.iterrows():
        e = entry(_key(r))
        e.update({c: _num(r[c], _INTS.get(c, float)) for c in stat_cols})
    for _, r in losses.iterrows():
        e = entry(_key(r))
        e["expired"] += int(r["expired"])
        e["dropped"] += int(r["dropped"])
    for _, r in churn.iterrows():
        e = entry(_key(r))
        action = str(r["action"])
        e["changes"][action] = e["changes"].get(action, 0) + int(r["changes"])
    ordered = sorted(rows.values(), key=lambda e: (-e["events"], e["expression"], str(e["window"])))
    total: dict[str, Any] = {c: None for c in stat_cols} | {"events": 0, "components": 0}
    if not overall.empty:
        total.update({c: _num(overall.iloc[0][c], _INTS.get(c, float)) for c in stat_cols})
    changes = dict.fromkeys(ACTIONS, 0)
    for e in ordered:
        for action, n in e["changes"].items():
            changes[action] = changes.get(action, 0) + n
    total.update(
        subscriptions=len(ordered),
        expired=sum(e["expired"] for e in ordered),
        dropped=sum(e["dropped"] for e in ordered),
        changes=changes,
    )
    return {"subscriptions": ordered, "overall": total}


def _seconds(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def composite_summary(view: dict[str, Any], top_n: int = 5) -> list[str]:
    """Console lines of a :func:`composite_view`."""
    o = view["overall"]
    if not view["subscriptions"]:
        return ["composite: no composite data"]
    lines = [
        f"composite: {o['events']} events over {o['subscriptions']} composite subscriptions, "
        f"completion p50 {_seconds(o['completion_p50'])} p99 {_seconds(o['completion_p99'])}, "
        f"expired {o['expired']}, dropped {o['dropped']}"
    ]
    lines.extend(
        f"  {e['expression']}: {e['events']} events, p50 {_seconds(e['completion_p50'])}, "
        f"p99 {_seconds(e['completion_p99'])}, "
        f"buffered max {'n/a' if e['buffered_max'] is None else e['buffered_max']}, "
        f"expired {e['expired']}, dropped {e['dropped']}"
        for e in view["subscriptions"][:top_n]
    )
    return lines
