"""The Grafana dashboard and the Prometheus alert rules in packaging/ query only metrics that a
running broker serves at /metrics (docs/operations.md, "Monitoring"): a renamed or removed
metric fails here instead of leaving an empty panel or an alert that can never fire."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path

from broker import Broker

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "packaging" / "grafana" / "siftmq.json"
ALERTS = ROOT / "packaging" / "prometheus-alerts.yml"
#: series Prometheus makes itself for every scrape target
SYNTHETIC = {"up"}


async def _served_metrics() -> set[str]:
    """The metric names of /metrics of a broker with a store (its gauges appear only then)."""
    async with Broker(
        host="127.0.0.1", port=0, sys_interval=0, store_path=":memory:", metrics_listen="127.0.0.1:0"
    ) as b:
        url = f"http://127.0.0.1:{b.metrics_port}/metrics"

        def get() -> str:
            with urllib.request.urlopen(url, timeout=10) as r:
                return str(r.read().decode())

        text = await asyncio.to_thread(get)
    names = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and line[0] != "#"}
    assert "siftmq_messages_received_total" in names, text[:500]
    return names


def _names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (ours are siftmq_*, plus Prometheus' own)."""
    return set(re.findall(r"\bsiftmq_[a-z0-9_]+\b", expr)) | (
        SYNTHETIC & set(re.findall(r"\b\w+(?=\{)", expr))
    )


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = []
    ids = []
    for panel in dash["panels"]:
        ids.append(panel["id"])
        assert panel["title"] and panel["targets"], panel
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        exprs += [t["expr"] for t in panel["targets"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for var in dash["templating"]["list"]:
        if "query" in var and var["type"] == "query":
            exprs.append(var["query"])
    return exprs


def _alert_rules() -> list[dict[str, str]]:
    """The rules of the YAML file, read line by line (its shape is fixed: one key a line)."""
    rules: list[dict[str, str]] = []
    for line in ALERTS.read_text().splitlines():
        found = re.match(r"\s*(?:- )?(alert|expr|for|severity|summary):\s*(.+)", line)
        if not found:
            continue
        key, value = found.groups()
        if key == "alert":
            rules.append({})
        rules[-1][key] = value.strip()
    return rules


async def test_every_metric_the_dashboard_and_the_alerts_query_is_served() -> None:
    served = await _served_metrics() | SYNTHETIC
    exprs = _dashboard_exprs()
    rules = _alert_rules()
    assert len(exprs) >= 20 and len(rules) >= 8
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "severity", "summary"}, rule
        assert rule["severity"] in {"critical", "warning", "info"}
        exprs.append(rule["expr"])
    for expr in exprs:
        names = _names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= served, f"{expr!r} queries {sorted(names - served)}, not served at /metrics"
        for counter in (n for n in names if n.endswith("_total")):
            assert re.search(rf"(rate|increase)\({counter}\b", expr), f"{expr!r}: a counter needs rate()"
