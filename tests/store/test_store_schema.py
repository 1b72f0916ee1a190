"""Schema version and migrations: empty file -> v1, step-wise upgrade, refusal of newer files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.packets import NO_PROPERTIES, Properties
from broker.store import (
    DB_NAME,
    MIGRATIONS,
    SCHEMA_VERSION,
    Store,
    StoreVersionError,
    decode_properties,
    encode_properties,
)


def _version(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT version FROM schema_version").fetchone()[0])


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_empty_file_is_migrated_to_current(data_dir: Path) -> None:
    with Store.in_data_dir(data_dir) as s:
        assert s.migrated_from == 0
        assert s.path == str(data_dir / DB_NAME)
    path = data_dir / DB_NAME
    assert _version(path) == SCHEMA_VERSION == len(MIGRATIONS)
    assert {"sessions", "entries", "outgoing", "qos2_in", "retained", "schema_version"} <= _tables(path)
    with Store(path) as s:  # reopening does not migrate again
        assert s.migrated_from == SCHEMA_VERSION


def test_wal_mode_and_synchronous(data_dir: Path) -> None:
    with Store.in_data_dir(data_dir) as s:
        assert s._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert s._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    with Store.in_data_dir(data_dir, synchronous="normal") as s:
        assert s._db.execute("PRAGMA synchronous").fetchone()[0] == 1
    with pytest.raises(ValueError, match="synchronous"):
        Store(":memory:", synchronous="OFF")


def test_upgrade_path_keeps_data(data_dir: Path) -> None:
    """A current file with data is upgraded by a (test) next migration; the data survives."""
    path = data_dir / DB_NAME
    with Store(path) as s:
        s.qos2_received("c", 7)
    v2 = "CREATE TABLE extra (k TEXT PRIMARY KEY); ALTER TABLE sessions ADD COLUMN note TEXT"
    with Store(path, migrations=(*MIGRATIONS, v2)) as s:
        assert s.migrated_from == SCHEMA_VERSION
        assert s.counts()["qos2_in"] == 1
    assert _version(path) == SCHEMA_VERSION + 1
    assert "extra" in _tables(path)


def test_failed_migration_rolls_back(data_dir: Path) -> None:
    path = data_dir / DB_NAME
    Store(path).close()
    with pytest.raises(sqlite3.OperationalError):
        Store(path, migrations=(*MIGRATIONS, "CREATE TABLE t2 (a); SELECT * FROM no_such_table"))
    assert _version(path) == SCHEMA_VERSION
    assert "t2" not in _tables(path)


def test_newer_database_is_refused(data_dir: Path) -> None:
    path = data_dir / DB_NAME
    Store(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    want = rf"schema version {SCHEMA_VERSION + 1} is newer than this siftmq supports \({SCHEMA_VERSION}\)"
    with pytest.raises(StoreVersionError, match=want):
        Store(path)


def test_version_1_file_gains_the_composite_journal(data_dir: Path) -> None:
    """A file of schema version 1 (before the composite journal) is upgraded in place."""
    path = data_dir / DB_NAME
    with Store(path, migrations=MIGRATIONS[:1]) as s:
        s.qos2_received("c", 7)
    with Store(path) as s:
        assert s.migrated_from == 1
        assert s.counts()["qos2_in"] == 1
        assert s.composite_seq() == 0
        s.composite_record((5, 1, 1.5, "t", b"p", 1, "t", 0))
        assert s.composite_journal(4) == [(5, 1, 1.5, "t", b"p", 1, "t", 0)]
        s.composite_trim(5)
        assert s.composite_journal() == []
    assert _version(path) == SCHEMA_VERSION == 3


def test_memory_mode() -> None:
    with Store(":memory:") as s:
        s.qos2_received("c", 1)
        assert s.counts()["qos2_in"] == 1


_props = st.builds(
    Properties,
    payload_format_indicator=st.none() | st.integers(0, 1),
    message_expiry_interval=st.none() | st.integers(0, 2**32 - 1),
    content_type=st.none() | st.text(),
    response_topic=st.none() | st.text(min_size=1),
    correlation_data=st.none() | st.binary(),
    subscription_identifiers=st.lists(st.integers(1, 268_435_455), max_size=3).map(tuple),
    will_delay_interval=st.none() | st.integers(0, 2**32 - 1),
    user_properties=st.lists(st.tuples(st.text(), st.text()), max_size=3).map(tuple),
)


@given(_props)
def test_properties_round_trip(p: Properties) -> None:
    blob = encode_properties(p)
    assert decode_properties(blob) == p
    assert (blob is None) == (p == NO_PROPERTIES)
