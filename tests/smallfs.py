"""A small file system for disk-full tests: a tmpfs of a few MiB and a file that fills it.

Both disk-full suites (the store's, tests/store/test_store_disk_full.py, and the bridge writer
process's, tests/bridge/test_bridge_writer_process.py) mount one under the test's ``tmp_path``;
the test is skipped where mounting needs a root it does not have.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["fill", "small_tmpfs"]


@contextmanager
def small_tmpfs(tmp_path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=...``: ``4m``) mounted at ``tmp_path / "small"``,
    unmounted on exit; skips the test when it cannot be mounted."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, check=False
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (root needed): {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path) -> int:
    """Write ``path`` until the file system is full (down to the last byte); returns the bytes
    written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    written = 0
    try:
        for chunk in (1 << 16, 1 << 12, 1):
            block = b"\0" * chunk
            while True:
                try:
                    written += os.write(fd, block)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return written
