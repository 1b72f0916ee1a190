"""``siftmq backup``: a consistent copy of the store while the broker runs (docs/operations.md,
"Backup and restore").

    siftmq backup [--data-dir DIR | --db FILE] DEST

The store is one SQLite database in WAL mode (``<data-dir>/broker.db``). Copying the file
with ``cp`` while the broker writes can tear it (the WAL holds the newest commits); this
command uses SQLite's online backup API instead: a read-only connection copies every page in
one step under a read transaction, so the copy is the state of one committed transaction, while
the broker goes on writing (readers do not block the WAL writer). The copy is then checked
(``PRAGMA integrity_check``) and its schema version printed. ``DEST`` is written to a
temporary name beside it and renamed, so a failed backup never leaves a partial file there.
The copy holds every stored message: it is made with mode 0600, whatever the umask.

Restore is a file copy with the broker stopped: put the backup at ``<data-dir>/broker.db``
(removing ``broker.db-wal`` and ``broker.db-shm``) and start ``siftmq serve``; an older schema
version is upgraded at start (docs/persistence.md, "Schema versions").
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from broker._files import open_private
from broker.plugins import Subparsers

__all__ = ["backup", "register", "run"]


def register(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``backup`` to an argparse sub-parsers object; returns the new parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "backup",
        help="copy the store consistently while the broker runs (SQLite online backup)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--data-dir", type=Path, default=None, help="data directory of the broker (default ./siftmq-data)"
    )
    where.add_argument("--db", type=Path, default=None, help="the store's database file itself")
    p.add_argument("dest", type=Path, metavar="DEST", help="file to write the copy to")
    p.set_defaults(func=run)
    return p


def backup(source: Path, dest: Path) -> int:
    """Copy the SQLite database ``source`` to ``dest`` consistently; returns the copy's schema
    version. Raises ``sqlite3.Error`` (or OSError) when either side fails or the copy does
    not pass ``PRAGMA integrity_check``."""
    if not source.is_file():
        raise FileNotFoundError(f"no store at {source}")
    import sqlite3  # not when the parser is built: serve without a store never imports it

    tmp = dest.with_name(f".{dest.name}.partial")
    tmp.unlink(missing_ok=True)
    src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
    try:
        # the copy holds every stored message: 0600 whatever the umask (broker/_files.py);
        # made here first, SQLite keeps the mode of the file it opens
        os.close(open_private(tmp, os.O_RDWR | os.O_EXCL))
        out = sqlite3.connect(tmp)
        try:
            src.backup(out)  # pages=-1: every page in one step, one read transaction
            check = out.execute("PRAGMA integrity_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(f"the copy fails integrity_check: {check}")
            row = out.execute("SELECT version FROM schema_version").fetchone()
            version = int(row[0]) if row else 0
        finally:
            out.close()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        src.close()
    os.replace(tmp, dest)
    return version


def run(args: argparse.Namespace) -> int:
    source: Path = args.db if args.db is not None else (args.data_dir or Path("siftmq-data")) / "broker.db"
    import sqlite3

    try:
        version = backup(source, args.dest)
    except (OSError, sqlite3.Error) as exc:
        print(f"siftmq backup: {exc}", file=sys.stderr)
        return 2
    size = args.dest.stat().st_size
    print(f"backed up {source} to {args.dest} ({size} bytes, schema version {version})")
    return 0
