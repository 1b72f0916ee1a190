"""An access node remembers the composite events it delivered to persisted sessions across a
restart (issue 30; broker/core/_composite_log.py, ``DELIVERED`` rows).

A new core sends again the events it computed in the last refresh (cluster._replicas); an
access node drops those it delivered already (the event's key: its expression and the origin
ids of its components).  That set was in memory only, so an event delivered just before a
``leave`` of the access node was delivered again after its restart (the one doubled event of
nemesis run 9, docs/fault.md).  Here a one-node cluster (the node is its own CSSU, so its
events arrive through the same ``ev`` control message as from a remote core) with a store:
the event is delivered to a persisted session, the broker restarts on the same store, and the
same ``ev`` message, as the core would send it again, delivers nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt

from broker import Broker
from broker.core._composite_log import DELIVERED
from broker.durability._store import Store
from cluster import ClusterNode
from tests.cluster._support import SECRET, node_of
from tests.waiting import eventually

EXPRESSION = "x/a & x/b"


@contextlib.asynccontextmanager
async def one_node(store: Path) -> AsyncIterator[Broker]:
    node = ClusterNode(("127.0.0.1", 0), [], SECRET, refresh=0.2, rpc_timeout=0.5)
    b = Broker("127.0.0.1", 0, hooks=[node], store_path=str(store))
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


def _store(b: Broker) -> Store:
    store = b.core.journal.store
    assert store is not None
    return store


def _resend(b: Broker, body: bytes) -> None:
    """What a new core sends to the access nodes of ``EXPRESSION`` (cluster._placement)."""
    placement = node_of(b).placement
    assert placement is not None
    placement.receive({"t": "ev", "expr": EXPRESSION, "body": body.decode(), "qos": 1})


async def _one_event(b: Broker, c: aiomqtt.Client, a: bytes, other: bytes) -> bytes:
    """Publish a pair on ``b``; the event ``c`` (subscribed) receives."""
    async with aiomqtt.Client("127.0.0.1", b.port, identifier="pub") as p:
        await eventually(lambda: bool(b.core.composite.delegated))
        # the node's own CSSU holds the subscription (its table row) before atoms pair
        placement = node_of(b).placement
        assert placement is not None
        await eventually(lambda: EXPRESSION in placement.replicas.emitting)
        await p.publish("x/a", a, qos=1)
        await p.publish("x/b", other, qos=1)
        got = await _until_marker(c, p)
    assert [m.topic.value for m in got] == ["$composite/pair"]
    payload = got[0].payload
    assert isinstance(payload, bytes)
    return payload


async def _until_marker(c: aiomqtt.Client, p: aiomqtt.Client) -> list[aiomqtt.Message]:
    """What ``c`` receives before a marker ``p`` publishes now (one session's deliveries keep
    their order, so whatever was queued for ``c`` before it comes first)."""
    await p.publish("marker", b"", qos=1)
    got: list[aiomqtt.Message] = []
    async with asyncio.timeout(10):
        async for m in c.messages:
            if m.topic.value == "marker":
                return got
            got.append(m)
    raise AssertionError("unreachable")


async def test_a_restarted_access_node_drops_an_event_it_delivered_before(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    async with one_node(store) as b:
        async with aiomqtt.Client("127.0.0.1", b.port, identifier="acc", clean_session=False) as c:
            await c.subscribe(f"$composite/pair/{EXPRESSION}", qos=1)
            await c.subscribe("marker", qos=1)
            body = await _one_event(b, c, b"1", b"2")
        # the row is committed with the event's stored messages
        rows = await asyncio.to_thread(_store(b).composite_journal)
        assert [r[6] for r in rows if r[1] == DELIVERED] == [b.core.composite.log.events.keys()[0]]
        _resend(b, body)  # while it runs: dropped by the in-memory set
        assert b.core.composite.duplicate_events == 1
    # a graceful restart (snapshot) keeps the key
    async with (
        one_node(store) as b2,
        aiomqtt.Client("127.0.0.1", b2.port, identifier="acc", clean_session=False) as c,
    ):
        await eventually(lambda: "acc" in b2.core.sessions)
        _resend(b2, body)
        assert b2.core.composite.duplicate_events == 1
        async with aiomqtt.Client("127.0.0.1", b2.port, identifier="pub") as p:
            assert await _until_marker(c, p) == []
        # a new event is delivered as before
        fresh = await _one_event(b2, c, b"3", b"4")
        assert sorted(x["payload"] for x in json.loads(fresh)["components"]) == ["3", "4"]


async def test_the_journal_alone_restores_the_delivered_keys(tmp_path: Path) -> None:
    """As after ``kill -9`` before any snapshot: the ``DELIVERED`` rows replayed."""
    async with one_node(tmp_path / "store.db") as b:
        async with aiomqtt.Client("127.0.0.1", b.port, identifier="acc", clean_session=False) as c:
            await c.subscribe(f"$composite/pair/{EXPRESSION}", qos=1)
            await c.subscribe("marker", qos=1)
            body = await _one_event(b, c, b"1", b"2")
        rows = await asyncio.to_thread(_store(b).composite_journal)
        key = b.core.composite.log.events.keys()
    fresh = Broker("127.0.0.1", 0)  # never started: its composite state is only what it loads
    fresh.core.composite.load(None, rows, lambda _cid: True)
    assert fresh.core.composite.log.events.keys() == key
    assert fresh.core.composite.deliver_remote(EXPRESSION, body, 1, 0.0) == 0
    assert fresh.core.composite.duplicate_events == 1


async def test_clean_sessions_write_no_rows(tmp_path: Path) -> None:
    async with one_node(tmp_path / "store.db") as b:
        async with aiomqtt.Client("127.0.0.1", b.port, identifier="tmp", clean_session=True) as c:
            await c.subscribe(f"$composite/pair/{EXPRESSION}", qos=1)
            await c.subscribe("marker", qos=1)
            await _one_event(b, c, b"1", b"2")
        rows = await asyncio.to_thread(_store(b).composite_journal)
        assert [r for r in rows if r[1] == DELIVERED] == []
        assert b.core.composite.log.events.keys() == []
