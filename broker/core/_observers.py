"""The registered hooks, split by the methods they override (unused ones cost nothing).

``broker.hooks.Hooks`` subclasses observe the broker (connections, subscription changes,
publications, deliveries, composite subscriptions, events and losses) and give opinions
(authenticate, authorize).  The core asks this object which hooks override what, so a broker
without hooks pays one boolean test per event.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from mypy_extensions import i32

from broker.core._clock import Clock
from broker.core._deliverylog import DeliveryLog
from broker.core._hooks import CoreHooks, DeliveryEntry
from broker.core._session import Stats
from broker.values import Message

__all__ = ["Observers"]

log = logging.getLogger("broker")


class Observers:
    """The registered hooks, split by the methods they override (unused ones cost nothing)."""

    def __init__(self, hooks: Iterable[CoreHooks]) -> None:
        self.all = list(hooks)

        def over(name: str) -> list[CoreHooks]:
            base = getattr(CoreHooks, name)
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
        # The one log, with no on_deliveries hook beside it (a broker with the bridge): each
        # write goes straight into it (DeliveryLog.begin/delivered/end), with no entry tuple or
        # list per fan-out.  Otherwise the entries are collected in ``fan`` and recorded at the
        # fan-out's end (``deliveries_written``).
        self.direct: DeliveryLog | None = (
            self.logs[0] if len(self.logs) == 1 and not self.deliveries else None
        )
        # a hook overriding either form (the default authenticate_request calls authenticate)
        either = {id(h) for name in ("authenticate", "authenticate_request") for h in over(name)}
        self.authenticate = [h for h in self.all if id(h) in either]
        self.authorize = over("authorize")
        # decisions fetched before a PUBLISH/SUBSCRIBE is processed (core/_ahead.py): empty,
        # the read loop tests this one list
        self.ahead = over("authorize_ahead")
        # message hooks (issue 39): a client's PUBLISH passes them before routing
        # (broker.core._msghooks); empty: the PUBLISH path tests this one list
        self.message = over("on_publish")
        self.writes = bool(self.delivery or self.recording)  # write_publish reports deliveries
        # The publication whose fan-out is being recorded for on_deliveries, and its entries.
        self.fan_msg: Message | None = None
        self.fan: list[DeliveryEntry] = []

    def begin(self, msg: Message) -> i32:
        """Open the fan-out of ``msg`` (the caller has kept ``fan_msg`` and ``fan`` to give
        back to :meth:`end`); returns the direct log's outer call row (-1 without one)."""
        self.fan_msg = msg
        direct = self.direct
        if direct is not None:
            return direct.begin(msg)
        self.fan = []
        return -1

    def end(  # noqa: PLR0917 (hot path: positional arguments)
        self,
        t: float,
        msg: Message,
        routes: int,
        outer_msg: Message | None,
        outer_fan: list[DeliveryEntry],
        outer_call: i32,
        stats: Stats,
    ) -> None:
        """Close the fan-out of ``msg`` at wall time ``t`` and restore the outer one."""
        self.fan_msg = outer_msg
        direct = self.direct
        if direct is not None:
            direct.end(outer_call, t, routes)
            return
        fan = self.fan
        self.fan = outer_fan
        self.deliveries_written(t, msg, fan, routes, stats)

    def written(  # noqa: PLR0917 (hot path: positional arguments)
        self,
        msg: Message,
        subscriber: str,
        topic_filter: str,
        selector: str | None,
        qos: int,
        retain: bool,
        clock: Clock,
        stats: Stats,
    ) -> None:
        """``msg`` was written to ``subscriber``: a delivery of the open fan-out, or one written
        after its publication (queued, retained, resumed session)."""
        direct = self.direct
        if direct is not None:
            if self.fan_msg is msg:
                direct.delivered(subscriber, topic_filter, selector, qos, retain)
            else:
                direct.delivered_later(clock.wall(), msg, subscriber, topic_filter, selector, qos, retain)
            return
        entry = (subscriber, topic_filter, selector, qos, retain)
        if self.fan_msg is msg:
            self.fan.append(entry)
        else:
            self.deliveries_written(clock.wall(), msg, [entry], -1, stats)

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
