"""A columnar, bounded log of publications and deliveries, filled on the event loop.

Recorders such as the Spark bridge used to receive one ``Hooks.on_deliveries`` call per routed
publication and keep a tuple per call and per delivery.  Profiled under publisher-paced QoS 1
(issue 19 item 5, docs/lab/performance-bridge.md), that cost more than the recording itself: the
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
(:class:`Strings`, one per column kind: publishers, subscribers, topics, filters; one dict
lookup per value, none when it is the table's previous value, which is common because the event
loop handles a connection's packets in a row), since a fleet has few distinct ids and topics
per batch; -1 stands for None.  Small fields share one ``u8``:
``flags`` = QoS | retain << 2.

No lock (issue 27 item 7: two lock method calls per publication were a third of ``record``'s
cost).  The reader swaps the columns object for an empty one (one attribute store, atomic under
the GIL) and then waits while ``record`` is *busy*: ``record`` sets the flag before it reads the
columns object and clears it after its last append, so a ``record`` that started on the old
object finishes before the reader uses it, and one that starts after the swap appends to the new
one.  Compiled, ``record`` never lets the GIL go (no call into Python code, no allocation the
cyclic GC tracks), so the reader never finds it busy; interpreted (``SIFTMQ_PURE=1``) it may,
and then yields until it is done.

Rows.  A *call row* carries a message's fields, the routes count and the time; a *delivery
row* the subscriber's and the index of its call row in the batch (``call``).  Two ways in:

* a fan-out (``Core.publish``, a composite event's delivery): :meth:`DeliveryLog.begin` appends
  the call row, each write of the fan-out appends its delivery row (:meth:`delivered`, straight
  from ``Connection.write_publish``: no tuple, no list per delivery), and :meth:`end` fills in
  the call row's time and routes.  Fan-outs nest (a sink may publish while it is called): each
  delivery row points at its own call row, and ``begin`` returns the outer fan-out's call, which
  ``end`` restores.  ``take`` waits until no fan-out is open, and a fan-out that began before a
  ``take`` keeps appending to the batch it began in (``_fan_cols``), so a fan-out's rows are
  never split between batches;
* :meth:`record` (a call row and its entries at once: ``on_deliveries`` outside a broker, and a
  delivery written after its publication).

``routes >= 0`` marks a routed publication; ``-1`` a delivery written after its publication (a
queued message, a retained message on SUBSCRIBE, a resumed session), whose call row only
carries the message's fields.

Bound.  ``pending`` = rows accepted (deliveries plus publications) minus rows the reader has
``release``-d (committed); at ``max_rows`` new records are dropped and counted per kind, so a
reader that falls behind never makes the broker block or grow without bound (a fan-out is
accepted or refused whole at its ``begin``, so one may overshoot the bound by its deliveries).
When ``pending`` reaches ``wake_rows`` the ``wake`` callback runs (once until the next ``take``).

Fewer lookups (issue 42 item 4b, session 18).  A broker's clients interleave (ten publishers'
packets in a row, each fanned out to its own subscriber), so the tables' "previous value" above
seldom matches: a publication and its delivery cost four or five dict lookups (publisher, topic,
subscriber, topic filter, selector).  Each batch also remembers, per publisher, the topic it
last published to, and per subscriber the topic filter and selector it was last delivered
through (:class:`_Recent`, one dict lookup by the client id, then a string comparison that is
an identity test for a subscription's filter strings): two lookups per publication with one
delivery instead of four or five.  The tables the reader sees are the same.

Costs: ``begin``/``end`` O(1), ``delivered`` O(1) (five vector appends, one dict lookup when
the subscriber's filter and selector are those of its previous delivery), ``record``
O(1 + entries); ``take`` O(1).
The module is compiled with the rest of the hot path (``broker._build.HOT_MODULES``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i32, i64, u8

from broker.values import Message

__all__ = ["DeliveryLog", "LogColumns", "Strings"]

# = broker.hooks.DeliveryEntry: (subscriber id, topic filter, selector, QoS, retained)
Entry = tuple[str, str, str | None, int, bool]

#: initial capacity of a batch's columns (they grow by doubling; the next batch starts with the
#: size the previous one reached)
_MIN_CAPACITY: Final = 1024


class Strings:
    """The distinct strings of a batch: ``values[i]`` for index ``i`` (first seen, first).

    The last string asked for is remembered: the event loop handles a connection's packets in
    a row, so consecutive records often carry the same publisher, topic, subscriber and filter
    (a string comparison instead of a dict lookup)."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.values: list[str] = []
        self.last = ""
        self.last_i: i32 = -1

    def id(self, s: str) -> i32:
        """The index of ``s`` (added on first sight).  O(1): one dict lookup at most."""
        if s == self.last and self.last_i >= 0:
            return self.last_i
        i = self.index.get(s, -1)
        if i < 0:
            i = len(self.values)
            self.index[s] = i
            self.values.append(s)
        self.last = s
        self.last_i = i32(i)
        return self.last_i

    def opt(self, s: str | None) -> i32:
        """:meth:`id`, or -1 for None."""
        return i32(-1) if s is None else self.id(s)


