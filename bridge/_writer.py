"""The bridge: broker hook records -> in-memory buffers -> Parquet files in a landing zone.

Hot path (event loop).  The bridge hands the broker a columnar
:class:`~broker.ext.DeliveryLog` (``Hooks.delivery_log``): for each routed
publication the compiled core appends the message's fields and its fan-out's delivery entries
to per-field lists -- no call into the bridge, no encoding, no I/O, nothing the cyclic GC
tracks.  (Profiled in issue 19: the previous form, one interpreted ``on_deliveries`` call per
publication keeping a tuple per call and per delivery, cost 11 % of the event loop in the call
and tripled its GC time, docs/lab/performance-bridge.md.)  ``on_deliveries`` still works for
callers outside a broker and records into the same log.  ``on_subscription_change``,
``on_composite_change`` and ``on_composite_loss`` (issue 16) append the broker's record to a
list per kind; the writer takes a prefix with ``batch = buf[:n]; del buf[:n]`` (atomic list
operations).  Those are rare.  Composite events can be hundreds per publication, so
``on_composite_event`` appends the event's fields to columns (``bridge/_eventlog.py``, the
delivery log's design: no record kept for the GC to scan); its deliveries go through the
delivery log like any other.

Writer (one daemon thread). Every ``roll_interval`` seconds (default 0.5 s), or as soon as
``roll_rows`` rows (derived from ``roll_bytes``) are buffered, it takes the log's columns and
turns them into Arrow arrays (:func:`_fanout_tables`: the log's typed columns read as NumPy
without a copy, strings as Arrow dictionaries of the batch's distinct values, the message's
fields repeated per delivery by indexing) and commits one Parquet file per kind: written under
a temporary name starting with ``.`` (Spark's and pyarrow's dataset readers ignore dot files),
``fsync``-ed, renamed to its final name, and the directory ``fsync``-ed. A reader therefore sees
whole files or nothing. Tables larger than ``roll_rows`` rows are split. Cost: O(publications +
deliveries) per round: about 35 ns per publication with one delivery to build both tables and
140 ns to encode both files (benchmarks/bench_recording.py, docs/performance.md "Throughput with
the shipped defaults"), plus ~2.4 ms per round (two Parquet files, their fsyncs).

Back-pressure policy (documented in docs/bridge.md): the rows buffered and not yet committed are
bounded by ``max_pending`` (deliveries and publications together; each record list apart).
When the writer falls behind (slow disk, failed writes) and the bound is reached, new records are
*dropped and counted* per kind (``stats().dropped``), and the writer logs a warning with the
counts at its next round; the broker is never slowed or blocked.  A failed write keeps its
table (and every later one, in order) for the next round.

Durability: a graceful :meth:`Bridge.stop` (or :meth:`Bridge.close`) commits everything buffered.
A hard kill loses what was buffered since the last commit: at most ``roll_interval`` plus the
duration of one write round (measured in docs/lab/performance-bridge.md).  With the writer
process (``writer="process"``), rounds of fewer than ``commit_rows`` rows are handed over every
round but committed in groups of at most ``commit_delay`` seconds of records (by default
4 x ``roll_interval`` when that is >= 0.5 s: a commit costs the child a fixed 2-6 ms of CPU,
bridge/_writerproc.py); a SIGKILL of the broker loses no more than above (the child commits
what it holds when the broker's socket closes), while a kill of both processes or a power loss
loses at most ``commit_delay`` plus one round, and a reader sees those rows up to
``commit_delay`` after they were recorded.

Filesystems: a local directory by default; a URI (``s3://bucket/prefix``, ``hdfs://...``) is
opened with ``pyarrow.fs.FileSystem.from_uri`` and committed by write-then-move (no fsync there:
the object store's own durability applies).

Whole messages (opt-in, ``messages=[topic filters]``, issue 29): the payloads of the matching
publications are kept as one small record each and land in ``messages/``; see :class:`Bridge`.

This part of the project has no seed document: it follows issue 6 (items 1 and 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge import _schema
from bridge._eventlog import EventLog, events_table
from bridge._messages import _MessageRow, _TopicMatcher
from bridge._schema import Kind
from bridge._writerproc import Job, JobError, WriterProcess, fanout_payload, keep_freed_memory
from broker.ext import PRIVATE_FILE, DeliveryLog, LogColumns, private_dir, tighten
from broker.hooks import (
    CompositeChange,
    CompositeEventRecord,
    CompositeLoss,
    DeliveryEntry,
    Hooks,
    SubscriptionChange,
)

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from broker import Broker, Message
    from broker.ext import Core

__all__ = ["Bridge", "BridgeStats"]

_log = logging.getLogger("siftmq.bridge")

# Built by _load_arrow (with numpy, pyarrow): at the writer's first table, not at import.
_TS: pa.DataType
_LOG_SCHEMAS: dict[Kind, pa.Schema]
_OPTIONS: dict[Kind, dict[str, Any]]
_arrow_lock = threading.Lock()


def _load_arrow() -> None:
    """Import numpy, pyarrow and pyarrow.parquet and build the write options, once (issue 42).

    The served broker registers the bridge at start, but these libraries (with pandas, which
    pyarrow imports at its first conversion of a list) were ~95 MB of the idle broker's RSS
    before a single row was written; they are loaded here, by the writer thread, when it builds
    its first table (docs/performance.md "Footprint": the first round then takes ~0.5 s longer).
    O(1) after the first call (one dict lookup)."""
    global np, pa, pq, _TS, _LOG_SCHEMAS, _OPTIONS  # noqa: PLW0603 -- the lazy constants, built once
    if "_OPTIONS" in globals():
        return
    with _arrow_lock:
        if "_OPTIONS" in globals():
            return
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        _TS = _schema._TS
        _LOG_SCHEMAS = {
            kind: _dictionary_schema(_schema.SCHEMAS[kind]) for kind in (Kind.DELIVERIES, Kind.PUBLICATIONS)
        }
        _OPTIONS = {kind: _write_options(kind) for kind in Kind}


# Approximate Arrow bytes per record, used to turn roll_bytes into a row count.
_ROW_BYTES = 96


@dataclass(frozen=True, slots=True)
class BridgeStats:
    """Counters of a bridge, per record kind (keys are :class:`Kind` values)."""

    written: dict[str, int] = field(default_factory=dict)  # records committed to files
    dropped: dict[str, int] = field(default_factory=dict)  # records refused by a full buffer
    pending: dict[str, int] = field(default_factory=dict)  # records buffered now
    files: int = 0  # files committed
    bytes: int = 0  # bytes committed
    write_errors: int = 0  # failed write rounds (their batches were retried)
    writer_restarts: int = 0  # writer="process": children started again after one died


def _ts(times: np.ndarray[Any, np.dtype[np.float64]]) -> pa.Array:
    micros = (times * 1e6).astype(np.int64)
    return pa.array(micros, type=pa.int64()).cast(_TS)


def _node_column(node: str | None, n: int) -> pa.Array:
    return pa.nulls(n, pa.string()) if node is None else pa.repeat(pa.scalar(node, pa.string()), n)


def _ints(col: Any, dtype: Any) -> np.ndarray[Any, Any]:
    """A ``vec`` column of the delivery log as NumPy, without a copy (its buffer)."""
    return np.frombuffer(col, dtype) if len(col) else np.zeros(0, dtype)


def _strings(idx: np.ndarray[Any, Any], values: list[str]) -> pa.Array:
    """The string column of indices ``idx`` into ``values`` (-1: null), dictionary-encoded: the
    indices as they are, the distinct values converted once (no Python object, no copy of a
    string per row).  Written to Parquet as it is (``_LOG_SCHEMAS``)."""
    table = pa.array(values, pa.string())
    if idx.size and int(idx.min()) < 0:
        return pa.DictionaryArray.from_arrays(pa.array(idx, mask=idx < 0), table)
    return pa.DictionaryArray.from_arrays(pa.array(idx), table)


def _node_strings(node: str | None, n: int) -> pa.Array:
    """``_node_column`` dictionary-encoded (for ``_LOG_SCHEMAS``)."""
    if node is None:
        return pa.DictionaryArray.from_arrays(pa.nulls(n, pa.int32()), pa.array([], pa.string()))
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([node], pa.string()))


def _dictionary_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema(
        [
            pa.field(f.name, pa.dictionary(pa.int32(), pa.string()), f.nullable)
            if pa.types.is_string(f.type)
            else f
            for f in schema
        ]
    )


# The tables built from the delivery log have their string columns dictionary-encoded: the log
# keeps strings as indices into the batch's distinct values, and Parquet's writer takes Arrow
# dictionaries as its own dictionary pages (no hashing of every row's string).  The files are
# written without the Arrow schema in their metadata (``store_schema=False``), so that every
# reader (pyarrow, Spark) sees the Parquet types: plain strings, the kind's schema (SCHEMAS).
# (_LOG_SCHEMAS: built by _load_arrow.)


def _fanout_tables(c: LogColumns, node: str | None = None) -> tuple[pa.Table, pa.Table]:
    """(deliveries, publications) tables of a batch of the log's columns.

    The log's columns are typed vectors: each is read as NumPy without a copy; string columns
    are indices into the batch's distinct values, turned into strings by one ``take`` each; the
    message's columns are repeated per delivery by indexing with the delivery rows' ``call``.
    No Python work per row.
    O(calls + deliveries)."""
    _load_arrow()
    n = len(c.time)
    times = _ints(c.time, np.float64)
    routes = _ints(c.routes, np.int64)
    mid = _ints(c.message_id, np.int64)
    pub = _ints(c.publisher_id, np.int32)
    topic = _ints(c.topic, np.int32)
    size = _ints(c.payload_size, np.int64)
    flags = _ints(c.flags, np.uint8)
    is_pub = routes >= 0
    if c.publications() != n:
        keep = np.flatnonzero(is_pub)
        p_times, p_mid, p_pub, p_topic, p_size, p_flags, p_routes = (
            a[keep] for a in (times, mid, pub, topic, size, flags, routes)
        )
    else:
        p_times, p_mid, p_pub, p_topic, p_size, p_flags, p_routes = (
            times,
            mid,
            pub,
            topic,
            size,
            flags,
            routes,
        )
    pubs = pa.Table.from_arrays(
        [
            _ts(p_times),
            pa.array(p_mid),
            _strings(p_pub, c.publishers.values),
            _strings(p_topic, c.topics.values),
            pa.array(p_size),
            pa.array((p_flags & 3).astype(np.int32)),
            pa.array((p_flags & 4) != 0),
            pa.array(p_routes),
            _node_strings(node, len(p_times)),
        ],
        schema=_LOG_SCHEMAS[Kind.PUBLICATIONS],
    )
    m = c.deliveries()
    if not m:
        return _LOG_SCHEMAS[Kind.DELIVERIES].empty_table(), pubs
    latency = np.maximum(times - _ints(c.received, np.float64), 0.0)
    call = _ints(c.call, np.int32)
    if m != n or bool((call != np.arange(n, dtype=np.int64)).any()):  # not one delivery per call
        times, mid, pub, topic, size, latency = (a[call] for a in (times, mid, pub, topic, size, latency))
    d_flags = _ints(c.d_flags, np.uint8)
    deliveries = pa.Table.from_arrays(
        [
            _ts(times),
            pa.array(mid),
            _strings(pub, c.publishers.values),
            _strings(_ints(c.subscriber, np.int32), c.subscribers.values),
            _strings(topic, c.topics.values),
            _strings(_ints(c.topic_filter, np.int32), c.filters.values),
            _strings(_ints(c.selector, np.int32), c.filters.values),
            pa.array((d_flags & 3).astype(np.int32)),
            pa.array((d_flags & 4) != 0),
            pa.array(size),
            pa.array(latency, pa.float64()),
            _node_strings(node, m),
        ],
        schema=_LOG_SCHEMAS[Kind.DELIVERIES],
    )
    return deliveries, pubs


def _records_table(kind: Kind, batch: list[Any], node: str | None) -> pa.Table:
    """The table of a batch of the broker's records of one kind (``SubscriptionChange``,
    ``CompositeChange``, ``CompositeLoss``): each column of the kind's schema is the record
    attribute of that name (an enum as its value), ``time`` a timestamp, ``node`` ``node``.
    O(rows x columns)."""
    _load_arrow()
    schema = _schema.SCHEMAS[kind]
    arrays = []
    for f in schema:
        if f.name == "time":
            arrays.append(_ts(np.array([r.time for r in batch], dtype=np.float64)))
        elif f.name == "node":
            arrays.append(_node_column(node, len(batch)))
        else:
            values = [getattr(r, f.name) for r in batch]
            if values and isinstance(values[0], enum.Enum):
                values = [v.value for v in values]
            arrays.append(pa.array(values, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


#: the kinds buffered as lists of the broker's records (deliveries and publications go through
#: the delivery log, composite events through the event log: both are columns of scalars)
_RECORD_KINDS = (Kind.SUBSCRIPTION_CHANGES, Kind.COMPOSITE_CHANGES, Kind.COMPOSITE_LOSSES, Kind.MESSAGES)


# Parquet dictionary encoding only where values repeat (ids, topics, filters, small ints): on
# unique values (times, message ids, latencies) it is wasted work.  Measured on a deliveries
# batch: 117 -> 79 ns of CPU per row and a 25% smaller file than dictionary-encoding every column.
def _dictionary(kind: Kind) -> list[str]:
    return [
        f.name
        for f in _schema.SCHEMAS[kind]
        if pa.types.is_string(f.type) or f.name in {"qos", "payload_size"}
    ]


def _scalar(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_boolean(t)
    )


# Column statistics (min/max and null count in each row group's footer) only for the scalar
# columns (numbers, times, flags): times, ids, sizes and latencies are what a reader prunes row
# groups by, and the min/max of string, binary and list columns (ids, topics, filters, payloads)
# cost most of the statistics' CPU.  Measured on a round of 55,000 publications with one delivery
# each, both files (benchmarks/bench_recording.py, issue 27 item 7): 168-248 against 210-446 ns
# per publication with every column's statistics, same file size.
def _statistics(kind: Kind) -> list[str]:
    return [f.name for f in _schema.SCHEMAS[kind] if _scalar(f.type)]


# Columns whose values are unique per row: the time and the message id, which grow, stored as
# deltas (DELTA_BINARY_PACKED: a few bits per row instead of 8 bytes), and the latency; none of
# the three is compressed (Snappy finds next to nothing to take out of them and was a sixth of
# the encoding's CPU).  Measured on a round of 55,000 publications with one delivery each, both
# files (issue 27 item 7): 158-180 against 217 ns per publication, 0.48 MB against 1.17 MB.
# Spark (3.3 and later) and pyarrow read DELTA_BINARY_PACKED.
_UNIQUE = ("time", "message_id", "latency")
_DELTA_KINDS = (Kind.DELIVERIES, Kind.PUBLICATIONS)


def _encoding(kind: Kind) -> dict[str, str]:
    return {f.name: "DELTA_BINARY_PACKED" for f in _schema.SCHEMAS[kind] if f.name in ("time", "message_id")}


def _compression(kind: Kind) -> dict[str, str] | str:
    if kind not in _DELTA_KINDS:
        return "snappy"
    return {f.name: "none" if f.name in _UNIQUE else "snappy" for f in _schema.SCHEMAS[kind]}


def _write_options(kind: Kind) -> dict[str, Any]:
    """``pyarrow.parquet.write_table`` options of a kind's files."""
    opts: dict[str, Any] = {
        "use_dictionary": _dictionary(kind),
        "write_statistics": _statistics(kind),
        "compression": _compression(kind),
    }
    if kind in _DELTA_KINDS:
        opts["column_encoding"] = _encoding(kind)
        opts["store_schema"] = False  # dictionary-encoded strings read back as strings
    return opts


