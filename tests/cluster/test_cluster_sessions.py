"""Persistent sessions in the cluster (issue 17): a composite subscription made at an access
node survives that node's restart from its data directory; a client reconnecting to another
node finds its session there before CONNACK.  Brokers in one event loop with their stores in
``tmp_path``, real TCP and UDP on loopback, ports 0, aiomqtt and paho clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
from pathlib import Path
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

import composite
from broker import Broker
from broker.packets import Properties as Properties_
from broker.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel, SubscriptionRequest
from tests.cluster._support import (
    all_linked,
    cluster,
    core_of,
    drain,
    node_of,
    routes_at_peers,
    start_node,
)
from tests.rawclient import RawClient
from tests.waiting import eventually


def persistent(port: int, client_id: str, clean_start: bool = False) -> aiomqtt.Client:
    """An MQTT 5 client whose session outlives its connection (expiry 300 s)."""
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    return aiomqtt.Client(
        "127.0.0.1",
        port,
        identifier=client_id,
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=clean_start,
        properties=props,
    )


async def _publish_pair(brokers: list[Broker], tag: str) -> None:
    """The two components of ``valve/open & flow/+``, published at two different nodes."""
    async with aiomqtt.Client("127.0.0.1", brokers[0].port, identifier=f"pf{tag}") as p:
        await p.publish("flow/7", f'{{"tag": "{tag}"}}', qos=1)
    async with aiomqtt.Client("127.0.0.1", brokers[-1].port, identifier=f"pv{tag}") as p:
        await p.publish("valve/open", f'{{"tag": "{tag}"}}', qos=1)


def _tags(got: list[aiomqtt.Message]) -> list[list[str]]:
    """The tags of each composite event's components (sorted per event)."""
    assert all(m.topic.value == "$composite/leak" for m in got), got
    return [sorted(json.loads(c["payload"])["tag"] for c in json.loads(m.payload)["components"]) for m in got]


async def test_a_composite_subscription_survives_the_restart_of_its_access_node(tmp_path: Path) -> None:
    """The access node stops and restarts from its data directory: the delegated composite
    subscription of the persistent session comes back from the composite snapshot and goes to
    its CSSU again; the event merged by the core while the node was down waited in the core's
    store and reaches the reconnecting client, and so do the events after the restart."""
    expression = "valve/open & flow/+"
    canon = composite.canonical(expression)
    bs: list[Broker] = []
    try:
        bs.append(await start_node(tmp_path / "n0", None))
        for i in (1, 2):
            bs.append(await start_node(tmp_path / f"n{i}", bs[0]))
        await all_linked(bs)
        placement = node_of(bs[0]).placement
        assert placement is not None
        members = placement.members(placement._code(canon))
        a = next(i for i in (1, 2) if node_of(bs[i]).name != members[0])  # not the core
        access = bs[a]
        name = node_of(access).name
        others = [b for b in bs if b is not access]
        async with persistent(access.port, "watcher") as c:
            await c.subscribe(f"$composite/leak/{expression}", qos=1)
            await eventually(lambda: core_of(bs, canon) is not None)
            core = core_of(bs, canon)
            assert core is not None and core is not access
            await routes_at_peers([core], 2)  # the core's atoms are held at every node
            await _publish_pair(others, "before")
            assert _tags(await drain(c)) == [["before", "before"]]
        await access.stop()  # graceful: the composite snapshot is written

        # while the access node is down the core's CSGT row still lists it: the event waits
        # in the core's broker for the access node's link session
        await _publish_pair(others, "down")
        link_session = core.core.sessions[f"$cluster/{name}"]
        await eventually(lambda: any(o.msg.topic == f"$cluster/ctl/{name}" for o in link_session.queue))

        bs[a] = access = await start_node(tmp_path / f"n{a}", bs[0])
        assert node_of(access).name == name  # the same node ID, from the data directory
        comp = access.core.composite
        assert comp.delegated == {("watcher", "leak"): (canon, 1)}  # from the snapshot
        assert node_of(access).placement is not None
        assert node_of(access).placement.local == {canon: 1}  # sent to the CSSU again
        await all_linked(bs)
        # the waiting event arrives and is queued for the offline persistent session
        await eventually(lambda: len(access.core.sessions["watcher"].queue) == 1, timeout=10)
        async with persistent(access.port, "watcher") as c:
            assert _tags(await drain(c)) == [["down", "down"]]
            await _publish_pair(others, "after")
            assert _tags(await drain(c)) == [["after", "after"]]
            # the restored subscription is a real one: unsubscribing ends it at the CSSU
            await c.unsubscribe("$composite/leak")
            await eventually(lambda: core_of(bs, canon) is None, timeout=10)
            await _publish_pair(others, "gone")
            assert await drain(c) == []
    finally:
        for b in bs:
            await b.stop()


