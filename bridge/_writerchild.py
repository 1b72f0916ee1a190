"""The bridge's writer process itself (``python -c "from bridge._writerchild import main"``,
started by :class:`bridge._writerproc.WriterProcess`; the protocol and why: that module).

It reads jobs from the socket it was given, builds their tables with the thread writer's own
functions (``bridge/_writer.py``: the same files, byte for byte) and commits them under the
names the job carries, skipping a name already committed (a job sent again after a child
died).  It answers ``("ok", files)`` or ``("error", message, retry, os_error)`` and exits when
the broker closes the socket.  pandas is refused (:func:`_block_pandas`).  O(rows) per job.

**Held fan-out jobs** (``Job.hold``, issue 42 item 4b: the broker's rounds grouped into fewer
commits when its rate is low; bridge/_writerproc.py says why and what it changes).  A held job
is not answered (the broker does not wait for it) and its columns are copied out of the receive
arena (a job that cannot be copied fails the group's answer instead); the next fan-out
job that is not held, or a ``"commit"`` job, commits the held jobs and itself as *one* group:
their columns concatenated (:func:`_merge`: each job's string indices mapped into one table of
distinct values per string column, delivery rows' ``call`` shifted), one table per kind, under
the names of the group's jobs in order (the first ones; the others stay unused, a gap in the
sequence numbers, which readers allow).  The group a commit covers is exactly the jobs held
since the previous commit, so the broker, which keeps every job until its group is answered,
sends the same group again after a child died and the names already committed are skipped as
for one job.  When the broker's socket closes (the broker stopped or was killed) the held jobs
are committed before the child exits: a broker killed with SIGKILL loses no row it had handed
over.  O(rows + distinct strings) per group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from bridge import _writer
from bridge._eventlog import events_table
from bridge._schema import Kind
from bridge._writerproc import COLUMNS, STRINGS, Arena, Job, JobError, keep_freed_memory, receive, send

if TYPE_CHECKING:
    from broker.ext import LogColumns

__all__ = ["main"]


class _Strings:
    __slots__ = ("values",)

    def __init__(self, values: list[str]) -> None:
        self.values = values


class _Columns:
    """``LogColumns`` rebuilt in the child: each column a NumPy array over the received bytes."""

    def __init__(self, payload: dict[str, Any]) -> None:
        import numpy as np

        for name, dtype in COLUMNS:
            setattr(self, name, np.frombuffer(payload[name], dtype))
        for name in STRINGS:
            setattr(self, name, _Strings(payload[name]))
        self._pubs = int(payload["n_publications"])

    def calls(self) -> int:
        return len(self.time)  # type: ignore[attr-defined]

    def deliveries(self) -> int:
        return len(self.subscriber)  # type: ignore[attr-defined]

    def publications(self) -> int:
        return self._pubs


def _block_pandas() -> None:
    """pyarrow imports pandas at its first conversion of a Python list when it can (~50 MB);
    nothing the writer does needs it, so the child refuses the import (pyarrow then works
    without it)."""

    class _NoPandas:
        @staticmethod
        def find_spec(name: str, path: Sequence[str] | None = None, target: object = None) -> None:
            if name == "pandas" or name.startswith("pandas."):
                raise ImportError("the bridge's writer process does not load pandas")

    sys.meta_path.insert(0, _NoPandas())


def _batch_scheduling() -> None:
    """Linux: the child runs under ``SCHED_BATCH`` (its CPU share is unchanged; it only no
    longer preempts the thread it wakes beside -- the broker's event loop, often on the same
    core -- when a job arrives: the job waits for the loop's time slice instead of cutting it
    short and cooling its caches; issue 42 item 4).  Elsewhere, or refused: nothing."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is not None:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, policy, os.sched_param(0))


#: string columns of the call and delivery rows and the table of distinct values each indexes
_REFS = {
    "publisher_id": "publishers",
    "topic": "topics",
    "subscriber": "subscribers",
    "topic_filter": "filters",
    "selector": "filters",
}


def _own(job: Job) -> Job:
    """``job`` with its columns copied out of the receive arena (reused by the next frame). O(rows)."""
    payload = dict(job.payload)
    for name, _ in COLUMNS:
        payload[name] = bytes(payload[name])
    return dataclasses.replace(job, payload=payload)


def _merge(jobs: Sequence[Job]) -> Job:
    """One fan-out job of a group's jobs, in order: columns concatenated, string indices mapped
    into one table of distinct values per string column (-1, None, kept), delivery rows'
    ``call`` shifted by the call rows before them; per kind the jobs' names, in order, as many
    as the group's files (the same ``roll_rows`` split as one job's).
    O(rows + distinct strings)."""
    if len(jobs) == 1:
        return jobs[0]
    import numpy as np

    payload: dict[str, Any] = {}
    maps: dict[str, list[Any]] = {}
    for name in STRINGS:
        index: dict[str, int] = {}
        per_job = []
        for job in jobs:
            values = job.payload[name]
            m = np.empty(len(values) + 1, np.int32)
            m[-1] = -1  # index -1 (None) maps to itself
            for i, v in enumerate(values):
                m[i] = index.setdefault(v, len(index))
            per_job.append(m)
        payload[name] = list(index)
        maps[name] = per_job
    for name, dtype in COLUMNS:
        parts = []
        calls = 0
        for k, job in enumerate(jobs):
            a = np.frombuffer(job.payload[name], dtype)
            if name in _REFS:
                a = maps[_REFS[name]][k][a]
            elif name == "call":
                a = a + calls
            parts.append(a.astype(dtype, copy=False))
            calls += len(np.frombuffer(job.payload["time"], "<f8"))
        payload[name] = np.concatenate(parts)
    payload["n_publications"] = sum(int(job.payload["n_publications"]) for job in jobs)
    kinds = [kind for kind, _ in jobs[0].names]
    rows = {kind: sum(n for job in jobs for k, n in job.rows if k == kind) for kind in kinds}
    per = jobs[0].roll_rows
    names = tuple(
        (
            kind,
            tuple(n for job in jobs for k, ns in job.names if k == kind for n in ns)[: -(-rows[kind] // per)],
        )
        for kind in kinds
    )
    return dataclasses.replace(
        jobs[-1],
        payload=payload,
        names=names,
        rows=tuple(rows.items()),
        credit=sum(job.credit for job in jobs),
    )


def _merged(jobs: Sequence[Job]) -> Job:
    """:func:`_merge`, a failure (a bug) answered as a job that cannot become a table."""
    try:
        return _merge(jobs)
    except Exception as exc:
        raise JobError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}", False, False) from exc


def _execute(sink: Any, job: Job) -> list[tuple[str, int, int]]:
    """Build the job's tables and commit them under its names (a name already committed is
    skipped: the job is being sent again after a child died)."""
    try:
        match job.what:
            case "fanout":
                deliveries, pubs = _writer._fanout_tables(cast("LogColumns", _Columns(job.payload)), job.node)
                tables = {Kind.DELIVERIES.value: deliveries, Kind.PUBLICATIONS.value: pubs}
            case "events":
                tables = {Kind.COMPOSITE_EVENTS.value: events_table(job.payload, job.node)}
            case kind:
                tables = {kind: _writer._records_table(Kind(kind), job.payload, job.node)}
    except Exception as exc:
        raise JobError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}", False, False) from exc
    files = []
    for kind, names in job.names:
        table = tables[kind]
        for i, name in enumerate(names):
            part = table.slice(i * job.roll_rows, job.roll_rows)
            try:
                size = sink.commit(Kind(kind), part, name=name)
            except OSError as exc:
                raise JobError(str(exc), True, True) from exc
            except Exception as exc:
                raise JobError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}", True, False) from exc
            files.append((kind, part.num_rows, size))
    return files


def main(argv: Sequence[str] | None = None) -> int:
    """``main([FD, LANDING])``: commit the jobs read from socket ``FD`` until it closes.

    SIGINT and SIGTERM are ignored: a Ctrl-C in a terminal or a service manager's stop signals
    the whole process group, and the child must outlive the broker's last flush; it ends when
    the broker closes the socket (or dies: the socket closes too)."""
    fd, landing = (argv if argv is not None else sys.argv[1:])[:2]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _block_pandas()
    _batch_scheduling()
    keep_freed_memory()  # the groups' columns and Arrow buffers reused (bridge/_writerproc.py)
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # bridge/_plugin.py says why
    sock = socket.socket(fileno=int(fd))
    sink = _writer._Sink(landing)
    _writer._load_arrow()  # numpy and pyarrow now, while the broker starts: not in its first round
    arena = Arena()  # the jobs' buffers, reused: each job is done before the next is read
    held: list[Job] = []  # fan-out jobs held for the next commit (their columns copied)
    bad: JobError | None = None  # a held job could not be copied: the group's answer fails
    while True:
        try:
            job = receive(sock, arena)
        except (EOFError, ConnectionError):
            if held and bad is None:  # the broker stopped or died: what it handed over lands
                with contextlib.suppress(JobError):
                    _execute(sink, _merged(held))
            return 0
        if job.what == "fanout" and job.hold:  # not answered: the broker does not wait
            try:
                held.append(_own(job))
            except Exception as exc:
                bad = bad or JobError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}", False, False)
            continue
        answer: tuple[Any, ...]
        try:
            if job.what in ("fanout", "commit"):
                group = [*held, job] if job.what == "fanout" else held
                held = []  # a failed commit is sent again whole by the broker
                if bad is not None:
                    error, bad = bad, None
                    raise error
                answer = ("ok", _execute(sink, _merged(group)) if group else [])
            else:
                answer = ("ok", _execute(sink, job))
        except JobError as exc:
            answer = ("error", str(exc), exc.retry, exc.os_error)
        try:
            send(sock, answer)
        except OSError:
            return 0