class _Sink:
    """Commits one table as one file: temporary dot name, fsync, rename (local) or move (URI)."""

    def __init__(self, landing: str | Path) -> None:
        text = str(landing)
        self.fs: Any = None
        if "://" in text:
            import pyarrow.fs as pafs

            self.fs, base = pafs.FileSystem.from_uri(text)
            self.base = base.rstrip("/")
            for kind in Kind:
                self.fs.create_dir(f"{self.base}/{kind.value}", recursive=True)
        else:
            self.base = str(Path(text).resolve())
            private_dir(self.base)
            tighten(self.base)  # what an older siftmq left readable by others
            for kind in Kind:  # private: the records hold topics, client ids, payloads
                private_dir(Path(self.base) / kind.value)
        self._seq = 0
        self._tag = uuid.uuid4().hex[:8]

    def remove_stale_temporaries(self) -> int:
        """Delete temporary files a killed writer left behind; returns how many."""
        if self.fs is not None:
            return 0
        removed = 0
        for kind in Kind:
            d = os.path.join(self.base, kind.value)
            for name in os.listdir(d):
                if name.startswith(".") and name.endswith(".tmp"):
                    os.unlink(os.path.join(d, name))
                    removed += 1
        return removed

    def next_name(self) -> str:
        """The name of the next file (a new, higher sequence number)."""
        self._seq += 1
        return f"part-{time.time_ns() // 1000:016d}-{self._tag}-{self._seq:08d}.parquet"

    def commit(self, kind: Kind, table: pa.Table, name: str | None = None) -> int:
        """Write ``table`` as one file of ``kind``; its size.  ``name``: given by the broker's
        side of the writer process (bridge/_writerproc.py), which may send a job again after its
        child died: a file already committed under that name is kept as it is (renamed into place
        only once whole, it is that job's file)."""
        _load_arrow()
        if name is None:
            name = self.next_name()
        elif self.fs is None:
            with contextlib.suppress(FileNotFoundError):
                return os.stat(os.path.join(self.base, kind.value, name)).st_size
        else:
            info = self.fs.get_file_info(f"{self.base}/{kind.value}/{name}")
            if info.is_file:
                return int(info.size)
        if self.fs is not None:
            final = f"{self.base}/{kind.value}/{name}"
            tmp = f"{self.base}/{kind.value}/.{name}.tmp"
            with self.fs.open_output_stream(tmp) as out:
                pq.write_table(table, out, **_OPTIONS[kind])
            self.fs.move(tmp, final)
            return int(self.fs.get_file_info(final).size)
        d = os.path.join(self.base, kind.value)
        final = os.path.join(d, name)
        tmp = os.path.join(d, f".{name}.tmp")
        # Encoded in memory (Arrow's own stream), then one write: through a Python file object
        # pyarrow calls back into Python for every buffer it writes (470 against 250 us for a
        # small file, a fixed cost of every round; issue 27 item 7).
        out = pa.BufferOutputStream()
        pq.write_table(table, out, **_OPTIONS[kind])
        data = out.getvalue()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            with contextlib.suppress(OSError):  # a partial file (the disk is full) frees its space
                os.unlink(tmp)
            raise
        size = int(data.size)
        os.replace(tmp, final)
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return size


