"""The landing zone as a replayable stream: listing, offsets, partitions, reading (no Spark here).

Used by the ``siftmq`` Spark data source (``bridge/_datasource.py``); kept free of pyspark so it
is testable and cheap to import.

**Files and offsets.**  Every file the bridge commits is named
``part-<microseconds>-<writer tag>-<sequence>.parquet`` (``bridge/_writer.py``): one writer (one
:class:`~bridge.Bridge`) has one random tag and numbers its files 1, 2, 3... in the order it
commits them (one writer thread, under a lock; a failed write is retried under a new, higher
number), and a committed file is never rewritten.  So, per landing zone and kind, the set of
files a reader can see is summarised exactly by *the highest sequence number seen per writer
tag*, and the files between two such summaries are a fixed set: ``start < seq <= end`` per tag.
That summary is the streaming offset::

    {"/abs/landing": {"3f9a0c1e": 41, "77b0d2aa": 7}, "/abs/other-landing": {...}}

Spark writes a micro-batch's end offset to the checkpoint's offset log before it runs the batch
and its id to the commit log after the sink committed; a restarted query re-runs a logged,
uncommitted batch between the same two offsets, which select the same files: each file is read
by exactly one batch.  Several landing zones (several cluster nodes) are one offset with a key
per landing zone; a shared directory written by several nodes works the same way (one tag per
writer).  A ``.parquet`` file not named by a bridge (copied in by hand) is its own writer with
sequence number 1: read once.  Dot and underscore files (the writer's temporaries) are ignored.
Offsets grow by one entry per writer (each broker start is a new writer): a few bytes each.

**Partitions.**  The files of a batch, in (landing zone, tag, sequence) order, are cut into
runs of about equal bytes: ``ceil(bytes / max_partition_bytes)`` of them (default 32 MiB), and
when there is more than 256 KiB at least ``min_partitions`` (default 2) and a multiple of it, so
that a ``local[2]`` session reads with both cores in whole waves (:func:`pack`).  A partition
is a list of file paths; reading one yields Arrow record batches conformed to the kind's schema
(a column missing from an older file, e.g. ``node`` of ``subscription_changes``, is read as
nulls).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from bridge._filters import RowFilter, keep_row_groups, row_mask
from bridge._schema import SCHEMAS, Kind

__all__ = [
    "LandingFile",
    "Offset",
    "conform",
    "files_between",
    "kind_schema",
    "latest_offset",
    "list_files",
    "pack",
    "parse_kind",
    "read_files",
]

_NAME = re.compile(r"part-(\d+)-([0-9A-Za-z]+)-(\d+)\.parquet\Z")

Offset = dict[str, dict[str, int]]

#: above this many bytes a read is spread over ``min_partitions`` tasks at least (below, one
#: task: a task costs a Python worker round trip, more than reading a few small files)
_SPREAD_BYTES = 256 << 10


@dataclass(frozen=True, slots=True)
class LandingFile:
    """One committed file: its landing zone (as given), writer tag, sequence number, path, size."""

    landing: str
    tag: str
    seq: int
    path: str
    size: int


def parse_kind(value: str | None) -> Kind:
    """The :class:`Kind` named by the ``kind`` option (a clear error otherwise)."""
    names = ", ".join(k.value for k in Kind)
    if value is None:
        raise ValueError(f"siftmq source: option 'kind' is required (one of {names})")
    try:
        return Kind(value)
    except ValueError:
        raise ValueError(
            f"siftmq source: option kind={value!r} is not a record kind (one of {names})"
        ) from None


def _fs(landing: str) -> tuple[Any, str]:
    if "://" in landing and not landing.startswith("file://"):
        import pyarrow.fs as pafs

        fs, base = pafs.FileSystem.from_uri(landing)
        return fs, base.rstrip("/")
    path = landing[len("file://") :] if landing.startswith("file://") else landing
    return None, os.path.abspath(path)


def list_files(landing: str, kind: Kind, known: dict[str, LandingFile] | None = None) -> list[LandingFile]:
    """The committed files of ``kind`` in ``landing``, by (tag, sequence).  A landing zone or
    kind directory that does not exist (yet) has none.  ``known`` (a cache the caller keeps
    across listings, by path) spares a file already seen its ``stat`` and name parsing: a
    committed file is never rewritten, so a streaming source's listing costs one directory
    read plus the new files (a directory of 36,000 files, an hour at a 0.1 s roll, is read in
    milliseconds; stat-ing each again was most of the listing)."""
    fs, base = _fs(landing)
    out: list[LandingFile] = []
    if fs is None:
        d = os.path.join(base, kind.value)
        try:
            with os.scandir(d) as it:
                entries = [e for e in it if not e.name.startswith((".", "_")) and e.name.endswith(".parquet")]
        except FileNotFoundError:
            return []
        for e in entries:
            f = known.get(e.path) if known is not None else None
            if f is None and e.is_file():
                f = _landing_file(landing, e.name, e.path, e.stat().st_size)
                if known is not None:
                    known[e.path] = f
            if f is not None:
                out.append(f)
    else:
        import pyarrow.fs as pafs

        info = fs.get_file_info(pafs.FileSelector(f"{base}/{kind.value}", allow_not_found=True))
        scheme = landing.split("://", 1)[0]
        for i in info:
            name = i.base_name
            if i.type == pafs.FileType.File and not name.startswith((".", "_")) and name.endswith(".parquet"):
                out.append(_landing_file(landing, name, f"{scheme}://{i.path}", i.size or 0))
    out.sort(key=lambda f: (f.tag, f.seq))
    return out


def _landing_file(landing: str, name: str, path: str, size: int) -> LandingFile:
    m = _NAME.match(name)
    tag, seq = (m.group(2), int(m.group(3))) if m else (f"file:{name}", 1)
    return LandingFile(landing, tag, seq, path, size)


def latest_offset(landings: Sequence[str], kind: Kind, known: dict[str, LandingFile] | None = None) -> Offset:
    """The offset that covers every file committed now."""
    offset: Offset = {}
    for landing in landings:
        tags: dict[str, int] = {}
        for f in list_files(landing, kind, known):
            if f.seq > tags.get(f.tag, 0):
                tags[f.tag] = f.seq
        offset[landing] = tags
    return offset


def files_between(
    landings: Sequence[str],
    kind: Kind,
    start: Offset | None,
    end: Offset,
    known: dict[str, LandingFile] | None = None,
) -> list[LandingFile]:
    """The files with ``start < seq <= end`` for their writer (``start`` None: from the first)."""
    out: list[LandingFile] = []
    for landing in landings:
        hi = end.get(landing, {})
        lo = (start or {}).get(landing, {})
        out.extend(
            f for f in list_files(landing, kind, known) if lo.get(f.tag, 0) < f.seq <= hi.get(f.tag, 0)
        )
    return out


def pack(
    files: Sequence[LandingFile], max_partition_bytes: int = 32 << 20, min_partitions: int = 2
) -> list[list[str]]:
    """Files packed into partitions (lists of paths) in order; see the module docstring.

    The number of partitions is ``ceil(total / max_partition_bytes)``, and when there is more
    than 256 KiB at least ``min_partitions`` and a multiple of it (whole waves of tasks on that
    many cores), at most one per file; the files are cut into that many runs of about equal
    bytes.  Filling each partition up to a target in turn left a straggler: 20 files of 0.25 MB
    in "2" partitions were 10 + 9 + 1, and the one-file third task ran alone after the others
    (0.5 s of a 1 s read, measured in docs/lab/performance-bridge.md, Session 11)."""
    if not files:
        return []
    sizes = [max(f.size, 1) for f in files]
    total = sum(sizes)
    n = -(-total // max_partition_bytes)
    if total > _SPREAD_BYTES and min_partitions > 1:
        n = max(n, min_partitions)
        n = -(-n // min_partitions) * min_partitions
    n = max(1, min(n, len(files)))
    parts: list[list[str]] = [[] for _ in range(n)]
    seen = 0
    for f, size in zip(files, sizes, strict=True):
        # the partition whose share of the bytes holds the middle of this file
        i = min(n - 1, (2 * seen + size) * n // (2 * total))
        parts[i].append(f.path)
        seen += size
    return [p for p in parts if p]


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with exactly the columns of ``schema``, in order (missing ones as nulls)."""
    if batch.schema.names == schema.names and batch.schema.types == schema.types:
        return pa.RecordBatch.from_arrays(batch.columns, schema=schema)
    cols = []
    for f in schema:
        i = batch.schema.get_field_index(f.name)
        cols.append(batch.column(i).cast(f.type) if i >= 0 else pa.nulls(batch.num_rows, f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def kind_schema(kind: Kind, columns: Sequence[str] | None = None) -> pa.Schema:
    """The Arrow schema a reader yields: ``kind``'s columns (nullable), or only ``columns``."""
    fields = [f.with_nullable(True) for f in SCHEMAS[kind]]
    if columns is None:
        return pa.schema(fields)
    names = [f.name for f in fields]
    unknown = [c for c in columns if c not in names]
    if unknown or not columns:
        raise ValueError(
            f"siftmq source: option columns={','.join(columns)!r}: {', '.join(unknown) or 'empty'} "
            f"(columns of {kind.value}: {', '.join(names)})"
        )
    return pa.schema([fields[names.index(c)] for c in columns])


def read_files(
    paths: Sequence[str],
    kind: Kind,
    columns: Sequence[str] | None = None,
    batch_rows: int = 65_536,
    filters: Sequence[RowFilter] = (),
) -> Iterator[pa.RecordBatch]:
    """The rows of ``paths`` as Arrow record batches of ``kind``'s schema (only ``columns``);
    with ``filters`` (``bridge/_filters.py``, from :func:`~bridge._filters.usable`) without the
    row groups and rows they rule out."""
    import pyarrow.parquet as pq  # here: the driver's source process lists, only workers read

    schema = kind_schema(kind, columns)
    for path in paths:
        fs, p = _fs(path)
        pf = pq.ParquetFile(p, filesystem=fs) if fs is not None else pq.ParquetFile(p)
        present = set(pf.schema_arrow.names)
        wanted = [n for n in schema.names if n in present]
        groups = keep_row_groups(pf.metadata, filters) if filters else None
        if groups == []:
            continue
        for read in pf.iter_batches(batch_size=batch_rows, columns=wanted, row_groups=groups):
            batch = read
            if filters and (mask := row_mask(read, filters)) is not None:
                batch = read.filter(mask)
                if not batch.num_rows:
                    continue
            yield conform(batch, schema)
