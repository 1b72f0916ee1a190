"""A lean plain-TCP transport: one slotted object per connection (issue 27, item 2).

asyncio's socket transport costs about 1.3 KB per idle connection (an instance ``__dict__``,
an ``extra`` dict with the socket, sockname and peername, a weak reference in the loop's
transport table, a write buffer allocated up front); uvloop's C transport about as much. An
idle MQTT device needs none of that, so plain-TCP listeners use :class:`LeanTransport`:

* **Reading**: the socket is watched by a :class:`Poller`, one ``select.epoll`` set per
  listening socket whose one descriptor the loop watches (``loop.add_reader``): the kernel
  holds the registrations, Python only a dict entry fd -> transport, where a loop reader per
  socket costs a ``Handle``, a context, a bound method and a selector key (~0.4 KB on
  asyncio, ~0.6 KB on uvloop). Level-triggered: a socket with data left is reported again.
  ``sock.recv`` takes 256 KiB at most per read, as asyncio; ``pause_reading``/
  ``resume_reading`` unregister and register the socket (flow control:
  ``MQTTProtocol._reading``). Without ``select.epoll`` (not Linux) the poller falls back to
  one loop reader per socket. End of stream: ``protocol.eof_received()``, then close unless
  it asks to keep the connection open.
* **Writing**: ``write`` sends at once with a non-blocking ``sock.send``; what the socket
  does not take goes into a ``bytearray`` backlog created on demand, and ``add_writer`` is
  registered only while there is a backlog. The backlog is dropped once it is empty (an idle
  connection holds no buffer). Above the high-water mark the protocol's ``pause_writing`` is
  called, at or below the low-water mark ``resume_writing`` (asyncio's rules, including the
  default low = high / 4); ``get_write_buffer_size`` is the backlog (hung-consumer detection,
  ``Core.tick``).
* **Closing**: ``close`` stops reading and calls ``connection_lost(None)`` (next loop turn)
  once the backlog has been written; ``abort`` drops the backlog and does it at once (next
  loop turn); ``write_eof`` half-closes after the backlog (the lingering close of
  ``MQTTProtocol.shut``). A socket error while reading or writing is fatal: the transport is
  aborted and ``connection_lost`` gets the exception. The socket is closed after
  ``connection_lost``.
* **Extra info**: ``socket``, ``peername`` and ``sockname`` (from the socket when asked;
  ``MQTTProtocol`` asks once), ``peercert`` None.

It implements the part of ``asyncio.Transport`` that ``MQTTProtocol`` uses, on any loop
with ``add_reader``/``add_writer`` (asyncio's selector loops and uvloop). TLS and WebSocket
listeners keep the loop's own transport (``broker.net._accept``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
from typing import Any

__all__ = ["MAX_EVENTS", "MAX_READ", "LeanTransport", "Poller"]

log = logging.getLogger("broker")

#: bytes asked from the socket per read (asyncio's ``max_size``)
MAX_READ = 256 * 1024
#: default high-water mark of the write backlog (asyncio's)
DEFAULT_HIGH = 64 * 1024
#: ready sockets handled per readiness of the poller at most (the rest: next loop turn)
MAX_EVENTS = 1024


class Poller:
    """Read readiness of the lean transports of one listening socket, in one epoll set.

    ``attach``/``detach`` count the transports alive; ``release`` (the listener closed) closes
    the epoll set once the last of them is gone (open connections outlive their listener).
    """

    __slots__ = ("_alive", "_ep", "_loop", "_readers", "_released")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._readers: dict[int, LeanTransport] = {}
        self._alive = 0
        self._released = False
        self._ep = select.epoll() if hasattr(select, "epoll") else None
        if self._ep is not None:
            loop.add_reader(self._ep.fileno(), self._ready)

    def attach(self) -> None:
        self._alive += 1

    def detach(self) -> None:
        self._alive -= 1
        if self._released and self._alive <= 0:
            self._close()

    def release(self) -> None:
        self._released = True
        if self._alive <= 0:
            self._close()

    def watch(self, fd: int, t: LeanTransport) -> None:
        ep = self._ep
        if ep is None or ep.closed:
            self._loop.add_reader(fd, t._read_ready)
            return
        self._readers[fd] = t
        ep.register(fd, select.EPOLLIN)

    def unwatch(self, fd: int) -> None:
        ep = self._ep
        if ep is None or self._readers.pop(fd, None) is None:
            self._loop.remove_reader(fd)
            return
        if not ep.closed:
            ep.unregister(fd)

    def _close(self) -> None:
        ep = self._ep
        if ep is None or ep.closed:
            return
        with contextlib.suppress(RuntimeError, ValueError):  # the loop is closed already
            self._loop.remove_reader(ep.fileno())
        ep.close()

    def _ready(self) -> None:
        ep = self._ep
        assert ep is not None
        readers = self._readers
        for fd, _events in ep.poll(0, MAX_EVENTS):
            t = readers.get(fd)
            if t is not None:
                try:
                    t._read_ready()
                except Exception:  # one connection's failure must not starve the others
                    log.exception("lean transport: read failed")
                    t.abort()


class LeanTransport(asyncio.Transport):
    """The transport of one accepted plain-TCP socket (see the module docstring)."""

    __slots__ = (
        "_backlog",
        "_closing",
        "_eof",
        "_fd",
        "_high",
        "_loop",
        "_lost",
        "_low",
        "_poller",
        "_protocol",
        "_reading",
        "_sock",
        "_write_paused",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol: asyncio.Protocol,
        poller: Poller,
    ) -> None:
        # asyncio.BaseTransport.__init__ would create the ``_extra`` dict: not called
        self._loop = loop
        self._poller = poller
        poller.attach()
        self._sock: socket.socket | None = sock
        self._fd = sock.fileno()
        self._protocol: asyncio.Protocol | None = protocol
        self._backlog: bytearray | None = None  # unsent bytes (None: none)
        self._closing = False  # close/abort called: no more reading or writing
        self._eof = False  # write_eof called
        self._lost = False  # connection_lost scheduled
        self._reading = True
        self._write_paused = False  # the protocol was told pause_writing
        self._high = DEFAULT_HIGH
        self._low = DEFAULT_HIGH // 4

    def start(self) -> None:
        """``connection_made``, then read (unless the protocol paused or closed already)."""
        protocol = self._protocol
        assert protocol is not None
        protocol.connection_made(self)
        if self._reading and not self._closing:
            self._poller.watch(self._fd, self)

    # ------------------------------------------------------------ information
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        sock = self._sock
        if sock is None:
            return default
        try:
            if name == "socket":
                return sock
            if name == "peername":
                return sock.getpeername()
            if name == "sockname":
                return sock.getsockname()
        except OSError:
            return default
        return default

    def is_closing(self) -> bool:
        return self._closing

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]

    # ------------------------------------------------------------ reading
    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        if self._closing or not self._reading:
            return
        self._reading = False
        self._poller.unwatch(self._fd)

    def resume_reading(self) -> None:
        if self._closing or self._reading:
            return
        self._reading = True
        self._poller.watch(self._fd, self)

    def _read_ready(self) -> None:
        sock = self._sock
        if self._lost or sock is None:
            return
        try:
            data = sock.recv(MAX_READ)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fatal(exc)
            return
        protocol = self._protocol
        assert protocol is not None
        if not data:
            if protocol.eof_received():
                self.pause_reading()  # kept open for writing; nothing more to read
            else:
                self.close()
            return
        try:
            protocol.data_received(data)
        except Exception as exc:  # MQTTProtocol catches its own; anything else ends the connection
            self._loop.call_exception_handler(
                {"message": "protocol.data_received() failed", "exception": exc, "transport": self}
            )
            self._fatal(exc)

    # ------------------------------------------------------------ writing
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = DEFAULT_HIGH if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high = high
        self._low = low
        self._pause_if_over()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_write_buffer_size(self) -> int:
        backlog = self._backlog
        return 0 if backlog is None else len(backlog)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._eof:
            raise RuntimeError("Cannot call write() after write_eof()")
        if not data or self._lost:
            return
        backlog = self._backlog
        if backlog is not None:
            backlog += data
            self._pause_if_over()
            return
        sock = self._sock
        assert sock is not None
        try:
            n = sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:
            self._fatal(exc)
            return
        if n == len(data):
            return
        self._backlog = bytearray(memoryview(data)[n:])
        self._loop.add_writer(self._fd, self._write_ready)
        self._pause_if_over()

    def _write_ready(self) -> None:
        backlog = self._backlog
        sock = self._sock
        if backlog is None or sock is None or self._lost:
            return
        try:
            n = sock.send(backlog)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fatal(exc)
            return
        del backlog[:n]
        if self._write_paused and len(backlog) <= self._low:
            self._write_paused = False
            if self._protocol is not None:
                self._protocol.resume_writing()  # may write more (onto the backlog)
        if self._backlog:
            return
        self._backlog = None  # empty: released
        self._loop.remove_writer(self._fd)
        if self._closing:
            self._connection_lost(None)
        elif self._eof:
            self._shutdown_write()

    def _pause_if_over(self) -> None:
        if not self._write_paused and self.get_write_buffer_size() > self._high:
            self._write_paused = True
            if self._protocol is not None:
                self._protocol.pause_writing()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self._closing or self._eof:
            return
        self._eof = True
        if self._backlog is None:
            self._shutdown_write()

    def _shutdown_write(self) -> None:
        sock = self._sock
        if sock is not None:
            sock.shutdown(socket.SHUT_WR)

    # ------------------------------------------------------------ closing
    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._reading:
            self._poller.unwatch(self._fd)
        if self._backlog is None:
            self._connection_lost(None)

    def abort(self) -> None:
        self._force_close(None)

    def _fatal(self, exc: Exception) -> None:
        """A socket error: the connection is over (``connection_lost(exc)``)."""
        self._force_close(exc)

    def _force_close(self, exc: Exception | None) -> None:
        if self._lost:
            return
        if self._backlog is not None:
            self._backlog = None
            self._loop.remove_writer(self._fd)
        if not self._closing:
            self._closing = True
            if self._reading:
                self._poller.unwatch(self._fd)
        self._connection_lost(exc)

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: Exception | None) -> None:
        protocol, sock = self._protocol, self._sock
        self._protocol = None
        self._sock = None
        try:
            if protocol is not None:
                protocol.connection_lost(exc)
        finally:
            if sock is not None:
                sock.close()
            self._poller.detach()
