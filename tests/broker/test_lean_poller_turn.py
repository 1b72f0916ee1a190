"""A loop turn of the lean poller reads at most ``MAX_EVENTS`` (64) sockets (issue 42 item 2).

A fleet disconnecting at once made every socket ready together: with 1,024 per turn the
broker's loop stalled 218-368 ms for 10,000 subscribers (a DISCONNECT read, a session ended
and a socket closed per socket; ``bench_content_fleet.py``'s ``stall_teardown``).  The rest
is read at the next turns, so timers and other clients get the loop in between.  A real
embedded broker and real TCP clients; the poller's methods are wrapped only to count.
"""

from __future__ import annotations

import asyncio
import socket
import tracemalloc
from typing import Any

import pytest

from broker import Broker
from broker.net import _lean

CONNECT = bytes([0x10, 12, 0, 4]) + b"MQTT" + bytes([4, 2, 0, 0, 0, 0])  # 3.1.1, empty client id
PINGREQ = b"\xc0\x00"


async def _connected(port: int, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``n`` raw MQTT 3.1.1 clients, each past its CONNACK."""
    clients = []
    for _ in range(n):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(CONNECT)
        assert (await asyncio.wait_for(r.readexactly(4), 10))[0] == 0x20
        clients.append((r, w))
    return clients


async def _ping_together(clients: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    """Every client sends a PINGREQ with no await in between (every socket ready together),
    then each reads its PINGRESP."""
    for _, w in clients:
        w.write(PINGREQ)
    for r, _ in clients:
        assert await asyncio.wait_for(r.readexactly(2), 10) == b"\xd0\x00"


async def test_a_turn_reads_at_most_max_events_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 400  # ready at once: more than a turn of 64
    per_turn: list[int] = []
    reads = [0]
    ready, read_ready = _lean.Poller._ready, _lean.LeanProtocol._read_ready

    def counted_ready(self: _lean.Poller) -> None:
        reads[0] = 0
        ready(self)
        per_turn.append(reads[0])

    def counted_read(self: _lean.LeanProtocol) -> bool:
        reads[0] += 1
        return read_ready(self)  # True: a read handled (a departure's is only held)

    monkeypatch.setattr(_lean.Poller, "_ready", counted_ready)
    monkeypatch.setattr(_lean.LeanProtocol, "_read_ready", counted_read)
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        clients = await _connected(b.port, n)
        per_turn.clear()
        await _ping_together(clients)
        assert sum(per_turn) >= n
        assert max(per_turn) <= _lean.MAX_EVENTS <= 64, per_turn
        assert sum(1 for k in per_turn if k) >= 2, per_turn  # the rest at the next turns
        for _, w in clients:
            w.close()


async def test_a_read_does_not_allocate_the_whole_read_size() -> None:
    """A read lands in the poller's shared buffer and only the bytes read are copied out: before,
    ``sock.recv(MAX_READ)`` allocated a 256-KiB object per read and shrank it (``mmap`` /
    ``mremap`` / ``munmap``, ~30 us for a 2-byte packet), once per read of every connection,
    twice per connection of a fleet leaving (its DISCONNECT and its end of stream)."""
    loop = asyncio.get_running_loop()
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        sock = socket.create_connection(("127.0.0.1", b.port))
        sock.setblocking(False)
        try:
            await loop.sock_sendall(sock, CONNECT)
            assert (await asyncio.wait_for(loop.sock_recv(sock, 4), 10))[0] == 0x20
            tracemalloc.start()
            try:
                tracemalloc.reset_peak()
                for _ in range(20):
                    await loop.sock_sendall(sock, PINGREQ)
                    assert await asyncio.wait_for(loop.sock_recv(sock, 2), 10) == b"\xd0\x00"
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak < _lean.MAX_READ // 4, f"{peak} bytes at the peak of 20 PINGREQ round trips"
        finally:
            sock.close()


class _CountingEpoll:
    """The poller's ``select.epoll``, passed through, counting the ready pairs it returns."""

    def __init__(self, ep: Any) -> None:
        self.ep = ep
        self.pairs = 0

    def poll(self, timeout: float, maxevents: int) -> list[tuple[int, int]]:
        got: list[tuple[int, int]] = self.ep.poll(timeout, maxevents)
        self.pairs += len(got)
        return got

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ep, name)


async def test_turns_over_many_ready_sockets_poll_each_about_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """With more than ``MAX_EVENTS`` live sockets ready, a turn asks epoll for ``MAX_EVENTS``,
    not ``MAX_READY``: asking for 1,024 built a (descriptor, events) pair for every ready socket
    at every turn and read 64 of them (500 ready publishers: ~2,200 pairs for 500 reads, the
    QoS 0 read path of a fleet, ``bench_broker_smoke.py --core-qos0`` lean500)."""
    n = 400
    counters: list[_CountingEpoll] = []
    ready = _lean.Poller._ready

    def counted_ready(self: _lean.Poller) -> None:
        if not isinstance(self._ep, _CountingEpoll):
            counters.append(_CountingEpoll(self._ep))
            self._ep = counters[-1]  # type: ignore[assignment]
        ready(self)

    monkeypatch.setattr(_lean.Poller, "_ready", counted_ready)
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        clients = await _connected(b.port, n)
        (counter,) = counters
        counter.pairs = 0
        await _ping_together(clients)
        assert n <= counter.pairs <= n + n // 4, f"{counter.pairs} ready pairs polled for {n} reads"
        for _, w in clients:
            w.close()
