"""Running ``siftmq pub`` / ``siftmq sub`` and mosquitto's clients as the user runs them (the
installed scripts, as subprocesses) for tests/cli/test_pubsub*.py.

:func:`run` returns (status, stdout, stderr) and asserts what every run must show: no
traceback and no Python warning. :func:`run_main` is the same for ``broker._cli.main`` (the
script's entry point) in this process, for inputs refused before anything is sent: a process
start costs ~0.2-0.4 s of CPU, so the tables of such inputs run in-process, with a few of
them also as processes.  :func:`one_line` is the shape of every error of ours: one
line ``siftmq <command>: ...`` on stderr.  :func:`free_port` / :func:`mosquitto` (from
tests/mosquitto.py) start a real mosquitto broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import sys
from pathlib import Path

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


def run_main(*argv: str) -> tuple[int, str, str]:
    """:func:`run` of ``siftmq ARGV`` through ``broker._cli.main`` in this process (argv without
    the ``siftmq`` script itself); it blocks: only for what is refused before connecting."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
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
