"""A hung subscriber does not stall healthy publishers for the grace time (issue 31, item 3).

A subscriber on ``bench/#`` whose socket stops taking bytes (a raw socket that never reads)
is over its high-water mark, which pauses every publisher feeding it. With
``slow_consumer_grace`` at 60 s, the healthy publisher-paced pairs can only finish their
messages if the broker finds the subscriber *hung* (its socket took nothing for
``hung_consumer_time``) and releases them long before the grace time: the test waits for
the healthy deliveries (bounded by far less than the grace) instead of measuring time.
Acknowledged messages are not lost: the healthy subscribers get all of them in order, and the
hung one, under the default ``drop`` policy, is disconnected when its queue is full instead of
dropping (a persistent session keeps its queue and gets it on reconnecting). A subscriber that
is slow but keeps reading is never taken for hung: its publisher stays paced and it gets
everything. One that was taken for hung and reads again (a client starved of CPU, a long GC
pause) is paced again instead of disconnected, and gets everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest

from broker import Broker
from broker.packets import Connect, Properties, Puback, Publish, Subscribe, SubscriptionRequest, encode
from tests.rawclient import RawClient
from tests.waiting import eventually

N = 300  # messages per healthy publisher
PAIRS = 3
WINDOW = 10  # unacknowledged PUBLISHes per publisher (publisher-paced, as device SDKs do)
T = 20.0  # far below the 60 s grace: only the hung detection can release the publishers
OPTIONS = {
    "host": "127.0.0.1",
    "port": 0,
    "sys_interval": 0,
    "max_inflight": 5,
    "max_queued_messages": 40,  # high-water mark 10, low-water mark 5
    "slow_consumer_grace": 60.0,
}


async def _hung(port: int, client_id: str, persistent: bool) -> socket.socket:
    """A subscriber on ``bench/#`` that never reads its socket (a 4 KiB receive buffer)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    props = Properties(session_expiry_interval=300) if persistent else Properties()
    connect = Connect(client_id, 5, clean_start=not persistent, properties=props)
    data = encode(connect, 5) + encode(Subscribe(1, (SubscriptionRequest("bench/#", 1),)), 5)
    await loop.sock_sendall(sock, data)
    return sock


async def _publish_paced(c: RawClient, topic: str, n: int) -> None:
    """``n`` QoS 1 PUBLISHes, at most WINDOW unacknowledged: a new one per PUBACK."""
    sent = acked = 0
    while acked < n:
        while sent < n and sent - acked < WINDOW:
            c.send(Publish(topic, b"%06d" % sent, 1, packet_id=c.pid()))
            sent += 1
        p = await c.recv(T)
        if isinstance(p, Puback):
            acked += 1


async def _receive(c: RawClient, n: int, pause: float = 0.0) -> list[bytes]:
    """The payloads of ``n`` QoS 1 deliveries, each acknowledged (``pause``: a slow reader)."""
    got: list[bytes] = []
    while len(got) < n:
        p = await c.recv(T)
        if isinstance(p, Publish):
            assert p.packet_id is not None
            c.send(Puback(p.packet_id))
            got.append(p.payload)
            if pause:
                await asyncio.sleep(pause)  # the reader's own work: slow, but it keeps reading
    return got


@pytest.mark.parametrize("persistent", [False, True])
async def test_hung_subscriber_releases_healthy_publishers(persistent: bool) -> None:
    async with Broker(**OPTIONS) as b:  # type: ignore[arg-type]
        hung = await _hung(b.port, "hung", persistent)
        try:
            await eventually(lambda: b.core.router.index.entry_count("hung") == 1, T)
            subs, pubs = [], []
            for i in range(PAIRS):
                s, _ = await RawClient.connect(b.port, f"sub{i}")
                await s.subscribe(f"bench/{i}")
                subs.append(s)
                pubs.append((await RawClient.connect(b.port, f"pub{i}"))[0])
            readers = [asyncio.create_task(_receive(s, N)) for s in subs]
            await asyncio.wait_for(
                asyncio.gather(*(_publish_paced(p, f"bench/{i}", N) for i, p in enumerate(pubs))), T
            )
            got = await asyncio.wait_for(asyncio.gather(*readers), T)
            assert all(g == [b"%06d" % k for k in range(N)] for g in got)  # nothing lost
            sys = b.core.sys_values(0.0)
            assert int(sys["$SYS/broker/flow/slow_consumers/hung"]) == 1
            # policy drop: queued up to its bound, then disconnected rather than dropping
            s = b.core.sessions.get("hung")
            if not persistent:
                assert s is None
            else:
                assert s is not None and s.conn is None and len(s.queue) == 40
                kept = len(s.queue) + len(s.inflight)
                back, ack = await RawClient.connect(
                    b.port, "hung", clean_start=False, properties=Properties(session_expiry_interval=300)
                )
                assert ack.session_present
                again = await _receive(back, kept)
                assert len(again) == kept and all(p.startswith(b"0") for p in again)
            assert all(len(x.queue) <= 40 for x in b.core.sessions.values())
            b.core._check()
        finally:
            with contextlib.suppress(OSError):
                hung.close()
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


async def test_slow_but_reading_subscriber_is_not_hung() -> None:
    async with Broker(**OPTIONS) as b:  # type: ignore[arg-type]
        slow, _ = await RawClient.connect(b.port, "slow")
        await slow.subscribe("bench/#")
        pub, _ = await RawClient.connect(b.port, "pub")
        n = 100
        reader = asyncio.create_task(_receive(slow, n, pause=0.002))
        await asyncio.wait_for(_publish_paced(pub, "bench/0", n), T)
        assert await asyncio.wait_for(reader, T) == [b"%06d" % k for k in range(n)]
        st = b.core.stats
        assert st.publisher_pauses >= 1  # it was over its mark: its publisher was paced
        assert st.hung_consumer_events == 0 and st.slow_consumer_events == 0
        b.core._check()
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


async def test_hung_subscriber_that_reads_again_is_paced_not_disconnected() -> None:
    async with Broker(**OPTIONS) as b:  # type: ignore[arg-type]
        sock = await _hung(b.port, "back", persistent=False)
        await eventually(lambda: b.core.router.index.entry_count("back") == 1, T)
        pub, _ = await RawClient.connect(b.port, "pub")
        # 5 in flight + 15 queued: over the high-water mark (10), below the bound (40); the
        # publisher is paused until the subscriber is found hung, then released
        await asyncio.wait_for(_publish_paced(pub, "bench/0", 20), T)
        assert b.core.stats.hung_consumer_events == 1
        reader, writer = await asyncio.open_connection(sock=sock)  # it reads again
        back = RawClient(reader, writer, 5)
        got = asyncio.create_task(_receive(back, 100))
        await asyncio.wait_for(_publish_paced(pub, "bench/0", 80), T)  # would overflow the bound
        assert [int(p) for p in await asyncio.wait_for(got, T)] == list(range(20)) + list(range(80))
        s = b.core.sessions["back"]
        assert s.conn is not None and b.core.stats.dropped_queue_full == 0
        b.core._check()
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace
