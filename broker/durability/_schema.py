"""The SQLite schema of the store, its migrations and the statement of each queued operation
(split from ``broker/durability/_store.py``; the tables are described in its docstring).

``MIGRATIONS[i]`` upgrades schema version ``i`` to ``i + 1``; :func:`migrate` applies them
one transaction per step and refuses a file written by a newer siftmq
(:class:`StoreVersionError`).  ``SQL`` maps an operation name of the store's writer queue to
its statement (every statement hits a primary key: O(log n)).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from broker.durability._records import StoreVersionError

if TYPE_CHECKING:  # imported by the store when it opens (issue 42 item 1: not without a store)
    import sqlite3

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "SQL", "migrate", "rollback"]

# ---------------------------------------------------------------------------- schema
_V1 = """
CREATE TABLE sessions (
    client_id TEXT PRIMARY KEY,
    protocol_level INTEGER NOT NULL,
    expiry_interval INTEGER NOT NULL,
    disconnected_at REAL,
    username TEXT,
    next_pid INTEGER NOT NULL DEFAULT 1,
    will_topic TEXT,
    will_payload BLOB,
    will_qos INTEGER,
    will_retain INTEGER,
    will_properties BLOB,
    will_due REAL
) WITHOUT ROWID;
CREATE TABLE entries (
    client_id TEXT NOT NULL,
    topic_filter TEXT NOT NULL,
    seq INTEGER NOT NULL,
    positive INTEGER NOT NULL,
    qos INTEGER,
    no_local INTEGER,
    retain_as_published INTEGER,
    retain_handling INTEGER,
    subscription_id INTEGER,
    selector TEXT,
    plain_filter TEXT,
    PRIMARY KEY (client_id, topic_filter)
) WITHOUT ROWID;
CREATE TABLE outgoing (
    client_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    direction INTEGER NOT NULL DEFAULT 0,
    state INTEGER NOT NULL,
    packet_id INTEGER,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    msg_qos INTEGER NOT NULL,
    msg_retain INTEGER NOT NULL,
    properties BLOB,
    publisher_id TEXT,
    expires_at REAL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    sub_ids TEXT,
    topic_filter TEXT NOT NULL,
    selector TEXT,
    PRIMARY KEY (client_id, seq)
) WITHOUT ROWID;
CREATE UNIQUE INDEX outgoing_pid ON outgoing (client_id, packet_id) WHERE packet_id IS NOT NULL;
CREATE TABLE qos2_in (
    client_id TEXT NOT NULL,
    packet_id INTEGER NOT NULL,
    PRIMARY KEY (client_id, packet_id)
) WITHOUT ROWID;
CREATE TABLE retained (
    topic TEXT PRIMARY KEY,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    properties BLOB,
    publisher_id TEXT,
    expires_at REAL
) WITHOUT ROWID;
"""

# the journal of the composite subscriptions of persisted sessions since their last snapshot
# (broker/core/_composite_log.py; docs/composite.md, "What persists"): one row per engine call
_V2 = """
CREATE TABLE composite_journal (
    seq INTEGER PRIMARY KEY,
    kind INTEGER NOT NULL,
    clock REAL,
    topic TEXT,
    payload BLOB,
    qos INTEGER,
    data TEXT,
    writes INTEGER NOT NULL DEFAULT 0
);
"""

# the admin API's bans (broker/core/_bans.py, docs/admin.md): kind is client_id, username or
# address (a canonical network), expires_at a wall-clock time (NULL: never)
_V3 = """
CREATE TABLE bans (
    kind TEXT NOT NULL,
    value TEXT NOT NULL,
    expires_at REAL,
    reason TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    PRIMARY KEY (kind, value)
) WITHOUT ROWID;
"""

#: ``MIGRATIONS[i]`` upgrades schema version ``i`` to ``i + 1`` (version 0 = empty file).
MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3)
SCHEMA_VERSION = len(MIGRATIONS)


def _schema_version(db: sqlite3.Connection) -> int:
    db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = db.execute("SELECT version FROM schema_version").fetchone()
    if row is None:
        db.execute("INSERT INTO schema_version VALUES (0)")
        return 0
    return int(row[0])


def migrate(db: sqlite3.Connection, migrations: Sequence[str] = MIGRATIONS) -> int:
    """Bring ``db`` to ``len(migrations)``, one transaction per step; returns the old version.

    Raises :class:`StoreVersionError` for a database newer than ``migrations`` know.
    """
    with db:
        version = _schema_version(db)
    target = len(migrations)
    if version > target:
        raise StoreVersionError(
            f"database schema version {version} is newer than this siftmq supports ({target}); "
            "upgrade siftmq or point --data-dir elsewhere"
        )
    for v in range(version, target):
        db.execute("BEGIN IMMEDIATE")
        try:
            for stmt in migrations[v].split(";"):
                if stmt.strip():
                    db.execute(stmt)
            db.execute("UPDATE schema_version SET version = ?", (v + 1,))
        except BaseException:
            rollback(db)
            raise
        db.execute("COMMIT")
    return version


def rollback(db: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite has not already (it does by itself on some
    errors, SQLITE_FULL among them: an unconditional ROLLBACK would then raise "no
    transaction is active" and hide the real cause)."""
    import sqlite3

    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


# ---------------------------------------------------------------------------- operations
SQL: dict[str, str] = {
    "session": "INSERT OR REPLACE INTO sessions VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
    "disconnected": "UPDATE sessions SET disconnected_at = ?, will_due = ?, next_pid = ? WHERE client_id = ?",
    "will": (
        "UPDATE sessions SET will_topic = ?, will_payload = ?, will_qos = ?, will_retain = ?, "
        "will_properties = ?, will_due = ? WHERE client_id = ?"
    ),
    "expiry": "UPDATE sessions SET expiry_interval = ? WHERE client_id = ?",
    "del_session": "DELETE FROM sessions WHERE client_id = ?",
    "del_entries": "DELETE FROM entries WHERE client_id = ?",
    "del_outgoing": "DELETE FROM outgoing WHERE client_id = ?",
    "del_qos2": "DELETE FROM qos2_in WHERE client_id = ?",
    "entry": "INSERT OR REPLACE INTO entries VALUES (?,?,?,?,?,?,?,?,?,?,?)",
    "outgoing": "INSERT INTO outgoing VALUES (?,?,0,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    "sent": "UPDATE outgoing SET state = 1, packet_id = ? WHERE client_id = ? AND seq = ?",
    "pubrec": "UPDATE outgoing SET state = 2 WHERE client_id = ? AND packet_id = ?",
    "acked": "DELETE FROM outgoing WHERE client_id = ? AND packet_id = ?",
    "dropped": "DELETE FROM outgoing WHERE client_id = ? AND seq = ?",
    "qos2_add": "INSERT OR IGNORE INTO qos2_in VALUES (?,?)",
    "qos2_del": "DELETE FROM qos2_in WHERE client_id = ? AND packet_id = ?",
    "retain": "INSERT OR REPLACE INTO retained VALUES (?,?,?,?,?,?)",
    "unretain": "DELETE FROM retained WHERE topic = ?",
    "composite": "INSERT OR REPLACE INTO composite_journal VALUES (?,?,?,?,?,?,?,?)",
    "ban": "INSERT OR REPLACE INTO bans VALUES (?,?,?,?,?)",
    "unban": "DELETE FROM bans WHERE kind = ? AND value = ?",
    "composite_trim": "DELETE FROM composite_journal WHERE seq <= ?",
}
