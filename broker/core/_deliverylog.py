"""A columnar, bounded log of publications and deliveries, filled on the event loop.

Recorders such as the Spark bridge used to receive one ``Hooks.on_deliveries`` call per routed
publication and keep a tuple per call and per delivery.  Profiled under publisher-paced QoS 1
(issue 19 item 5, docs/performance-bridge.md), that cost more than the recording itself: the
interpreted call, and CPython's cyclic GC, which counts every kept tuple as a new container and
ran collections on the event loop to find out they held only scalars.  This log is the cheaper
contract: a hook returns one from ``Hooks.delivery_log()`` and the compiled core appends each
field to a list of its own (*columns*: floats, ints, strings, None, bools -- objects the cyclic
GC does not track).  The reader converts whole columns with one C call each (``pyarrow.array``
on a list of floats), with no per-row Python work.

No lock (issue 27 item 7: two lock method calls per publication were a third of ``record``'s
cost).  The reader swaps the columns object for an empty one (one attribute store, atomic under
the GIL) and then waits while ``record`` is *busy*: ``record`` sets the flag before it reads the
columns object and clears it after its last append, so a ``record`` that started on the old
object finishes before the reader uses it, and one that starts after the swap appends to the new
one.  Compiled, ``record`` never lets the GIL go (no call into Python code, no allocation the
cyclic GC tracks), so the reader never finds it busy; interpreted (``SIFTMQ_PURE=1``) it may,
and then yields until it is done.

Rows.  A ``record`` call adds one *call row* (the message's fields, the routes count and how
many delivery rows follow) and one *delivery row* per entry.  ``routes >= 0`` marks a routed
publication; ``-1`` a delivery written after its publication (a queued message, a retained
message on SUBSCRIBE, a resumed session), whose call row only carries the message's fields.

Bound.  ``pending`` = rows accepted (deliveries plus publications) minus rows the reader has
``release``-d (committed); at ``max_rows`` new records are dropped and counted per kind, so a
reader that falls behind never makes the broker block or grow without bound.  When ``pending``
crosses ``wake_rows`` the ``wake`` callback runs once (the reader's event).

Costs: ``record`` O(1 + entries) list appends; ``take`` O(1).
The module is compiled with the rest of the hot path (``broker._build.HOT_MODULES``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from broker.core._message import Message

__all__ = ["DeliveryLog", "LogColumns"]

# = broker.hooks.DeliveryEntry: (subscriber id, topic filter, selector, QoS, retained)
Entry = tuple[str, str, str | None, int, bool]


class LogColumns:
    """The columns of a batch of ``record`` calls (call rows first, then delivery rows).

    Call rows: ``time`` (wall clock of the call), ``message_id``, ``publisher_id``, ``topic``,
    ``payload_size``, ``qos``, ``retain``, ``received`` (wall clock at receipt), ``routes``
    (-1: not a publication), ``count`` (its delivery rows, which follow in order).
    Delivery rows: ``subscriber``, ``topic_filter``, ``selector``, ``d_qos``, ``d_retained``.
    """

    def __init__(self) -> None:
        self.time: list[float] = []
        self.message_id: list[int] = []
        self.publisher_id: list[str | None] = []
        self.topic: list[str] = []
        self.payload_size: list[int] = []
        self.qos: list[int] = []
        self.retain: list[bool] = []
        self.received: list[float] = []
        self.routes: list[int] = []
        self.count: list[int] = []
        self.subscriber: list[str] = []
        self.topic_filter: list[str] = []
        self.selector: list[str | None] = []
        self.d_qos: list[int] = []
        self.d_retained: list[bool] = []

    def calls(self) -> int:
        return len(self.time)

    def deliveries(self) -> int:
        return len(self.subscriber)

    def publications(self) -> int:
        return sum(1 for r in self.routes if r >= 0)

    def _check(self) -> None:
        n = len(self.time)
        for col in (
            self.message_id,
            self.publisher_id,
            self.topic,
            self.payload_size,
            self.qos,
            self.retain,
            self.received,
            self.routes,
            self.count,
        ):
            assert len(col) == n
        m = len(self.subscriber)
        for dcol in (self.topic_filter, self.selector, self.d_qos, self.d_retained):
            assert len(dcol) == m
        assert sum(self.count) == m


class DeliveryLog:
    """Bounded columnar log of ``(time, message, entries, routes)`` records (module docstring).

    Written by the event loop (:meth:`record`), read by one other thread (:meth:`take`, then
    :meth:`release` once the rows are safe).  ``dropped_deliveries``/``dropped_publications``
    count what the bound refused."""

    def __init__(self, max_rows: int, wake_rows: int, wake: Callable[[], None] | None = None) -> None:
        if max_rows < 1 or wake_rows < 1:
            raise ValueError("max_rows and wake_rows must be positive")
        self.max_rows: Final = max_rows
        self.wake_rows: Final = wake_rows
        self._wake = wake
        self._cols = LogColumns()
        self._busy = False  # record() is appending (see the module docstring)
        # rows accepted (event loop only) and released (reader only): pending = in - out
        self.rows_in = 0
        self.rows_out = 0
        self.dropped_deliveries = 0
        self.dropped_publications = 0

    @property
    def pending(self) -> int:
        """Rows accepted and not yet released (buffered here or held by the reader)."""
        return self.rows_in - self.rows_out

    def record(self, t: float, msg: Message, entries: list[Entry], routes: int) -> None:
        """Append one call row and a delivery row per entry (or drop and count at the bound)."""
        n = self.rows_in - self.rows_out
        k = len(entries)
        if n >= self.max_rows:
            self.dropped_deliveries += k
            if routes >= 0:
                self.dropped_publications += 1
            return
        self._busy = True
        try:
            c = self._cols
            c.time.append(t)
            c.message_id.append(msg.message_id)
            c.publisher_id.append(msg.publisher_id)
            c.topic.append(msg.topic)
            c.payload_size.append(len(msg.payload))
            c.qos.append(msg.qos)
            c.retain.append(msg.retain)
            c.received.append(msg.received)
            c.routes.append(routes)
            c.count.append(k)
            for e in entries:
                c.subscriber.append(e[0])
                c.topic_filter.append(e[1])
                c.selector.append(e[2])
                c.d_qos.append(e[3])
                c.d_retained.append(e[4])
        finally:
            self._busy = False
        if routes >= 0:
            k += 1
        self.rows_in += k
        if n < self.wake_rows <= n + k and self._wake is not None:
            self._wake()

    def take(self) -> LogColumns:
        """Everything recorded so far (the log continues with empty columns).  O(1)."""
        cols = self._cols
        self._cols = LogColumns()
        while self._busy:  # a record() on ``cols`` let the GIL go (interpreted only): let it finish
            time.sleep(0)
        return cols

    def release(self, rows: int) -> None:
        """The reader has made ``rows`` of what it took safe (they no longer count as pending)."""
        self.rows_out += rows

    def peek_counts(self) -> tuple[int, int]:
        """(deliveries, publications) buffered in the log now (not yet taken)."""
        while self._busy:  # as in take(): never with the compiled module
            time.sleep(0)
        c = self._cols
        return c.deliveries(), c.publications()
