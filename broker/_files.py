"""Private files and directories of the broker's state (issue 37, item 6; docs/security.md,
"Files on disk").

Everything the broker keeps on disk holds messages or secrets: the store (``broker.db`` and
its ``-wal``/``-shm``, which hold the newest commits), composite snapshots, the cluster's node
id and retained stamps, the bridge's landing zone (topics, client ids, payloads) and backups.
So every directory the broker creates for them is ``0700`` and every file ``0600``, *whatever
the umask*: a umask only removes permissions, so the modes are given explicitly at creation
(``os.mkdir(path, 0o700)``, ``os.open(path, O_CREAT, 0o600)``) and set again with
``chmod`` right after (a umask of ``0o200`` would otherwise leave a file unwritable).  SQLite
creates ``-wal`` and ``-shm`` with the mode of the database file, so creating ``broker.db``
here first (0600) makes its companions private too.

Files and directories an older version left with group or other permissions are tightened at
start (:func:`tighten`, :func:`tighten_data_dir`): the owner's permissions are kept, group's
and others' removed; one log line says how many.

Files the operator provides are only checked (:func:`shared_access`): a password or ACL file
that group or others may read gets a start-up warning (it holds password hashes / the
authorization policy: worth fixing, not worth refusing to start), a cluster secret file an
error (``siftmq serve`` exits 2): whoever reads the secret can join the cluster as a peer,
which is trusted with every message (docs/security.md, "Threat model").

Complexity: :func:`tighten` is O(entries under the root) ``lstat`` calls; the rest O(1).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

__all__ = [
    "PRIVATE_DIR",
    "PRIVATE_FILE",
    "open_private",
    "private_dir",
    "shared_access",
    "tighten",
    "tighten_data_dir",
    "write_private",
]

log = logging.getLogger("broker")

PRIVATE_DIR = 0o700  #: mode of every directory the broker creates for its state
PRIVATE_FILE = 0o600  #: mode of every file the broker writes with messages or secrets
_SHARED = 0o077  # group's and others' permission bits


def private_dir(path: str | Path) -> Path:
    """Create ``path`` and every missing parent with mode 0700 (whatever the umask); an existing
    directory is left as it is (:func:`tighten` handles those).  Returns ``path``."""
    path = Path(path)
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, PRIVATE_DIR)
        except FileExistsError:  # made meanwhile by someone else: theirs
            continue
        os.chmod(d, PRIVATE_DIR)
    return path


def open_private(path: str | Path, flags: int) -> int:
    """``os.open(path, flags | O_CREAT, 0o600)``, and mode 0600 whatever the umask (an existing
    file too: this is how the broker's own files are opened).  Returns the descriptor."""
    fd = os.open(path, flags | os.O_CREAT, PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: str | Path, data: bytes, *, sync: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file beside it, then ``os.replace``)
    with mode 0600; ``sync``: fsync the file before the rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def tighten(*paths: str | Path, recursive: bool = True) -> int:
    """Remove group's and others' permissions from each of ``paths`` and (``recursive``)
    everything under those that are directories; symbolic links are not followed, missing
    paths are skipped.  Logs one line when something changed; returns how many entries did."""
    changed = 0

    def fix(p: str) -> None:
        nonlocal changed
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode) or not st.st_mode & _SHARED:
            return
        os.chmod(p, stat.S_IMODE(st.st_mode) & ~_SHARED)
        changed += 1

    for root in map(str, paths):
        fix(root)
        if recursive and os.path.isdir(root) and not os.path.islink(root):
            for d, dirs, files in os.walk(root):
                for name in (*dirs, *files):
                    fix(os.path.join(d, name))
    if changed:
        log.warning(
            "%s: %d files and directories made by an older siftmq were accessible by others: "
            "now private to this user (directories 0700, files 0600)",
            ", ".join(map(str, paths)),
            changed,
        )
    return changed


def tighten_data_dir(data_dir: str | Path) -> int:
    """:func:`tighten` of ``data_dir`` itself and the files directly in it (the store, composite
    snapshots, the cluster's files); its subdirectories are their writers' (the bridge tightens
    its landing zone; ``siftmq analytics`` output is Spark's).  O(entries of the directory)."""
    root = Path(data_dir)
    if not root.is_dir():
        return 0
    files = [p for p in root.iterdir() if p.is_file() and not p.is_symlink()]
    return tighten(root, *files, recursive=False)


def shared_access(path: str | Path) -> str | None:
    """Why ``path`` is not private (group or others may access it), or None if it is."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if not mode & _SHARED:
        return None
    return f"{path} is accessible by group or others (mode {mode:04o}; chmod 600 {path})"
