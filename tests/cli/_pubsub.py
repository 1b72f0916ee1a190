"""Running ``siftmq pub`` / ``siftmq sub`` and mosquitto's clients as the user runs them (the
installed scripts, as subprocesses) for tests/cli/test_pubsub*.py.

:func:`run` returns (status, stdout, stderr) and asserts what every run must show: no
traceback and no Python warning.  :func:`one_line` is the shape of every error of ours: one
line ``siftmq <command>: ...`` on stderr.  :func:`free_port` / :func:`mosquitto` start a real
mosquitto broker (it cannot bind port 0): a port is picked by binding 0, and when mosquitto
then fails to bind it (another process took it in between) it is started again on a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["MOSQUITTO", "SIFTMQ", "free_port", "mosquitto", "one_line", "run"]

SIFTMQ = str(Path(sys.executable).parent / "siftmq")
MOSQUITTO = shutil.which("mosquitto") or (
    "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
)


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


def one_line(err: str, command: str) -> str:
    """The single error line of ``siftmq <command>`` (asserted to be the whole stderr)."""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"siftmq {command}: "), err
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def mosquitto(tmp: Path, extra: str = "") -> Iterator[int]:
    """A mosquitto broker on 127.0.0.1; yields its port.  ``extra``: more configuration lines."""
    assert MOSQUITTO is not None
    for attempt in range(5):
        port = free_port()
        conf = tmp / f"mosquitto-{port}.conf"
        conf.write_text(f"listener {port} 127.0.0.1\npersistence false\nlog_dest stderr\n{extra}")
        log = open(tmp / f"mosquitto-{port}.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 10.0
            while proc.poll() is None and not _listening(port) and time.monotonic() < deadline:
                time.sleep(0.02)
            if proc.poll() is not None:  # the port was taken in between: another one
                continue
            assert _listening(port), f"mosquitto did not listen on {port} (attempt {attempt})"
            yield port
            return
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
            log.close()
    raise AssertionError("mosquitto could not bind a free port in 5 attempts")
