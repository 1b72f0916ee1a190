"""The broker with a store (``BrokerConfig.store_path``): state survives a restart.

Real clients over loopback (port 0): the raw client of tests/rawclient.py where exact packets
matter (DUP flags, packet ids, reason codes), aiomqtt (Paho) elsewhere.  A crash is simulated
by writing, with the public Store API, the rows a broker leaves when it dies with a client
connected (tests/fault/test_crash_loop.py does real SIGKILLs).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest

from broker import Broker
from broker.packets import (
    Connack,
    Disconnect,
    Properties,
    Puback,
    Publish,
    Pubrec,
    ReasonCode,
    SubscriptionRequest,
    Will,
)
from broker.store import SessionRecord, Store
from tests.rawclient import RawClient
from tests.waiting import eventually

T = 5.0
EXPIRY = Properties(session_expiry_interval=3600)


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "data" / "broker.db")


async def _close_all() -> None:
    """Close the raw clients (a broker stopping with clients open waits for them)."""
    await RawClient.close_all()


@contextlib.asynccontextmanager
async def _broker(db: str) -> AsyncIterator[Broker]:
    """A broker on ``db``; the raw clients are closed before it stops (else it waits for them)."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=db) as b:
        try:
            yield b
        finally:
            await _close_all()


async def _raw(port: int, cid: str, clean: bool, **kw: object) -> tuple[RawClient, Connack]:
    return await RawClient.connect(port, cid, 5, clean_start=clean, properties=EXPIRY, **kw)


async def _publishes(c: RawClient, n: int) -> list[Publish]:
    got: list[Publish] = []
    while len(got) < n:
        p = await c.recv()
        if isinstance(p, Publish):
            got.append(p)
    return got


@pytest.fixture(autouse=True)
async def _close_raw() -> AsyncIterator[None]:
    yield
    await _close_all()


async def test_graceful_restart_restores_sessions_entries_queues_and_retained(db: str) -> None:
    will = Will("status/sub", b"gone", 1, False, Properties(will_delay_interval=600))
    async with _broker(db) as b:
        sub, ack = await _raw(b.port, "sub", True, will=will)
        assert not ack.session_present
        await sub.subscribe(
            SubscriptionRequest("a/#", 2),
            properties=Properties(subscription_identifiers=(7,), user_properties=(("filter", "t > 1"),)),
        )
        await sub.subscribe(SubscriptionRequest("b/+", 1, no_local=True))
        await sub.unsubscribe("b/x")  # partial unsubscribe: a negative entry
        entries = b.core.router.index.entries("sub")
        await sub.close()  # vanishes: the will waits for its delay
        async with aiomqtt.Client(
            "127.0.0.1", b.port, identifier="pub", protocol=aiomqtt.ProtocolVersion.V5
        ) as pub:
            await pub.publish("a/1", b'{"t": 5}', qos=1)  # queued for sub
            await pub.publish("a/2", b'{"t": 0}', qos=1)  # filtered out by the selector
            await pub.publish("b/x", b"excluded", qos=1)  # negative entry
            await pub.publish("b/y", b"queued", qos=2)
            await pub.publish("r/1", b"kept", qos=1, retain=True)
    async with _broker(db) as b:
        assert b.core.router.index.entries("sub") == entries
        restored = b.core.sessions["sub"]
        assert restored.will == will and restored.will_due is not None  # the delay goes on
        assert [o.msg.payload for o in restored.queue] == [b'{"t": 5}', b"queued"]
        sub, ack = await _raw(b.port, "sub", False)
        assert ack.session_present
        got = await _publishes(sub, 2)
        assert [(p.topic, p.payload, p.qos) for p in got] == [("a/1", b'{"t": 5}', 1), ("b/y", b"queued", 1)]
        assert got[0].properties.subscription_identifiers == (7,)
        assert b.core.sessions["sub"].will is None  # resumed before the delay: cancelled
        for p in got:
            sub.send(Puback(p.packet_id or 0))
        async with aiomqtt.Client(
            "127.0.0.1", b.port, identifier="late", protocol=aiomqtt.ProtocolVersion.V5
        ) as late:
            await late.subscribe("r/#")
            m = await asyncio.wait_for(anext(late.messages), T)
            assert (m.topic.value, m.payload, m.retain) == ("r/1", b"kept", True)
            await late.publish("b/x", b"still excluded", qos=1)
            await late.publish("a/3", b'{"t": 0}', qos=1)
            await late.publish("b/z", b"live", qos=1)
        (live,) = await _publishes(sub, 1)
        assert (live.topic, live.payload) == ("b/z", b"live")


async def test_unacknowledged_message_is_resent_with_dup_after_restart(db: str) -> None:
    async with _broker(db) as b:
        sub, _ = await _raw(b.port, "sub", True)
        await sub.subscribe(SubscriptionRequest("t", 2))
        pub, _ = await _raw(b.port, "pub", True)
        await pub.publish1("t", b"one")
        (first,) = await _publishes(sub, 1)  # never acknowledged
        assert not first.dup
    async with _broker(db) as b:
        sub, ack = await _raw(b.port, "sub", False)
        assert ack.session_present
        (again,) = await _publishes(sub, 1)
        assert (again.payload, again.packet_id, again.dup) == (b"one", first.packet_id, True)
        sub.send(Puback(again.packet_id or 0))
        await sub.barrier()
        store = b.core.journal.store
        assert store is not None
        assert store.counts()["outgoing"] == 0


async def test_qos2_packet_id_survives_restart(db: str) -> None:
    async with _broker(db) as b:
        sub, _ = await _raw(b.port, "sub", True)
        await sub.subscribe(SubscriptionRequest("t", 2))
        pub, _ = await _raw(b.port, "pub", True)
        pub.send(Publish("t", b"once", 2, packet_id=9))
        assert isinstance(await pub.recv(), Pubrec)  # PUBREL never sent
        await _publishes(sub, 1)
        sub.send(Pubrec(1))
        await sub.recv()  # PUBREL
    async with _broker(db) as b:
        assert b.core.sessions["pub"].qos2_received == {9}
        pub, _ = await _raw(b.port, "pub", False)
        pub.send(Publish("t", b"once", 2, packet_id=9, dup=True))  # the publisher retries
        assert isinstance(await pub.recv(), Pubrec)
        sub, _ = await _raw(b.port, "sub", False)
        got = await sub.barrier()
        assert [type(p).__name__ for p in got] == ["Pubrel"]  # resumed at PUBREL, no second copy


async def test_will_of_a_session_connected_at_the_crash_follows_its_delay(db: str) -> None:
    will = Will("status/dead", b"crashed", 1, False, Properties(will_delay_interval=1))
    with Store(db) as store:  # the rows a broker leaves when it dies with "dead" connected
        store.put_session(SessionRecord("dead", 5, 3600, None, None, 1, will, None))
    async with _broker(db) as b:
        assert b.core.sessions["dead"].will_due is not None  # not at once: after the delay
        async with aiomqtt.Client("127.0.0.1", b.port, identifier="watch") as watch:
            await watch.subscribe("status/#", qos=1)
            m = await asyncio.wait_for(anext(watch.messages), T)
            assert (m.topic.value, m.payload) == ("status/dead", b"crashed")
        assert b.core.sessions["dead"].will is None
    with Store(db) as store:
        assert store.load().sessions["dead"].will is None


async def test_failing_store_stops_acknowledging(db: str, caplog: pytest.LogCaptureFixture) -> None:
    async with _broker(db) as b:
        sub, _ = await _raw(b.port, "sub", True)
        await sub.subscribe(SubscriptionRequest("t", 1))
        await sub.close()
        store = b.core.journal.store
        assert store is not None
        with store._lock:  # the disk is full: no page can be added any more
            pages = store._db.execute("PRAGMA page_count").fetchone()[0]
            store._db.execute(f"PRAGMA max_page_count={pages}")
        pub, _ = await _raw(b.port, "pub", False)
        pub.send(Publish("t", b"x" * 200_000, 1, packet_id=1))
        got = await pub.closed()
        assert not any(isinstance(p, Puback) for p in got)
        assert [p.reason_code for p in got if isinstance(p, Disconnect)] == [ReasonCode.UNSPECIFIED_ERROR]
        assert "persistent store failed" in caplog.text
        # messages that need no storage are still acknowledged
        clean, _ = await RawClient.connect(b.port, "clean", 5, clean_start=True)
        ack = await clean.publish1("nobody/listens", b"x")
        assert ack.reason_code == ReasonCode.NO_MATCHING_SUBSCRIBERS


async def test_clean_sessions_and_qos0_write_nothing(db: str) -> None:
    async with _broker(db) as b:
        sub, _ = await RawClient.connect(b.port, "sub", 5, clean_start=True)
        await sub.subscribe(SubscriptionRequest("t", 2))
        pub, _ = await RawClient.connect(b.port, "pub", 5, clean_start=True)
        await pub.publish1("t", b"x")
        pub.send(Publish("t", b"y", 0))
        await _publishes(sub, 2)
        store = b.core.journal.store
        assert store is not None
        assert store.submitted == 0