async def test_a_delegated_composite_subscription_is_matched_locally_without_the_cluster(
    tmp_path: Path,
) -> None:
    """A node of a one-node cluster delegates to itself; restarted from its data directory
    without the cluster, the snapshot's delegated subscription is matched by its own engine."""
    expression = "valve/open & flow/+"
    canon = composite.canonical(expression)
    b = await start_node(tmp_path / "n0", None)
    try:
        async with persistent(b.port, "watcher") as c:
            await c.subscribe(f"$composite/leak/{expression}", qos=1)
            await eventually(lambda: core_of([b], canon) is b)
            assert b.core.composite.delegated == {("watcher", "leak"): (canon, 1)}
            await _publish_pair([b], "cluster")
            assert _tags(await drain(c)) == [["cluster", "cluster"]]
    finally:
        await b.stop()
    async with Broker("127.0.0.1", 0, store_path=str(tmp_path / "n0" / "broker.db")) as b:
        comp = b.core.composite
        assert comp.delegated == {}
        assert comp.subscriptions_of("watcher") == {"leak": canon}
        assert comp.engine.subscription(("watcher", "leak")) is not None
        comp._check()
        async with persistent(b.port, "watcher") as c:
            await _publish_pair([b], "alone")
            assert _tags(await drain(c)) == [["alone", "alone"]]


class Mover:
    """A paho MQTT 5 client with a persistent session (expiry 300 s) on its network thread:
    what its CONNACK said and what it received, in order."""

    def __init__(self, port: int, client_id: str, clean_start: bool = False) -> None:
        self.c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id, protocol=paho.MQTTv5)
        self.port = port
        self.clean_start = clean_start
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()  # ("connack", present) / ("msg", ...)
        self.connected = threading.Event()
        self.subscribed = threading.Event()

        def on_connect(_c: object, _u: object, flags: paho.ConnectFlags, rc: object, _p: object) -> None:
            self.events.put(("connack", flags.session_present))
            self.connected.set()

        self.c.on_connect = on_connect
        self.c.on_message = lambda _c, _u, m: self.events.put(("msg", (m.topic, m.payload)))
        self.c.on_subscribe = lambda *_a: self.subscribed.set()

    async def start(self) -> None:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 300
        self.c.connect_async("127.0.0.1", self.port, clean_start=self.clean_start, properties=props)
        self.c.loop_start()
        assert await asyncio.to_thread(self.connected.wait, 10)

    async def subscribe(self, topic_filter: str) -> None:
        self.subscribed.clear()
        self.c.subscribe(topic_filter, qos=1)
        assert await asyncio.to_thread(self.subscribed.wait, 10)

    async def stop(self) -> None:
        self.c.disconnect()
        await asyncio.to_thread(self.c.loop_stop)

    async def until(self, count: int, quiet: float = 0.5) -> list[tuple[str, Any]]:
        """The events so far and until ``count`` messages came (or ``quiet`` s pass without one)."""
        got: list[tuple[str, Any]] = []
        with contextlib.suppress(queue.Empty):
            while sum(1 for kind, _ in got if kind == "msg") < count or not self.events.empty():
                got.append(await asyncio.to_thread(self.events.get, True, quiet))
        return got


