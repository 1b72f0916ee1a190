"""The bridge's buffer of composite events: columns of scalars, not the broker's records.

``Bridge.on_composite_event`` runs once per composite event, and a busy composite subscription
set produces hundreds per publication (docs/composite.md, "Measurements").  Keeping each
``CompositeEventRecord`` until the writer's next round (0.5 s) makes it a long-lived object for
CPython's cyclic GC (a slotted record holding a tuple is a tracked container), so the collector
would scan hundreds of thousands of them on the event loop, and the writer would then convert
them field by field.  As the delivery log does for deliveries (``broker/core/_deliverylog.py``),
the event's fields are appended to one list per column instead -- floats, ints and strings,
which the GC does not track -- and the record is freed at once by reference counting.  The
subscribers ``(client id, name)`` go flat into two string columns with a count per event, which
become Arrow list arrays through offsets.

A lock makes a record's appends atomic with respect to the writer thread, which takes the
whole column set (O(1) swap) and builds the table with one ``pyarrow.array`` call per column.
Bounded: at ``max_rows`` events buffered, new ones are refused (the caller counts them).

Costs: ``record`` O(1 + subscribers) list appends under an uncontended lock; ``take`` O(1);
:func:`events_table` O(events + subscribers) in C, no Python work per row except flattening.
numpy and pyarrow are imported by :func:`events_table`, in the writer thread, not with the module
(the idle broker's footprint, issue 42: docs/performance.md "Footprint").
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from bridge import _schema
from bridge._schema import Kind
from broker.hooks import CompositeEventRecord

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["EventColumns", "EventLog", "events_table"]


class EventColumns:
    """The columns of a batch of composite events (``count``: subscribers of each event, whose
    client ids and names follow in ``client_ids`` / ``names``)."""

    __slots__ = (
        "begin",
        "buffered",
        "client_ids",
        "completion",
        "components",
        "count",
        "end",
        "expression",
        "max_buffer",
        "names",
        "time",
        "window",
    )

    def __init__(self) -> None:
        self.time: list[float] = []
        self.expression: list[str] = []
        self.window: list[float] = []
        self.max_buffer: list[int] = []
        self.count: list[int] = []
        self.client_ids: list[str] = []
        self.names: list[str] = []
        self.begin: list[float] = []
        self.end: list[float] = []
        self.components: list[int] = []
        self.completion: list[float] = []
        self.buffered: list[int] = []

    def __len__(self) -> int:
        return len(self.time)

    def _check(self) -> None:
        n = len(self.time)
        for col in (self.expression, self.window, self.max_buffer, self.count, self.begin, self.end):
            assert len(col) == n
        assert len(self.components) == len(self.completion) == len(self.buffered) == n
        assert len(self.client_ids) == len(self.names) == sum(self.count)


class EventLog:
    """Composite events appended on the event loop, taken by the writer thread."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._cols = EventColumns()

    def record(self, e: CompositeEventRecord) -> int:
        """Append ``e``; returns the events buffered before it, or -1 when full (refused)."""
        with self._lock:
            c = self._cols
            n = len(c.time)
            if n >= self.max_rows:
                return -1
            c.time.append(e.time)
            c.expression.append(e.expression)
            c.window.append(e.window)
            c.max_buffer.append(e.max_buffer)
            subs = e.subscribers
            c.count.append(len(subs))
            for client_id, name in subs:
                c.client_ids.append(client_id)
                c.names.append(name)
            c.begin.append(e.begin)
            c.end.append(e.end)
            c.components.append(e.components)
            c.completion.append(e.completion)
            c.buffered.append(e.buffered)
            return n

    def take(self) -> EventColumns:
        """The buffered events (the log starts empty again).  O(1)."""
        with self._lock:
            cols, self._cols = self._cols, EventColumns()
        return cols

    def __len__(self) -> int:
        return len(self._cols)


def _ts(values: list[float]) -> pa.Array:
    import numpy as np
    import pyarrow as pa

    micros = (np.array(values, dtype=np.float64) * 1e6).astype(np.int64)
    return pa.array(micros, type=pa.int64()).cast(_schema._TS)


def events_table(c: EventColumns, node: str | None) -> pa.Table:
    """The ``composite_events`` table of a batch (schema ``SCHEMAS[Kind.COMPOSITE_EVENTS]``)."""
    import numpy as np  # here, not at the module's import: the idle broker does without (issue 42)
    import pyarrow as pa

    n = len(c)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.array(c.count, dtype=np.int32), out=offsets[1:])
    starts = pa.array(offsets)
    node_col = pa.nulls(n, pa.string()) if node is None else pa.repeat(pa.scalar(node, pa.string()), n)
    return pa.Table.from_arrays(
        [
            _ts(c.time),
            pa.array(c.expression, pa.string()),
            pa.array(c.window, pa.float64()),
            pa.array(c.max_buffer, pa.int64()),
            pa.ListArray.from_arrays(starts, pa.array(c.client_ids, pa.string())),
            pa.ListArray.from_arrays(starts, pa.array(c.names, pa.string())),
            _ts(c.begin),
            _ts(c.end),
            pa.array(c.components, pa.int32()),
            pa.array(c.completion, pa.float64()),
            pa.array(c.buffered, pa.int64()),
            node_col,
        ],
        schema=_schema.SCHEMAS[Kind.COMPOSITE_EVENTS],
    )
