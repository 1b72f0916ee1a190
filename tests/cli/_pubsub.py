"""Running ``siftmq pub`` / ``siftmq sub`` and mosquitto's clients as the user runs them (the
installed scripts, as subprocesses) for tests/cli/test_pubsub*.py.

:func:`run` returns (status, stdout, stderr) and asserts what every run must show: no
traceback and no Python warning. :func:`run_main` is the same for ``broker._cli.main`` (the
script's entry point) in this process, for inputs refused before anything is sent: a process
start costs ~0.2-0.4 s of CPU, so the tables of such inputs run in-process, with a few of
them also as processes.  It captures what the calling thread writes to ``sys.stdout`` and
``sys.stderr`` only (:class:`_ThreadCapture`), not with ``contextlib.redirect_stdout``, which
swaps the streams of the whole process: called in a worker thread beside a broker on the
test's loop (tests/admin/test_ctl.py), it caught what the loop's thread wrote meanwhile.
:func:`one_line` is the shape of every error of ours: one line ``siftmq <command>: ...`` on
stderr.  :func:`free_port` / :func:`mosquitto` (from
tests/mosquitto.py) start a real mosquitto broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from broker._cli import main
from tests.mosquitto import MOSQUITTO, free_port, mosquitto

__all__ = ["MOSQUITTO", "SIFTMQ", "free_port", "mosquitto", "one_line", "run", "run_main"]

SIFTMQ = str(Path(sys.executable).parent / "siftmq")


async def run(*argv: str, timeout: float = 30.0, stdin: bytes | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    assert proc.returncode is not None
    text = err.decode()
    assert "Traceback" not in text and "Traceback" not in out.decode(), text
    assert not re.search(r"\w+Warning: ", text), text
    return proc.returncode, out.decode(), text


class _ThreadCapture(io.TextIOBase):
    """``sys.stdout`` (or ``sys.stderr``) while :func:`run_main` runs somewhere: the writes of
    a thread running it go to that thread's buffer, every other thread's to the stream that
    was there before (``beside``). O(1) per write."""

    def __init__(self, beside: TextIO) -> None:
        self.beside = beside
        self.buffers: dict[int, io.StringIO] = {}  # thread id -> what it wrote

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def write(self, text: str) -> int:
        buffer = self.buffers.get(threading.get_ident())
        return (self.beside if buffer is None else buffer).write(text)

    def flush(self) -> None:
        if threading.get_ident() not in self.buffers:
            self.beside.flush()


_CAPTURE_LOCK = threading.Lock()


@contextlib.contextmanager
def _captured(name: str) -> Iterator[io.StringIO]:
    """What this thread writes to ``sys.<name>`` while in the block (the others' unchanged)."""
    me = threading.get_ident()
    with _CAPTURE_LOCK:
        stream = getattr(sys, name)
        if not isinstance(stream, _ThreadCapture):
            stream = _ThreadCapture(stream)
            setattr(sys, name, stream)
        buffer = stream.buffers[me] = io.StringIO()
    try:
        yield buffer
    finally:
        with _CAPTURE_LOCK:
            del stream.buffers[me]
            if not stream.buffers and getattr(sys, name) is stream:
                setattr(sys, name, stream.beside)


def run_main(*argv: str) -> tuple[int, str, str]:
    """:func:`run` of ``siftmq ARGV`` through ``broker._cli.main`` in this process (argv without
    the ``siftmq`` script itself), its output captured in this thread only (the module
    docstring); it blocks: in a worker thread beside a broker on the loop, or for what is
    refused before connecting."""
    with _captured("stdout") as out, _captured("stderr") as err:
        try:
            status = main(list(argv))
        except SystemExit as exc:  # argparse's errors
            status = exc.code if isinstance(exc.code, int) else 1
    text = err.getvalue()
    assert "Traceback" not in text and "Traceback" not in out.getvalue(), text
    assert not re.search(r"\w+Warning: ", text), text
    return status, out.getvalue(), text


def one_line(err: str, command: str) -> str:
    """The single error line of ``siftmq <command>`` (asserted to be the whole stderr)."""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"siftmq {command}: "), err
    return lines[0]
