"""The bridge: broker hook records -> in-memory buffers -> Parquet files in a landing zone.

Hot path (event loop).  ``on_delivery``/``on_publication``/``on_subscription_change`` append the
record object the broker already built to a per-kind Python list (one ``len`` and one
``list.append``: no encoding, no I/O, no lock).  The writer thread takes a prefix of each list
with ``batch = buf[:n]; del buf[:n]`` -- each of these is one atomic list operation, so records
appended concurrently by the event loop stay in the list for the next round (nothing is lost
between the two statements).

Writer (one daemon thread).  Every ``roll_interval`` seconds (default 0.5 s), or as soon as a
buffer holds ``roll_rows`` records (derived from ``roll_bytes``), it turns each non-empty buffer
into an Arrow table (columns built with one comprehension per field, times converted with numpy)
and commits it as one Parquet file per kind: written under a temporary name starting with ``.``
(Spark's and pyarrow's dataset readers ignore dot files), ``fsync``-ed, renamed to its final
name, and the directory ``fsync``-ed.  A reader therefore sees whole files or nothing.  Files
larger than ``roll_rows`` rows are split.  Cost: O(records) per round, amortised O(1) per record.

Back-pressure policy (documented in docs/bridge.md): each buffer is bounded by ``max_pending``
records.  When the writer falls behind (slow disk, failed writes) and a buffer is full, new
records of that kind are *dropped and counted* (``stats().dropped``), and the writer logs a
warning with the counts at its next round; the broker is never slowed or blocked.  A failed
write puts its batch back at the head of its buffer and is retried next round.

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
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bridge._schema import SCHEMAS, Kind
from broker.hooks import Delivery, Hooks, Publication, SubscriptionChange

__all__ = ["Bridge", "BridgeStats"]

_log = logging.getLogger("siftmq.bridge")

_TS = pa.timestamp("us", tz="UTC")
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


def _ts(times: list[float]) -> pa.Array:
    micros = (np.asarray(times, dtype=np.float64) * 1e6).astype(np.int64)
    return pa.array(micros, type=pa.int64()).cast(_TS)


def _deliveries_table(batch: list[Any]) -> pa.Table:
    return pa.Table.from_arrays(
        [
            _ts([r.time for r in batch]),
            pa.array([r.message_id for r in batch], pa.int64()),
            pa.array([r.publisher_id for r in batch], pa.string()),
            pa.array([r.subscriber_id for r in batch], pa.string()),
            pa.array([r.topic for r in batch], pa.string()),
            pa.array([r.subscription_filter for r in batch], pa.string()),
            pa.array([r.content_filter for r in batch], pa.string()),
            pa.array([r.qos for r in batch], pa.int32()),
            pa.array([r.retained for r in batch], pa.bool_()),
            pa.array([r.payload_size for r in batch], pa.int64()),
            pa.array([r.latency for r in batch], pa.float64()),
        ],
        schema=SCHEMAS[Kind.DELIVERIES],
    )


def _publications_table(batch: list[Any]) -> pa.Table:
    return pa.Table.from_arrays(
        [
            _ts([r.time for r in batch]),
            pa.array([r.message_id for r in batch], pa.int64()),
            pa.array([r.publisher_id for r in batch], pa.string()),
            pa.array([r.topic for r in batch], pa.string()),
            pa.array([r.payload_size for r in batch], pa.int64()),
            pa.array([r.qos for r in batch], pa.int32()),
            pa.array([r.retained for r in batch], pa.bool_()),
            pa.array([r.deliveries for r in batch], pa.int64()),
        ],
        schema=SCHEMAS[Kind.PUBLICATIONS],
    )


def _changes_table(batch: list[Any]) -> pa.Table:
    return pa.Table.from_arrays(
        [
            _ts([r.time for r in batch]),
            pa.array([r.client_id for r in batch], pa.string()),
            pa.array([r.action.value for r in batch], pa.string()),
            pa.array([r.topic_filter for r in batch], pa.string()),
            pa.array([r.content_filter for r in batch], pa.string()),
            pa.array([r.qos for r in batch], pa.int32()),
            pa.array([r.entries for r in batch], pa.int64()),
        ],
        schema=SCHEMAS[Kind.SUBSCRIPTION_CHANGES],
    )


_BUILDERS = {
    Kind.DELIVERIES: _deliveries_table,
    Kind.PUBLICATIONS: _publications_table,
    Kind.SUBSCRIPTION_CHANGES: _changes_table,
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
                pq.write_table(table, out)
            self.fs.move(tmp, final)
            return int(self.fs.get_file_info(final).size)
        d = os.path.join(self.base, kind.value)
        final = os.path.join(d, name)
        tmp = os.path.join(d, f".{name}.tmp")
        with open(tmp, "wb") as f:
            pq.write_table(table, f)
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
    ``close()`` (or ``with Bridge(...) as b:``).

    ``roll_interval``: seconds between commits (the hard-kill loss window); ``roll_bytes``:
    approximate size at which a file is rolled early; ``max_pending``: per-kind buffer bound
    beyond which records are dropped and counted (see the module docstring).
    Hot path cost: O(1) per record, no allocation besides the list slot.
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
        self._deliveries: list[Delivery] = []
        self._publications: list[Publication] = []
        self._changes: list[SubscriptionChange] = []
        self._buffers: dict[Kind, list[Any]] = {
            Kind.DELIVERIES: self._deliveries,
            Kind.PUBLICATIONS: self._publications,
            Kind.SUBSCRIPTION_CHANGES: self._changes,
        }
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

    # ---- hot path (event loop) ----

    def on_delivery(self, delivery: Delivery) -> None:
        buf = self._deliveries
        n = len(buf)
        if n < self.max_pending:
            buf.append(delivery)
            if n == self.roll_rows:
                self._wake.set()
        else:
            self._dropped_deliveries += 1

    def on_publication(self, publication: Publication) -> None:
        buf = self._publications
        n = len(buf)
        if n < self.max_pending:
            buf.append(publication)
            if n == self.roll_rows:
                self._wake.set()
        else:
            self._dropped_publications += 1

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
            while not self._stopping.is_set() and any(
                len(b) >= self.roll_rows for b in self._buffers.values()
            ):
                self.flush()

    def flush(self) -> None:
        """Commit everything buffered now (callable from any thread)."""
        with self._write_lock:
            for kind, buf in self._buffers.items():
                n = len(buf)
                if n == 0:
                    continue
                batch = buf[:n]
                del buf[:n]
                done = 0
                try:
                    while done < n:
                        part = batch[done : done + self.roll_rows]
                        size = self._sink.commit(kind, _BUILDERS[kind](part))
                        done += len(part)
                        self._written[kind] += len(part)
                        self._files += 1
                        self._bytes += size
                except Exception:
                    self._write_errors += 1
                    _log.exception(
                        "bridge: writing %s failed; %d records kept for retry", kind.value, n - done
                    )
                    buf[0:0] = batch[done:]
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
        """A snapshot of the counters."""
        return BridgeStats(
            written={k.value: v for k, v in self._written.items()},
            dropped={
                Kind.DELIVERIES.value: self._dropped_deliveries,
                Kind.PUBLICATIONS.value: self._dropped_publications,
                Kind.SUBSCRIPTION_CHANGES.value: self._dropped_changes,
            },
            pending={k.value: len(b) for k, b in self._buffers.items()},
            files=self._files,
            bytes=self._bytes,
            write_errors=self._write_errors,
        )

    def _check(self) -> None:
        """Invariants: new records are refused at the bound (only a failed write's retried batch
        can exceed it), counters are non-negative."""
        if self._write_errors == 0:
            for buf in self._buffers.values():
                assert len(buf) <= self.max_pending
        assert min(self._written.values()) >= 0
        assert min(self._dropped_deliveries, self._dropped_publications, self._dropped_changes) >= 0