class _Recent:
    """A client's index in its table and the strings it came with last time (module docstring,
    "Fewer lookups"): a publisher's topic, or a subscriber's topic filter and selector, with
    their indices.  Mutable: updated in place when they change."""

    def __init__(self, i: i32, first: str, first_i: i32, second: str | None, second_i: i32) -> None:
        self.i = i
        self.first = first
        self.first_i = first_i
        self.second = second
        self.second_i = second_i


class LogColumns:
    """The columns of a batch (call rows and delivery rows, see the module docstring).

    Call rows: ``time`` (wall clock of the call), ``message_id``, ``publisher_id`` (index into
    ``publishers``, -1: None), ``topic`` (index into ``topics``), ``payload_size``, ``flags`` (QoS
    | retain << 2), ``received`` (wall clock at receipt), ``routes`` (-1: not a publication).
    Delivery rows: ``call`` (index of its call row), ``subscriber`` (index into ``subscribers``),
    ``topic_filter`` and ``selector`` (indices into ``filters``, -1: no selector), ``d_flags``
    (QoS | retained << 2).  Every column is a ``vec`` (buffer protocol:
    ``numpy.frombuffer(c.time, numpy.float64)``)."""

    def __init__(self, calls: i64 = _MIN_CAPACITY, deliveries: i64 = _MIN_CAPACITY) -> None:
        self.time = vec[float](capacity=calls)
        self.message_id = vec[i64](capacity=calls)
        self.publisher_id = vec[i32](capacity=calls)
        self.topic = vec[i32](capacity=calls)
        self.payload_size = vec[i64](capacity=calls)
        self.flags = vec[u8](capacity=calls)
        self.received = vec[float](capacity=calls)
        self.routes = vec[i64](capacity=calls)
        self.call = vec[i32](capacity=deliveries)
        self.subscriber = vec[i32](capacity=deliveries)
        self.topic_filter = vec[i32](capacity=deliveries)
        self.selector = vec[i32](capacity=deliveries)
        self.d_flags = vec[u8](capacity=deliveries)
        # one table per column: each remembers its own last value (module docstring)
        self.publishers = Strings()
        self.subscribers = Strings()
        self.topics = Strings()
        self.filters = Strings()
        # per client: the strings of its previous row (module docstring, "Fewer lookups")
        self._by_publisher: dict[str, _Recent] = {}
        self._by_subscriber: dict[str, _Recent] = {}
        # the previous row's client (an identity test: a session's id is one string object)
        self._last_pub: _Recent | None = None
        self._last_pub_id = ""
        self._last_sub: _Recent | None = None
        self._last_sub_id = ""
        self.n_publications = 0

    def calls(self) -> int:
        return len(self.time)

    def deliveries(self) -> int:
        return len(self.subscriber)

    def publications(self) -> int:
        return self.n_publications

    def add_call(self, t: float, msg: Message, routes: int) -> i32:
        """Append a call row; returns its index."""
        i = i32(len(self.time))
        topic = msg.topic
        pid = msg.publisher_id
        if pid is None:
            p_i = i32(-1)
            t_i = self.topics.id(topic)
        else:
            r = self._last_pub
            if r is None or pid is not self._last_pub_id:
                r = self._by_publisher.get(pid)
                if r is None:
                    r = _Recent(self.publishers.id(pid), topic, self.topics.id(topic), None, -1)
                    self._by_publisher[pid] = r
                self._last_pub = r
                self._last_pub_id = pid
            if r.first != topic:
                r.first = topic
                r.first_i = self.topics.id(topic)
            p_i = r.i
            t_i = r.first_i
        self.time = append(self.time, t)
        self.message_id = append(self.message_id, i64(msg.message_id))
        self.publisher_id = append(self.publisher_id, p_i)
        self.topic = append(self.topic, t_i)
        self.payload_size = append(self.payload_size, i64(len(msg.payload)))
        self.flags = append(self.flags, u8(msg.qos | (4 if msg.retain else 0)))
        self.received = append(self.received, msg.received)
        self.routes = append(self.routes, i64(routes))
        if routes >= 0:
            self.n_publications += 1
        return i

    def add_delivery(  # noqa: PLR0917 (hot path: positional arguments)
        self, call: i32, subscriber: str, topic_filter: str, selector: str | None, qos: int, retained: bool
    ) -> None:
        """Append a delivery row of call row ``call``."""
        r = self._last_sub
        if r is None or subscriber is not self._last_sub_id:
            r = self._by_subscriber.get(subscriber)
            self._last_sub_id = subscriber
        if r is None:
            filters = self.filters
            r = _Recent(
                self.subscribers.id(subscriber),
                topic_filter,
                filters.id(topic_filter),
                selector,
                filters.opt(selector),
            )
            self._by_subscriber[subscriber] = r
            self._last_sub = r
        else:
            self._last_sub = r
            if r.first is not topic_filter and r.first != topic_filter:
                r.first = topic_filter
                r.first_i = self.filters.id(topic_filter)
            if r.second is not selector and r.second != selector:
                r.second = selector
                r.second_i = self.filters.opt(selector)
        self.call = append(self.call, call)
        self.subscriber = append(self.subscriber, r.i)
        self.topic_filter = append(self.topic_filter, r.first_i)
        self.selector = append(self.selector, r.second_i)
        self.d_flags = append(self.d_flags, u8(qos | (4 if retained else 0)))

    def _check(self) -> None:
        n = len(self.time)
        for col in (self.message_id, self.payload_size, self.routes):
            assert len(col) == n
        for icol in (self.publisher_id, self.topic):
            assert len(icol) == n
        assert len(self.flags) == len(self.received) == n
        m = len(self.subscriber)
        assert len(self.call) == len(self.topic_filter) == len(self.selector) == len(self.d_flags) == m
        assert all(0 <= int(c) < int(n) for c in self.call)
        assert self.n_publications == sum(1 for r in self.routes if r >= 0)


