"""Slow consumers cannot stall anyone else (issue 7, item 5; docs/fault.md).

Two subscribers that never read (raw sockets with a 4 KiB receive buffer; one at QoS 0, one
at QoS 1) and two fast QoS 1 subscribers share a topic; a publisher sends 8 MiB in QoS 1
messages. The fast subscribers get every message in order; the QoS 0 slow one loses messages
(transport paused -> dropped, counted in ``$SYS/broker/messages/dropped``); the QoS 1 slow one
fills its in-flight window and queue up to its high-water mark, which pauses the publisher for
the grace time (issue 14, flow control), or until it is found hung (its socket took nothing
for ``hung_consumer_time``; issue 31); then it is a slow consumer and its policy applies:
``drop`` queues up to ``max_queued_messages`` and drops the rest (counted) - except for a hung
consumer, which is disconnected at a full queue rather than lose acknowledged messages while
connected - ``disconnect`` disconnects it (QUOTA_EXCEEDED). No queue grows beyond
``max_queued_messages``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest

from broker import Broker
from broker.packets import Connect, Puback, Publish, Subscribe, SubscriptionRequest, encode
from tests.rawclient import RawClient
from tests.waiting import eventually

N = 1000
PAYLOAD = b"x" * 8192
TOPIC = "slow/t"
T = 30.0


async def _never_reader(port: int, client_id: str, qos: int) -> socket.socket:
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    data = encode(Connect(client_id, 5), 5) + encode(Subscribe(1, (SubscriptionRequest(TOPIC, qos),)), 5)
    await loop.sock_sendall(sock, data)
    return sock


async def _fast(c: RawClient) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < N:
        p = await c.recv(T)
        if isinstance(p, Publish):
            assert p.qos == 1 and p.packet_id is not None
            c.send(Puback(p.packet_id))
            got.append(p.payload[:8])
    return got


@pytest.mark.parametrize(("policy", "hung"), [("drop", 0.0), ("drop", 0.25), ("disconnect", 0.25)])
async def test_slow_consumers_do_not_stall_fast_ones(policy: str, hung: float) -> None:
    async with Broker(
        host="127.0.0.1",
        port=0,
        sys_interval=0,
        max_queued_messages=50,
        max_inflight=10,
        slow_consumer_grace=60.0 if hung else 0.3,  # hung: released only by the hung detection
        slow_consumer_policy=policy,
        hung_consumer_time=hung,
        tick_interval=0.05,
    ) as b:
        fast = [(await RawClient.connect(b.port, f"fast{i}", 5))[0] for i in range(2)]
        for c in fast:
            await c.subscribe(TOPIC)
        slow = [await _never_reader(b.port, "slow0", 0), await _never_reader(b.port, "slow1", 1)]
        try:
            # both slow subscriptions are in place before publishing (a PINGREQ round trip
            # of the same broker loop does not order other connections, so check the index)
            index = b.core.router.index
            await eventually(lambda: index.entry_count("slow0") + index.entry_count("slow1") >= 2, T)
            readers = [asyncio.create_task(_fast(c)) for c in fast]
            pub, _ = await RawClient.connect(b.port, "pub", 5)
            for i in range(N):
                await pub.publish1(TOPIC, b"%07d|" % i + PAYLOAD)
            results = await asyncio.wait_for(asyncio.gather(*readers), T)
            expected = [b"%07d|" % i for i in range(N)]
            assert all(r == expected for r in results)
            sys = b.core.sys_values(0.0)
            assert int(sys["$SYS/broker/messages/dropped"]) > 0  # the QoS 0 slow one
            assert int(sys["$SYS/broker/flow/slow_consumers/total"]) >= 1  # the QoS 1 slow one
            s1 = b.core.sessions.get("slow1")
            if policy == "disconnect":
                assert s1 is None or s1.conn is None  # disconnected for QUOTA_EXCEEDED
                assert int(sys["$SYS/broker/flow/slow_consumers/disconnected"]) == 1
            elif hung:  # hung (never reads): disconnected at its full queue, not dropping
                assert s1 is None or s1.conn is None
                assert int(sys["$SYS/broker/flow/slow_consumers/hung"]) >= 1
            else:
                assert s1 is not None and s1.conn is not None
                assert int(sys["$SYS/broker/flow/dropped/queue_full"]) >= 1
            assert all(len(s.queue) <= 50 for s in b.core.sessions.values())
            b.core._check()
        finally:
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.close()
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace
