"""Durable broker state in SQLite (docs/persistence.md): plain records (``_records``) and the
store with its group-committing writer thread (``_store``).  The core reaches it only through
its journal (:mod:`broker.core._journal`); the public names are in :mod:`broker.store`.
"""