async def test_session_rows_follow_the_session_lifecycle(db: str) -> None:
    async with _broker(db) as b:
        store = b.core.journal.store
        assert store is not None
        clean, _ = await RawClient.connect(b.port, "c", 5, clean_start=True)  # expiry 0
        await clean.subscribe("x")
        kept, _ = await _raw(b.port, "k", True)
        await kept.subscribe("y")
        assert (store.counts()["sessions"], store.counts()["entries"]) == (1, 1)
        # a takeover of a session with expiry 0 does not reuse it [MQTT-3.1.2-6] (issue 21):
        # the new session (with an expiry) is written, without the old subscription
        c2, ack = await RawClient.connect(b.port, "c", 5, clean_start=False, properties=EXPIRY)
        assert not ack.session_present
        await c2.subscribe("z")
        assert (store.counts()["sessions"], store.counts()["entries"]) == (2, 2)
        # DISCONNECT setting the expiry to 0 ends the session and deletes its rows
        c2.send(Disconnect(properties=Properties(session_expiry_interval=0)))
        await c2.closed()
        k2, _ = await RawClient.connect(b.port, "k", 5, clean_start=True)  # clean start: "k" ends
        await k2.barrier()
        assert store.counts()["sessions"] == 0 and store.counts()["entries"] == 0


async def test_a_failed_start_closes_the_store(db: str) -> None:
    async with _broker(db) as running:
        taken = Broker(host="127.0.0.1", port=running.port, sys_interval=0, store_path=db + "-2")
        with pytest.raises(OSError):
            await taken.start()
        assert taken.core.journal.store is None
    with Store(db + "-2") as store:  # closed cleanly: it opens again
        assert store.load().sessions == {}


async def test_store_backlog_bound_pauses_the_writing_publisher(db: str) -> None:
    """With ``store_max_backlog`` 0 every QoS 1 PUBLISH to a persisted subscriber leaves the
    writer behind: its publisher is paused until the commit (issue 15: the store's queue is
    bounded), and every message is still acknowledged and delivered, in order."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=db, store_max_backlog=0) as b:
        try:
            sub, _ = await _raw(b.port, "bk-sub", False)
            await sub.subscribe(SubscriptionRequest("bk/t", 1))
            pub, _ = await RawClient.connect(b.port, "bk-pub", 5)
            for i in range(20):  # pipelined: the pauses hold back the later ones
                pub.send(Publish("bk/t", b"%d" % i, 1, packet_id=i + 1))
            acks = [await pub.recv_where(lambda p: isinstance(p, Puback)) for _ in range(20)]
            assert [a.packet_id for a in acks if isinstance(a, Puback)] == list(range(1, 21))
            got = []
            while len(got) < 20:
                p = await sub.recv_where(lambda p: isinstance(p, Publish))
                assert isinstance(p, Publish) and p.packet_id is not None
                sub.send(Puback(p.packet_id))
                got.append(p.payload)
            assert got == [b"%d" % i for i in range(20)]
            assert b.core.stats.store_waits >= 1 and b.core.stats.publishers_paused == 0
            b.core._check()
        finally:
            await _close_all()


async def test_puback_leaves_before_the_commit_once_persisted_deliveries_are_acknowledged(db: str) -> None:
    """A QoS 1 publication whose only store writes are its deliveries to persisted sessions is
    acknowledged when those deliveries are (nothing of it is left to make durable), even while
    the store cannot commit; one whose delivery is not acknowledged waits for the commit, and
    the publisher's PUBACKs keep the order of its PUBLISHes."""
    async with _broker(db) as b:
        store = b.core.journal.store
        assert store is not None
        sub, _ = await _raw(b.port, "sub", False)
        await sub.subscribe(SubscriptionRequest("t/#", 1))
        pub, _ = await RawClient.connect(b.port, "pub", 5)
        store._lock.acquire()  # the writer cannot commit until released
        try:
            pub.send(Publish("t/a", b"1", 1, packet_id=1))
            (p1,) = await _publishes(sub, 1)
            sub.send(Puback(p1.packet_id or 0))
            ack = await pub.recv()  # arrives although nothing was committed
            assert isinstance(ack, Puback) and ack.packet_id == 1
            committed = store.commits
            # not acknowledged by the subscriber: the PUBACK waits for the commit, and a
            # later PUBLISH that writes nothing waits behind it (acknowledgement order)
            pub.send(Publish("t/b", b"2", 1, packet_id=2))
            (p2,) = await _publishes(sub, 1)
            pub.send(Publish("other", b"3", 1, packet_id=3))
            conn = b.core.sessions["pub"].conn
            assert conn is not None
            await eventually(lambda: conn.held == 2)
            assert store.commits == committed
        finally:
            store._lock.release()
        acks = [await pub.recv(), await pub.recv()]
        assert [a.packet_id for a in acks if isinstance(a, Puback)] == [2, 3]
        sub.send(Puback(p2.packet_id or 0))