async def test_connack_says_session_present_when_the_session_comes_from_another_node() -> None:
    """EMQX's behaviour: the CONNACK of a client that moved waits for its session, says
    "session present", and comes before the queued messages; a clean start says 0."""
    async with cluster(3) as bs:
        first = Mover(bs[0].port, "mover")
        await first.start()
        await first.subscribe("jobs/#")
        await first.subscribe("$composite/pair/gate/open & truck/+")
        await first.stop()
        canon = composite.canonical("gate/open & truck/+")
        await eventually(lambda: core_of(bs, canon) is not None)
        links0 = node_of(bs[0]).links.values()  # (node 0 may hold the composite's atoms too)
        await eventually(lambda: all("jobs/#" in link._held for link in links0))
        async with aiomqtt.Client("127.0.0.1", bs[2].port, identifier="p") as pub:
            for k in range(5):
                await pub.publish(f"jobs/{k}", str(k), qos=1)  # queued at node 0 for "mover"
        await eventually(lambda: len(bs[0].core.sessions["mover"].queue) == 5)

        second = Mover(bs[1].port, "mover")
        await second.start()
        got = await second.until(5)
        assert got[0] == ("connack", True)  # first, and with the session
        assert sorted(m for kind, m in got[1:] if kind == "msg") == [
            (f"jobs/{k}", str(k).encode()) for k in range(5)
        ]
        assert "mover" not in bs[0].core.sessions
        assert node_of(bs[1]).takeover is not None and node_of(bs[1]).takeover.timeouts == 0
        # the composite subscription moved too: its events now come to node 1
        assert bs[1].core.composite.delegated == {("mover", "pair"): (canon, 1)}
        core = core_of(bs, canon)
        assert core is not None and node_of(core).placement is not None
        rows = node_of(core).placement.tables
        mover_nodes = {node_of(b).name for b in bs[1:2]}
        await eventually(
            lambda: any(r.subscribers == mover_nodes for t in rows.values() for r in t.rows.values())
        )
        async with aiomqtt.Client("127.0.0.1", bs[2].port, identifier="p2") as pub:
            await pub.publish("truck/4", b"{}", qos=1)
            await pub.publish("gate/open", b"{}", qos=1)
        assert [m[0] for kind, m in await second.until(1) if kind == "msg"] == ["$composite/pair"]
        await second.stop()

        fresh = Mover(bs[2].port, "mover", clean_start=True)
        await fresh.start()
        assert await fresh.until(0) == [("connack", False)]
        await fresh.stop()
        await eventually(lambda: "mover" not in bs[1].core.sessions)

        nobody = Mover(bs[0].port, "newcomer")  # no node has a session: every peer says so
        await nobody.start()
        assert await nobody.until(0) == [("connack", False)]
        await nobody.stop()
        assert all(node_of(b).takeover.timeouts == 0 for b in bs)  # type: ignore[union-attr]


@pytest.mark.parametrize("connected", [False, True], ids=["offline", "taken-over"])
async def test_no_message_is_lost_or_doubled_while_a_session_moves(connected: bool) -> None:
    """Publishers on the old node, the new node and a third one publish QoS 1 without pause
    while the persistent session moves (offline, or still connected to the old node, which
    then disconnects it with 0x8E): every message reaches the client, the new node delivers
    none twice, and each publisher's messages in order (the fences of the handover,
    cluster/_takeover.py).  Taken over while connected, what was in flight at the old node
    may come again from the new one (QoS 1)."""
    async with cluster(3) as bs:
        first = Mover(bs[0].port, "mover")
        await first.start()
        await first.subscribe("feed/#")
        await routes_at_peers(bs[:1], 1)
        stop = asyncio.Event()
        sent: dict[int, int] = {}

        async def publish(i: int) -> None:
            async with aiomqtt.Client("127.0.0.1", bs[i].port, identifier=f"pub{i}") as pub:
                k = 0
                while not stop.is_set() or k < 50:
                    await pub.publish(f"feed/{i}", f"{i}:{k}", qos=1)
                    k += 1
                sent[i] = k

        tasks = [asyncio.create_task(publish(i)) for i in range(3)]
        await eventually(lambda: first.events.qsize() > 60)  # traffic flows
        if not connected:
            await first.stop()
        second = Mover(bs[1].port, "mover")
        await second.start()
        await eventually(lambda: second.events.qsize() > 60)  # traffic after the move
        stop.set()
        await asyncio.gather(*tasks)
        total = sum(sent.values())
        if connected:
            await first.stop()
        before = [m for kind, m in await first.until(total, 0.1) if kind == "msg"]
        after = [m for kind, m in await second.until(total - len(before)) if kind == "msg"]
        await second.stop()
        assert after, "nothing after the move"
        payloads = [p.decode() for _, p in after]
        assert len(payloads) == len(set(payloads)), "a message delivered twice by the new node"
        seen = {p.decode() for _, p in before} | set(payloads)
        missing = [f"{i}:{k}" for i, n in sent.items() for k in range(n) if f"{i}:{k}" not in seen]
        assert missing == []
        for i in range(3):
            ks = [int(p.split(":")[1]) for p in payloads if p.startswith(f"{i}:")]
            assert ks == sorted(ks), f"publisher {i} out of order"
        assert all(node_of(b).takeover.timeouts == 0 for b in bs)  # type: ignore[union-attr]


