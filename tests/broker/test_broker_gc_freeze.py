"""A broker holding many sessions freezes the survivors of a full collection (issue 42 item 2).

A full (generation 2) collection walks every long-lived object: with 10,000 sessions holding
content selectors that took ~0.3 s in-process, with 100,000 selectors ~1 s, a stall of the
event loop the next full collection repeats.  After a full collection, once the sessions grew
by ``FREEZE_SESSIONS`` since the last freeze, the broker's tick moves the heap to the
permanent generation (``gc.freeze``), as the store's restore does.  A real embedded broker;
the sessions are in-process subscribers (``Core.local_subscribe``).
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

from broker import Broker
from broker._broker import FREEZE_SESSIONS
from tests.waiting import eventually


async def test_a_full_collection_with_many_new_sessions_freezes_the_heap() -> None:
    gc.unfreeze()
    try:
        async with Broker(port=0, sys_interval=0, tick_interval=0.05) as b:
            for i in range(FREEZE_SESSIONS + 100):
                b.core.local_subscribe(f"s{i}", "t/#", None, 0, lambda m, r: None, 0.0)
            assert gc.get_freeze_count() == 0
            gc.collect()
            await eventually(lambda: gc.get_freeze_count() > 0, 10.0)  # else: the heap was not frozen
            frozen = gc.get_freeze_count()
            # no new growth: a later full collection freezes nothing more
            gc.collect()
            await eventually(lambda: b._full_seen == gc.get_stats()[2]["collections"], 10.0)
            assert gc.get_freeze_count() <= frozen  # (frozen objects freed meanwhile leave it)
    finally:
        gc.unfreeze()


async def test_few_sessions_never_freeze() -> None:
    gc.unfreeze()
    try:
        async with Broker(port=0, sys_interval=0, tick_interval=0.05) as b:
            for i in range(50):
                b.core.local_subscribe(f"s{i}", "t/#", None, 0, lambda m, r: None, 0.0)
            gc.collect()
            await eventually(
                lambda: b._full_seen == gc.get_stats()[2]["collections"], 10.0
            )  # a tick looked at it
            assert gc.get_freeze_count() == 0
        assert not [c for c in gc.callbacks if getattr(c, "__self__", None) is b]  # no per-collection hook
    finally:
        gc.unfreeze()


def _left_for_the_collector(cls: type) -> int:
    """After one collection with the heap as the broker left it: how many ``cls`` objects were
    still garbage that only a collection of the unfrozen heap finds (frozen cycles)."""
    gc.collect()
    gc.unfreeze()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return sum(1 for o in gc.garbage if type(o) is cls)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _connect_and_subscribe(client_id: str) -> bytes:
    """CONNECT (MQTT 3.1.1, clean session) and SUBSCRIBE a/b QoS 0, as bytes."""
    cid = client_id.encode()
    var = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(cid).to_bytes(2, "big") + cid
    return bytes([0x10, len(var)]) + var + b"\x82\x08\x00\x01\x00\x03a/b\x00"


async def test_a_frozen_fleet_that_leaves_is_freed() -> None:
    """A closed connection is a reference cycle (connection, session, protocol, transport) that
    only the collector frees: once FREEZE_SESSIONS connections of a frozen heap closed, the
    broker unfreezes it so that a full collection frees them (before: they stayed for good)."""
    from broker.core._connection import Connection

    gc.unfreeze()
    n = FREEZE_SESSIONS + 50
    try:
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05) as b:
            streams = []
            for i in range(n):
                r, w = await asyncio.open_connection("127.0.0.1", b.port)
                w.write(_connect_and_subscribe(f"fleet{i}"))
                assert (await r.readexactly(4))[:2] == b"\x20\x02"  # CONNACK
                streams.append((r, w))
            await eventually(lambda: len(b.core.sessions) == n, 10.0)
            gc.collect()
            await eventually(lambda: gc.get_freeze_count() > 0, 10.0)  # else: the heap was not frozen
            for _, w in streams:
                w.write(b"\xe0\x00")  # DISCONNECT
                w.close()
            streams.clear()
            await eventually(lambda: not b.core.sessions and not b.core.connections, 30.0)
            await eventually(lambda: gc.get_freeze_count() == 0, 10.0)  # else: the heap stayed frozen
            left = _left_for_the_collector(Connection)
            assert left == 0, f"{left} closed connections were still waiting for the collector"
    finally:
        gc.unfreeze()


async def _fleet(b: Broker, n: int, *, clean: bool) -> None:
    """``n`` clients connect (clean session or not), subscribe, disconnect; returns when the
    broker has no connection left."""
    writers = []
    for i in range(n):
        r, w = await asyncio.open_connection("127.0.0.1", b.port)
        packet = bytearray(_connect_and_subscribe(f"fleet{i}"))
        if not clean:
            packet[9] = 0x00  # connect flags: no clean session
        w.write(bytes(packet))
        assert (await r.readexactly(4))[:2] == b"\x20\x02"  # CONNACK
        writers.append(w)
    for w in writers:
        w.write(b"\xe0\x00")
        w.close()
    await eventually(lambda: not b.core.connections, 30.0)


async def test_restored_sessions_discarded_are_freed(tmp_path: Path) -> None:
    """The restore freezes the heap holding the restored sessions; once FREEZE_SESSIONS of them
    are gone (here: clean-session clients of the same ids discard them), the broker unfreezes
    the heap so that the collector frees them (before: 1,050 Sessions stayed for good)."""
    from broker.core._session import Session

    db = tmp_path / "store.db"
    n = FREEZE_SESSIONS + 50
    gc.unfreeze()
    try:
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=db) as b:
            await _fleet(b, n, clean=False)
            assert len(b.core.sessions) == n
        gc.collect()
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=db, tick_interval=0.05) as b:
            assert len(b.core.sessions) == n
            assert gc.get_freeze_count() > 0, "the restore did not freeze the heap"
            await _fleet(b, n, clean=True)
            await eventually(lambda: not b.core.sessions, 10.0)
            await eventually(lambda: gc.get_freeze_count() == 0, 10.0)  # else: the heap stayed frozen
            left = _left_for_the_collector(Session)
            assert left == 0, f"{left} discarded sessions were still waiting for the collector"
    finally:
        gc.unfreeze()
