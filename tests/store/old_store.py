"""A store with every QoS 1/2 flow state, written by a running broker (the fixture's maker).

``python -m tests.store.old_store OUT`` (from a checkout's root, with its own ``.venv``) runs
that checkout's broker on the database file ``OUT`` and leaves in it a persisted session
``sub`` (subscribed to ``t/#`` at QoS 2, ``max_inflight`` 2) with

* ``t/1`` (QoS 1) in flight, PUBLISH sent and not acknowledged (state PUBLISH_SENT),
* ``t/2`` (QoS 2) in flight, PUBREC received and PUBREL sent (state PUBREL_SENT),
* ``t/3`` (QoS 1) queued behind the full window (state QUEUED),

and a persisted publisher ``pub`` whose QoS 2 packet id 9 awaits PUBREL.
``tests/store/data/store-main-b166b29.db`` was written so by siftmq's main at commit b166b29
(the last before issue 41 item 2),
before the flow state had one encoding (``broker.values._flow``): the core then counted 0/1
and translated to the store's 1/2; ``test_store_compat.py`` opens it with today's code.
"""

from __future__ import annotations

import asyncio
import sys

from broker import Broker
from broker.packets import Properties, Publish, Pubrec, Pubrel, SubscriptionRequest
from tests.rawclient import RawClient

__all__ = ["write_store"]

EXPIRY = Properties(session_expiry_interval=0xFFFFFFFF)  # never expires: the file has no age


async def write_store(path: str) -> None:
    """Run a broker on ``path`` and leave the state described above in it."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=path, max_inflight=2) as b:
        sub, _ = await RawClient.connect(b.port, "sub", 5, clean_start=True, properties=EXPIRY)
        await sub.subscribe(SubscriptionRequest("t/#", 2))
        pub, _ = await RawClient.connect(b.port, "pub", 5, clean_start=True, properties=EXPIRY)
        pub.send(Publish("t/1", b"one", 1, packet_id=1))
        pub.send(Publish("t/2", b"two", 2, packet_id=2))
        pub.send(Publish("t/3", b"three", 1, packet_id=3))
        pub.send(Publish("t/4", b"routed once", 2, packet_id=9))  # PUBREL never sent
        await pub.recv_where(lambda p: isinstance(p, Pubrec) and p.packet_id == 9)
        two = await sub.recv_where(lambda p: isinstance(p, Publish) and p.topic == "t/2")
        assert isinstance(two, Publish) and two.packet_id is not None
        sub.send(Pubrec(two.packet_id))
        await sub.recv_where(lambda p: isinstance(p, Pubrel))
        await sub.barrier()
        await pub.barrier()
        await RawClient.close_all()


if __name__ == "__main__":
    asyncio.run(write_store(sys.argv[1]))
