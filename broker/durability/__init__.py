"""Durable broker state in SQLite (docs/persistence.md): plain records (``_records``) and the
store with its group-committing writer thread (``_store``).

This module is the package's public seam (docs/architecture.md, "Seams"). Who may use it: the
rest of the ``broker`` package (``broker._broker`` opens the store, the composite saver writes
through it), the core's journal (``broker.core._journal``: the replay and the writes of
sessions and messages), and :mod:`broker.store`, which offers the same names to users and
tests. The store is below the core: it knows records and the shared values of
:mod:`broker.values` (messages, subscription options, the QoS flow state), never the core
(``tests/test_layers.py``, ``test_broker_floors_import_downwards_only``). Stable: the
names below, within a release; the stored schema has its own version and migrations
(``SCHEMA_VERSION``, ``MIGRATIONS``).

Every name is imported from its home module at its first use (PEP 562, as :mod:`broker`
does): importing the package costs nothing and a name loads only the module that defines it,
so this seam changes no import order. Cost: a dictionary lookup at a name's first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker._extras import lazy_names

if TYPE_CHECKING:
    from broker.durability._records import (
        DB_NAME,
        EntryRecord,
        LoadedState,
        MessageRecord,
        MessageState,
        OutgoingRecord,
        SessionRecord,
        StoreClosed,
        StoreError,
        StoreVersionError,
        decode_properties,
        encode_properties,
        message_record,
        replay_entries,
    )
    from broker.durability._store import MIGRATIONS, SCHEMA_VERSION, Store, migrate

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

#: public name -> the module that defines it (imported at the name's first use)
_LAZY = {
    "DB_NAME": "broker.durability._records",
    "EntryRecord": "broker.durability._records",
    "LoadedState": "broker.durability._records",
    "MessageRecord": "broker.durability._records",
    "MessageState": "broker.durability._records",
    "OutgoingRecord": "broker.durability._records",
    "SessionRecord": "broker.durability._records",
    "StoreClosed": "broker.durability._records",
    "StoreError": "broker.durability._records",
    "StoreVersionError": "broker.durability._records",
    "decode_properties": "broker.durability._records",
    "encode_properties": "broker.durability._records",
    "message_record": "broker.durability._records",
    "replay_entries": "broker.durability._records",
    "MIGRATIONS": "broker.durability._store",
    "SCHEMA_VERSION": "broker.durability._store",
    "Store": "broker.durability._store",
    "migrate": "broker.durability._store",
}

__getattr__ = lazy_names("broker.durability", _LAZY)
