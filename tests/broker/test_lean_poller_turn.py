"""A loop turn of the lean poller reads at most ``MAX_EVENTS`` (256) sockets (issue 42 item 2).

A fleet disconnecting at once made every socket ready together: with 1,024 per turn the
broker's loop stalled 218-368 ms for 10,000 subscribers (a DISCONNECT read, a session ended
and a socket closed per socket; ``bench_content_fleet.py``'s ``stall_teardown``).  The rest
is read at the next turns, so timers and other clients get the loop in between.  A real
embedded broker and real TCP clients; the poller's methods are wrapped only to count.
"""

from __future__ import annotations

import asyncio

import pytest

from broker import Broker
from broker.net import _lean

CONNECT = bytes([0x10, 12, 0, 4]) + b"MQTT" + bytes([4, 2, 0, 0, 0, 0])  # 3.1.1, empty client id
PINGREQ = b"\xc0\x00"


async def test_a_turn_reads_at_most_max_events_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 400  # ready at once: more than a turn of 256
    per_turn: list[int] = []
    reads = [0]
    ready, read_ready = _lean.Poller._ready, _lean.LeanProtocol._read_ready

    def counted_ready(self: _lean.Poller) -> None:
        reads[0] = 0
        ready(self)
        per_turn.append(reads[0])

    def counted_read(self: _lean.LeanProtocol) -> None:
        reads[0] += 1
        read_ready(self)

    monkeypatch.setattr(_lean.Poller, "_ready", counted_ready)
    monkeypatch.setattr(_lean.LeanProtocol, "_read_ready", counted_read)
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        clients = []
        for _ in range(n):
            r, w = await asyncio.open_connection("127.0.0.1", b.port)
            w.write(CONNECT)
            assert (await asyncio.wait_for(r.readexactly(4), 10))[0] == 0x20
            clients.append((r, w))
        per_turn.clear()
        for _, w in clients:  # every socket ready together: no await in between
            w.write(PINGREQ)
        for r, _ in clients:
            assert await asyncio.wait_for(r.readexactly(2), 10) == b"\xd0\x00"
        assert sum(per_turn) >= n
        assert max(per_turn) <= _lean.MAX_EVENTS <= 256, per_turn
        assert sum(1 for k in per_turn if k) >= 2, per_turn  # the rest at the next turns
        for _, w in clients:
            w.close()
