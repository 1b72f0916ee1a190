"""The outbound bridge benchmark's load generator (benchmarks/bench_uplink.py, issue 40).

Raw MQTT 5 over ``asyncio.Protocol`` (the framing of benchmarks/_storm_client.py, no client
library in the way), uvloop when installed, so the generator is not the cap it was with paho
(one paho publisher and one paho subscriber reached about 6,000 msg/s straight to mosquitto):

* :func:`publish_slice` runs in one of several worker processes: one connection, QoS 1
  PUBLISHes with at most ``window`` unacknowledged (capped by the broker's Receive Maximum
  from CONNACK), and returns how many were acknowledged, when the first was sent and the
  last acknowledged (``time.monotonic()``: one clock for every process of the machine) and
  the process's CPU seconds;
* :func:`counter_main` runs in its own process: one connection to the central, subscribed to
  ``central/#`` at QoS 1, acknowledging and counting every PUBLISH (``persistent``: a
  persistent session that reconnects every 20 ms while the central is down, for the drain
  measure: a central with persistence on keeps what arrives for it meanwhile).  The parent drives it
  over a pipe with :func:`expect`: ``("expect", tag, n, idle)`` starts a measure (payloads
  beginning with ``tag``), answered at once by ``("armed", tag)`` and later by :class:`Count`
  once ``n`` distinct payloads arrived or nothing new arrived for ``idle`` seconds.

The ``armed`` answer is what makes the count exact: the counter reads its pipe in the same
event loop as its socket, and a PUBLISH read before it took the ``expect`` in is acknowledged
but not counted (its tag is not yet the measure's).  A parent that started its publishers right
after sending ``expect`` lost the race whenever the counter's thread or process was slow to be
scheduled: under load, the first 20 of 600 acknowledged messages arrived, were PUBACKed and were
ignored (the broker had delivered all 600, no drop counted).  :func:`expect` returns only once
the counter is armed, so everything published after it is counted.

Both sides cost O(1) per message (a dict insert at the counter); each reports its CPU
seconds so the benchmark can show the generator's load beside the brokers'.
"""

from __future__ import annotations

import asyncio
import functools
import struct
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from _storm_client import (
    DISCONNECT,
    _frame,
    _Proto,
    _publish_fields,
    connect_packet,
    publish_packet,
    subscribe_packet,
)

from broker.packets import Connack, Decoder

__all__ = ["Count", "Sent", "counter_main", "expect", "publish_slice"]


@dataclass(frozen=True, slots=True)
class Sent:
    """One publisher process's outcome."""

    acked: int
    first: float  # time.monotonic() of the first PUBLISH
    last: float  # time.monotonic() of the last PUBACK
    cpu: float  # CPU seconds of the process during the run
    window: int  # the window actually used (min of asked and the broker's Receive Maximum)


@dataclass(frozen=True, slots=True)
class Count:
    """The counter's outcome for one measure."""

    distinct: int
    duplicates: int
    last: float  # time.monotonic() of the last new arrival (0 if none)
    cpu: float  # CPU seconds of the counter process during the measure
    first: float = 0.0  # time.monotonic() of the first new arrival (0 if none)


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        import uvloop

        runner: Callable[[Any], Any] = uvloop.run
    except ImportError:
        runner = asyncio.run
    return runner(coro)


def _receive_maximum(first: int, body: bytes) -> int:
    """The Receive Maximum of a v5 CONNACK (65535 when absent), read by the broker's own codec
    (once per connection)."""
    (connack,) = Decoder(version=5, server=False).feed(_frame(first, body))
    assert isinstance(connack, Connack)
    rm = connack.properties.receive_maximum
    return 65535 if rm is None else rm


async def _publish(port: int, cid: str, prefix: str, tag: str, n: int, window: int) -> Sent:
    loop = asyncio.get_running_loop()
    connack: asyncio.Future[int] = loop.create_future()
    done: asyncio.Future[None] = loop.create_future()
    acked = 0
    last = 0.0
    free: asyncio.Semaphore | None = None

    def on_packet(first: int, body: bytes) -> None:
        nonlocal acked, last
        kind = first >> 4
        if kind == 2 and not connack.done():
            connack.set_result(_receive_maximum(first, body) if body[1] == 0 else -body[1])
        elif kind == 4:
            acked += 1
            assert free is not None
            free.release()
            if acked == n:
                last = time.monotonic()
                if not done.done():
                    done.set_result(None)

    proto = _Proto(on_packet)
    await loop.create_connection(lambda: proto, "127.0.0.1", port)
    proto.send(connect_packet(cid, True, 0))
    rmax = await asyncio.wait_for(connack, 30)
    if rmax < 0:
        raise RuntimeError(f"CONNACK reason {-rmax:#x}")
    window = min(window, rmax)
    free = asyncio.Semaphore(window)
    pad = b"x" * 64
    pid = 0
    t0 = time.monotonic()
    for i in range(n):
        await free.acquire()
        pid = pid % 65535 + 1
        proto.send(publish_packet(f"{prefix}{i % 10}", pid, f"{tag}-{i}-".encode() + pad))
    if n:
        await asyncio.wait_for(done, 300)
    proto.send(DISCONNECT)
    assert proto.transport is not None
    proto.transport.close()
    return Sent(acked, t0, last, 0.0, window)


