"""A columnar, bounded log of publications and deliveries, filled on the event loop.

Recorders such as the Spark bridge used to receive one ``Hooks.on_deliveries`` call per routed
publication and keep a tuple per call and per delivery.  Profiled under publisher-paced QoS 1
(issue 19 item 5, docs/performance-bridge.md), that cost more than the recording itself: the
interpreted call, and CPython's cyclic GC, which counts every kept tuple as a new container and
ran collections on the event loop to find out they held only scalars.  This log is the cheaper
contract: a hook returns one from ``Hooks.delivery_log()`` and the compiled core appends each
field to a column of its own.

Typed columns (issue 27 item 7).  The columns are ``librt.vecs.vec`` arrays of native values
(``float``, ``i64``, ``i32``, ``u8``: mypyc's packed vectors, appended to without boxing, one
machine word per value), not lists of Python objects: the event loop allocates no float or int
per row, and the reader turns each column into a NumPy/Arrow array with no copy and no work per
row (``numpy.frombuffer`` on the vector's buffer).  Strings (client ids, topics, topic filters,
content filters) are stored as an ``i32`` index into a table of the distinct values of the batch
(:class:`Strings`: one dict lookup per value, hash cached in the ``str``), since a fleet has few
distinct ids and topics per batch; -1 stands for None.  Small fields share one ``u8``:
``flags`` = QoS | retain << 2.

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

Costs: ``record`` O(1 + entries) vector appends and dict lookups; ``take`` O(1).
The module is compiled with the rest of the hot path (``broker._build.HOT_MODULES``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i32, i64, u8

from broker.core._message import Message

__all__ = ["DeliveryLog", "LogColumns", "Strings"]

# = broker.hooks.DeliveryEntry: (subscriber id, topic filter, selector, QoS, retained)
Entry = tuple[str, str, str | None, int, bool]

#: initial capacity of a batch's columns (they grow by doubling; the next batch starts with the
#: size the previous one reached)
_MIN_CAPACITY: Final = 1024


class Strings:
    """The distinct strings of a batch: ``values[i]`` for index ``i`` (first seen, first)."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.values: list[str] = []

    def id(self, s: str) -> i32:
        """The index of ``s`` (added on first sight).  O(1): one dict lookup."""
        i = self.index.get(s, -1)
        if i < 0:
            i = len(self.values)
            self.index[s] = i
            self.values.append(s)
        return i32(i)

    def opt(self, s: str | None) -> i32:
        """:meth:`id`, or -1 for None."""
        return i32(-1) if s is None else self.id(s)


class LogColumns:
    """The columns of a batch of ``record`` calls (call rows first, then delivery rows).

    Call rows: ``time`` (wall clock of the call), ``message_id``, ``publisher_id`` (index into
    ``clients``, -1: None), ``topic`` (index into ``topics``), ``payload_size``, ``flags`` (QoS
    | retain << 2), ``received`` (wall clock at receipt), ``routes`` (-1: not a publication),
    ``count`` (its delivery rows, which follow in order).
    Delivery rows: ``subscriber`` (index into ``clients``), ``topic_filter`` and ``selector``
    (indices into ``filters``, -1: no selector), ``d_flags`` (QoS | retained << 2).
    Every column is a ``vec`` (buffer protocol: ``numpy.frombuffer(c.time, numpy.float64)``)."""

    def __init__(self, calls: i64 = _MIN_CAPACITY, deliveries: i64 = _MIN_CAPACITY) -> None:
        self.time = vec[float](capacity=calls)
        self.message_id = vec[i64](capacity=calls)
        self.publisher_id = vec[i32](capacity=calls)
        self.topic = vec[i32](capacity=calls)
        self.payload_size = vec[i64](capacity=calls)
        self.flags = vec[u8](capacity=calls)
        self.received = vec[float](capacity=calls)
        self.routes = vec[i64](capacity=calls)
        self.count = vec[i32](capacity=calls)
        self.subscriber = vec[i32](capacity=deliveries)
        self.topic_filter = vec[i32](capacity=deliveries)
        self.selector = vec[i32](capacity=deliveries)
        self.d_flags = vec[u8](capacity=deliveries)
        self.clients = Strings()
        self.topics = Strings()
        self.filters = Strings()
        self.n_publications = 0

    def calls(self) -> int:
        return len(self.time)

    def deliveries(self) -> int:
        return len(self.subscriber)

    def publications(self) -> int:
        return self.n_publications

    def _check(self) -> None:
        n = len(self.time)
        for col in (self.message_id, self.payload_size, self.routes):
            assert len(col) == n
        for icol in (self.publisher_id, self.topic):
            assert len(icol) == n
        assert len(self.flags) == len(self.received) == len(self.count) == n
        m = len(self.subscriber)
        assert len(self.topic_filter) == len(self.selector) == len(self.d_flags) == m
        assert sum(self.count) == m
        assert self.n_publications == sum(1 for r in self.routes if r >= 0)


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
            c.time = append(c.time, t)
            c.message_id = append(c.message_id, i64(msg.message_id))
            c.publisher_id = append(c.publisher_id, c.clients.opt(msg.publisher_id))
            c.topic = append(c.topic, c.topics.id(msg.topic))
            c.payload_size = append(c.payload_size, i64(len(msg.payload)))
            c.flags = append(c.flags, u8(msg.qos | (4 if msg.retain else 0)))
            c.received = append(c.received, msg.received)
            c.routes = append(c.routes, i64(routes))
            c.count = append(c.count, i32(k))
            if routes >= 0:
                c.n_publications += 1
            if k:
                clients = c.clients
                filters = c.filters
                for e in entries:
                    c.subscriber = append(c.subscriber, clients.id(e[0]))
                    c.topic_filter = append(c.topic_filter, filters.id(e[1]))
                    c.selector = append(c.selector, filters.opt(e[2]))
                    c.d_flags = append(c.d_flags, u8(e[3] | (4 if e[4] else 0)))
        finally:
            self._busy = False
        if routes >= 0:
            k += 1
        self.rows_in += k
        if n < self.wake_rows <= n + k and self._wake is not None:
            self._wake()

    def take(self) -> LogColumns:
        """Everything recorded so far (the log continues with empty columns, sized like these).
        O(1)."""
        cols = self._cols
        self._cols = LogColumns(
            max(_MIN_CAPACITY, i64(len(cols.time))), max(_MIN_CAPACITY, i64(len(cols.subscriber)))
        )
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
