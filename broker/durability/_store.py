"""Durable broker state in SQLite (issue 7, item 1): sessions, entries, QoS 1/2 messages, retained.

Design
------
One SQLite database file (``<data-dir>/broker.db``, or ``":memory:"`` for tests) in WAL mode
holds everything a restarted broker needs to rebuild its state:

* ``sessions``: client id, protocol level, session expiry interval, the wall-clock time the
  network connection ended (NULL while connected), user name, next packet id, and the will
  (topic, payload, QoS, retain, properties, wall-clock due time of a delayed will).
* ``entries``: each client's ordered list of MQTT subscriptions (with every option of
  :class:`broker.values.SubOptions`) and negative entries (docs/reference.md, "Negative entries
  inside the MQTT broker"; seed 002, the IBM patent, Fig. 4), in the client's order, exactly
  as :meth:`topics.SubscriptionIndex.entries` lists them.
* ``outgoing``: QoS 1/2 messages on their way to a client: queued (no packet id), PUBLISH
  sent, or PUBREC received (PUBREL sent); ordered by a store-wide sequence number.
* ``qos2_in``: packet ids of incoming QoS 2 PUBLISHes awaiting PUBREL (method A, MQTT 5
  section 4.3.3: the message was routed, only the id is remembered).
* ``retained``: topic -> retained message (properties, wall-clock expiry); ``bans``: the admin
  API's bans (kind, value, wall-clock expiry, reason; ``broker/core/_bans.py``).
* ``schema_version``: one row; :data:`MIGRATIONS` upgrades older files step by step and a
  file written by a newer siftmq is refused with :class:`StoreVersionError`.

Times: stored deadlines are wall-clock (``time.time()``; the core's ``time.monotonic()`` does
not survive a restart); :func:`message_record` and :meth:`MessageRecord.to_message` convert.

Group commit
------------
Mutations never touch the database on the caller's thread: each appends one operation to a
queue; a writer thread runs everything queued in ONE transaction (more past ``max_batch``).
:meth:`Store.sync` returns a :class:`concurrent.futures.Future` that completes when every
operation submitted before the call is committed (all callers between two commits share one
future, so a commit costs one wake-up, not one per waiter), so the
broker sends PUBACK/PUBREC from the future's callback (``loop.call_soon_threadsafe``) or
after ``await Store.durable()``.  Under load, many publishes share one commit (one fsync): more
throughput, each acknowledgement still waits for its own data (docs/performance-store.md).

Operations wait in a list (``Store._ops``) that the writer swaps out whole under a lock, one
round at a time.  While a message's ``outgoing`` insert is still in that list, the later
operations on the same row are applied to it in place: sent (packet id) and PUBREC change
its state; PUBACK/PUBCOMP and discarding it cancel it.  A QoS 1 message to a persisted
subscriber that is acknowledged before the writer's next round (the usual case: a round
lasts one commit, an fsync) never reaches SQLite, and its row is never even built.  Two
dictionaries, (client, seq) and (client, packet id) -> index in the list, find the insert in
O(1); both are replaced at the swap, so they only ever point into the current list.  The
core reuses a packet id only after its completion was written or cancelled, and a sequence
number never, so neither key can name an older row while its insert is pending.  One case
cannot be applied in place: a queued insert that is sent with a packet id whose previous row's
DELETE was queued after the insert (the id was freed meanwhile) — moving the id to the insert's
place would put it before that DELETE; such a "sent" is queued as an update instead (the set
``_freed``, replaced at the swap like the dictionaries).

The writer builds the rows of a round, then *seals* it (under ``_sync_lock``, inside the
connection lock its first transaction takes: no acquisition of its own; a round with nothing
to write takes none): until then an insert it took can still be cancelled by the event loop
(``_taken_seq``, ``_taken_pid``: the dictionaries of the round it took, kept until the seal),
so a delivery acknowledged while the writer builds the round's rows (which it does holding the
GIL, in turns with the event loop) is not written either; after the seal, its DELETE is queued.

One statement per table and round
---------------------------------
A round's consecutive operations of one kind are written by ONE statement (per 1,024 rows),
not one ``executemany`` step per row: ``sqlite3`` releases the GIL around every step and the
writer must take it back from a busy event loop each time (up to the 5 ms switch interval),
so a round of 1,000 rows could wait seconds for the GIL.  Each such operation has a TEMP view
with an ``INSTEAD OF INSERT`` trigger whose body is the operation's statement (``_bulk_schema``);
``INSERT INTO bulk_<op> VALUES (...), (...)`` runs that statement once per row, in order,
inside SQLite (same semantics as the ``executemany``, every statement still hits its primary
key or index: a row-value ``IN (VALUES ...)`` would use the first column of the key only).
Inserts need no trigger: ``INSERT INTO t SELECT ... FROM (VALUES (...), (...))``.  The row
count is padded up to a power of two with NULL rows that the trigger's ``WHEN`` (or the
insert's ``WHERE``) skips, so at most 11 statements per operation are ever prepared (and
cached).
Measured against ``executemany``, plain multi-row ``VALUES`` deletes and ``json_each`` in
docs/persistence.md, "One statement per table and round" (``bench_store.py --statements``).

``commit_delay`` (``store_commit_delay``, 2 ms; PostgreSQL's ``commit_delay``, MySQL's
``binlog_group_commit_sync_delay``): a writer that wakes while deliveries to persisted sessions
are pending waits that long, so that subscribers that keep up acknowledge (cancel) them first;
an acknowledgement waiting for this commit waits that much longer, other rounds start at once.

Durability: ``PRAGMA synchronous=FULL`` by default.  In WAL mode ``NORMAL`` only syncs at
checkpoints: a commit survives ``kill -9`` (the WAL pages are in the page cache), not a power
loss; ``FULL`` fsyncs the WAL at each commit ("an acknowledged QoS 1/2 message is durable
before its PUBACK/PUBREC leaves"), once per batch with group commit.  ``synchronous="NORMAL"``
is for deployments that accept losing the last commits on power loss.

A full disk
-----------
A failed commit (``SQLITE_FULL``, an I/O error) loses nothing and fails its round's signal
(nothing that needs the store is acknowledged); the writer keeps its operations and retries
them with back-off until a commit succeeds, so the store recovers without a restart
(:meth:`Store._run`).  Logged once per episode (the cause, then the recovery) and counted
(:attr:`Store.failures`, ``failed_commits``, ``recoveries``; docs/persistence.md).

Complexity: each operation is O(log n) in SQLite's B-trees (primary keys cover every update
and delete); :meth:`Store.load` is O(size of the database).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from itertools import chain, groupby
from operator import itemgetter
from pathlib import Path
from typing import Any, Protocol

from broker._files import open_private, private_dir, tighten
from broker._logging import fields
from broker.durability._records import (
    DB_NAME,
    EntryRecord,
    LoadedState,
    MessageRecord,
    OutgoingRecord,
    SessionRecord,
    StoreClosed,
    StoreError,
    decode_properties,
    encode_properties,
    outgoing_of_row,
    session_of_row,
)
from broker.durability._schema import MIGRATIONS, SCHEMA_VERSION, SQL, migrate, rollback
from broker.packets import Will
from broker.values import PUBLISH_SENT, PUBREL_SENT, Message, SubOptions

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Store", "migrate"]

log = logging.getLogger("broker")

# ---------------------------------------------------------------------------- operations
_SQL = SQL  # the statements by operation name (tests replay operations with it)
_Op = tuple[str, Any]  # (name in _SQL, its parameters; a _Row for "outgoing")
_WAKE = 1  # the writer's token: a round is due (at most one outstanding: Store._wake_sent)
_STOP = 0  # the writer's token from close(): a last round, then stop


#: operations written through a TEMP view, one statement per round (module doc): every one
#: whose first parameter is never NULL (the trigger skips the NULL rows that pad a statement)
_BULK = (
    "session",
    "disconnected",
    "expiry",
    "del_session",
    "del_entries",
    "del_outgoing",
    "del_qos2",
    "entry",
    "outgoing",
    "sent",
    "pubrec",
    "acked",
    "dropped",
    "qos2_add",
    "qos2_del",
    "retain",
    "unretain",
)
_BULK_MAX = 1024  # rows per statement at most (fewer where SQLite's variable limit asks: _bulk_rows)


#: ``sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER`` (SQLite's C constant; sqlite3 is imported when a
#: store opens, not with this module)
_LIMIT_VARIABLE_NUMBER = 9


def _bulk_rows(cols: int, variable_limit: int) -> int:
    """Rows per bulk statement of an operation of ``cols`` parameters: a power of two up to
    :data:`_BULK_MAX` whose parameters fit ``variable_limit`` (SQLITE_LIMIT_VARIABLE_NUMBER:
    32,766 since SQLite 3.32, 999 before, which 1,024 rows x 16 parameters of "outgoing" went
    far past: every round failed, for good). O(1)."""
    fit = max(1, min(_BULK_MAX, variable_limit // cols))
    return 1 << (fit.bit_length() - 1)


def _bulk_schema(name: str, sql: str) -> list[str]:
    """The TEMP view ``bulk_<name>`` and its ``INSTEAD OF INSERT`` trigger, which runs ``sql``
    (the operation's statement, its ``?`` replaced by the row's columns in order) for each
    inserted row whose first column is not NULL.  O(len(sql))."""
    n = sql.count("?")
    cols = [f"p{i}" for i in range(1, n + 1)]
    parts = sql.split("?")
    body = parts[0] + "".join(f"NEW.{c}{rest}" for c, rest in zip(cols, parts[1:], strict=True))
    return [
        f"CREATE TEMP VIEW bulk_{name}({', '.join(cols)}) AS SELECT {', '.join(['NULL'] * n)}",
        f"CREATE TEMP TRIGGER bulk_{name}_write INSTEAD OF INSERT ON bulk_{name} "
        f"WHEN NEW.p1 IS NOT NULL BEGIN {body}; END",
    ]


def _bulk_statement(name: str, size: int) -> str:
    """The statement writing ``size`` rows of operation ``name`` (NULL rows skipped): an
    ``INSERT ... VALUES`` operation becomes ``INSERT ... SELECT <its columns> FROM (VALUES
    (..), ...) WHERE column1 IS NOT NULL`` (rows in order), any other an insert into its TEMP
    view.  O(size)."""
    sql = SQL[name]
    one = "(" + ",".join("?" * _BULK_COLS[name]) + ")"
    rows = ",".join([one] * size)
    head, values, template = sql.partition(" VALUES ")
    if not (values and head.startswith("INSERT")):
        return f"INSERT INTO bulk_{name} VALUES {rows}"
    k = 0
    cols = []
    for item in template.strip().removeprefix("(").removesuffix(")").split(","):
        if item.strip() == "?":
            k += 1
            cols.append(f"column{k}")
        else:
            cols.append(item)  # a literal of the statement
    return f"{head} SELECT {','.join(cols)} FROM (VALUES {rows}) WHERE column1 IS NOT NULL"


_BULK_SCHEMA = [
    stmt for name in _BULK if not SQL[name].startswith("INSERT") for stmt in _bulk_schema(name, SQL[name])
]
_BULK_COLS = {name: SQL[name].count("?") for name in _BULK}  # parameters per row
#: the bulk statements by (operation, rows): :func:`_bulk_statement`
_BULK_SQL: dict[tuple[str, int], str] = {}


def _batches(ops: list[_Op], max_batch: int) -> list[list[_Op]]:
    """``ops`` cut into transactions of about ``max_batch`` operations, never between a
    ``composite`` row and the ``writes`` operations queued just before it (the messages of the
    composite events its offer produced, docs/composite.md "What persists": the consumption
    and the events it delivered commit together).  ``writes`` counts mutating calls, so when
    some were applied in place or cancelled (``Store.complete``) the span reaches further back
    than needed, which only makes a transaction longer.  O(len(ops))."""
    if len(ops) <= max_batch:
        return [ops] if ops else []
    n = len(ops)
    # reach[i]: the earliest operation a composite row at or after i must commit with
    reach = list(range(n + 1))
    for i, (name, args) in enumerate(ops):
        if name == "composite" and args[7]:
            reach[i] = min(reach[i], i - args[7])
    for i in range(n - 1, -1, -1):
        reach[i] = min(reach[i], reach[i + 1])
    out: list[list[_Op]] = []
    lo = 0
    while lo < n:
        hi = min(lo + max_batch, n)
        while reach[hi] < hi:  # a cut before hi would split a composite row from its writes
            hi += 1
        out.append(ops[lo:hi])
        lo = hi
    return out


class Delivery(Protocol):
    """What :meth:`Store.add_delivery` reads of a broker ``Outgoing`` (none of it may change
    after the call: the writer thread reads it later)."""

    @property
    def msg(self) -> Message: ...
    @property
    def qos(self) -> int: ...
    @property
    def retain(self) -> bool: ...
    @property
    def sub_ids(self) -> tuple[int, ...]: ...
    @property
    def topic_filter(self) -> str: ...
    @property
    def selector(self) -> str | None: ...


class _Row:
    """An ``outgoing`` insert the writer has not taken yet: the event loop may still move it
    to a later state (:meth:`Store.mark_sent`, :meth:`Store.mark_pubrec`) or cancel it
    (:meth:`Store.complete`, :meth:`Store.drop_outgoing`) in place; the writer builds its
    row only if it survives until taken (from ``record``, or from the delivery ``out``)."""

    __slots__ = ("client_id", "expires_at", "out", "pid", "record", "seq", "state")

    def __init__(  # noqa: PLR0917
        self,
        record: OutgoingRecord | None,
        client_id: str,
        seq: int,
        state: int,
        pid: int | None,
        out: Delivery | None = None,
        expires_at: float | None = None,
    ) -> None:
        self.record = record
        self.client_id = client_id
        self.seq = seq
        self.state = state
        self.pid = pid
        self.out = out
        self.expires_at = expires_at  # wall clock, computed at the call

    def row(self) -> tuple[Any, ...]:
        """The ``outgoing`` row (on the writer thread)."""
        if self.record is not None:
            return _outgoing_row(self.record, self.state, self.pid)
        out = self.out
        assert out is not None
        return _message_row(self.client_id, self.seq, self.state, self.pid, out.msg, self.expires_at, out)


def _will_row(will: Will | None, due: float | None) -> tuple[Any, ...]:
    if will is None:
        return (None, None, None, None, None, None)
    return (will.topic, will.payload, will.qos, int(will.retain), encode_properties(will.properties), due)


def _entry_row(client_id: str, seq: int, e: EntryRecord) -> tuple[Any, ...]:
    o = e.options
    if o is None:
        return (client_id, e.topic_filter, seq, 0, None, None, None, None, None, None, None)
    return (
        client_id,
        e.topic_filter,
        seq,
        1,
        o.qos,
        int(o.no_local),
        int(o.retain_as_published),
        o.retain_handling,
        o.subscription_id,
        o.selector,
        o.topic_filter,
    )


def _outgoing_row(r: OutgoingRecord, state: int | None = None, pid: int | None = None) -> tuple[Any, ...]:
    """The ``outgoing`` row of ``r`` (with ``state`` and ``pid`` instead of its own when given)."""
    if state is None:
        state, pid = int(r.state), r.packet_id
    return _message_row(r.client_id, r.seq, state, pid, r.message, r.message.expires_at, r)


def _message_row(  # noqa: PLR0917
    client_id: str,
    seq: int,
    state: int,
    pid: int | None,
    m: MessageRecord | Message,
    expires_at: float | None,
    d: OutgoingRecord | Delivery,
) -> tuple[Any, ...]:
    """An ``outgoing`` row: message ``m`` (stored or the broker's; ``expires_at`` wall clock)
    delivered as ``d`` says (QoS, RETAIN flag, subscription ids, filter, selector)."""
    return (
        client_id,
        seq,
        state,
        pid,
        m.topic,
        m.payload,
        m.qos,
        int(m.retain),
        encode_properties(m.properties),
        m.publisher_id,
        expires_at,
        d.qos,
        int(d.retain),
        ",".join(map(str, d.sub_ids)) if d.sub_ids else None,
        d.topic_filter,
        d.selector,
    )


class Store:
    """The SQLite store of one broker; see the module docstring.

    ``Store(path)`` opens (creating and migrating) the database; mutations are queued to
    the writer thread (O(1) on the caller's thread, thread-safe); :meth:`sync` /
    :meth:`durable` / :meth:`when_durable` signal their commit; :meth:`close` commits what
    is queued and stops the writer (operations queued by a store never closed are lost, and
    were never signalled durable).  ``path`` ``":memory:"`` keeps everything in memory
    (tests).  Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "FULL",
        max_batch: int = 10_000,
        max_backlog: int = 100_000,
        commit_delay: float = 0.0,
        migrations: Sequence[str] = MIGRATIONS,
        retry_min: float = 0.1,
        retry_max: float = 2.0,
    ) -> None:
        if synchronous.upper() not in {"FULL", "NORMAL", "EXTRA"}:
            raise ValueError(f"synchronous must be FULL, NORMAL or EXTRA, not {synchronous!r}")
        self.path = str(path)
        self.max_batch = max_batch
        if self.path != ":memory:":  # private whatever the umask (broker/_files.py)
            parent = private_dir(Path(self.path).parent)
            tighten(parent, *(self.path + x for x in ("", "-wal", "-shm")), recursive=False)
            # created here, 0600: SQLite gives -wal and -shm the database file's mode
            os.close(open_private(self.path, os.O_RDWR))
        import sqlite3

        # cached_statements: the bulk statements, 11 sizes per operation (module doc)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, cached_statements=512)
        try:
            if self.path != ":memory:":
                mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise StoreError(f"{self.path}: WAL journal mode unavailable ({mode})")
            db.execute(f"PRAGMA synchronous={synchronous.upper()}")
            db.execute("PRAGMA foreign_keys=OFF")
            self.migrated_from = migrate(db, migrations)
            for stmt in _BULK_SCHEMA:  # TEMP: per connection, nothing in the file (no migration)
                db.execute(stmt)
        except BaseException:
            db.close()
            raise
        self._db = db
        self._lock = threading.Lock()  # the connection: writer thread vs load/sweep callers
        # the writer's tokens: one _WAKE when a round is due (the list went non-empty, or a
        # sync() needs one), _STOP at close
        self._tokens: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._closed = False
        # guards _ops, _by_seq, _by_pid, _next, _wake_sent: the event loop's writes vs the
        # writer's swap. sync() hands out the future of the writer's next round: every waiter
        # between two commits shares it (one future and one wake-up per commit, not per waiter).
        self._sync_lock = threading.Lock()
        self._ops: list[_Op | None] = []  # not yet taken; None = cancelled in place
        self._by_seq: dict[tuple[str, int], int] = {}  # queued insert -> index in _ops
        self._by_pid: dict[tuple[str, int], int] = {}  # insert with a packet id -> index
        # packet ids whose DELETE ("acked") is in _ops: an insert before it must not take one
        self._freed: set[tuple[str, int]] = set()
        # the round the writer took and has not sealed yet: its inserts are still cancellable
        self._taken: list[_Op | None] = []
        self._taken_seq: dict[tuple[str, int], int] = {}
        self._taken_pid: dict[tuple[str, int], int] = {}
        self._next: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._wake_sent = False
        self._async_waiter: (
            tuple[concurrent.futures.Future[None], asyncio.AbstractEventLoop, asyncio.Future[None]] | None
        ) = None
        self._failure: BaseException | None = None  # the last failed commit's error, until one succeeds
        #: operations of failed commits, in order, retried ahead of newer ones (``_commit``)
        self._pending: list[_Op] = []
        self._retry_at = 0.0  # monotonic time of the next retry while failed
        self._retry_delay = 0.0
        self._failed_since = 0.0
        self._failed_before = 0  # failed_commits before the current episode
        #: back-off between retries of a failed commit (seconds; doubles up to ``retry_max``)
        self.retry_min = retry_min
        self.retry_max = retry_max
        self.failures = 0  # episodes: a commit failed after one succeeded (or at start)
        self.failed_commits = 0  # commits that failed, retries included
        self.recoveries = 0  # episodes ended by a successful commit
        #: a new, increasing sequence number for an :class:`OutgoingRecord` per call
        #: (``itertools.count``: atomic under the GIL, so thread-safe, and no Python frame)
        self.next_seq: Callable[[], int] = itertools.count(self._max_seq() + 1).__next__
        self.commits = 0  # transactions committed by the writer
        self.operations = 0  # operations written
        self.submitted = 0  # mutating calls (the broker compares it to see if it wrote)
        self.taken = 0  # operations the writer took (cancelled ones included)
        self.cancelled = 0  # inserts cancelled before the writer wrote them (late ones included)
        self.cancelled_late = 0  # of which cancelled after the writer took their round
        self.inserts = 0  # ``outgoing`` inserts written
        #: seconds the writer waits before taking a round while deliveries to persisted
        #: sessions are pending (their acknowledgements may still cancel them); 0 = never
        self.commit_delay = commit_delay
        #: operations queued and not yet taken above which the broker stops reading the
        #: publishers that write (``backlog``; the queue itself never refuses a write)
        self.max_backlog = max_backlog
        self._writer = threading.Thread(target=self._run, name="siftmq-store", daemon=True)
        self._writer.start()

    @classmethod
    def in_data_dir(cls, data_dir: str | Path, **kw: Any) -> Store:
        """``Store(data_dir / "broker.db")``: the ``siftmq serve --data-dir`` convention."""
        return cls(Path(data_dir) / DB_NAME, **kw)

    def _max_seq(self) -> int:
        row = self._db.execute("SELECT MAX(seq) FROM outgoing").fetchone()
        return int(row[0] or 0)

    # ------------------------------------------------------------------ writer
    def _put(self, name: str, args: Any) -> int:
        """Append one operation (caller holds ``_sync_lock``); its index in ``_ops``."""
        if self._closed:
            raise StoreClosed("store is closed")
        self.submitted += 1
        ops = self._ops
        ops.append((name, args))
        if not self._wake_sent:  # the list was empty and the writer has no token
            self._wake_sent = True
            self._tokens.put(_WAKE)
        return len(ops) - 1

    def _op(self, name: str, args: tuple[Any, ...]) -> None:
        with self._sync_lock:
            self._put(name, args)

    def _take(self) -> tuple[concurrent.futures.Future[None], list[_Op | None], list[Any]]:
        """Writer: swap out the pending operations and the signal their commit resolves, and
        build the rows of their inserts; the round is sealed later (:meth:`_seal`: its inserts
        stay cancellable until then).  O(operations)."""
        with self._sync_lock:
            current = self._next
            self._next = concurrent.futures.Future()
            self._wake_sent = False
            taken = self._ops
            self._ops = []
            self._taken = taken  # its inserts stay cancellable until the seal
            self._taken_seq = self._by_seq
            self._taken_pid = self._by_pid
            self._by_seq = {}
            self._by_pid = {}
            self._freed = set()
        self.taken += len(taken)
        built: list[Any] = [None] * len(taken)
        for i, op in enumerate(taken):  # the event loop may cancel any of them meanwhile
            if op is not None and op[0] == "outgoing":
                row: _Row = op[1]
                built[i] = row.row()
        return current, taken, built

    def _seal(self, taken: list[_Op | None], built: list[Any]) -> list[_Op]:
        """Writer: end the cancellation of ``taken``'s inserts (an acknowledgement from now on
        queues its DELETE) and return the operations that stay, with their rows.  Called under
        the connection lock that the round's first transaction holds (:meth:`_commit`), right
        before its statements: a test holds that lock to act between the take and the seal,
        at no cost to the writer (no acquisition of its own).  O(operations)."""
        with self._sync_lock:
            self._taken = []
            self._taken_seq = {}
            self._taken_pid = {}
        ops: list[_Op] = []
        for i, op in enumerate(taken):
            if op is None:
                continue
            if op[0] == "outgoing":
                ops.append(("outgoing", built[i]))
            else:
                ops.append(op)
        return ops

    def _run(self) -> None:
        """Writer thread: wait for a token, take the operations and the signal, commit, signal.

        The swap happens under ``_sync_lock``; every operation put before a :meth:`sync`
        call that returned the swapped-out future is in the list at the swap, so it is
        committed now (in transactions of at most ``max_batch`` operations) before that
        future is resolved.

        A failed commit (the disk is full, ...) keeps its operations, in order, ahead of
        everything queued later (``_pending``) and fails the round's signal; the writer then
        retries the whole backlog after a back-off (``retry_min`` doubling up to
        ``retry_max``), and a round due before the retry fails its signal at once without
        touching the database.  The first commit that succeeds ends the failure: nothing was
        lost, the signals after it succeed again (module doc, "A full disk").
        """
        tokens = self._tokens
        delay = self.commit_delay
        stop = False
        while not stop:
            if self._pending:  # failed: retry at _retry_at even if no round is due before
                with contextlib.suppress(queue.Empty):
                    stop = tokens.get(timeout=max(0.0, self._retry_at - time.monotonic())) == _STOP
            else:
                stop = tokens.get() == _STOP
            if delay and not stop and (self._by_pid or self._by_seq):
                time.sleep(delay)  # let acknowledgements cancel the young inserts (module doc)
            current, taken, built = self._take()
            error: BaseException | None = None
            if self._pending and not stop and time.monotonic() < self._retry_at:  # in the back-off:
                self._pending.extend(self._seal(taken, built))  # refused, kept behind the failed ones
                error = self._failure
            else:
                error = self._commit(taken, built)
            if not current.set_running_or_notify_cancel():
                continue
            if error is None:
                current.set_result(None)
            else:
                current.set_exception(StoreError(f"commit failed: {error}"))

    def _commit(self, taken: list[_Op | None], built: list[Any]) -> BaseException | None:
        """Writer: seal the round (:meth:`_seal`) and commit its operations, behind those of
        failed commits (``_pending``), in transactions, each under the connection lock (the
        seal under the first one's); on a failure keep the operations from the failed
        transaction on in ``_pending`` and schedule the retry.  Returns the error."""
        if not taken and not self._pending:  # a round of no operation (a sync's): no seal, no lock
            return None
        db = self._db
        sql = SQL
        lock = self._lock
        lock.acquire()  # the first transaction's: the seal is made under it
        locked = True
        try:
            ops = self._seal(taken, built)
            if self._pending:
                self._pending.extend(ops)  # behind the failed ones, in order (O(new ops))
                ops = self._pending
            batches = _batches(ops, self.max_batch)
            for k, batch in enumerate(batches):
                try:
                    if not locked:
                        lock.acquire()
                        locked = True
                    rollback(db)  # a failed ROLLBACK may have left one open
                    db.execute("BEGIN")
                    try:
                        for name, group in groupby(batch, itemgetter(0)):
                            rows = [args for _, args in group]
                            if len(rows) > 1 and name in _BULK_COLS:
                                self._bulk(name, rows)
                            else:
                                db.executemany(sql[name], rows)
                        db.execute("COMMIT")
                    except BaseException:
                        rollback(db)  # not a bare ROLLBACK: it would hide the real cause
                        raise
                    finally:
                        lock.release()
                        locked = False
                    self.commits += 1
                    self.operations += len(batch)
                    self.inserts += sum(1 for op in batch if op[0] == "outgoing")
                except BaseException as exc:  # the disk is full, the file vanished, ...
                    self._pending = [op for b in batches[k:] for op in b]
                    self._failed_commit(exc)
                    return exc
        finally:
            if locked:  # nothing to write (every operation cancelled), or the seal raised
                lock.release()
        self._pending = []
        if self._failure is not None:
            self._recovered()
        return None

    def _bulk(self, name: str, rows: list[Any]) -> None:
        """Writer (holding the connection in a transaction): ``rows`` of operation ``name`` in
        one statement (:func:`_bulk_statement`) per :func:`_bulk_rows` rows, padded with NULL
        rows to a power of two (module doc, "One statement per table and round").  O(len(rows))."""
        db = self._db
        ncols = _BULK_COLS[name]
        step = _bulk_rows(ncols, db.getlimit(_LIMIT_VARIABLE_NUMBER))
        for lo in range(0, len(rows), step):
            chunk = rows[lo : lo + step]
            n = len(chunk)
            size = 1 << (n - 1).bit_length()
            stmt = _BULK_SQL.get((name, size))
            if stmt is None:
                stmt = _BULK_SQL[name, size] = _bulk_statement(name, size)
            params = list(chain.from_iterable(chunk))
            if size > n:
                params.extend([None] * ((size - n) * ncols))
            db.execute(stmt, params)

    def _failed_commit(self, exc: BaseException) -> None:
        """Writer: a commit failed; count it, log the first of an episode, back off."""
        self.failed_commits += 1
        now = time.monotonic()
        if self._failure is None:
            self.failures += 1
            self._failed_since = now
            self._failed_before = self.failed_commits - 1
            self._retry_delay = self.retry_min
            log.error(
                "persistent store failed (%s: commit failed: %s): QoS 1/2 messages that must be "
                "stored are not acknowledged (the broker disconnects their publishers, 0x80); "
                "its writes are kept and retried every %g..%g s, it recovers by itself once the "
                "cause is gone (no restart needed)",
                self.path,
                exc,
                self.retry_min,
                self.retry_max,
                extra=fields("store.failed", reason=str(exc)),
            )
        else:
            self._retry_delay = min(self._retry_delay * 2, self.retry_max)
        self._failure = exc
        self._retry_at = now + self._retry_delay

    def _recovered(self) -> None:
        """Writer: the first commit after a failure succeeded."""
        self.recoveries += 1
        log.warning(
            "persistent store recovered (%s, after %.1f s, %d failed commits): writes and "
            "acknowledgements resume",
            self.path,
            time.monotonic() - self._failed_since,
            self.failed_commits - self._failed_before,
            extra=fields("store.recovered"),
        )
        self._failure = None

    @property
    def failed(self) -> bool:
        """A commit failed and no later one succeeded yet (the writer is retrying)."""
        return self._failure is not None

    @property
    def backlog(self) -> int:
        """Operations waiting for the writer's next round (cancelled ones included)."""
        return len(self._ops)

    def sync(self) -> concurrent.futures.Future[None]:
        """A future done when every operation submitted so far is committed (durable).

        All callers between two commits share one future (the writer resolves it after the
        next commit): do not cancel it.  Fails with :class:`StoreError` if a commit failed
        (the store then refuses further commits: the broker should stop acknowledging).
        """
        if self._closed:
            closed: concurrent.futures.Future[None] = concurrent.futures.Future()
            closed.set_exception(StoreClosed("store is closed"))
            return closed
        with self._sync_lock:
            if not self._wake_sent:  # the writer may be idle: make sure a round follows
                self._wake_sent = True
                self._tokens.put(_WAKE)
            return self._next

    def when_durable(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once everything submitted so far is committed.

        It runs on the writer thread (or at once on the caller's thread when nothing is
        pending); for asyncio pass ``lambda: loop.call_soon_threadsafe(send_ack)``.  A failed
        commit never calls it (:meth:`sync`'s future carries the error).
        """
        fut = self.sync()
        fut.add_done_callback(lambda f: None if f.exception() else callback())

    async def durable(self) -> None:
        """``await store.durable()``: everything submitted so far is committed.

        Waiters of one signal share one asyncio future (one thread-safe wake-up per commit,
        not per waiter); ``shield`` keeps a cancelled waiter from cancelling the others.
        """
        fut = self.sync()
        loop = asyncio.get_running_loop()
        shared = self._async_waiter
        if shared is None or shared[0] is not fut or shared[1] is not loop:
            shared = self._async_waiter = (fut, loop, asyncio.wrap_future(fut, loop=loop))
        await asyncio.shield(shared[2])

    def close(self) -> None:
        """Commit everything queued, stop the writer and close the database (idempotent)."""
        if self._closed:
            return
        import sqlite3  # already imported by __init__ (opening the database)

        with self._sync_lock:
            self._closed = True
        self._tokens.put(_STOP)
        self._writer.join()
        with self._lock:
            if self.path != ":memory:" and self._failure is None:
                try:  # committed rows are safe in the WAL if this fails (e.g. the disk is full)
                    self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                except sqlite3.OperationalError as exc:
                    log.warning("persistent store %s: WAL kept for the next start: %s", self.path, exc)
            self._db.close()
        if self._pending:  # the last attempt failed too
            log.warning(
                "persistent store %s closed while failed: %d operations were never committed "
                "(nothing that needed them was acknowledged)",
                self.path,
                len(self._pending),
                extra=fields("store.failed", reason="closed while failed"),
            )

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ sessions
    def put_session(self, s: SessionRecord) -> None:
        """Create or replace the session row (CONNECT; entries and messages are untouched)."""
        self._op(
            "session",
            (
                s.client_id,
                s.protocol_level,
                s.expiry_interval,
                s.disconnected_at,
                s.username,
                s.next_pid,
                *_will_row(s.will, s.will_due),
            ),
        )

    def session_disconnected(
        self, client_id: str, at: float, next_pid: int = 1, will_due: float | None = None
    ) -> None:
        """The network connection ended at wall-clock ``at`` (expiry starts; will delay due)."""
        self._op("disconnected", (at, will_due, next_pid, client_id))

    def set_will(self, client_id: str, will: Will | None, due: float | None = None) -> None:
        """Replace the will (None: published or cancelled)."""
        self._op("will", (*_will_row(will, due), client_id))

    def set_expiry(self, client_id: str, expiry_interval: int) -> None:
        """A DISCONNECT changed the Session Expiry Interval."""
        self._op("expiry", (expiry_interval, client_id))

    def delete_session(self, client_id: str) -> None:
        """The session ended: its row, entries, messages and QoS 2 ids go."""
        for op in ("del_session", "del_entries", "del_outgoing", "del_qos2"):
            self._op(op, (client_id,))

    # ------------------------------------------------------------------ entries
    def put_entries(self, client_id: str, entries: Sequence[EntryRecord]) -> None:
        """Replace the client's whole entry list (oldest first) with ``entries``.

        One SUBSCRIBE/UNSUBSCRIBE may reorder, add and remove several entries (replaced
        filters become newest, included negative entries go), so the simplest exact record
        is the list :meth:`topics.SubscriptionIndex.entries` returns after the packet:
        O(entries of that client) per SUBSCRIBE/UNSUBSCRIBE packet.
        """
        self._op("del_entries", (client_id,))
        for i, e in enumerate(entries):
            self._op("entry", _entry_row(client_id, i, e))

    # ------------------------------------------------------------------ messages
    def add_outgoing(self, r: OutgoingRecord) -> None:
        """A QoS 1/2 delivery was queued or sent (``r.state`` says which). O(1)."""
        self._add(_Row(r, r.client_id, r.seq, int(r.state), r.packet_id))

    def add_delivery(  # noqa: PLR0917
        self,
        client_id: str,
        seq: int,
        state: int,
        pid: int | None,
        out: Delivery,
        now: float,
        wall: float | None = None,
    ) -> None:
        """:meth:`add_outgoing` of the broker's delivery ``out`` (``now`` monotonic, ``wall``
        the wall clock at the same moment): the row is built on the writer thread, and only
        if the insert is not cancelled before the writer takes it.  O(1)."""
        exp = out.msg.expires_at
        if exp is not None:
            exp = (time.time() if wall is None else wall) + (exp - now)
        self._add(_Row(None, client_id, seq, state, pid, out, exp))

    def _add(self, row: _Row) -> None:
        with self._sync_lock:
            i = self._put("outgoing", row)
            if row.pid is None:
                self._by_seq[row.client_id, row.seq] = i
            else:
                self._by_pid[row.client_id, row.pid] = i

    def mark_sent(self, client_id: str, seq: int, packet_id: int) -> None:
        """A queued message left the queue as PUBLISH with ``packet_id``. O(1).

        Applied in place unless the DELETE of an older row with the same packet id was queued
        after the insert (the insert would then come first, with that id: the DELETE would
        hit the new row, and the unique index would refuse the insert).
        """
        with self._sync_lock:
            key = (client_id, packet_id)
            i = None if key in self._freed else self._by_seq.pop((client_id, seq), None)
            if i is None:
                self._put("sent", (packet_id, client_id, seq))
                return
            self.submitted += 1
            row: _Row = self._ops[i][1]  # type: ignore[index]
            row.state = PUBLISH_SENT
            row.pid = packet_id
            self._by_pid[key] = i

    def mark_pubrec(self, client_id: str, packet_id: int) -> None:
        """PUBREC received for an outgoing QoS 2 message (PUBREL sent). O(1)."""
        with self._sync_lock:
            i = self._by_pid.get((client_id, packet_id))
            if i is None:
                self._put("pubrec", (client_id, packet_id))
                return
            self.submitted += 1
            row: _Row = self._ops[i][1]  # type: ignore[index]
            row.state = PUBREL_SENT

    def complete(self, client_id: str, packet_id: int) -> None:
        """PUBACK / PUBCOMP (or a failing PUBREC) ended the flow of ``packet_id``. O(1)."""
        self._end(False, client_id, packet_id, "acked")

    def drop_outgoing(self, client_id: str, seq: int) -> None:
        """A queued message was discarded (expired, queue overflow). O(1)."""
        self._end(True, client_id, seq, "dropped")

    def _end(self, queued: bool, client_id: str, key: int, name: str) -> None:
        """Delete a row: cancel its insert if still pending (found by seq if ``queued``, else
        by packet id), else queue the DELETE ``name``. O(1)."""
        with self._sync_lock:
            i = (self._by_seq if queued else self._by_pid).pop((client_id, key), None)
            if i is not None:
                self.submitted += 1
                self.cancelled += 1
                self._ops[i] = None
                return
            # taken by the writer, not sealed yet: still cancellable (module doc)
            i = (self._taken_seq if queued else self._taken_pid).pop((client_id, key), None)
            if i is not None:
                self.submitted += 1
                self.cancelled += 1
                self.cancelled_late += 1
                self._taken[i] = None
                return
            self._put(name, (client_id, key))
            if not queued:
                self._freed.add((client_id, key))

    def qos2_received(self, client_id: str, packet_id: int) -> None:
        """An incoming QoS 2 PUBLISH was accepted; its id awaits PUBREL."""
        self._op("qos2_add", (client_id, packet_id))

    def qos2_released(self, client_id: str, packet_id: int) -> None:
        """PUBREL for an incoming QoS 2 id."""
        self._op("qos2_del", (client_id, packet_id))

    # ------------------------------------------------------------------ retained
    def set_retained(self, m: MessageRecord) -> None:
        """Retain ``m`` at its topic (an empty payload deletes, as MQTT says)."""
        if not m.payload:
            self._op("unretain", (m.topic,))
            return
        self._op(
            "retain",
            (m.topic, m.payload, m.qos, encode_properties(m.properties), m.publisher_id, m.expires_at),
        )

    def delete_retained(self, topic: str) -> None:
        self._op("unretain", (topic,))

    def ban(self, kind: str, value: str, row: tuple[Any, ...] | None) -> None:
        """Store the ban row ``(kind, value, expires_at, reason, created_at)``, or lift it (None)."""
        self._op("ban", row) if row is not None else self._op("unban", (kind, value))

    def bans(self) -> list[tuple[Any, ...]]:
        """Every stored ban row (committed data; read at start). O(bans)."""
        self.sync().result()
        with self._lock:
            return self._db.execute("SELECT * FROM bans").fetchall()

    # ------------------------------------------------------------------ composite journal
    def composite_record(self, row: tuple[Any, ...]) -> None:
        """Append a row to the composite journal: ``(seq, kind, clock, topic, payload, qos,
        data, writes)``; ``writes``: the operations queued just before it that must commit
        in the same transaction (``_batches``).  The meaning of the other fields is the
        broker's (broker/core/_composite_log.py)."""
        self._put("composite", row)

    def composite_trim(self, seq: int) -> None:
        """Delete the composite journal rows up to ``seq`` (a snapshot holds them now)."""
        self._put("composite_trim", (seq,))

    def composite_journal(self, after: int = 0) -> list[tuple[Any, ...]]:
        """The composite journal rows above ``after``, in order (committed data: waits for
        queued operations).  Synchronous; O(rows)."""
        self.sync().result()
        with self._lock:
            return self._db.execute(
                "SELECT * FROM composite_journal WHERE seq > ? ORDER BY seq", (after,)
            ).fetchall()

    def composite_seq(self) -> int:
        """The largest sequence number in the composite journal (0 when empty)."""
        self.sync().result()
        with self._lock:
            row = self._db.execute("SELECT MAX(seq) FROM composite_journal").fetchone()
        return int(row[0] or 0)

    # ------------------------------------------------------------------ reading
    def load(self, wall: float | None = None) -> LoadedState:
        """Everything needed to rebuild the broker at start (call before accepting clients).

        Waits for queued operations, then deletes expired sessions and retained messages
        (``wall`` = now, ``time.time()`` by default).  Sessions still marked connected (the
        process died with them attached) are treated as disconnected ``wall``: the crash
        ended their network connection, and their expiry starts now.
        """
        wall = time.time() if wall is None else wall
        self.sync().result()
        expired = self.sweep(wall)
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            try:
                crashed = {
                    r[0] for r in db.execute("SELECT client_id FROM sessions WHERE disconnected_at IS NULL")
                }
                db.execute("UPDATE sessions SET disconnected_at = ? WHERE disconnected_at IS NULL", (wall,))
                sessions = {r.client_id: r for r in map(session_of_row, db.execute("SELECT * FROM sessions"))}
                entries: dict[str, list[EntryRecord]] = {}
                for row in db.execute(
                    "SELECT client_id, topic_filter, positive, qos, no_local, retain_as_published, "
                    "retain_handling, subscription_id, selector, plain_filter FROM entries "
                    "ORDER BY client_id, seq"
                ):
                    cid = row[0]
                    opts = (
                        SubOptions(row[3], bool(row[4]), bool(row[5]), row[6], row[7], row[8], row[9])
                        if row[2]
                        else None
                    )
                    entries.setdefault(cid, []).append(EntryRecord(row[1], opts))
                outgoing: dict[str, list[OutgoingRecord]] = {}
                for row in db.execute("SELECT * FROM outgoing ORDER BY client_id, seq"):
                    r = outgoing_of_row(row)
                    outgoing.setdefault(r.client_id, []).append(r)
                qos2: dict[str, set[int]] = {}
                for cid, pid in db.execute("SELECT client_id, packet_id FROM qos2_in"):
                    qos2.setdefault(cid, set()).add(pid)
                retained = {
                    row[0]: MessageRecord(
                        row[0], row[1], row[2], True, decode_properties(row[3]), row[4], row[5]
                    )
                    for row in db.execute("SELECT * FROM retained")
                }
                db.execute("COMMIT")
            except BaseException:
                rollback(db)
                raise
        return LoadedState(sessions, entries, outgoing, qos2, retained, expired, crashed)

    def sweep(self, wall: float | None = None) -> list[SessionRecord]:
        """Delete sessions whose expiry has passed and expired retained messages.

        Returns the deleted sessions (a will still attached to one is due: the broker
        publishes it).  Call at start (``load`` does) and periodically with a grace period
        (``sweep(time.time() - 60)``): the broker's own timers end sessions while it runs, the
        sweep only catches what they missed.  Synchronous (waits for queued operations and
        takes the connection lock: run it with ``asyncio.to_thread``); O(sessions).
        """
        wall = time.time() if wall is None else wall
        self.sync().result()
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                rows = db.execute(
                    "SELECT * FROM sessions WHERE disconnected_at IS NOT NULL "
                    "AND expiry_interval != 4294967295 AND disconnected_at + expiry_interval <= ?",
                    (wall,),
                ).fetchall()
                gone = [session_of_row(r) for r in rows]
                for s in gone:
                    for table in ("sessions", "entries", "outgoing", "qos2_in"):
                        db.execute(f"DELETE FROM {table} WHERE client_id = ?", (s.client_id,))
                db.execute("DELETE FROM retained WHERE expires_at IS NOT NULL AND expires_at <= ?", (wall,))
                db.execute("COMMIT")
            except BaseException:
                rollback(db)
                raise
        return gone

    def counts(self) -> dict[str, int]:
        """Rows per table (committed data; for tests, ``$SYS`` and the docs)."""
        self.sync().result()
        with self._lock:
            return {
                t: int(self._db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0])
                for t in ("sessions", "entries", "outgoing", "qos2_in", "retained")
            }

    def _check(self) -> None:
        """Invariants of the committed data (packet id iff not queued, ids in range, ordered entries)."""
        self.sync().result()
        with self._lock:
            db = self._db
            assert not db.execute(
                "SELECT 1 FROM outgoing WHERE (state = 0) != (packet_id IS NULL) "
                "OR packet_id < 1 OR packet_id > 65535 OR qos NOT IN (1, 2) "
                "OR (state = 2 AND qos != 2)"
            ).fetchall()
            assert not db.execute("SELECT 1 FROM entries WHERE positive = 0 AND qos IS NOT NULL").fetchall()
            assert not db.execute(
                "SELECT client_id FROM entries GROUP BY client_id HAVING COUNT(DISTINCT seq) != COUNT(*)"
            ).fetchall()
            assert not db.execute("SELECT 1 FROM qos2_in WHERE packet_id < 1 OR packet_id > 65535").fetchall()
