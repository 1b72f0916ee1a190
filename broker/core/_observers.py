"""The registered hooks, split by the methods they override (unused ones cost nothing).

``broker.hooks.Hooks`` subclasses observe the broker (connections, subscription changes,
publications, deliveries, composite subscriptions, events and losses) and give opinions
(authenticate, authorize).  The core asks this object which hooks override what, so a broker
without hooks pays one boolean test per event.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from broker.core._deliverylog import DeliveryLog
from broker.core._message import Message
from broker.core._session import Stats
from broker.hooks import DeliveryEntry, Hooks

__all__ = ["Observers"]

log = logging.getLogger("broker")


class Observers:
    """The registered hooks, split by the methods they override (unused ones cost nothing)."""

    def __init__(self, hooks: Iterable[Hooks]) -> None:
        self.all = list(hooks)

        def over(name: str) -> list[Hooks]:
            base = getattr(Hooks, name)
            return [h for h in self.all if getattr(type(h), name) is not base]

        self.connect = over("on_connect")
        self.hold_connack = over("hold_connack")
        self.disconnect = over("on_disconnect")
        self.subscription = over("on_subscription_change")
        self.publication = over("on_publication")
        self.delivery = over("on_delivery")
        self.composite_change = over("on_composite_change")
        self.composite_event = over("on_composite_event")
        self.composite_loss = over("on_composite_loss")
        # Recorders with a columnar log get their records appended by the core (compiled, no
        # call into the hook); they are not called through on_deliveries as well.
        logs = {id(h): h.delivery_log() for h in self.all}
        self.logs: list[DeliveryLog] = [dlog for dlog in logs.values() if dlog is not None]
        self.deliveries = [h for h in over("on_deliveries") if logs[id(h)] is None]
        # whether the core records each fan-out's writes (for on_deliveries hooks or logs)
        self.recording = bool(self.deliveries or self.logs)
        self.authenticate = over("authenticate")
        self.authorize = over("authorize")
        self.writes = bool(self.delivery or self.recording)  # write_publish reports deliveries
        # The publication whose fan-out is being recorded for on_deliveries, and its entries.
        self.fan_msg: Message | None = None
        self.fan: list[DeliveryEntry] = []

    def deliveries_written(
        self, t: float, msg: Message, entries: list[DeliveryEntry], routes: int, stats: Stats
    ) -> None:
        """One record per log and one ``on_deliveries`` call per hook at wall time ``t`` (read
        once for all ``entries``)."""
        for dlog in self.logs:
            dlog.record(t, msg, entries, routes)
        for h in self.deliveries:
            try:
                h.on_deliveries(t, msg, entries, routes)
            except Exception:
                stats.hook_errors += 1
                log.exception("hook %s.on_deliveries failed", type(h).__name__)
