"""Durable broker state in SQLite: the public names of :mod:`broker.durability` (docs/persistence.md)."""

from __future__ import annotations

from broker.durability import (
    DB_NAME,
    MIGRATIONS,
    SCHEMA_VERSION,
    EntryRecord,
    LoadedState,
    MessageRecord,
    MessageState,
    OutgoingRecord,
    SessionRecord,
    Store,
    StoreClosed,
    StoreError,
    StoreVersionError,
    decode_properties,
    encode_properties,
    message_record,
    migrate,
    replay_entries,
)

__all__ = [
    "DB_NAME",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "EntryRecord",
    "LoadedState",
    "MessageRecord",
    "MessageState",
    "OutgoingRecord",
    "SessionRecord",
    "Store",
    "StoreClosed",
    "StoreError",
    "StoreVersionError",
    "decode_properties",
    "encode_properties",
    "message_record",
    "migrate",
    "replay_entries",
]
