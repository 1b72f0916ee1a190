"""A broker holding many sessions freezes the survivors of a full collection (issue 42 item 2).

A full (generation 2) collection walks every long-lived object: with 10,000 sessions holding
content selectors that took ~0.3 s in-process, with 100,000 selectors ~1 s, a stall of the
event loop the next full collection repeats.  After a full collection, once the sessions grew
by ``FREEZE_SESSIONS`` since the last freeze, the broker's tick moves the heap to the
permanent generation (``gc.freeze``), as the store's restore does.  Frozen objects are freed
by their reference counts only, so nothing the broker drops may be a reference cycle: a
finished connection and an ended session are not (``MQTTProtocol._unlink``), and the heap is
never unfrozen (the tests below count what a collection of the unfrozen heap would still
find).  And the broker does not wait for the collector: once the sessions grew by
``IDLE_FREEZE_SESSIONS`` since the last freeze, or ``IDLE_FREEZE_OBJECTS`` objects are not
frozen, an idle tick (no PUBLISH, no new connection, little read) runs the full collection
itself and freezes, so a fleet's big fan-outs do not walk the fleet or what its first
messages built.  A real embedded broker; real TCP clients, or
in-process subscribers (``Core.local_subscribe``).
"""

from __future__ import annotations

import asyncio
import gc
import socket
import struct
from pathlib import Path

from broker import Broker
from broker._broker import FREEZE_SESSIONS, IDLE_FREEZE_OBJECTS, IDLE_FREEZE_SESSIONS
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


def _left_for_the_collector(*classes: type) -> int:
    """After one collection with the heap as the broker left it: how many objects of
    ``classes`` were still garbage that only a collection of the unfrozen heap finds (frozen
    cycles)."""
    gc.collect()
    gc.unfreeze()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return sum(1 for o in gc.garbage if isinstance(o, classes))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _connect_and_subscribe(client_id: str) -> bytes:
    """CONNECT (MQTT 3.1.1, clean session) and SUBSCRIBE a/b QoS 0, as bytes."""
    cid = client_id.encode()
    var = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(cid).to_bytes(2, "big") + cid
    return bytes([0x10, len(var)]) + var + b"\x82\x08\x00\x01\x00\x03a/b\x00"


async def _ticks(b: Broker, n: int = 3) -> None:
    """Until ``n`` ticks of ``b`` ran (each looks at the heap: ``Broker._tick``)."""
    for _ in range(n):
        tick = b._next_tick
        await eventually(lambda t=tick: b._next_tick != t, 10.0)  # type: ignore[misc]


async def test_a_frozen_fleet_that_leaves_leaves_nothing_frozen() -> None:
    """A fleet of a frozen heap that leaves (clean sessions: connections closed, sessions
    ended) is freed by reference counts: the heap stays frozen (no full walk in the middle of
    the departure) and nothing of it waits for the collector. Before: each closed connection
    was a cycle (connection, session, protocol, transport), and the tick unfroze the heap
    after 1,000 of them or 1,000 sessions fewer so that a full collection freed them."""
    from broker.core._connection import Connection
    from broker.core._session import Session
    from broker.net import MQTTProtocol

    gc.unfreeze()
    n = FREEZE_SESSIONS + 50
    try:
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05) as b:
            writers = await _join(b, n, clean=True)
            await eventually(lambda: len(b.core.sessions) == n, 10.0)
            gc.collect()
            await eventually(lambda: gc.get_freeze_count() > 0, 10.0)  # else: the heap was not frozen
            await _leave(b, writers)
            await eventually(lambda: not b.core.sessions, 30.0)
            await _ticks(b)
            assert gc.get_freeze_count() > 0, "the heap was unfrozen"
            left = _left_for_the_collector(Connection, Session, MQTTProtocol)
            assert left == 0, f"{left} objects of the fleet were still waiting for the collector"
    finally:
        gc.unfreeze()


async def test_a_frozen_fleet_that_reconnects_needs_no_thaw() -> None:
    """Connections of a frozen heap that close while their sessions stay (persistent
    sessions: a fleet reconnecting) leave nothing for the collector, so the heap stays frozen
    (before: each closed connection was a cycle, and 1,000 of them unfroze the heap, a full
    walk of it per 1,000 closes)."""
    from broker.core._connection import Connection

    gc.unfreeze()
    n = FREEZE_SESSIONS + 50
    try:
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05) as b:
            writers = await _join(b, n, clean=False)
            gc.collect()
            await eventually(lambda: gc.get_freeze_count() > 0, 10.0)  # else: the heap was not frozen
            await _leave(b, writers)
            assert len(b.core.sessions) == n  # persistent: they stay
            await _ticks(b)
            assert gc.get_freeze_count() > 0, "the heap was unfrozen"
            left = _left_for_the_collector(Connection)
            assert left == 0, f"{left} closed connections were still waiting for the collector"
    finally:
        gc.unfreeze()


async def _join(b: Broker, n: int, *, clean: bool) -> list[asyncio.StreamWriter]:
    """``n`` clients connect (clean session or not) and subscribe; their writers."""
    writers = []
    for i in range(n):
        r, w = await asyncio.open_connection("127.0.0.1", b.port)
        packet = bytearray(_connect_and_subscribe(f"fleet{i}"))
        if not clean:
            packet[9] = 0x00  # connect flags: no clean session
        w.write(bytes(packet))
        assert (await r.readexactly(4))[:2] == b"\x20\x02"  # CONNACK
        writers.append(w)
    return writers


async def _leave(b: Broker, writers: list[asyncio.StreamWriter]) -> None:
    """The clients of ``writers`` send DISCONNECT and close; returns when the broker has no
    connection left."""
    for w in writers:
        w.write(b"\xe0\x00")  # DISCONNECT
        w.close()
    writers.clear()
    await eventually(lambda: not b.core.connections, 30.0)


async def _fleet(b: Broker, n: int, *, clean: bool) -> None:
    """``n`` clients connect (clean session or not), subscribe, disconnect; returns when the
    broker has no connection left."""
    await _leave(b, await _join(b, n, clean=clean))


