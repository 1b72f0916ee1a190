"""``siftmq serve`` as a child process in tests: start it, wait for what its log says, stop it.

The tests that need the real command (signals, exit status, the log, descriptor limits, a
``kill -9``) each started it and read its port from the log in their own way; this is the one
way. ``Serve(*flags)`` starts ``python -m broker._cli serve --port 0 FLAGS`` with stderr piped;
a thread reads every line into :attr:`Serve.lines` (kept whole, in order, so a test can assert
on the log after the fact) and, when ``log`` is given, appends it to that file too.
:meth:`Serve.wait_for` waits for a line matching a pattern (from index ``start`` on) and fails
with the log when the process ends or the time is up instead; :meth:`Serve.port` is the port
of a listener from its ``listening on 127.0.0.1:PORT (KIND)`` line. As a context manager it
kills what is still running on the way out; :meth:`Serve.stop` is the clean way (SIGTERM,
exit status, the rest of the log).

Waiting never sleeps a fixed time: the reader notifies a condition per line, so ``wait_for``
is O(lines) per line read. From a coroutine, ``await s.line(...)`` waits in a worker thread
(the test's own clients keep running); a short blocking ``wait_for`` is fine where nothing
of the test's runs on its loop.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

__all__ = ["CLI", "Serve", "T"]

#: the command line of ``siftmq`` in this environment
CLI = [sys.executable, "-m", "broker._cli"]
#: seconds a child may take to start or stop on a loaded machine (2 cores, many tests)
T = 30.0


class Serve:
    """A running ``siftmq serve --port 0 *flags`` and the lines it logged so far."""

    def __init__(
        self,
        *flags: str,
        env: dict[str, str] | None = None,
        log: Path | None = None,
        prefix: tuple[str, ...] = (),
        preexec_fn: Callable[[], None] | None = None,
        command: Sequence[str] = CLI,
        cwd: Path | None = None,
    ) -> None:
        """``env`` is added to this process's environment; ``prefix`` goes before the command
        (a wrapper such as ``sh -c 'umask 0; exec "$@"' sh``); ``preexec_fn`` runs in the
        child before the broker (a resource limit); ``command`` replaces ``python -m
        broker._cli`` (a script that patches a constant first, then calls its ``main``)."""
        self.proc = subprocess.Popen(
            [*prefix, *command, "serve", "--port", "0", *flags],
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env={**os.environ, **env} if env else None,
            preexec_fn=preexec_fn,  # noqa: PLW1509 (a test's resource limit, set before exec)
        )
        self.lines: list[str] = []
        self._eof = False
        self._cond = threading.Condition()
        assert self.proc.stderr is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stderr, log), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str], log: Path | None) -> None:
        out = log.open("a") if log is not None else None
        try:
            for line in stream:
                if out is not None:
                    out.write(line)
                    out.flush()
                with self._cond:
                    self.lines.append(line)
                    self._cond.notify_all()
        finally:
            if out is not None:
                out.close()
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def wait_for(self, pattern: str, start: int = 0, timeout: float = T) -> re.Match[str]:
        """The match of the first line from index ``start`` on that matches ``pattern``,
        waiting for it; AssertionError (with the log) if the process ends or ``timeout``
        passes first."""
        compiled = re.compile(pattern)
        m = compiled.search(self.lines[self.wait_line(compiled.search, start, timeout, repr(pattern))])
        assert m is not None
        return m

    def wait_line(
        self, test: Callable[[str], object], start: int = 0, timeout: float = T, what: str = ""
    ) -> int:
        """The index of the first line from ``start`` on for which ``test`` is true, waiting
        for it; AssertionError (with the log) if the process ends or ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        i = start
        with self._cond:
            while True:
                while i < len(self.lines):  # each line is tested once
                    if test(self.lines[i]):
                        return i
                    i += 1
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    why = "siftmq serve ended" if self._eof else f"not within {timeout:g} s"
                    log = "".join(self.lines[start:])
                    raise AssertionError(f"no log line {what or test!r} ({why}):\n{log}")
                self._cond.wait(left)

    async def line(self, pattern: str, start: int = 0, timeout: float = T) -> re.Match[str]:
        """:meth:`wait_for` from a coroutine: the test's event loop runs on meanwhile."""
        return await asyncio.to_thread(self.wait_for, pattern, start, timeout)

    def port(self, kind: str = "tcp", timeout: float = T) -> int:
        """The port of this broker's ``kind`` listener (``tcp``, ``tcp+tls``, ``ws``, ...)."""
        return int(self.wait_for(rf"listening on 127\.0\.0\.1:(\d+) \({re.escape(kind)}\)", 0, timeout)[1])

    def stop(self, timeout: float = T) -> int:
        """SIGTERM, then its exit status once it ended and its whole log is in :attr:`lines`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        return code

    def kill(self) -> None:
        """SIGKILL if it still runs; waits for it and for the end of its log."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(T)
        self._reader.join(T)

    def __enter__(self) -> Serve:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill it if it still runs and close its pipe (idempotent)."""
        self.kill()
        assert self.proc.stderr is not None
        self.proc.stderr.close()