class Bridge(Hooks):
    """A broker hook that streams deliveries, publications, subscription changes and composite
    subscription records to Parquet.

    ``Bridge(landing_dir)`` creates one directory per :class:`Kind` under ``landing_dir``.
    Register it with ``Broker(hooks=[bridge])``: the broker's ``start``/``stop`` start the writer
    thread and flush everything on a graceful stop.  Outside a broker use ``start_writer()`` and
    ``close()`` (or ``with Bridge(...) as b:``) and call the hook methods yourself.

    ``roll_interval``: seconds between rounds (a round is committed at once, or grouped: see
    ``commit_rows``; the hard-kill loss window); ``roll_bytes``:
    approximate size at which a file is rolled early; ``max_pending``: bound on the rows
    buffered and not yet committed (deliveries + publications together; each other kind
    apart) beyond which new records are dropped and counted (see the module docstring).
    Hot path cost: O(1) per publication and per delivery (typed appends into the delivery log).

    ``messages``: topic filters whose messages are landed whole, payload included, in
    ``messages/`` (issue 29: what a Spark job computes on, e.g. device telemetry).  Opt-in and
    not free: the broker then calls :meth:`on_deliveries` once per publication (an interpreted
    call, instead of the compiled core appending to the delivery log) and the payloads are
    copied.

    ``writer``: ``"thread"`` (default when embedding) builds and writes the files in a thread of
    this process; ``"process"`` (``siftmq serve``'s default) in a child process
    (bridge/_writerproc.py: numpy and pyarrow never load here; a child that dies is restarted
    and nothing acknowledged is lost; ``stats().writer_restarts``).

    ``commit_rows``, ``commit_delay`` (``writer="process"`` only): a round of fewer than
    ``commit_rows`` rows (deliveries + publications, those held with it included) is held by
    the child and committed with later rounds as one group, one file per kind, as long as its
    oldest records are at most ``commit_delay`` seconds old at the group's commit (default
    ``4 * roll_interval`` when ``roll_interval >= 0.5``, else ``roll_interval``: every round
    committed, as a short roll interval asks for fresh files).  ``commit_delay=roll_interval``
    commits every round.  See the module docstring for what it changes on a hard kill.
    """

    def __init__(
        self,
        landing_dir: str | Path,
        roll_interval: float = 0.5,
        roll_bytes: int = 32 * 1024 * 1024,
        max_pending: int = 1_000_000,
        messages: Sequence[str] = (),
        *,
        writer: str = "thread",
        commit_rows: int = 40_000,
        commit_delay: float | None = None,
    ) -> None:
        if writer not in {"thread", "process"}:
            raise ValueError(f"writer must be 'thread' or 'process', not {writer!r}")
        if not (math.isfinite(roll_interval) and roll_interval > 0):
            raise ValueError("roll_interval must be a positive number of seconds")
        if max_pending < 1 or roll_bytes < 1:
            raise ValueError("max_pending and roll_bytes must be positive")
        if commit_delay is None:
            commit_delay = 4 * roll_interval if roll_interval >= 0.5 else roll_interval
        if not (math.isfinite(commit_delay) and commit_delay >= roll_interval):  # nan, inf too
            raise ValueError("commit_delay must be a finite number of seconds >= roll_interval")
        if not isinstance(commit_rows, int) or commit_rows < 0:
            raise ValueError("commit_rows must be >= 0 (0: every round committed)")
        self.landing_dir = landing_dir
        self.roll_interval = roll_interval
        self.roll_bytes = roll_bytes
        self.roll_rows = max(1, roll_bytes // _ROW_BYTES)
        self.max_pending = max_pending
        # writer="process": rounds of fewer than commit_rows rows are grouped into one commit
        # of at most commit_delay seconds of records (bridge/_writerproc.py)
        self.commit_rows = commit_rows
        self.commit_delay = commit_delay
        self._sink = _Sink(landing_dir)
        self._wake = threading.Event()
        # Deliveries and publications: appended by the broker's core (or on_deliveries), taken
        # by the writer, released once committed (its pending rows are bounded by max_pending).
        self._log = DeliveryLog(max_pending, self.roll_rows, self._wake.set)
        # The other kinds: the broker's records, one list per kind (appended on the event loop).
        self._records: dict[Kind, list[Any]] = {kind: [] for kind in _RECORD_KINDS}
        self._events = EventLog(max_pending)  # composite events, as columns (bridge/_eventlog.py)
        self._dropped_records = dict.fromkeys((*_RECORD_KINDS, Kind.COMPOSITE_EVENTS), 0)
        # Tables built from the log but not committed yet (a failed write is retried):
        # (kind, table, rows to release from the log once committed).
        self._unwritten: list[tuple[Kind, pa.Table, int]] = []
        self._reported_drops = 0
        self._written = dict.fromkeys(Kind, 0)
        self._files = 0
        self._bytes = 0
        self._write_errors = 0
        self._write_failing = False  # the last write failed (logged once until one succeeds)
        self._write_lock = threading.Lock()
        self._committed = threading.Condition()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._core: Core | None = None  # the broker's core, for its cluster node id
        self._messages = _TopicMatcher(tuple(messages)) if messages else None
        # writer="process": the tables are built and written by a child (bridge/_writerproc.py);
        # the jobs sent and not acknowledged yet, in order (resent to a restarted child)
        self.writer = writer
        self._process = WriterProcess(str(landing_dir)) if writer == "process" else None
        self._jobs: list[Job] = []
        self._held: list[Job] = []  # fan-out jobs the child holds, in order (not acknowledged)
        self._process_failing = False  # the child failed and no job succeeded since (logged once)

    def attach(self, broker: Broker) -> None:
        self._core = broker.core

    # ---- hot path (event loop) ----

    def delivery_log(self) -> DeliveryLog | None:
        # Landing whole messages needs the message: the broker then calls on_deliveries.
        return self._log if self._messages is None else None

    def on_deliveries(
        self, time: float, message: Message, deliveries: list[DeliveryEntry], routes: int
    ) -> None:
        """The hook form: for callers outside a broker, and for a broker when the bridge lands
        whole messages (``messages``); otherwise a broker appends to the log itself."""
        self._log.record(time, message, deliveries, routes)
        match = self._messages
        if match is not None and routes >= 0 and match(message.topic):
            row = _MessageRow(
                time,
                message.message_id,
                message.publisher_id,
                message.topic,
                bytes(message.payload),
                message.qos,
                message.retain,
            )
            self._append(Kind.MESSAGES, row)

    def _append(self, kind: Kind, record: object) -> None:
        buf = self._records[kind]
        n = len(buf)
        if n < self.max_pending:
            buf.append(record)
            if n == self.roll_rows:
                self._wake.set()
        else:
            self._dropped_records[kind] += 1

    def on_subscription_change(self, change: SubscriptionChange) -> None:
        self._append(Kind.SUBSCRIPTION_CHANGES, change)

    def on_composite_change(self, change: CompositeChange) -> None:
        self._append(Kind.COMPOSITE_CHANGES, change)

    def on_composite_event(self, event: CompositeEventRecord) -> None:
        n = self._events.record(event)
        if n < 0:
            self._dropped_records[Kind.COMPOSITE_EVENTS] += 1
        elif n == self.roll_rows:
            self._wake.set()

    def on_composite_loss(self, loss: CompositeLoss) -> None:
        self._append(Kind.COMPOSITE_LOSSES, loss)

    # ---- lifecycle ----

    async def start(self) -> None:
        self.start_writer()

    async def stop(self) -> None:
        await asyncio.to_thread(self.close)

    def start_writer(self) -> None:
        """Start the writer thread (idempotent)."""
        if self._thread is not None:
            return
        removed = self._sink.remove_stale_temporaries()
        if removed:
            _log.info("bridge: removed %d temporary files left by an interrupted writer", removed)
        # numpy, pyarrow and pandas (which pyarrow imports at its first conversion of a list:
        # 0.3-0.5 s of CPU, mostly holding the GIL) are loaded by the writer's first table, not
        # here: loaded at start they were ~95 MB of an idle broker's RSS (issue 42). The cost:
        # the first round with rows takes that CPU from the event loop once (issue 27 had
        # measured 28 % of a paced QoS 1 profile's samples in it, in the first seconds only).
        self._stopping.clear()
        keep_freed_memory()  # the log's columns reused, not mapped and faulted in every round
        if self._process is not None:  # its libraries load now, in the child, not at the first round
            with contextlib.suppress(OSError):  # tried again, and said once, by the first round
                self._process.start()
        self._thread = threading.Thread(target=self._run, name="siftmq-bridge-writer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the writer thread and commit everything buffered (nothing is lost)."""
        thread = self._thread
        if thread is not None:
            self._stopping.set()
            self._wake.set()
            thread.join()
            self._thread = None
        self.flush()
        if self._process is not None:
            self._process.close()

    def __enter__(self) -> Bridge:
        self.start_writer()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writer ----

    def _backlog(self) -> bool:
        return (
            self._log.pending >= self.roll_rows
            or len(self._events) >= self.roll_rows
            or any(len(buf) >= self.roll_rows for buf in self._records.values())
        )

    def _run(self) -> None:
        # Fixed-rate rounds: a round starts roll_interval after the previous one *started*, so
        # the time a record waits is bounded by roll_interval (plus a round that overruns it).
        due = time.monotonic() + self.roll_interval
        while not self._stopping.is_set():
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()
            now = time.monotonic()
            due = max(due + self.roll_interval, now) if now >= due else due
            self._round()
            # A buffer that refilled past the roll size during the write is written at once.
            while not self._stopping.is_set() and self._backlog() and not self._unwritten:
                self._round()

    def _take(self) -> None:
        """Turn the buffers into tables queued in ``_unwritten`` (files of at most roll_rows)."""
        cols = self._log.take()
        if cols.calls():
            rows = cols.deliveries() + cols.publications()
            try:
                core = self._core
                deliveries, pubs = _fanout_tables(cols, None if core is None else core.node)
            except Exception:
                self._write_errors += 1
                self._log.release(rows)
                _log.exception("bridge: %d malformed hook records discarded", rows)
            else:
                self._queue(Kind.DELIVERIES, deliveries, credit=True)
                self._queue(Kind.PUBLICATIONS, pubs, credit=True)
        node = None if self._core is None else self._core.node
        events = self._events.take()
        if len(events):
            try:
                table = events_table(events, node)
            except Exception:
                self._write_errors += 1
                _log.exception("bridge: %d malformed composite events discarded", len(events))
            else:
                self._queue(Kind.COMPOSITE_EVENTS, table, credit=False)
        for kind, buf in self._records.items():
            n = len(buf)
            if n:
                part = buf[:n]
                del buf[:n]
                try:
                    table = _records_table(kind, part, node)
                except Exception:
                    self._write_errors += 1
                    _log.exception("bridge: %d malformed %s records discarded", n, kind.value)
                else:
                    self._queue(kind, table, credit=False)

    def _queue(self, kind: Kind, table: pa.Table, credit: bool) -> None:
        rows = self.roll_rows
        for start in range(0, table.num_rows, rows):
            part = table.slice(start, rows)
            self._unwritten.append((kind, part, part.num_rows if credit else 0))

    def _take_jobs(self) -> None:
        """``_take`` for the writer process: the buffers as jobs queued in ``_jobs``, their file
        names chosen now (a job sent again writes the same files). O(columns + distinct strings
        + rare records)."""
        node = None if self._core is None else self._core.node
        rows = self.roll_rows
        sink = self._sink

        def names(kind: Kind, n: int) -> tuple[str, tuple[str, ...]]:
            return kind.value, tuple(sink.next_name() for _ in range(-(-n // rows)))

        cols = self._log.take()
        if cols.calls():
            m, p = cols.deliveries(), cols.publications()
            self._jobs.append(
                Job(
                    "fanout",
                    fanout_payload(cols),
                    node,
                    rows,
                    (names(Kind.DELIVERIES, m), names(Kind.PUBLICATIONS, p)),
                    ((Kind.DELIVERIES.value, m), (Kind.PUBLICATIONS.value, p)),
                    m + p,
                    at=time.monotonic(),
                )
            )
        events = self._events.take()
        if n := len(events):
            kind = Kind.COMPOSITE_EVENTS
            self._jobs.append(Job("events", events, node, rows, (names(kind, n),), ((kind.value, n),), 0))
        for kind, buf in self._records.items():
            n = len(buf)
            if n:
                part = buf[:n]
                del buf[:n]
                self._jobs.append(Job(kind.value, part, node, rows, (names(kind, n),), ((kind.value, n),), 0))

    def _write_resumed(self) -> None:
        """A write succeeded: end a failing episode with its one line (both writers)."""
        if self._write_failing:
            self._write_failing = False
            _log.warning(
                "bridge: writing resumed (%d failed writes so far); the records kept are landed",
                self._write_errors,
            )

    def _may_wait(self, first: Job, rows: int) -> bool:
        """Whether a group of fan-out jobs whose first was built at ``first.at``, of ``rows`` rows,
        may be held past this round: fewer than ``commit_rows`` rows, and its oldest records
        (recorded from one roll interval before its first job was built) still within
        ``commit_delay`` at the next round. O(1)."""
        ri = self.roll_interval  # a quarter of a round of slack: rounds wake a little late
        return (
            rows < self.commit_rows and time.monotonic() + ri - (first.at - ri) <= self.commit_delay + ri / 4
        )

    def _release(self, jobs: Sequence[Job], files: list[tuple[str, int, int]]) -> None:
        for kind, n, size in files:
            self._written[Kind(kind)] += n
            self._files += 1
            self._bytes += size
        for job in jobs:
            self._log.release(job.credit)

    def _next_job(self, commit: bool) -> Job | None:
        """The job to send next (``_jobs[0]``, a fan-out job's hold decided), a ``"commit"`` job
        when a held group must be committed now, or None: nothing to send this round."""
        queue = self._jobs
        if not queue:
            held = self._held
            if not held or (not commit and self._may_wait(held[0], sum(j.credit for j in held))):
                return None
            node = None if self._core is None else self._core.node
            queue.append(Job("commit", None, node, self.roll_rows, (), (), 0, hold=False))
        job = queue[0]
        if job.what == "fanout" and job.hold is None:  # decided once: sent again the same
            group = [*self._held, job]
            hold = not commit and self._may_wait(group[0], sum(j.credit for j in group))
            job = queue[0] = dataclasses.replace(job, hold=hold)
        return job

    def _job_failed(self, job: Job, closes: bool, exc: JobError) -> bool:
        """The child answered ``job`` (``_jobs[0]``) with an error: a job (and the group it
        closes) whose records cannot become a table is discarded (True: go on with the next);
        a failed write keeps them for the next round, the group sent again whole (False)."""
        queue = self._jobs
        self._write_errors += 1
        group = [*self._held, job] if closes else [job]
        if closes:
            self._held = []
        if not exc.retry:  # the records could not become a table (a bug): discarded
            del queue[0]
            for j in group:
                self._log.release(j.credit)
            rows = sum(n for j in group for _, n in j.rows)
            _log.error("bridge: %d malformed %s records discarded: %s", rows, job.what, exc)
            return True
        if not self._write_failing:
            self._write_failing = True
            _log.error(
                "bridge: writing %s failed (%s); %d records kept for retry (every round, "
                "until a write succeeds)",
                job.names[0][0] if job.names and job.what != "fanout" else "deliveries",
                exc,
                sum(n for j in (*group[:-1], *queue) for _, n in j.rows),
            )
        queue[0:0] = group[:-1]  # the child dropped the group: sent again, first
        return False

    def _flush_jobs(self, process: WriterProcess, commit: bool) -> None:
        """``flush`` with the writer process (under the write lock): send the jobs in order; a
        job is counted written (and its log rows released) only when the child answered that
        all its files are committed.  ``commit`` False (a round): a fan-out job of few rows may
        be held by the child (:meth:`_may_wait`), committed with a later one as one group;
        True (``flush``, a stop): everything is committed.  A child that died is restarted once
        per round, and sent again the jobs it held, then the job it failed on (bridge/_writerproc.py
        explains why that is safe)."""
        self._take_jobs()
        queue = self._jobs
        restarted = False
        while job := self._next_job(commit):
            closes = job.what in ("fanout", "commit") and not job.hold  # commits the held group
            try:
                files = process.run(job)
            except JobError as exc:
                if self._job_failed(job, closes, exc):
                    continue
                break
            except (OSError, EOFError) as exc:
                self._write_errors += 1
                queue[0:0] = self._held  # the child's held jobs died with it: sent again, first
                self._held = []
                if not self._process_failing:  # once per episode (a child that cannot start
                    self._process_failing = True  # would otherwise say it every round)
                    _log.warning(
                        "bridge: the writer process failed (%s; exit status %s); it is started again "
                        "and the %d jobs it did not acknowledge are sent again",
                        exc,
                        process.last_exit,
                        len(queue),
                    )
                if restarted:
                    break  # the next round tries again
                restarted = True
                continue
            if self._process_failing:
                self._process_failing = False
                _log.warning("bridge: writer process running again (%d restarts so far)", process.starts - 1)
            del queue[0]
            if files is None:  # held by the child: acknowledged with its group
                self._held.append(job)
                continue
            self._write_resumed()
            group = [*self._held, job] if closes else [job]
            if closes:
                self._held = []
            self._release(group, files)

    def _round(self) -> None:
        """One round of the writer thread: :meth:`flush`, except that the writer process may
        hold a round of few rows for a later commit (bridge/_writerproc.py)."""
        process = self._process
        if process is None:
            self.flush()
            return
        with self._write_lock:
            self._flush_jobs(process, commit=False)
            self._report_drops()
        with self._committed:
            self._committed.notify_all()

    def flush(self) -> None:
        """Commit everything buffered now (callable from any thread)."""
        process = self._process
        if process is not None:
            with self._write_lock:
                self._flush_jobs(process, commit=True)
                self._report_drops()
            with self._committed:
                self._committed.notify_all()
            return
        with self._write_lock:
            self._take()
            queue = self._unwritten
            while queue:
                kind, table, credit = queue[0]
                try:
                    size = self._sink.commit(kind, table)
                except Exception as exc:
                    self._write_errors += 1
                    if not self._write_failing:  # once per episode: the next rounds retry
                        self._write_failing = True
                        _log.error(
                            "bridge: writing %s failed (%s); %d records kept for retry (every round, "
                            "until a write succeeds)",
                            kind.value,
                            exc,
                            sum(t.num_rows for _, t, _ in queue),
                            # a full disk or a vanished directory says it all; anything else
                            # (a bug) shows where
                            exc_info=None if isinstance(exc, OSError) else exc,
                        )
                    break
                self._write_resumed()
                del queue[0]
                self._written[kind] += table.num_rows
                self._log.release(credit)
                self._files += 1
                self._bytes += size
            self._report_drops()
        with self._committed:
            self._committed.notify_all()

    def wait_written(self, kind: Kind, count: int, timeout: float) -> bool:
        """Block until at least ``count`` records of ``kind`` are committed; False on timeout."""
        with self._committed:
            return self._committed.wait_for(lambda: self._written[kind] >= count, timeout)

    def _report_drops(self) -> None:
        dlog = self._log
        total = dlog.dropped_deliveries + dlog.dropped_publications + sum(self._dropped_records.values())
        if total != self._reported_drops:
            _log.warning(
                "bridge: writer behind, buffers full (max_pending=%d); dropped so far: "
                "deliveries=%d publications=%d %s",
                self.max_pending,
                dlog.dropped_deliveries,
                dlog.dropped_publications,
                " ".join(f"{k.value}={v}" for k, v in self._dropped_records.items()),
            )
            self._reported_drops = total

    def stats(self) -> BridgeStats:
        """A snapshot of the counters (``pending``: buffered or built, not yet committed)."""
        deliveries, publications = self._log.peek_counts()
        pending = {
            Kind.DELIVERIES: deliveries,
            Kind.PUBLICATIONS: publications,
            **{kind: len(buf) for kind, buf in self._records.items()},
            Kind.COMPOSITE_EVENTS: len(self._events),
        }
        for kind, table, _ in list(self._unwritten):
            pending[kind] += table.num_rows
        for job in [*self._held, *self._jobs]:
            for name, n in job.rows:
                pending[Kind(name)] += n
        return BridgeStats(
            written={k.value: v for k, v in self._written.items()},
            dropped={
                Kind.DELIVERIES.value: self._log.dropped_deliveries,
                Kind.PUBLICATIONS.value: self._log.dropped_publications,
                **{kind.value: n for kind, n in self._dropped_records.items()},
            },
            pending={k.value: v for k, v in pending.items()},
            files=self._files,
            bytes=self._bytes,
            write_errors=self._write_errors,
            writer_restarts=max(0, self._process.starts - 1) if self._process is not None else 0,
        )

    def _check(self) -> None:
        """Invariants: the hot path refuses rows at the bound (one call may overshoot it by its
        own rows), committed rows never exceed accepted ones, counters are non-negative."""
        with self._write_lock:
            dlog = self._log
            deliveries, publications = dlog.peek_counts()
            jobs = (*self._jobs, *self._held)
            unwritten = sum(c for _, _, c in self._unwritten) + sum(j.credit for j in jobs)
            assert dlog.pending == deliveries + publications + unwritten
            assert 0 <= dlog.rows_out <= dlog.rows_in
            assert all(len(buf) <= self.max_pending for buf in self._records.values())
            assert len(self._events) <= self.max_pending
            self._events._cols._check()
        assert min(self._written.values()) >= 0
        assert min(self._log.dropped_deliveries, self._log.dropped_publications) >= 0
        assert min(self._dropped_records.values()) >= 0
