"""Snapshots of the durable composite subscriptions: compaction of their journal, off the loop.

The composite subscriptions of persisted sessions are journalled in the store, one row per
call (:mod:`broker.core._composite_log`): that is what makes them survive ``kill -9``.  A
snapshot only bounds the journal (and the replay at start): :class:`CompositeSaver` takes
one when the journal has grown past ``max(COMPOSITE_COMPACT_ROWS, durable subscriptions)``
rows since the last one (checked every ``COMPOSITE_SNAPSHOT_INTERVAL``), at start when
rows were replayed, and at a graceful stop.

**Off the event loop.**  Serialising the engine is O(state) (0.34-0.44 s at 50,000 composite
subscriptions, docs/composite.md) and needs a consistent state, so the broker forks: the
child process has a copy-on-write image of the engine as of the fork, writes
``<store>.composite.tmp`` (JSON, fsync) and exits; the event loop pays only the ``fork``
call (page tables: milliseconds, measured in docs/composite.md) and goes on.  The child resets
the signal handlers, closes every inherited descriptor (the listening sockets: a restarted
broker can bind its port while the child finishes) and leaves with ``os._exit`` (no
finalizer, no buffered output written twice).  The parent waits for it in a thread, then
waits until the store has committed every journal row the snapshot includes (the snapshot
names the last one, ``journal``), renames the file into place (fsync of the directory), and
deletes those rows.  A crash at any point leaves either the old snapshot with every row after
it, or the new one with the rows after it: the journal is only trimmed behind a durable
snapshot.  Without ``os.fork`` (or when it fails) the snapshot is taken on the event loop, as
at start and at a graceful stop.

Memory: while the child runs, pages the broker writes are copied (the child's image stays
the fork's); at most the broker's heap, for about the time of one snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import resource
import signal
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker._files import open_private
from broker._logging import fields
from broker.durability import StoreError

if TYPE_CHECKING:
    from broker.core import Composites
    from broker.durability import Store

__all__ = ["COMPOSITE_COMPACT_ROWS", "COMPOSITE_SNAPSHOT_INTERVAL", "CompositeSaver"]

log = logging.getLogger("broker")

#: seconds between two checks whether a snapshot is due
COMPOSITE_SNAPSHOT_INTERVAL = 5.0
#: journal rows since the last snapshot above which a snapshot is due (or the number of
#: durable composite subscriptions, when larger: the journal then outweighs the state)
COMPOSITE_COMPACT_ROWS = 10_000


def _read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _write(path: str, data: bytes) -> None:
    # 0600 whatever the umask: the snapshot holds subscribers' state (broker/_files.py)
    with os.fdopen(open_private(path, os.O_WRONLY | os.O_TRUNC), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _install(tmp: str, path: str) -> None:
    """Rename ``tmp`` to ``path`` and make the rename durable (fsync of the directory)."""
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _wait(pid: int) -> bool:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _fork_dump(dump: Callable[[], bytes], tmp: str) -> int:
    """Fork; the child writes ``dump()`` to ``tmp`` and exits (0: written).  Returns the
    child's pid (raises OSError when the fork fails)."""
    with warnings.catch_warnings():  # Python 3.12+ warns about fork() with threads running
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the child: no Python signal handler, no descriptor of the broker's
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        gc.disable()
        _write(tmp, dump())
        code = 0
    finally:
        os._exit(code)


class CompositeSaver:
    """Loads the durable composite state at start, snapshots it (see the module docstring),
    and takes the last snapshot at a graceful stop."""

    def __init__(self, comps: Composites, store: Store, path: str) -> None:
        self.comps = comps
        self.store = store
        self.path = path
        self.fork = hasattr(os, "fork")
        self.snapshots = 0  # snapshots installed
        self.pause = 0.0  # seconds the event loop stopped for the last one (fork or dump)
        self.took = 0.0  # seconds from its start to the file written
        self._task: asyncio.Task[None] | None = None
        self._current: asyncio.Task[bool] | None = None

    async def load(self, keep: Callable[[str], bool]) -> int:
        """Restore the snapshot and replay the journal rows after it (before any client
        connects); a snapshot follows when rows were replayed.  Returns the subscribers."""
        raw = await asyncio.to_thread(_read_file, self.path)
        rows = await asyncio.to_thread(self.store.composite_journal, 0)
        comps = self.comps
        try:
            n = comps.load(raw, rows, keep)
        except (ValueError, KeyError, TypeError, IndexError):
            log.exception(
                "composite snapshot %s and journal not restored", self.path, extra=fields("store.failed")
            )
            if raw is not None:
                await asyncio.to_thread(os.replace, self.path, self.path + ".bad")
            comps.log.seq = max((int(r[0]) for r in rows), default=0)
            comps.log.rows = len(rows)
            n = 0
        else:
            log.info(
                "composite snapshot %s: %d composite subscriptions restored (%d journal rows replayed)",
                self.path,
                n,
                comps.log.replayed,
            )
        if comps.log.rows:
            await self.snapshot(fork=False)  # nothing to pause yet
        self._task = asyncio.create_task(self._every())
        return n

    def due(self) -> bool:
        log_ = self.comps.log
        return log_.rows >= max(COMPOSITE_COMPACT_ROWS, len(log_.keys))

    async def _every(self) -> None:
        while True:
            await asyncio.sleep(COMPOSITE_SNAPSHOT_INTERVAL)
            if self.due():
                self._current = asyncio.create_task(self.snapshot())
                await asyncio.shield(self._current)
                self._current = None

    async def snapshot(self, fork: bool | None = None) -> bool:
        """Write a snapshot (in a forked child unless ``fork`` is False), install it once the
        journal rows it includes are committed, and trim those rows.  False on failure
        (logged; the journal stays whole)."""
        log_ = self.comps.log
        log_.flush()  # the pending QoS 0 offers are in the state the snapshot takes
        seq, rows = log_.seq, log_.rows
        tmp = self.path + ".tmp"
        t0 = time.perf_counter()
        try:
            pid = 0
            if self.fork if fork is None else fork:
                try:
                    pid = _fork_dump(self.comps.dump, tmp)
                except OSError:
                    log.exception("composite snapshot: fork failed, snapshot on the event loop")
                    self.fork = False
            if pid:
                self.pause = time.perf_counter() - t0
                if not await asyncio.to_thread(_wait, pid):
                    log.error("composite snapshot %s: the child process failed", tmp)
                    return False
            else:
                data = self.comps.dump()
                self.pause = time.perf_counter() - t0
                await asyncio.to_thread(_write, tmp, data)
            self.took = time.perf_counter() - t0
            await self.store.durable()  # every journal row up to seq is committed
            await asyncio.to_thread(_install, tmp, self.path)
            self.store.composite_trim(seq)
        except (OSError, StoreError):
            log.exception("composite snapshot %s not written", self.path, extra=fields("store.failed"))
            return False
        log_.rows -= rows
        self.snapshots += 1
        log.debug(
            "composite snapshot %s: up to journal row %d, event loop paused %.1f ms, %.2f s in all",
            self.path,
            seq,
            self.pause * 1e3,
            self.took,
        )
        return True

    async def close(self) -> None:
        """Graceful stop (the store still open): the snapshot under way ends, a last one is
        taken on the event loop if the journal has rows."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._current is not None:
            await self._current
            self._current = None
        if self.comps.log.rows:
            await self.snapshot(fork=False)
