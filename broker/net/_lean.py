"""Lean plain-TCP connections: one slotted object per connection (issue 27, item 2).

asyncio's socket transport costs about 1.3 KB per idle connection (an instance ``__dict__``,
an ``extra`` dict with the socket, sockname and peername, a weak reference in the loop's
transport table, a write buffer allocated up front); uvloop's C transport about as much. An
idle MQTT device needs none of that, so on plain-TCP listeners a connection is one
:class:`LeanProtocol`: the :class:`~broker.net._transport.MQTTProtocol` that IS its own
transport (``self.transport is self``; it owns the socket), so there is no second object,
no protocol/transport references both ways, no descriptor held as a Python int twice (the
socket knows it) and no per-connection write-buffer limits (the configured high-water mark
and a quarter of it, asked from the config when needed). Its transport state (closing,
half-closed, lost, reading paused, watched) is one small int of bits.

* **Reading**: the socket is watched by a :class:`Poller`, one ``select.epoll`` set per
  listening socket whose one descriptor the loop watches (``loop.add_reader``): the kernel
  holds the registrations, Python only a list slot indexed by the descriptor (8 bytes; a
  dict entry fd -> connection cost ~60 B with its int key), where a loop reader per socket
  costs a ``Handle``, a context, a bound method and a selector key (~0.4 KB on asyncio,
  ~0.6 KB on uvloop). Level-triggered: a socket with data left is reported again.
  ``sock.recv`` takes 256 KiB at most per read, as asyncio; ``pause_reading``/
  ``resume_reading`` unregister and register the socket (flow control:
  ``MQTTProtocol._reading``). Without ``select.epoll`` (not Linux) the poller falls back to
  one loop reader per socket. End of stream: ``eof_received()``, then close unless it asks
  to keep the connection open. A read goes into the poller's one 256-KiB buffer
  (``sock.recv_into``) and only the bytes read are copied out: ``sock.recv(256 KiB)``
  allocated a 256-KiB object per read and shrank it (``mmap``/``mremap``/``munmap`` from
  glibc: ~30 us for a 2-byte DISCONNECT, measured with a socket pair, against ~6 us), once
  per read of every connection (issue 42 item 2). **Departures wait behind live reads**: a
  read that is a bare DISCONNECT, or the end of stream, is held (the socket leaves the set
  until it is handled, so the connection's bytes stay in order) and handled ``MAX_EVENTS``
  per loop turn by ``Poller._drain``; a turn reads up to ``MAX_READY`` (1,024) ready sockets
  but handles at most ``MAX_EVENTS`` (64) live reads. epoll hands the ready sockets over
  first in, first out, so a live client's PINGREQ sent as 10,000 clients leave was read
  only after 10,000 departures had been handled (~35 us each, 280-360 ms); now after
  10,000 reads held (a few us each; issue 42 item 2).
* **The open connections**: the poller's list holds every connection of its listener from
  ``start`` to ``connection_lost`` (watched or paused), so it is also the broker's registry
  of them (``Broker.stop`` closes them; a set of open protocols would cost ~105 B more per
  connection). TLS and WebSocket connections stay in the broker's set.
* **Writing**: ``write`` sends at once with a non-blocking ``sock.send``; what the socket
  does not take goes into a ``bytearray`` backlog created on demand, and ``add_writer`` is
  registered only while there is a backlog. The backlog is dropped once it is empty (an idle
  connection holds no buffer). Above the high-water mark (``write_buffer_high``)
  ``pause_writing`` is called, at or below a quarter of it ``resume_writing`` (asyncio's
  rules with its default low-water mark); ``get_write_buffer_size`` is the backlog
  (hung-consumer detection, ``Core.tick``).
* **Closing**: ``close`` stops reading and calls ``connection_lost(None)`` (next loop turn)
  once the backlog has been written; ``abort`` drops the backlog and does it at once (next
  loop turn); ``write_eof`` half-closes after the backlog (the lingering close of
  ``MQTTProtocol.shut``). A socket error while reading or writing is fatal: the connection is
  aborted and ``connection_lost`` gets the exception. The socket is closed after
  ``connection_lost``.
* **Extra info**: ``socket``, ``peername`` and ``sockname`` (from the socket when asked),
  ``peercert`` None.

It implements the part of ``asyncio.Transport`` that ``MQTTProtocol`` (and the core's
hung-consumer check, ``Connection.io``) uses, on any loop with ``add_reader``/``add_writer``
(asyncio's selector loops and uvloop). TLS and WebSocket listeners keep the loop's own
transport (``broker.net._accept``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import select
import socket
from collections import deque
from typing import Any, cast

from broker.core import Core
from broker.net._admission import ListenerPolicy
from broker.net._transport import MQTTProtocol

__all__ = ["MAX_EVENTS", "MAX_READ", "MAX_READY", "LeanProtocol", "Poller"]

log = logging.getLogger("broker")

#: bytes asked from the socket per read (asyncio's ``max_size``)
MAX_READ = 256 * 1024
#: ready sockets whose reads are handled per readiness of the poller at most (the rest: next
#: loop turn): a burst such as 10,000 publishers at once holds the loop for 64 reads per turn
#: (issue 42 item 2, bench_content_fleet.py's ``stall_teardown``: 1,281 ms with 1,024,
#: 125-224 ms with 256); a turn costs one more ``epoll_wait`` than a bigger batch would
MAX_EVENTS = 64
#: ready sockets taken from epoll per readiness at most (asked ``MAX_EVENTS`` at a time, then
#: again for as many as were held: ``Poller._ready``): a departure's read (a bare DISCONNECT, or
#: the end of stream) is only held (:meth:`LeanProtocol._hold`, ~2-4 us: the read and the
#: socket's removal from the set) and does not count against ``MAX_EVENTS``; held departures
#: are handled ``MAX_EVENTS`` per loop turn after (:meth:`Poller._drain`). epoll's ready list
#: is first in, first out: a live client's PINGREQ sent as 10,000 clients leave is read
#: after their 10,000 reads, ~30 ms of holding them instead of ~300 ms of ending them
MAX_READY = 1024
#: the read of a departure held for :meth:`Poller._drain` (3.1.1 / 5 DISCONNECT, no properties)
_BARE_DISCONNECT = b"\xe0\x00"

# LeanProtocol.bits: its transport state
_CLOSING = 1  # close/abort called: no more reading; connection_lost once the backlog is out
_EOF = 2  # write_eof called
_LOST = 4  # connection_lost scheduled
_NOREAD = 8  # reading paused (pause_reading)
_WATCHED = 16  # registered with the poller (or a loop reader)
_HELD = 32  # a departure's read waits in the poller's queue (not watched until handled)
_LOST_OR_HELD = _LOST | _HELD  # (interpreted: one constant, not an ``|`` per read)


class Poller:
    """Read readiness of the lean connections of one listening socket, in one epoll set.

    ``attach``/``detach`` add and remove a connection (``protocols()``: those alive);
    ``release`` (the listener closed) closes the epoll set once the last of them is gone
    (open connections outlive their listener).
    """

    __slots__ = ("_alive", "_conns", "_draining", "_ep", "_leaving", "_released", "buffer", "loop", "view")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        #: the open connections by descriptor (None: a free descriptor)
        self._conns: list[LeanProtocol | None] = []
        self._alive = 0
        self._released = False
        #: departures read and held, handled ``MAX_EVENTS`` per loop turn (``_drain``):
        #: (connection, its bytes read, None: its end of stream)
        self._leaving: deque[tuple[LeanProtocol, bytes | None]] = deque()
        self._draining = False  # a ``_drain`` is scheduled
        self._ep = select.epoll() if hasattr(select, "epoll") else None
        #: every read of its connections lands here first (one loop: one read at a time); an
        #: anonymous mapping, not a bytearray: ``bytearray(n)`` writes its n zero bytes, so an
        #: idle broker would hold all 256 KiB resident, while a mapping's pages become
        #: resident only once a read writes them (the light broker's 25 MB, issue 42 item 1)
        self.buffer = mmap.mmap(-1, MAX_READ)
        self.view = memoryview(self.buffer)
        if self._ep is not None:
            loop.add_reader(self._ep.fileno(), self._ready)

    def attach(self, fd: int, p: LeanProtocol) -> None:
        conns = self._conns
        if fd >= len(conns):
            conns.extend([None] * max(fd + 1 - len(conns), len(conns)))  # doubling: amortised O(1)
        conns[fd] = p
        self._alive += 1

    def detach(self, fd: int, p: LeanProtocol) -> None:
        conns = self._conns
        if 0 <= fd < len(conns) and conns[fd] is p:
            conns[fd] = None
        self._alive -= 1
        if self._released and self._alive <= 0:
            self._close()

    def protocols(self) -> list[LeanProtocol]:
        """The open connections of this listening socket. O(highest descriptor)."""
        return [p for p in self._conns if p is not None]

    def release(self) -> None:
        self._released = True
        if self._alive <= 0:
            self._close()

    def watch(self, fd: int, p: LeanProtocol) -> None:
        ep = self._ep
        if ep is None or ep.closed:
            self.loop.add_reader(fd, p._read_ready)
            return
        ep.register(fd, select.EPOLLIN)

    def unwatch(self, fd: int) -> None:
        ep = self._ep
        if ep is None or ep.closed:
            self.loop.remove_reader(fd)
            return
        with contextlib.suppress(OSError):  # not registered (a loop reader then)
            ep.unregister(fd)
            return
        self.loop.remove_reader(fd)

    def _close(self) -> None:
        ep = self._ep
        if ep is None or ep.closed:
            return
        with contextlib.suppress(RuntimeError, ValueError):  # the loop is closed already
            self.loop.remove_reader(ep.fileno())
        ep.close()

    def _ready(self) -> None:
        """One turn: read up to ``MAX_EVENTS`` ready sockets; a departure's read is only held
        (it leaves the epoll set) and makes room for one more, asked from epoll again, up to
        ``MAX_READY`` sockets in all. Without departures that is one ``poll(0, MAX_EVENTS)``:
        a single ``poll(0, MAX_READY)`` built a (descriptor, events) pair for every ready
        socket, all of them again at every turn while more than ``MAX_EVENTS`` were ready
        (500 ready publishers: ~2,200 pairs built for 500 reads). O(sockets read)."""
        ep = self._ep
        assert ep is not None
        conns = self._conns
        handled = 0
        polled = 0
        ask = MAX_EVENTS
        while True:
            events = ep.poll(0, ask)
            for fd, _events in events:
                p = conns[fd] if fd < len(conns) else None
                if p is not None:
                    try:
                        if p._read_ready():
                            handled += 1
                    except Exception:  # one connection's failure must not starve the others
                        log.exception("lean connection: read failed")
                        p.abort()
                        handled += 1
                    if handled >= MAX_EVENTS:
                        return  # the sockets not read are reported again (level-triggered)
            polled += len(events)
            if len(events) < ask or polled >= MAX_READY:
                return  # no more ready, or enough departures held for one turn
            ask = min(MAX_EVENTS - handled, MAX_READY - polled)  # the held ones made room

    def hold(self, p: LeanProtocol, data: bytes | None) -> None:
        """Queue a departure's read (``data``; None: its end of stream) to be handled by a
        later loop turn (``_drain``). O(1)."""
        self._leaving.append((p, data))
        if not self._draining:
            self._draining = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        """Handle up to ``MAX_EVENTS`` held departures, oldest first; again at the next loop
        turn while some wait. O(handled)."""
        self._draining = False
        leaving = self._leaving
        for _ in range(min(len(leaving), MAX_EVENTS)):
            p, data = leaving.popleft()
            try:
                p._release(data)
            except Exception:  # one connection's failure must not starve the others
                log.exception("lean connection: read failed")
                p.abort()
        if leaving and not self._draining:
            self._draining = True
            self.loop.call_soon(self._drain)


class LeanProtocol(MQTTProtocol):
    """One accepted plain-TCP connection: protocol and transport (see the module docstring)."""

    __slots__ = ("backlog", "bits", "poller", "sock")

    def __init__(
        self, core: Core, policy: ListenerPolicy | None, poller: Poller, sock: socket.socket
    ) -> None:
        super().__init__(core, policy, None)  # the poller is the registry
        self.poller = poller
        self.sock: socket.socket | None = sock
        self.backlog: bytearray | None = None  # unsent bytes (None: none)
        self.bits = 0

    def start(self) -> None:
        """Join the poller, tune the socket, create the machine, then read (unless it
        paused or closed already): what ``connection_made`` does on a loop's transport."""
        sock = self.sock
        assert sock is not None
        self.poller.attach(sock.fileno(), self)
        self.transport = cast(asyncio.Transport, self)
        self._tune(sock)
        self._start(self.get_extra_info("peername") if self.policy is not None else None)
        if not self.bits & (_NOREAD | _CLOSING):
            self._watch(True)

    def _fileno(self) -> int:
        sock = self.sock
        return -1 if sock is None else sock.fileno()

    def _watch(self, on: bool) -> None:
        """Register (True) or unregister the socket with the poller, if not so already
        (a held departure's socket is registered again only once handled, ``_release``)."""
        if bool(self.bits & _WATCHED) is on or (on and self.bits & _HELD):
            return
        self.bits ^= _WATCHED
        fd = self._fileno()
        if fd < 0:
            return
        if on:
            self.poller.watch(fd, self)
        else:
            self.poller.unwatch(fd)

    # ------------------------------------------------------------ information
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        sock = self.sock
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
        return bool(self.bits & _CLOSING)

    # ------------------------------------------------------------ reading
    def is_reading(self) -> bool:
        return not self.bits & (_NOREAD | _CLOSING)

    def pause_reading(self) -> None:
        if self.bits & (_NOREAD | _CLOSING):
            return
        self.bits |= _NOREAD
        self._watch(False)

    def resume_reading(self) -> None:
        bits = self.bits
        if bits & _CLOSING or not bits & _NOREAD:
            return
        self.bits = bits & ~_NOREAD
        self._watch(True)

    def _read_ready(self) -> bool:
        """Read the socket: True if the read was handled, False if nothing was read or the
        read is a departure's (a bare DISCONNECT, the end of stream), only held
        (``Poller.hold``: a fleet's departure does not hold up a live client's read)."""
        sock = self.sock
        if self.bits & _LOST_OR_HELD or sock is None:
            return False
        poller = self.poller
        try:
            n = sock.recv_into(poller.buffer)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            self._force_close(exc)
            return True
        if not n:
            self._hold(None)
            return False
        data = poller.view[:n].tobytes()  # the bytes read, copied out of the shared buffer
        if n == 2 and data == _BARE_DISCONNECT:
            self._hold(data)
            return False
        try:  # (``_received`` inline: a Python call less per read, ~1 % of a QoS 0 read path)
            self.data_received(data)
        except Exception as exc:  # MQTTProtocol catches its own; anything else ends the connection
            self._failed(exc)
        return True

    def _hold(self, data: bytes | None) -> None:
        """A departure's read: the socket leaves the poller's set (nothing more is read from
        it before this read is handled: the connection's bytes stay in order) and the read
        waits for ``Poller._drain``. O(1) and one ``epoll_ctl``."""
        self._watch(False)
        self.bits |= _HELD
        self.poller.hold(self, data)

    def _release(self, data: bytes | None) -> None:
        """Handle a held read (``Poller._drain``), then read again unless closing or paused."""
        self.bits &= ~_HELD
        if self.bits & _LOST or self.sock is None:
            return
        if data is None:
            if self.eof_received():
                self.pause_reading()  # kept open for writing; nothing more to read
            else:
                self.close()
            return
        self._received(data)
        if not self.bits & (_NOREAD | _CLOSING):
            self._watch(True)

    def _received(self, data: bytes) -> None:
        try:
            self.data_received(data)
        except Exception as exc:  # MQTTProtocol catches its own; anything else ends the connection
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        """``data_received`` raised (a bug: MQTTProtocol catches its own): reported, closed."""
        self.poller.loop.call_exception_handler(
            {"message": "protocol.data_received() failed", "exception": exc, "protocol": self}
        )
        self._force_close(exc)

    # ------------------------------------------------------------ writing
    def get_write_buffer_size(self) -> int:
        backlog = self.backlog
        return 0 if backlog is None else len(backlog)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        bits = self.bits
        if bits & _EOF:
            raise RuntimeError("Cannot call write() after write_eof()")
        if not data or bits & _LOST:
            return
        backlog = self.backlog
        if backlog is not None:
            backlog += data
            self._pause_if_over()
            return
        sock = self.sock
        assert sock is not None
        try:
            n = sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:
            self._force_close(exc)
            return
        if n == len(data):
            return
        self.backlog = bytearray(memoryview(data)[n:])
        self.poller.loop.add_writer(sock.fileno(), self._write_ready)
        self._pause_if_over()

    def _write_ready(self) -> None:
        backlog = self.backlog
        sock = self.sock
        if backlog is None or sock is None or self.bits & _LOST:
            return
        fd = sock.fileno()
        try:
            n = sock.send(backlog)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._force_close(exc)
            return
        del backlog[:n]
        if self.write_paused and len(backlog) <= self.core.config.write_buffer_high // 4:
            self.resume_writing()  # may write more (onto the backlog)
        if self.backlog:
            return
        self.backlog = None  # empty: released
        self.poller.loop.remove_writer(fd)
        bits = self.bits
        if bits & _CLOSING:
            self._connection_lost(None)
        elif bits & _EOF:
            self._shutdown_write()

    def _pause_if_over(self) -> None:
        if not self.write_paused and self.get_write_buffer_size() > self.core.config.write_buffer_high:
            self.pause_writing()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self.bits & (_CLOSING | _EOF):
            return
        self.bits |= _EOF
        if self.backlog is None:
            self._shutdown_write()

    def _shutdown_write(self) -> None:
        sock = self.sock
        if sock is not None:
            sock.shutdown(socket.SHUT_WR)

    # ------------------------------------------------------------ closing
    def close(self) -> None:
        if self.bits & _CLOSING:
            return
        self.bits |= _CLOSING
        self._watch(False)
        if self.backlog is None:
            self._connection_lost(None)

    def abort(self) -> None:
        self._force_close(None)

    def _force_close(self, exc: Exception | None) -> None:
        """``abort``, or a socket error (``exc``): the connection is over at once."""
        if self.bits & _LOST:
            return
        if self.backlog is not None:
            self.backlog = None
            fd = self._fileno()
            if fd >= 0:
                self.poller.loop.remove_writer(fd)
        self.bits |= _CLOSING
        self._watch(False)
        self._connection_lost(exc)

    def _connection_lost(self, exc: Exception | None) -> None:
        if self.bits & _LOST:
            return
        self.bits |= _LOST
        self.poller.loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: Exception | None) -> None:
        sock = self.sock
        fd = -1 if sock is None else sock.fileno()
        try:
            self.connection_lost(exc)
        finally:
            self.sock = None
            if sock is not None:
                sock.close()
            self.poller.detach(fd, self)