class DeliveryLog:
    """Bounded columnar log of publications and their deliveries (module docstring).

    Written by the event loop (:meth:`begin`, :meth:`delivered`, :meth:`end`, :meth:`record`),
    read by one other thread (:meth:`take`, then :meth:`release` once the rows are safe).
    ``dropped_deliveries``/``dropped_publications`` count what the bound refused."""

    def __init__(self, max_rows: int, wake_rows: int, wake: Callable[[], None] | None = None) -> None:
        if max_rows < 1 or wake_rows < 1:
            raise ValueError("max_rows and wake_rows must be positive")
        self.max_rows: Final = max_rows
        self.wake_rows: Final = wake_rows
        self._wake = wake
        self._woken = False  # wake ran since the last take
        self._cols = LogColumns()
        self._busy = False  # appending (see the module docstring)
        # the open fan-outs: how many, the batch they append to, the innermost one's call row
        # (-1: refused at the bound, its deliveries are counted as dropped)
        self._depth = 0
        self._fan_cols = self._cols
        self._fan_call: i32 = -1
        # rows accepted (event loop only) and released (reader only): pending = in - out
        self.rows_in = 0
        self.rows_out = 0
        self.dropped_deliveries = 0
        self.dropped_publications = 0

    @property
    def pending(self) -> int:
        """Rows accepted and not yet released (buffered here or held by the reader)."""
        return self.rows_in - self.rows_out

    def _accepted(self, rows: int) -> None:
        self.rows_in += rows
        if not self._woken and self.rows_in - self.rows_out >= self.wake_rows and self._wake is not None:
            self._woken = True
            self._wake()

    def begin(self, msg: Message) -> i32:
        """Open the fan-out of publication ``msg`` (its call row); returns the outer fan-out's
        call row, for :meth:`end`."""
        outer = self._fan_call
        if self._depth == 0:
            self._fan_cols = self._cols
        self._depth += 1
        if self.rows_in - self.rows_out >= self.max_rows:
            self._fan_call = -1
            self.dropped_publications += 1
            return outer
        self._busy = True
        try:
            self._fan_call = self._fan_cols.add_call(0.0, msg, 0)
        finally:
            self._busy = False
        self.rows_in += 1
        return outer

    def delivered(
        self, subscriber: str, topic_filter: str, selector: str | None, qos: int, retained: bool
    ) -> None:
        """A delivery row of the innermost open fan-out."""
        call = self._fan_call
        if call < 0:
            self.dropped_deliveries += 1
            return
        self._busy = True
        try:
            self._fan_cols.add_delivery(call, subscriber, topic_filter, selector, qos, retained)
        finally:
            self._busy = False
        self.rows_in += 1

    def end(self, outer: i32, t: float, routes: int) -> None:
        """Close the innermost fan-out at wall time ``t`` with its ``routes`` count."""
        call = self._fan_call
        if call >= 0:
            c = self._fan_cols
            c.time[i64(call)] = t
            c.routes[i64(call)] = i64(routes)
        self._fan_call = outer
        self._depth -= 1
        self._accepted(0)

    def delivered_later(  # noqa: PLR0917 (hot path: positional arguments)
        self,
        t: float,
        msg: Message,
        subscriber: str,
        topic_filter: str,
        selector: str | None,
        qos: int,
        retained: bool,
    ) -> None:
        """A delivery written after its publication (queued, retained, resumed session): its own
        call row (routes -1) and the delivery row; :meth:`record` without the entry."""
        if self.rows_in - self.rows_out >= self.max_rows:
            self.dropped_deliveries += 1
            return
        self._busy = True
        try:
            c = self._fan_cols if self._depth else self._cols
            call = c.add_call(t, msg, -1)
            c.add_delivery(call, subscriber, topic_filter, selector, qos, retained)
        finally:
            self._busy = False
        self._accepted(1)

    def record(self, t: float, msg: Message, entries: list[Entry], routes: int) -> None:
        """Append one call row and a delivery row per entry (or drop and count at the bound)."""
        k = len(entries)
        if self.rows_in - self.rows_out >= self.max_rows:
            self.dropped_deliveries += k
            if routes >= 0:
                self.dropped_publications += 1
            return
        self._busy = True
        try:
            c = self._fan_cols if self._depth else self._cols
            call = c.add_call(t, msg, routes)
            for e in entries:
                c.add_delivery(call, e[0], e[1], e[2], e[3], e[4])
        finally:
            self._busy = False
        self._accepted(k + 1 if routes >= 0 else k)

    def take(self) -> LogColumns:
        """Everything recorded so far (the log continues with empty columns, sized like these).
        O(1), then waits while a fan-out on the taken batch is open (never, compiled, unless a
        sink let the GIL go in the middle of one)."""
        cols = self._cols
        self._cols = LogColumns(
            max(_MIN_CAPACITY, i64(len(cols.time))), max(_MIN_CAPACITY, i64(len(cols.subscriber)))
        )
        self._woken = False
        while self._busy or self._depth:  # records on ``cols`` let the GIL go: let them finish
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
