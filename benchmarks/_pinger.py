"""What the auth benchmarks measure the broker's event loop with, and how they pace a storm
(benchmarks/bench_auth_storm.py, benchmarks/bench_auth_backends.py).

:func:`pinger` is an MQTT 5 session on a blocking socket (TCP_NODELAY), connected before the
load starts (its CONNECT would otherwise queue behind the load's); :func:`pings` sends one
PINGREQ at a time and records each round trip, which is how long the broker's loop took to
get to a tiny request.  :func:`paced` starts ``rate`` coroutines a second for ``seconds``
(on a schedule, not after each other's end) and waits for all of them.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any

from broker.packets import Connack, Connect, Decoder, Pingreq, encode

__all__ = ["paced", "pinger", "pings"]


def pinger(port: int) -> socket.socket:
    """A connected MQTT 5 session (client id ``pinger``, no keep-alive) on 127.0.0.1:``port``."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(60)
    s.sendall(encode(Connect("pinger", 5, keep_alive=0), 5))
    dec = Decoder(5, server=False)
    got: list[Any] = []
    while not got:
        got = dec.feed(s.recv(4096))
    assert isinstance(got[0], Connack) and got[0].reason_code == 0, got
    return s


def pings(s: socket.socket, seconds: float) -> list[float]:
    """PINGREQ -> PINGRESP round trips (seconds each) for ``seconds``, one at a time."""
    ping = encode(Pingreq(), 5)
    rtts: list[float] = []
    end = time.perf_counter() + seconds
    while (t0 := time.perf_counter()) < end:
        s.sendall(ping)
        data = s.recv(16)
        while len(data) < 2:  # PINGRESP is 2 bytes: 0xD0 0x00
            data += s.recv(16)
        rtts.append(time.perf_counter() - t0)
        assert data[:2] == b"\xd0\x00", data
    return rtts


async def paced(
    rate: float, seconds: float, attempt: Callable[[int], Coroutine[Any, Any, None]], tolerate: bool = False
) -> int:
    """Start ``attempt(i)`` at ``start + i / rate`` for ``seconds`` and wait for them all (an
    exception of one is raised, or with ``tolerate`` ignored); how many were started."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    i = 0
    while (due := start + i / rate) < start + seconds:
        await asyncio.sleep(max(0.0, due - loop.time()))
        tasks.append(asyncio.create_task(attempt(i)))
        i += 1
    await asyncio.gather(*tasks, return_exceptions=tolerate)
    return i