async def _persisted(db: Path, n: int) -> None:
    """``n`` persistent sessions in the store ``db`` (a broker that is gone when this returns:
    alive during the next one's restore, its objects would be frozen with it)."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=db) as b:
        await _fleet(b, n, clean=False)
        assert len(b.core.sessions) == n


async def test_restored_sessions_discarded_are_freed(tmp_path: Path) -> None:
    """The restore freezes the heap holding the restored sessions; clean-session clients of
    the same ids discard them, and they are freed by reference counts: the heap stays frozen
    and no session waits for the collector (before: 1,050 Sessions stayed until a thaw)."""
    from broker.core._session import Session

    db = tmp_path / "store.db"
    n = FREEZE_SESSIONS + 50
    gc.unfreeze()
    try:
        await _persisted(db, n)
        gc.collect()
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=db, tick_interval=0.05) as b:
            assert len(b.core.sessions) == n
            assert gc.get_freeze_count() > 0, "the restore did not freeze the heap"
            await _fleet(b, n, clean=True)
            await eventually(lambda: not b.core.sessions, 10.0)
            await _ticks(b)
            assert gc.get_freeze_count() > 0, "the heap was unfrozen"
            left = _left_for_the_collector(Session)
            assert left == 0, f"{left} discarded sessions were still waiting for the collector"
    finally:
        gc.unfreeze()


def _connect_with_will(client_id: str, *, clean: bool = True) -> bytes:
    """CONNECT (MQTT 3.1.1) with a QoS 0 will on ``will/<id>``, and SUBSCRIBE a/b, as bytes."""
    cid = client_id.encode()
    topic = b"will/" + cid
    flags = 0x06 if clean else 0x04  # will flag (+ clean session)
    body = len(cid).to_bytes(2, "big") + cid + len(topic).to_bytes(2, "big") + topic + b"\x00\x04gone"
    var = b"\x00\x04MQTT\x04" + bytes([flags]) + b"\x00\x3c" + body
    return bytes([0x10, len(var)]) + var + b"\x82\x08\x00\x01\x00\x03a/b\x00"


async def test_closed_connections_are_freed_by_reference_counts() -> None:
    """A finished connection leaves no reference cycle (issue 42 item 2): with the heap frozen
    and the collector saving what it finds (``DEBUG_SAVEALL``), clients that leave every way
    (DISCONNECT, socket closed with a will, reset, persistent session) leave no connection,
    protocol or session for ``gc.collect()`` to free. Before: each closed connection was a
    cycle of 12 objects (connection <-> protocol, its own transport, the linger timer)."""
    from broker.core._connection import Connection
    from broker.core._session import Session
    from broker.net import MQTTProtocol

    n = 120
    gc.collect()
    gc.freeze()  # what exists now is out of the count (and the broker's heap is frozen)
    gc.set_debug(gc.DEBUG_SAVEALL)  # a collection keeps what it found in gc.garbage
    try:
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05) as b:
            wills: list[str] = []
            b.core.local_subscribe("will-watch", "will/#", None, 0, lambda m, r: wills.append(m.topic), 0.0)
            streams = []
            for i in range(n):
                r, w = await asyncio.open_connection("127.0.0.1", b.port)
                kind = i % 4
                w.write(_connect_with_will(f"c{i}", clean=kind != 3))
                assert (await r.readexactly(4))[:2] == b"\x20\x02"  # CONNACK
                assert (await r.readexactly(5))[:1] == b"\x90"  # SUBACK
                streams.append((kind, w))
            for kind, w in streams:
                if kind in (0, 3):
                    w.write(b"\xe0\x00")  # DISCONNECT: no will
                elif kind == 2:  # reset
                    sock = w.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                w.close()
            streams.clear()
            await eventually(lambda: not b.core.connections, 30.0)
            # the wills of the connections closed without DISCONNECT fired; persistent
            # sessions stayed
            await eventually(lambda: len(wills) == n // 2, 10.0)
            assert len(b.core.sessions) == n // 4 + 1
            gc.collect()
            kinds = (Connection, MQTTProtocol, Session)
            left = [type(o).__name__ for o in gc.garbage if isinstance(o, kinds)]
            assert not left, f"{len(left)} objects freed only by the collector: {left[:6]}"
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.unfreeze()


async def test_an_idle_fleet_is_frozen_without_a_full_collection_of_its_own() -> None:
    """A fleet that connected and idles has its heap frozen by the broker's idle tick, with
    nothing published and no full collection of the collector's own (here prevented: the
    generation-2 threshold out of reach), so that the first big fan-out does not walk it
    (issue 42 item 2: at 100k the stream's first message met 57.6 ms of collections before
    its first write). Before: only a full collection that happened by itself froze the heap,
    so what connected after the last one stayed in the collector's generations. Real TCP
    clients; one collection for the growth, none again while the sessions stay."""
    threshold = gc.get_threshold()
    gc.collect()
    gc.freeze()  # what exists now is out of the count
    gc.set_threshold(threshold[0], threshold[1], 1_000_000)  # no full collection by itself
    n = FREEZE_SESSIONS + 50
    try:
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05) as b:
            before = gc.get_freeze_count()
            writers = await _join(b, n, clean=True)
            await eventually(lambda: gc.get_freeze_count() > before + n, 30.0)  # else: not frozen
            assert b.core.stats.messages_received == 0
            assert b.idle_collections == 1
            assert 0 < b.idle_collection_s < 10
            await _ticks(b, 5)  # idle ticks without growth: no collection again
            assert b.idle_collections == 1
            await _leave(b, writers)
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


async def test_the_idle_collection_waits_for_a_tick_without_traffic() -> None:
    """The idle collection runs only when nothing was published, no client connected and
    little was read since the previous look (``Broker._idle_freeze``, called here directly:
    the timer's tick is a minute away), and not below ``FREEZE_SESSIONS`` sessions or
    ``IDLE_FREEZE_SESSIONS`` sessions of growth since the last freeze, or without growth
    ``IDLE_FREEZE_OBJECTS`` objects not frozen (what messages built). A real broker, a real
    client connecting, messages published."""
    gc.unfreeze()
    try:
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=60) as b:
            for i in range(FREEZE_SESSIONS - 1):
                b.core.local_subscribe(f"s{i}", "t/#", None, 0, lambda m, r: None, 0.0)
            b._idle_freeze()
            b._idle_freeze()  # quiet, but fewer sessions than a fleet
            assert (b.idle_collections, gc.get_freeze_count()) == (0, 0)
            b.core.local_subscribe("last", "t/#", None, 0, lambda m, r: None, 0.0)
            assert await b.publish("t/x", b"1") == FREEZE_SESSIONS
            b._idle_freeze()  # a PUBLISH since the previous look
            assert b.idle_collections == 0
            r, w = await asyncio.open_connection("127.0.0.1", b.port)
            w.write(_connect_and_subscribe("late"))
            assert (await r.readexactly(4))[:2] == b"\x20\x02"  # CONNACK
            b._idle_freeze()  # a connection since the previous look
            assert (b.idle_collections, gc.get_freeze_count()) == (0, 0)
            b._idle_freeze()  # quiet: collected and frozen
            assert b.idle_collections == 1
            assert gc.get_freeze_count() > FREEZE_SESSIONS
            for i in range(IDLE_FREEZE_SESSIONS - 1):
                b.core.local_subscribe(f"more{i}", "t/#", None, 0, lambda m, r: None, 0.0)
            b._idle_freeze()  # grown by fewer than IDLE_FREEZE_SESSIONS since
            assert b.idle_collections == 1
            b.core.local_subscribe("one-more", "t/#", None, 0, lambda m, r: None, 0.0)
            b._idle_freeze()
            assert b.idle_collections == 2
            # a fleet that leaves and comes back is collected and frozen again
            fleet = [b.core.sessions[f"s{i}"] for i in range(FREEZE_SESSIONS - 1)]
            for s in fleet:
                b.core.end_session(s, 0.0)
            fleet.clear()
            b._idle_freeze()
            assert b.idle_collections == 2
            for i in range(FREEZE_SESSIONS - 1):
                b.core.local_subscribe(f"s{i}", "t/#", None, 0, lambda m, r: None, 0.0)
            b._idle_freeze()
            assert b.idle_collections == 3
            # without growth: once IDLE_FREEZE_OBJECTS objects or more are not frozen (what
            # messages built: here retained messages), then no more
            await b.publish("t/x", b"2")
            b._idle_freeze()
            b._idle_freeze()
            assert b.idle_collections == 3  # a message that left little behind
            for i in range(IDLE_FREEZE_OBJECTS):
                await b.publish(f"r/{i}", b"kept", retain=True)
            b._idle_freeze()  # PUBLISHes since the previous look
            assert b.idle_collections == 3
            b._idle_freeze()
            assert b.idle_collections == 4
            b._idle_freeze()
            assert b.idle_collections == 4
            w.close()
    finally:
        gc.unfreeze()


async def test_no_idle_collection_with_the_collector_disabled() -> None:
    """A program that disabled the collector keeps it so: no idle tick collects, freezes or
    enables it (a real fleet of TCP clients, idle ticks counted)."""
    gc.unfreeze()
    gc.disable()
    try:
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05) as b:
            writers = await _join(b, FREEZE_SESSIONS + 10, clean=True)
            await _ticks(b, 5)
            assert (b.idle_collections, gc.get_freeze_count()) == (0, 0)
            assert not gc.isenabled()
            await _leave(b, writers)
    finally:
        gc.enable()
        gc.unfreeze()
