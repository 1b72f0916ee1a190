"""Prometheus metrics of a running broker (issue 19, item 1; docs/broker.md, "Metrics").

``siftmq serve --metrics-listen HOST:PORT`` (``BrokerConfig.metrics_listen``) serves the
Prometheus text format at ``/metrics`` from ``prometheus-client``'s HTTP server on its own
thread. Nothing is counted on the hot path for it: a collector reads the core's counters
(:class:`~broker.core._session.Stats`, the same numbers as ``$SYS``) when Prometheus scrapes.
Every field of ``Stats`` is exported, so a counter added to the core appears without a change
here: ``siftmq_<field>_total`` for counters, ``siftmq_<field>`` for the gauges in
:data:`GAUGES`; plus a few gauges read from the core's state, and the labelled counters of the
packages above the core (``Core.metric_sources``: ``siftmq_<name>_total{reason="..."}``, e.g.
the cluster's refused datagrams and link tokens). Reads from the scrape thread
are of ints and ``len()`` of containers, which the GIL keeps consistent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from broker.net import HttpServer, HttpStats, parse_listen

if TYPE_CHECKING:
    from broker.core import Core

__all__ = ["GAUGES", "CoreCollector", "HttpCollector", "parse_listen", "registry_for"]

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
        yield from _labelled(core.metric_sources)
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
            yield CounterMetricFamily(
                "siftmq_store_inserts", "QoS 1/2 deliveries to persisted sessions written", store.inserts
            )
            yield CounterMetricFamily(
                "siftmq_store_inserts_cancelled",
                "QoS 1/2 deliveries to persisted sessions acknowledged or dropped before they were written",
                store.cancelled,
            )
            yield GaugeMetricFamily(
                "siftmq_store_failed",
                "1 while the store's commits fail (retried until one succeeds)",
                float(store.failed),
            )
            yield CounterMetricFamily(
                "siftmq_store_failures", "times the store's commits began to fail", store.failures
            )
            yield CounterMetricFamily(
                "siftmq_store_failed_commits",
                "store commits that failed, retries included",
                store.failed_commits,
            )
            yield CounterMetricFamily(
                "siftmq_store_recoveries", "times the store recovered from failing commits", store.recoveries
            )


def _labelled(sources: Iterable[Callable[[], dict[str, dict[str, int]]]]) -> Iterator[Metric]:
    """The counters of ``Core.metric_sources``, one family per name: two sources that name the
    same counter (HTTP authentication and authorization both count ``auth_bad_answers``) add
    their reasons to one family (a counter of one reason in both: their sum), never two
    families of one name, which a Prometheus scrape rejects.  O(counters)."""
    merged: dict[str, dict[str, int]] = {}
    for source in sources:
        for name, by_reason in source().items():
            into = merged.setdefault(name, {})
            for reason, count in by_reason.items():
                into[reason] = into.get(reason, 0) + count
    for name, by_reason in merged.items():
        family = CounterMetricFamily(f"siftmq_{name}", f"{name} by reason", labels=["reason"])
        for reason, count in sorted(by_reason.items()):
            family.add_metric([reason], float(count))
        yield family


class HttpCollector(Collector):
    """The HTTP listener's own counters (``broker.net._http``): ``siftmq_http_<field>_total``
    for each field of :class:`~broker.net._http.HttpStats` (refused, evicted, timed-out
    connections, bad requests) and gauges of its pools. O(number of counters)."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        srv = self.server
        for f in dataclasses.fields(HttpStats):
            doc = f"HTTP listener: {f.name.replace('_', ' ')}"
            yield CounterMetricFamily(f"siftmq_http_{f.name}", doc, float(getattr(srv.stats, f.name)))
        yield GaugeMetricFamily("siftmq_http_connections", "HTTP listener: open connections", len(srv.slots))
        yield GaugeMetricFamily(
            "siftmq_http_unauthenticated_connections",
            "HTTP listener: connections without valid credentials yet",
            len(srv.unauthenticated),
        )
        yield GaugeMetricFamily("siftmq_http_streams", "HTTP listener: open event streams", srv.streams)


def registry_for(core: Core, http: HttpServer | None = None) -> CollectorRegistry:
    """A registry holding only this broker's collectors (no process-global metrics): the
    core's, and the HTTP listener's when given."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CoreCollector(core))
    if http is not None:
        registry.register(HttpCollector(http))
    return registry