def publish_slice(port: int, cid: str, prefix: str, tag: str, n: int, window: int) -> Sent:
    """Worker process entry: publish ``n`` QoS 1 messages ``<tag>-<i>-...`` to ``<prefix><i % 10>``."""
    c0 = time.process_time()
    out: Sent = _run(_publish(port, cid, prefix, tag, n, window))
    return Sent(out.acked, out.first, out.last, time.process_time() - c0, out.window)


async def _count(port: int, pipe: Connection, persistent: bool = False) -> None:
    loop = asyncio.get_running_loop()
    seen: dict[bytes, int] = {}
    state: dict[str, Any] = {"tag": b"\x00", "n": 0, "first": 0.0, "last": 0.0, "dups": 0}
    wake = asyncio.Event()
    link: dict[str, Any] = {}  # the current connection ("proto") and its SUBACK ("suback")

    def on_packet(first: int, body: bytes) -> None:
        kind = first >> 4
        if kind == 3:
            _topic, pid, payload = _publish_fields(first, body)
            if pid:
                link["proto"].send(b"\x40\x02" + struct.pack("!H", pid))
            if payload.startswith(state["tag"]):
                if payload in seen:
                    state["dups"] += 1
                else:
                    seen[payload] = 1
                    now = time.monotonic()
                    if not state["first"]:
                        state["first"] = now
                    state["last"] = now
                    if len(seen) >= state["n"]:
                        wake.set()
        elif kind == 9 and not link["suback"].done():
            link["suback"].set_result(None)

    async def connect() -> None:
        """Connect and subscribe (``persistent``: retried every 20 ms while the central is down)."""
        while True:
            proto = _Proto(on_packet)
            try:
                await loop.create_connection(functools.partial(_same, proto), "127.0.0.1", port)
            except OSError:
                if not persistent:
                    raise
                await asyncio.sleep(0.02)
                continue
            link.update(proto=proto, suback=loop.create_future())
            cid = "bench-drain-counter" if persistent else "bench-counter"
            proto.send(connect_packet(cid, not persistent, 3600 if persistent else 0))
            proto.send(subscribe_packet(1, ["central/#"]))
            try:
                await asyncio.wait_for(link["suback"], 5 if persistent else 30)
            except TimeoutError:
                if not persistent:
                    raise RuntimeError("the counter could not subscribe") from None
                assert proto.transport is not None
                proto.transport.close()  # the central went away meanwhile: again
                continue
            return

    async def reconnect() -> None:
        """``persistent``: the central's session keeps what arrives while the counter is away;
        reconnect as soon as the connection is lost (the central restarted)."""
        while True:
            await link["proto"].closed
            await connect()

    await connect()
    keeper = loop.create_task(reconnect()) if persistent else None
    pipe.send("ready")
    readable = asyncio.Event()
    loop.add_reader(pipe.fileno(), readable.set)
    while True:
        await readable.wait()
        readable.clear()
        while pipe.poll():
            msg = pipe.recv()
            if msg[0] == "stop":
                if keeper is not None:
                    keeper.cancel()
                proto = link["proto"]
                proto.send(DISCONNECT)
                assert proto.transport is not None
                proto.transport.close()
                return
            _, tag, n, idle = msg
            seen.clear()
            wake.clear()
            c0 = time.process_time()
            state.update(tag=tag.encode(), n=n, first=0.0, last=0.0, dups=0)
            pipe.send(("armed", tag))  # from here on, every PUBLISH tagged ``tag`` is counted
            while len(seen) < n:
                before = len(seen)
                try:
                    await asyncio.wait_for(wake.wait(), idle)
                except TimeoutError:
                    if len(seen) == before:
                        break
            pipe.send(
                Count(len(seen), state["dups"], state["last"], time.process_time() - c0, state["first"])
            )


def expect(pipe: Connection, tag: str, n: int, idle: float, timeout: float = 30.0) -> None:
    """Start a measure at the counter behind ``pipe`` (``n`` distinct payloads beginning with
    ``tag``, or ``idle`` seconds without a new one) and return once the counter is armed: start
    the publishers only after this returns.  Its :class:`Count` is the pipe's next message."""
    pipe.send(("expect", tag, n, idle))
    if not pipe.poll(timeout):
        raise RuntimeError(f"the counter did not start the measure {tag!r} within {timeout} s")
    reply = pipe.recv()
    if reply != ("armed", tag):
        raise RuntimeError(f"the counter answered {reply!r} to the measure {tag!r}")


def _same(proto: _Proto) -> _Proto:
    return proto


def counter_main(port: int, pipe: Connection, persistent: bool = False) -> None:
    """Counter process entry: count ``central/#`` at the broker on ``port`` until told to stop
    (``persistent``: a persistent session, reconnected while the broker restarts)."""
    _run(_count(port, pipe, persistent))
