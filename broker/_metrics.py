"""Prometheus metrics of a running broker (issue 19, item 1; docs/broker.md, "Metrics").

``siftmq serve --metrics-listen HOST:PORT`` (``BrokerConfig.metrics_listen``) serves the
Prometheus text format at ``/metrics`` from ``prometheus-client``'s HTTP server on its own
thread. Nothing is counted on the hot path for it: a collector reads the core's counters
(:class:`~broker.core._session.Stats`, the same numbers as ``$SYS``) when Prometheus scrapes.
Every field of ``Stats`` is exported, so a counter added to the core appears without a change
here: ``siftmq_<field>_total`` for counters, ``siftmq_<field>`` for the gauges in
:data:`GAUGES`; plus a few gauges read from the core's state. Reads from the scrape thread
are of ints and ``len()`` of containers, which the GIL keeps consistent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from broker.net._http import parse_listen

if TYPE_CHECKING:
    from broker.core._core import Core

__all__ = ["GAUGES", "CoreCollector", "parse_listen", "registry_for"]

#: fields of ``Stats`` that go up and down (the others only grow)
GAUGES = frozenset({"auth_pending", "publishers_paused", "slow_consumers"})


class CoreCollector(Collector):
    """Reads a :class:`~broker.core._core.Core` at scrape time (O(number of counters))."""

    def __init__(self, core: Core) -> None:
        self.core = core

    def collect(self) -> Iterator[Metric]:
        core = self.core
        stats = core.stats
        for f in dataclasses.fields(stats):
            value = float(getattr(stats, f.name))
            if f.name in GAUGES:
                yield GaugeMetricFamily(f"siftmq_{f.name}", f"$SYS counter {f.name} (now)", value)
            else:
                yield CounterMetricFamily(f"siftmq_{f.name}", f"$SYS counter {f.name}", value)
        yield GaugeMetricFamily("siftmq_connections", "open network connections", len(core.connections))
        yield GaugeMetricFamily("siftmq_sessions", "sessions (connected and kept)", len(core.sessions))
        yield GaugeMetricFamily("siftmq_retained_messages", "retained messages", len(core.router.retained))
        yield GaugeMetricFamily(
            "siftmq_uptime_seconds", "seconds since the broker started", core.clock.monotonic() - core.started
        )
        store = core.journal.store
        if store is not None:
            yield GaugeMetricFamily(
                "siftmq_store_backlog", "store operations waiting for the writer thread", store.backlog
            )
            yield CounterMetricFamily("siftmq_store_commits", "store transactions committed", store.commits)


def registry_for(core: Core) -> CollectorRegistry:
    """A registry holding only this broker's collector (no process-global metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CoreCollector(core))
    return registry