async def test_qos2_state_moves_with_the_session() -> None:
    """The session moves with its packet identifiers: a QoS 2 message whose PUBREC the old node
    had is continued with PUBREL (not sent again), one whose PUBREC had not come is sent again
    with DUP under the same identifier, a QoS 1 one likewise (with its user property); and
    the client's own QoS 2 PUBLISH that the old node acknowledged with PUBREC is not routed
    again when the client, now at the new node, sends it again with DUP (its identifier
    moved too)."""
    async with cluster(3) as bs:
        old, new, third = bs
        props = Properties_(session_expiry_interval=300)
        c, ack = await RawClient.connect(old.port, "q2", clean_start=False, properties=props)
        assert not ack.session_present
        await c.subscribe(SubscriptionRequest("q/#", 2))
        await routes_at_peers(bs[:1], 1)
        async with aiomqtt.Client("127.0.0.1", third.port, identifier="watch") as watch:
            await watch.subscribe("up/#", qos=2)
            await eventually(lambda: all("up/#" in link._held for link in node_of(third).links.values()))
            v5 = aiomqtt.ProtocolVersion.V5
            async with aiomqtt.Client("127.0.0.1", third.port, identifier="qpub", protocol=v5) as pub:
                await pub.publish("q/1", b"one", qos=2)
                await pub.publish("q/2", b"two", qos=2)
                user = Properties(PacketTypes.PUBLISH)
                user.UserProperty = [("origin", "third")]
                await pub.publish("q/3", b"three", qos=1, properties=user)
            got = [await c.recv_where(lambda p: isinstance(p, Publish)) for _ in range(3)]
            assert [(p.topic, p.qos) for p in got] == [("q/1", 2), ("q/2", 2), ("q/3", 1)]
            p1, p2, p3 = (p.packet_id for p in got)
            c.send(Pubrec(p1))  # q/1: PUBREC, the broker's PUBREL, and no PUBCOMP
            assert await c.recv_where(lambda p: isinstance(p, Pubrel)) == Pubrel(p1)
            c.send(Publish("up/x", b"mine", 2, packet_id=77))  # its PUBREC, and no PUBREL
            assert await c.recv_where(lambda p: isinstance(p, Pubrec)) == Pubrec(77)
            await c.close()
            await eventually(lambda: old.core.sessions["q2"].conn is None)

            c2, ack2 = await RawClient.connect(new.port, "q2", clean_start=False, properties=props)
            assert ack2.session_present
            resent = [await c2.recv() for _ in range(3)]
            assert resent[0] == Pubrel(p1)  # continued, not delivered again
            assert [(p.topic, p.packet_id, p.dup) for p in resent[1:] if isinstance(p, Publish)] == [
                ("q/2", p2, True),
                ("q/3", p3, True),
            ]
            assert resent[2].properties.user_properties == (("origin", "third"),)  # type: ignore[union-attr]
            c2.send(Pubcomp(p1))
            c2.send(Pubrec(p2))
            assert await c2.recv_where(lambda p: isinstance(p, Pubrel)) == Pubrel(p2)
            c2.send(Pubcomp(p2))
            c2.send(Puback(p3))
            # the client's QoS 2 PUBLISH again, with DUP: PUBREC, not routed a second time
            c2.send(Publish("up/x", b"mine", 2, dup=True, packet_id=77))
            assert await c2.recv_where(lambda p: isinstance(p, Pubrec)) == Pubrec(77)
            c2.send(Pubrel(77))
            assert await c2.recv_where(lambda p: isinstance(p, Pubcomp)) == Pubcomp(77)
            assert [m.payload for m in await drain(watch)] == [b"mine"]
            assert await c2.barrier() == []
            s = new.core.sessions["q2"]
            assert s.inflight == {} and s.qos2_received == set()
            await c2.close()
        assert "q2" not in old.core.sessions
        assert node_of(new).takeover.timeouts == 0  # type: ignore[union-attr]
