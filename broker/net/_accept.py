"""The broker's own accept loop, and the process's descriptor limit (issue 27, item 1).

Why not ``loop.create_server``: when the process runs out of descriptors, the default
asyncio loop logs ``socket.accept() out of system resource`` with a traceback through the
loop's exception handler and stops accepting for one second (fixed), and uvloop (libuv)
silently accepts and closes the waiting connections with its reserved descriptor: either
way nothing is counted, and under uvloop nothing is logged. An :class:`Acceptor` is one
listening socket read with ``loop.add_reader`` (both loops support it), so the answer is
ours and the same on both loops:

* **Reserve.** ``RESERVE`` descriptors below the soft limit stay free for the store, the
  bridge's files, the metrics thread and the logs. Linux gives an accepted socket the lowest
  free descriptor, so a socket whose number is at or above ``limit - RESERVE`` proves that
  every descriptor below it is taken: it is closed at once, unanswered (there is no
  descriptor budget to read its CONNECT; mosquitto does the same), and counted in
  ``$SYS/broker/connections/refused/descriptors`` (``siftmq_refused_descriptors_total``).
* **Back-off.** After refusing (or after ``accept`` itself failed with EMFILE / ENFILE /
  ENOBUFS / ENOMEM), the acceptor stops reading its socket for ``BACKOFF_MIN`` seconds,
  doubling up to ``BACKOFF_MAX`` while it stays out of descriptors; new connections wait in
  the kernel's listen backlog meanwhile, so a reconnecting fleet cannot make it spin. Any
  closed connection (``ConnectionLimits.release``) resumes it at once. Pauses are counted in
  ``$SYS/broker/connections/accept_pauses``; the log says it at most once per
  ``LIMIT_LOG_INTERVAL`` (``Core.log_limit``).

Each accepted socket of a plain-TCP MQTT listener (``lean``) becomes a
:class:`~broker.net._lean.LeanProtocol` at once (one slotted object, protocol and transport,
read through the listener's epoll ``Poller``: issue 27, item 2); on the other listeners
(TLS, WebSocket) it becomes the loop's own transport with
``loop.connect_accepted_socket`` (TLS by the loop's TLS when the listener has a context),
which is what ``create_server`` does inside.
Listening sockets are bound here with ``listen_backlog`` (the kernel caps it at
``net.core.somaxconn``; docs/operations-fleet.md).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.core import Core
from broker.net._admission import ConnectionLimits
from broker.net._lean import LeanProtocol, Poller

if TYPE_CHECKING:
    import ssl

__all__ = [
    "RESERVE",
    "Acceptor",
    "bind",
    "connection_capacity",
    "descriptor_limit",
    "open_descriptors",
    "raise_descriptor_limit",
]

log = logging.getLogger("broker")

#: descriptors kept free for everything that is not a client connection
RESERVE = 64
#: seconds of the first pause of accepting when out of descriptors; doubles up to BACKOFF_MAX
BACKOFF_MIN = 0.05
BACKOFF_MAX = 2.0
#: connections accepted per readiness event at most (the others wait for the next loop turn)
ACCEPT_BATCH = 128

_STARVED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def descriptor_limit() -> int:
    """The soft RLIMIT_NOFILE of this process."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (before, after).

    An unlimited hard limit is capped at ``fs.nr_open`` (what the kernel allows a process).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open") as fh:
                target = int(fh.read())
        except (OSError, ValueError):
            target = max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, target, exc)
            return soft, soft
        return soft, target
    return soft, soft


def open_descriptors() -> int:
    """Descriptors this process holds now (0 where /proc is missing)."""
    try:
        return max(0, len(os.listdir("/proc/self/fd")) - 1)  # minus the listing's own
    except OSError:
        return 0


def connection_capacity() -> int:
    """Client connections the process has descriptors for now (after ``RESERVE``)."""
    return max(0, descriptor_limit() - open_descriptors() - RESERVE)


