"""Persistent sessions in the cluster (issue 17): a composite subscription made at an access
node survives that node's restart from its data directory; a client reconnecting to another
node finds its session there before CONNACK.  Brokers in one event loop with their stores in
``tmp_path``, real TCP and UDP on loopback, ports 0, aiomqtt and paho clients."""

from __future__ import annotations

import json
from pathlib import Path

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

import composite
from broker import Broker
from tests.cluster._support import all_linked, core_of, drain, node_of, routes_at_peers, start_node
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
