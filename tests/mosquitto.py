"""A real mosquitto broker for the tests that talk to one (Debian's, installed by the
Makefile when missing; tests skip when it is not there).

mosquitto cannot bind port 0: :func:`free_port` picks one by binding 0 and the configuration
names it; :func:`mosquitto` starts it and, when mosquitto then fails to bind that port
(another process took it in between), starts it again on a new one.  It waits until the
port accepts connections (polling every 20 ms, 10 s at most), never a fixed time.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["MOSQUITTO", "free_port", "mosquitto"]

MOSQUITTO = shutil.which("mosquitto") or (
    "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
)


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
