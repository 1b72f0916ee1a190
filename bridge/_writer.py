"""The bridge: broker hook records -> in-memory buffers -> Parquet files in a landing zone.

Hot path (event loop).  The bridge uses the broker's batched hook ``on_deliveries``: one call per
routed publication carrying the message object and the list of its fan-out's delivery entries
(plain tuples the broker built), and the bridge appends ONE tuple ``(time, message, entries,
routes)`` to a list -- no per-delivery work, no encoding, no I/O, no lock.
``on_subscription_change`` appends the broker's record to a second list.  The writer thread takes
a prefix of a list with ``batch = buf[:n]; del buf[:n]`` -- each of these is one atomic list
operation, so records appended concurrently by the event loop stay for the next round.

Writer (one daemon thread).  Every ``roll_interval`` seconds (default 0.5 s), or as soon as
``roll_rows`` rows (derived from ``roll_bytes``) are buffered, it expands the buffered calls into
Arrow columns (:func:`_fanout_tables`: the message's fields once per publication, repeated per
delivery with ``take``; the entry tuples transposed with ``zip`` and converted by pyarrow in C)
and commits one Parquet file per kind: written under a temporary name starting with ``.``
(Spark's and pyarrow's dataset readers ignore dot files), ``fsync``-ed, renamed to its final
name, and the directory ``fsync``-ed.  A reader therefore sees whole files or nothing.  Tables
larger than ``roll_rows`` rows are split.  Cost: O(publications + deliveries) per round, a few
hundred nanoseconds of GIL time per delivery (measured in docs/performance-bridge.md).

Back-pressure policy (documented in docs/bridge.md): the rows buffered and not yet committed are
bounded by ``max_pending`` (deliveries and publications together; subscription changes apart).
When the writer falls behind (slow disk, failed writes) and the bound is reached, new records are
*dropped and counted* per kind (``stats().dropped``), and the writer logs a warning with the
counts at its next round; the broker is never slowed or blocked.  A failed write keeps its
table (and every later one, in order) for the next round.

Durability: a graceful :meth:`Bridge.stop` (or :meth:`Bridge.close`) commits everything buffered.
A hard kill loses what was buffered since the last commit: at most ``roll_interval`` plus the
duration of one write round (measured in docs/performance-bridge.md).

Filesystems: a local directory by default; a URI (``s3://bucket/prefix``, ``hdfs://...``) is
opened with ``pyarrow.fs.FileSystem.from_uri`` and committed by write-then-move (no fsync there:
the object store's own durability applies).

This part of the project has no seed document: it follows issue 6 (items 1 and 2).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bridge._schema import SCHEMAS, Kind
from broker.hooks import DeliveryEntry, Hooks, SubscriptionChange

if TYPE_CHECKING:
    from broker import Broker, Message
    from broker.core._core import Core

__all__ = ["Bridge", "BridgeStats"]

_log = logging.getLogger("siftmq.bridge")

_TS = pa.timestamp("us", tz="UTC")
# Approximate Arrow bytes per record, used to turn roll_bytes into a row count.
_ROW_BYTES = 96

# One on_deliveries call as buffered on the hot path: (time, message_id, publisher_id, topic,
# payload_size, qos, retain, received, routes, number of entries).  Only scalars: CPython's
# cyclic GC untracks such a tuple at its first collection, so a buffered record is never
# promoted to an older generation (retaining the Message or the entry list would make every
# buffered publication a long-lived tracked object and trigger full collections).
_Record: TypeAlias = tuple[float, int, "str | None", str, int, int, bool, float, int, int]


@dataclass(frozen=True, slots=True)
class BridgeStats:
    """Counters of a bridge, per record kind (keys are :class:`Kind` values)."""

    written: dict[str, int] = field(default_factory=dict)  # records committed to files
    dropped: dict[str, int] = field(default_factory=dict)  # records refused by a full buffer
    pending: dict[str, int] = field(default_factory=dict)  # records buffered now
    files: int = 0  # files committed
    bytes: int = 0  # bytes committed
    write_errors: int = 0  # failed write rounds (their batches were retried)


def _ts(times: np.ndarray[Any, np.dtype[np.float64]]) -> pa.Array:
    micros = (times * 1e6).astype(np.int64)
    return pa.array(micros, type=pa.int64()).cast(_TS)


_RECORD_TYPE = pa.struct(
    [
        ("time", pa.float64()),
        ("message_id", pa.int64()),
        ("publisher_id", pa.string()),
        ("topic", pa.string()),
        ("payload_size", pa.int64()),
        ("qos", pa.int32()),
        ("retained", pa.bool_()),
        ("received", pa.float64()),
        ("routes", pa.int64()),
        ("entries", pa.int64()),
    ]
)
_ENTRY_TYPE = pa.struct(
    [
        ("subscriber_id", pa.string()),
        ("subscription_filter", pa.string()),
        ("content_filter", pa.string()),
        ("qos", pa.int32()),
        ("retained", pa.bool_()),
    ]
)


def _node_column(node: str | None, n: int) -> pa.Array:
    return pa.nulls(n, pa.string()) if node is None else pa.repeat(pa.scalar(node, pa.string()), n)


def _fanout_tables(
    records: list[_Record], entries: list[DeliveryEntry], node: str | None = None
) -> tuple[pa.Table, pa.Table]:
    """(deliveries, publications) tables of buffered ``on_deliveries`` calls and their entries.

    The record and entry tuples are converted by pyarrow in one C pass each (as struct arrays,
    then split into columns); the message's columns are repeated per delivery with ``take``.
    No Python-level loop per row, and no container allocated per row (transposing with
    ``zip(*rows)`` allocates huge argument tuples that the cyclic GC traverses again and again:
    measured 3x slower).  O(calls + deliveries)."""
    (c_t, c_mid, c_pub, c_topic, c_size, c_qos, c_retain, c_received, c_routes, c_count) = pa.array(
        records, type=_RECORD_TYPE
    ).flatten()
    times = c_t.to_numpy()
    routes = c_routes.to_numpy()
    c_time = _ts(times)
    is_pub = routes >= 0
    pub_cols = [c_time, c_mid, c_pub, c_topic, c_size, c_qos, c_retain, c_routes]
    if not is_pub.all():
        keep = pa.array(np.flatnonzero(is_pub))
        pub_cols = [c.take(keep) for c in pub_cols]
    pub_cols.append(_node_column(node, len(pub_cols[0])))
    pubs = pa.Table.from_arrays(pub_cols, schema=SCHEMAS[Kind.PUBLICATIONS])
    if not entries:
        return SCHEMAS[Kind.DELIVERIES].empty_table(), pubs
    counts = c_count.to_numpy()
    latency = np.maximum(times - c_received.to_numpy(), 0.0)
    if len(entries) == len(records) and bool((counts == 1).all()):  # no repetition needed
        rep = [c_time, c_mid, c_pub, c_topic, c_size]
        c_latency = pa.array(latency, pa.float64())
    else:
        idx_np = np.repeat(np.arange(len(records), dtype=np.int64), counts)
        idx = pa.array(idx_np)
        rep = [c.take(idx) for c in (c_time, c_mid, c_pub, c_topic, c_size)]
        c_latency = pa.array(latency[idx_np], pa.float64())
    r_time, r_mid, r_pub, r_topic, r_size = rep
    e_sub, e_filter, e_selector, e_qos, e_retained = pa.array(entries, type=_ENTRY_TYPE).flatten()
    deliveries = pa.Table.from_arrays(
        [
            r_time,
            r_mid,
            r_pub,
            e_sub,
            r_topic,
            e_filter,
            e_selector,
            e_qos,
            e_retained,
            r_size,
            c_latency,
            _node_column(node, len(e_sub)),
        ],
        schema=SCHEMAS[Kind.DELIVERIES],
    )
    return deliveries, pubs


def _changes_table(batch: list[SubscriptionChange]) -> pa.Table:
    return pa.Table.from_arrays(
        [
            _ts(np.array([r.time for r in batch], dtype=np.float64)),
            pa.array([r.client_id for r in batch], pa.string()),
            pa.array([r.action.value for r in batch], pa.string()),
            pa.array([r.topic_filter for r in batch], pa.string()),
            pa.array([r.content_filter for r in batch], pa.string()),
            pa.array([r.qos for r in batch], pa.int32()),
            pa.array([r.entries for r in batch], pa.int64()),
        ],
        schema=SCHEMAS[Kind.SUBSCRIPTION_CHANGES],
    )


# Parquet dictionary encoding only where values repeat (ids, topics, filters, small ints): on
# unique values (times, message ids, latencies) it is wasted work.  Measured on a deliveries
# batch: 117 -> 79 ns of CPU per row and a 25% smaller file than dictionary-encoding every column.
_DICTIONARY: dict[Kind, list[str]] = {
    kind: [f.name for f in SCHEMAS[kind] if pa.types.is_string(f.type) or f.name in {"qos", "payload_size"}]
    for kind in Kind
}


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
            for kind in Kind:
                os.makedirs(os.path.join(self.base, kind.value), exist_ok=True)
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

    def commit(self, kind: Kind, table: pa.Table) -> int:
        self._seq += 1
        name = f"part-{time.time_ns() // 1000:016d}-{self._tag}-{self._seq:08d}.parquet"
        if self.fs is not None:
            final = f"{self.base}/{kind.value}/{name}"
            tmp = f"{self.base}/{kind.value}/.{name}.tmp"
            with self.fs.open_output_stream(tmp) as out:
                pq.write_table(table, out, use_dictionary=_DICTIONARY[kind])
            self.fs.move(tmp, final)
            return int(self.fs.get_file_info(final).size)
        d = os.path.join(self.base, kind.value)
        final = os.path.join(d, name)
        tmp = os.path.join(d, f".{name}.tmp")
        with open(tmp, "wb") as f:
            pq.write_table(table, f, use_dictionary=_DICTIONARY[kind])
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, final)
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return size


class Bridge(Hooks):
    """A broker hook that streams deliveries, publications and subscription changes to Parquet.

    ``Bridge(landing_dir)`` creates ``landing_dir/{deliveries,publications,subscription_changes}``.
    Register it with ``Broker(hooks=[bridge])``: the broker's ``start``/``stop`` start the writer
    thread and flush everything on a graceful stop.  Outside a broker use ``start_writer()`` and
    ``close()`` (or ``with Bridge(...) as b:``) and call the hook methods yourself.

    ``roll_interval``: seconds between commits (the hard-kill loss window); ``roll_bytes``:
    approximate size at which a file is rolled early; ``max_pending``: bound on the rows
    buffered and not yet committed (deliveries + publications together; subscription changes
    apart) beyond which new records are dropped and counted (see the module docstring).
    Hot path cost: O(1) per publication (one tuple appended, whatever its fan-out).
    """

    def __init__(
        self,
        landing_dir: str | Path,
        roll_interval: float = 0.5,
        roll_bytes: int = 32 * 1024 * 1024,
        max_pending: int = 1_000_000,
    ) -> None:
        if roll_interval <= 0:
            raise ValueError("roll_interval must be positive")
        if max_pending < 1 or roll_bytes < 1:
            raise ValueError("max_pending and roll_bytes must be positive")
        self.landing_dir = landing_dir
        self.roll_interval = roll_interval
        self.roll_bytes = roll_bytes
        self.roll_rows = max(1, roll_bytes // _ROW_BYTES)
        self.max_pending = max_pending
        self._sink = _Sink(landing_dir)
        # The calls' records, and all their entries back to back (a call's entries are added
        # before its record, so a prefix of the records always has its entries present).
        self._records: list[_Record] = []
        self._entries: list[DeliveryEntry] = []
        self._changes: list[SubscriptionChange] = []
        # Rows (deliveries + publications) accepted by the hot path and committed by the writer;
        # each counter has a single writer thread (event loop / writer under _write_lock), so
        # their difference bounds the buffered rows without a lock.
        self._rows_in = 0
        self._rows_out = 0
        # Tables built from the buffers but not committed yet (a failed write is retried):
        # (kind, table, rows to credit to _rows_out once committed).
        self._unwritten: list[tuple[Kind, pa.Table, int]] = []
        self._dropped_deliveries = 0
        self._dropped_publications = 0
        self._dropped_changes = 0
        self._reported_drops = 0
        self._written = dict.fromkeys(Kind, 0)
        self._files = 0
        self._bytes = 0
        self._write_errors = 0
        self._write_lock = threading.Lock()
        self._committed = threading.Condition()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._core: Core | None = None  # the broker's core, for its cluster node id

    def attach(self, broker: Broker) -> None:
        self._core = broker.core

    # ---- hot path (event loop) ----

    def on_deliveries(
        self, time: float, message: Message, deliveries: list[DeliveryEntry], routes: int
    ) -> None:
        rows = self._rows_in
        n = rows - self._rows_out
        if n < self.max_pending:
            m = message
            k = len(deliveries)
            if k:
                self._entries.extend(deliveries)
            self._records.append(
                (
                    time,
                    m.message_id,
                    m.publisher_id,
                    m.topic,
                    len(m.payload),
                    m.qos,
                    m.retain,
                    m.received,
                    routes,
                    k,
                )
            )
            k += routes >= 0
            self._rows_in = rows + k
            if n < self.roll_rows <= n + k:
                self._wake.set()
        else:
            self._dropped_deliveries += len(deliveries)
            self._dropped_publications += routes >= 0

    def on_subscription_change(self, change: SubscriptionChange) -> None:
        buf = self._changes
        n = len(buf)
        if n < self.max_pending:
            buf.append(change)
            if n == self.roll_rows:
                self._wake.set()
        else:
            self._dropped_changes += 1

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
        self._stopping.clear()
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

    def __enter__(self) -> Bridge:
        self.start_writer()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writer ----

    def _backlog(self) -> bool:
        return self._rows_in - self._rows_out >= self.roll_rows or len(self._changes) >= self.roll_rows

    def _run(self) -> None:
        # Fixed-rate rounds: a round starts roll_interval after the previous one *started*, so
        # the time a record waits is bounded by roll_interval (plus a round that overruns it).
        due = time.monotonic() + self.roll_interval
        while not self._stopping.is_set():
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()
            now = time.monotonic()
            due = max(due + self.roll_interval, now) if now >= due else due
            self.flush()
            # A buffer that refilled past the roll size during the write is written at once.
            while not self._stopping.is_set() and self._backlog() and not self._unwritten:
                self.flush()

    def _take(self) -> None:
        """Turn the buffers into tables queued in ``_unwritten`` (files of at most roll_rows)."""
        buf = self._records
        n = len(buf)
        if n:
            batch = buf[:n]
            del buf[:n]  # appends made meanwhile by the event loop stay for the next round
            m = sum([r[9] for r in batch])
            entries = self._entries[:m]
            del self._entries[:m]
            try:
                core = self._core
                deliveries, pubs = _fanout_tables(batch, entries, None if core is None else core.node)
            except Exception:
                rows = m + sum([r[8] >= 0 for r in batch])
                self._write_errors += 1
                self._rows_out += rows
                _log.exception("bridge: %d malformed hook records discarded", rows)
            else:
                self._queue(Kind.DELIVERIES, deliveries, credit=True)
                self._queue(Kind.PUBLICATIONS, pubs, credit=True)
        changes = self._changes
        n = len(changes)
        if n:
            part = changes[:n]
            del changes[:n]
            self._queue(Kind.SUBSCRIPTION_CHANGES, _changes_table(part), credit=False)

    def _queue(self, kind: Kind, table: pa.Table, credit: bool) -> None:
        rows = self.roll_rows
        for start in range(0, table.num_rows, rows):
            part = table.slice(start, rows)
            self._unwritten.append((kind, part, part.num_rows if credit else 0))

    def flush(self) -> None:
        """Commit everything buffered now (callable from any thread)."""
        with self._write_lock:
            self._take()
            queue = self._unwritten
            while queue:
                kind, table, credit = queue[0]
                try:
                    size = self._sink.commit(kind, table)
                except Exception:
                    self._write_errors += 1
                    _log.exception(
                        "bridge: writing %s failed; %d records kept for retry",
                        kind.value,
                        sum(t.num_rows for _, t, _ in queue),
                    )
                    break
                del queue[0]
                self._written[kind] += table.num_rows
                self._rows_out += credit
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
        total = self._dropped_deliveries + self._dropped_publications + self._dropped_changes
        if total != self._reported_drops:
            _log.warning(
                "bridge: writer behind, buffers full (max_pending=%d); dropped so far: "
                "deliveries=%d publications=%d subscription_changes=%d",
                self.max_pending,
                self._dropped_deliveries,
                self._dropped_publications,
                self._dropped_changes,
            )
            self._reported_drops = total

    def stats(self) -> BridgeStats:
        """A snapshot of the counters (``pending``: buffered or built, not yet committed)."""
        records = list(self._records)
        pending = {
            Kind.DELIVERIES: sum(r[9] for r in records),
            Kind.PUBLICATIONS: sum(r[8] >= 0 for r in records),
            Kind.SUBSCRIPTION_CHANGES: len(self._changes),
        }
        for kind, table, _ in list(self._unwritten):
            pending[kind] += table.num_rows
        return BridgeStats(
            written={k.value: v for k, v in self._written.items()},
            dropped={
                Kind.DELIVERIES.value: self._dropped_deliveries,
                Kind.PUBLICATIONS.value: self._dropped_publications,
                Kind.SUBSCRIPTION_CHANGES.value: self._dropped_changes,
            },
            pending={k.value: v for k, v in pending.items()},
            files=self._files,
            bytes=self._bytes,
            write_errors=self._write_errors,
        )

    def _check(self) -> None:
        """Invariants: the hot path refuses rows at the bound (one call may overshoot it by its
        own rows), committed rows never exceed accepted ones, counters are non-negative."""
        with self._write_lock:
            assert sum(r[9] for r in self._records) == len(self._entries)
            buffered = sum(r[9] + (r[8] >= 0) for r in self._records)
            unwritten = sum(c for _, _, c in self._unwritten)
            assert self._rows_in - self._rows_out == buffered + unwritten
            assert 0 <= self._rows_out <= self._rows_in
            assert len(self._changes) <= self.max_pending
        assert min(self._written.values()) >= 0
        assert min(self._dropped_deliveries, self._dropped_publications, self._dropped_changes) >= 0