async def bind(host: str | None, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets for ``host``:``port`` (every address ``host`` resolves to, all
    interfaces for None or ""), like ``create_server``; with port 0 the later sockets take
    the first one's port. Raises OSError (closing what it opened) when one cannot bind.

    An address (``127.0.0.1``, ``::``) or no host is resolved here, without a lookup
    (``AI_NUMERICHOST``), as ``create_server`` does: the loop's ``getaddrinfo`` would start
    the default executor's thread for it (its stack and malloc arena stay resident), and a
    ``str`` host is IDNA-encoded, which imports ``unicodedata`` (issue 42 item 1). A name goes
    to the loop's ``getaddrinfo``."""
    loop = asyncio.get_running_loop()
    kind, passive = socket.SOCK_STREAM, socket.AI_PASSIVE
    name = (host.encode("ascii") if host.isascii() else host) if host else None
    try:
        infos = socket.getaddrinfo(name, port, socket.AF_UNSPEC, kind, 0, passive | socket.AI_NUMERICHOST)
    except socket.gaierror:  # not an address: a name to look up, off the event loop
        infos = await loop.getaddrinfo(host, port, family=socket.AF_UNSPEC, type=kind, flags=passive)
    seen: set[tuple[int, object]] = set()
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, found in infos:
            if (family, found) in seen:
                continue
            seen.add((family, found))
            addr = found
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:
                addr = (addr[0], socks[0].getsockname()[1], *addr[2:])
            try:
                sock.bind(addr)
            except OSError as exc:
                raise OSError(exc.errno, f"cannot bind {addr!r}: {exc.strerror}") from None
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


class Acceptor:
    """The accept loop of one listening socket (see the module docstring)."""

    __slots__ = (
        "backoff",
        "ceiling",
        "closed",
        "core",
        "factory",
        "lean",
        "limits",
        "loop",
        "paused",
        "poller",
        "resume_at",
        "sock",
        "ssl",
    )

    def __init__(  # noqa: PLR0917
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: Callable[[], asyncio.BaseProtocol],
        ssl_context: ssl.SSLContext | None,
        core: Core,
        limits: ConnectionLimits,
        lean: Callable[[Poller, socket.socket], LeanProtocol] | None = None,
    ) -> None:
        """``lean``: makes the :class:`LeanProtocol` of an accepted plain-TCP socket;
        without it ``factory``'s protocols are served by ``loop.connect_accepted_socket``."""
        self.loop = loop
        self.lean = lean if ssl_context is None else None
        # the lean connections' read readiness, one epoll set per listening socket
        self.poller = Poller(loop) if self.lean is not None else None
        self.sock = sock
        self.factory = factory
        self.ssl = ssl_context
        self.core = core
        self.limits = limits
        #: accepted sockets numbered at or above this are refused (the reserve begins)
        self.ceiling = descriptor_limit() - RESERVE
        self.backoff = BACKOFF_MIN
        self.paused = False
        self.closed = False
        self.resume_at: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.loop.add_reader(self.sock.fileno(), self._ready)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.resume_at is not None:
            self.resume_at.cancel()
        if not self.paused:
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        if self.poller is not None:
            self.poller.release()  # closed once its last connection is gone

    def _ready(self) -> None:
        sock = self.sock
        refused = 0
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno in _STARVED:
                    self._pause(f"accept failed: {exc.strerror}")
                    return
                log.warning("accept on %s failed: %s", sock.getsockname(), exc)
                break
            if conn.fileno() >= self.ceiling:
                conn.close()
                refused += 1
                continue
            self._serve(conn)
        if refused:
            self.core.stats.refused_descriptors += refused
            self._pause(f"{refused} connection(s) closed unanswered")
        elif not self.paused:
            self.backoff = BACKOFF_MIN

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # the peer is gone already
            conn.close()
            return
        if self.poller is not None and self.lean is not None:
            try:
                self.lean(self.poller, conn).start()
            except Exception:
                log.exception("accepted connection not set up")
                conn.close()
            return
        task = self.loop.create_task(self.loop.connect_accepted_socket(self.factory, conn, ssl=self.ssl))
        task.add_done_callback(_accepted)

    def _pause(self, what: str) -> None:
        """Out of descriptors: stop reading the listening socket for ``backoff`` seconds (or
        until a connection closes), and say so at a bounded rate."""
        core = self.core
        core.stats.accept_pauses += 1
        core.log_limit(
            "descriptors",
            None,
            f"out of file descriptors (limit {self.ceiling + RESERVE}, {RESERVE} kept in reserve): "
            f"{what}; accepting again in {self.backoff:g} s or when a connection closes "
            "(raise the limit: docs/operations-fleet.md)",
        )
        if not self.paused:
            self.paused = True
            self.loop.remove_reader(self.sock.fileno())
            self.limits.starved.append(self.resume)
        if self.resume_at is not None:
            self.resume_at.cancel()
        self.resume_at = self.loop.call_later(self.backoff, self.resume)
        self.backoff = min(BACKOFF_MAX, self.backoff * 2)

    def resume(self) -> None:
        """Accept again (the back-off timer, or a descriptor was freed)."""
        if self.resume_at is not None:
            self.resume_at.cancel()
            self.resume_at = None
        if self.closed or not self.paused:
            return
        self.paused = False
        self.loop.add_reader(self.sock.fileno(), self._ready)


def _accepted(task: asyncio.Task[tuple[asyncio.Transport, asyncio.BaseProtocol]]) -> None:
    """A transport that could not be set up (peer gone, TLS handshake failed) is not an error
    of the broker: logged at debug level, never left as an unretrieved task exception."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.debug("accepted connection not set up: %r", exc)
