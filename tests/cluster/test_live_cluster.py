"""A cluster of real brokers in one event loop (issue 17 item 3): aiomqtt and paho clients on
different nodes, real TCP links and Kademlia over UDP on loopback, ports 0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from pathlib import Path

import aiomqtt
import paho.mqtt.client as paho
import pyarrow.parquet as pq
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

import composite
from broker import Broker
from cluster import ClusterNode, make_token
from tests.cluster._support import (
    SECRET,
    cluster,
    core_of,
    drain,
    links_up,
    node_of,
    routes_at_peers,
    tables_of,
)
from tests.waiting import eventually


async def test_publish_anywhere_reaches_subscribers_everywhere_once() -> None:
    async with cluster(3) as bs, contextlib.AsyncExitStack() as stack:
        subs = [
            await stack.enter_async_context(aiomqtt.Client("127.0.0.1", b.port, identifier=f"s{i}"))
            for i, b in enumerate(bs)
        ]
        for s in subs:
            await s.subscribe("plant/+/temp", qos=2)
            await s.subscribe("plant/#", qos=2)  # overlapping: still one copy per node
        await routes_at_peers(bs, 1)  # plant/# covers plant/+/temp
        pub = await stack.enter_async_context(aiomqtt.Client("127.0.0.1", bs[1].port, identifier="p"))
        for q in (0, 1, 2):
            await pub.publish("plant/7/temp", f"q{q}", qos=q)
        for s in subs:
            got = await drain(s)
            assert sorted(m.payload for m in got) == [b"q0", b"q1", b"q2"], got
            assert {m.qos for m in got} == {0, 1, 2}


async def test_content_filters_are_evaluated_at_the_subscriber_node() -> None:
    async with (
        cluster(2) as bs,
        aiomqtt.Client("127.0.0.1", bs[0].port, identifier="hot") as hot,
        aiomqtt.Client("127.0.0.1", bs[1].port, identifier="p") as pub,
    ):
        await hot.subscribe("$filter/temp > 30/sensors/#", qos=1)
        await routes_at_peers(bs[:1], 1)
        for t in (10, 35, 31, 5):
            await pub.publish("sensors/a", f'{{"temp": {t}}}', qos=1)
        got = await drain(hot)
        assert [m.payload for m in got] == [b'{"temp": 35}', b'{"temp": 31}']


async def test_retained_message_published_anywhere_reaches_a_new_subscriber_anywhere() -> None:
    async with cluster(3) as bs:
        async with aiomqtt.Client("127.0.0.1", bs[2].port, identifier="p") as pub:
            await pub.publish("cfg/a", b"A", qos=1, retain=True)
            await pub.publish("cfg/b", b"B", qos=1, retain=True)
        async with aiomqtt.Client("127.0.0.1", bs[0].port, identifier="late") as late:
            await late.subscribe("cfg/+", qos=1)
            got = await drain(late, 0.5)
            assert sorted((m.topic.value, m.payload, m.retain) for m in got) == [
                ("cfg/a", b"A", True),
                ("cfg/b", b"B", True),
            ]
        # the copies stay at the subscriber's node for the next subscriber there
        async with aiomqtt.Client("127.0.0.1", bs[0].port, identifier="later") as later:
            await later.subscribe("cfg/a", qos=1)
            got = await drain(later)
            assert [(m.topic.value, m.payload) for m in got] == [("cfg/a", b"A")]


async def test_shared_subscription_delivers_once_per_group_across_the_cluster() -> None:
    async with cluster(3) as bs, contextlib.AsyncExitStack() as stack:
        members = []
        for i, b in enumerate(bs[:2]):
            for j in range(2):
                c = await stack.enter_async_context(
                    aiomqtt.Client("127.0.0.1", b.port, identifier=f"m{i}{j}")
                )
                await c.subscribe("$share/workers/jobs/#", qos=1)
                members.append(c)
        other = await stack.enter_async_context(aiomqtt.Client("127.0.0.1", bs[0].port, identifier="o"))
        await other.subscribe("$share/audit/jobs/#", qos=1)
        # node 2 has no member: both nodes 0 and 1 hold their groups at every peer
        await eventually(lambda: all(len(node_of(b).table) >= 1 for b in bs[:2]))
        await eventually(
            lambda: all(
                len(link._held) == len(node_of(b).table) for b in bs for link in node_of(b).links.values()
            )
        )
        pub = await stack.enter_async_context(aiomqtt.Client("127.0.0.1", bs[2].port, identifier="p"))
        n = 40
        for k in range(n):
            await pub.publish(f"jobs/{k}", str(k), qos=1)
        counts = [len(await drain(c)) for c in members]
        audit = await drain(other)
        assert sum(counts) == n, counts  # one delivery per message for the group
        assert counts[0] + counts[1] > 0 and counts[2] + counts[3] > 0, counts  # both nodes served
        assert sorted(int(m.payload) for m in audit) == list(range(n))  # the other group too


async def test_unsubscribe_and_session_end_withdraw_the_routes() -> None:
    async with cluster(2) as bs:
        async with aiomqtt.Client("127.0.0.1", bs[0].port, identifier="s") as s:
            await s.subscribe("a/#", qos=1)
            await s.subscribe("b/1", qos=1)
            await routes_at_peers(bs[:1], 2)
            await s.unsubscribe("a/#")
            await routes_at_peers(bs[:1], 1)
            peer_index = bs[1].core.router.index
            link_id = f"$cluster/{node_of(bs[0]).name}"
            ctl = f"$cluster/ctl/{node_of(bs[0]).name}"  # the link's control topic stays
            assert sorted(e.topic_filter for e in peer_index.entries(link_id)) == [ctl, "b/1"]
        # the clean session ended with the connection: nothing is held for it any more
        await eventually(lambda: [e.topic_filter for e in bs[1].core.router.index.entries(link_id)] == [ctl])


async def test_partial_unsubscribe_is_applied_where_the_subscriber_is() -> None:
    async with (
        cluster(2) as bs,
        aiomqtt.Client("127.0.0.1", bs[0].port, identifier="s") as s,
        aiomqtt.Client("127.0.0.1", bs[1].port, identifier="p") as pub,
    ):
        await s.subscribe("home/#", qos=1)
        await s.unsubscribe("home/garage/#")  # partial: a negative entry (seed 002)
        await routes_at_peers(bs[:1], 1)
        for t in ("home/kitchen", "home/garage/door", "home/hall"):
            await pub.publish(t, t, qos=1)
        got = await drain(s)
        assert [m.topic.value for m in got] == ["home/kitchen", "home/hall"]


async def test_no_message_loops_with_everyone_subscribed_to_everything() -> None:
    async with cluster(4) as bs, contextlib.AsyncExitStack() as stack:
        subs = []
        for i, b in enumerate(bs):
            c = await stack.enter_async_context(aiomqtt.Client("127.0.0.1", b.port, identifier=f"s{i}"))
            await c.subscribe("#", qos=2)
            subs.append(c)
        await routes_at_peers(bs, 1)
        await subs[3].publish("x/y", b"once", qos=2)
        for c in subs:
            assert [m.payload for m in await drain(c, 0.5)] == [b"once"]


async def test_qos1_to_a_slow_remote_node_is_kept_not_dropped() -> None:
    """The link's in-flight window and the peer's queue hold QoS 1 for a node whose
    subscriber is slow; nothing acknowledged to the publisher is lost."""
    async with cluster(2, max_queued_messages=100_000) as bs:
        got: list[bytes] = []
        done = asyncio.Event()
        n = 3000

        def on_message(_c: object, _u: object, m: paho.MQTTMessage) -> None:
            got.append(m.payload)
            if len(got) == n:
                done.set()

        loop = asyncio.get_running_loop()
        sub = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="slow", protocol=paho.MQTTv5)
        sub.on_message = lambda c, u, m: loop.call_soon_threadsafe(on_message, c, u, m)
        sub.connect("127.0.0.1", bs[0].port)
        sub.subscribe("load/#", qos=1)
        sub.loop_start()
        try:
            await routes_at_peers(bs[:1], 1)
            pub = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="fast", protocol=paho.MQTTv5)
            pub.max_inflight_messages_set(64)
            pub.connect("127.0.0.1", bs[1].port)
            pub.loop_start()
            infos = [pub.publish(f"load/{k % 10}", str(k).encode(), qos=1) for k in range(n)]
            await asyncio.to_thread(lambda: [i.wait_for_publish(30) for i in infos])
            assert all(i.is_published() for i in infos)
            await asyncio.wait_for(done.wait(), 30)
            assert sorted(int(p) for p in got) == list(range(n))
            pub.loop_stop()
            pub.disconnect()
        finally:
            sub.loop_stop()
            sub.disconnect()


async def test_a_node_with_another_secret_cannot_join() -> None:
    async with cluster(2) as bs:
        intruder = ClusterNode(
            ("127.0.0.1", 0), [("127.0.0.1", node_of(bs[0]).port or 0)], b"not-the-secret", refresh=0.2
        )
        b = Broker("127.0.0.1", 0, hooks=[intruder])
        proto = node_of(bs[0]).overlay.server.protocol
        before = proto.dropped
        await b.start()
        try:
            # its join attempt reached node 0, whose overlay dropped the datagrams unread
            await eventually(lambda: proto.dropped > before)
            assert not intruder.links
            assert all(len(node_of(x).links) == 1 for x in bs)
        finally:
            await b.stop()


async def test_link_ids_need_the_secret_and_links_cannot_publish() -> None:
    async with cluster(2) as bs:
        port = node_of(bs[0]).port
        assert port is not None
        fake = "$cluster/" + "ab" * 20
        with pytest.raises(aiomqtt.MqttCodeError):
            async with aiomqtt.Client(
                "127.0.0.1", port, identifier=fake, username="siftmq-cluster", password="1.2.3"
            ):
                pass
        # a valid token is single-use: a replay is refused
        token = make_token(SECRET, fake, node_of(bs[0]).name).decode()
        async with aiomqtt.Client(
            "127.0.0.1", port, identifier=fake, username="siftmq-cluster", password=token
        ):
            pass
        with pytest.raises(aiomqtt.MqttCodeError):
            async with aiomqtt.Client(
                "127.0.0.1", port, identifier=fake, username="siftmq-cluster", password=token
            ):
                pass
        assert node_of(bs[0]).refused_links == 2


async def test_garbage_datagrams_on_the_overlay_port_are_dropped() -> None:
    async with cluster(2) as bs:
        port = node_of(bs[0]).port
        assert port is not None
        proto = node_of(bs[0]).overlay.server.protocol
        before = proto.dropped
        garbage = (b"", b"\x00" * 21, b"\x00" + b"x" * 40, b"A" * 9000, bytes(range(256)) * 4)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for payload in garbage:
                s.sendto(payload, ("127.0.0.1", port))
        await eventually(lambda: proto.dropped >= before + len(garbage))
        # still a working cluster
        async with (
            aiomqtt.Client("127.0.0.1", bs[0].port, identifier="s") as sub,
            aiomqtt.Client("127.0.0.1", bs[1].port, identifier="p") as pub,
        ):
            await sub.subscribe("ok", qos=1)
            await routes_at_peers(bs[:1], 1)
            await pub.publish("ok", b"1", qos=1)
            assert [m.payload for m in await drain(sub)] == [b"1"]


async def test_a_reply_to_a_cancelled_overlay_call_is_dropped_quietly() -> None:
    """A graceful stop cancels the overlay's refresh while its socket still reads: a reply that
    comes after that used to raise InvalidStateError in rpcudp (a traceback in the node's log,
    and the call's entry kept for good)."""
    async with cluster(2) as bs:
        proto = node_of(bs[0]).overlay.server.protocol
        peer = ("127.0.0.1", node_of(bs[1]).port)
        ok, _ = await proto.ping(peer, proto.source_node.id)
        assert ok  # an answered call
        before = set(proto._outstanding)
        call = proto.ping(peer, proto.source_node.id)
        (msg_id,) = set(proto._outstanding) - before
        call.cancel()  # abandoned before its reply
        await eventually(lambda: msg_id not in proto._outstanding)


async def test_sys_cluster_topics() -> None:
    async with (
        cluster(2, sys_interval=0.2) as bs,
        aiomqtt.Client("127.0.0.1", bs[0].port, identifier="ops") as c,
    ):
        await c.subscribe("$SYS/cluster/#")
        seen: dict[str, bytes] = {}
        async with asyncio.timeout(5):
            async for m in c.messages:
                seen[m.topic.value] = m.payload
                wanted = ("links/up", "members", "node_id", "sessions/handover_holder_lost")
                if all(f"$SYS/cluster/{k}" in seen for k in wanted):
                    break
        assert seen["$SYS/cluster/members"] == b"2"
        assert seen["$SYS/cluster/links/up"] == b"1"
        assert seen["$SYS/cluster/node_id"] == node_of(bs[0]).name.encode()
        assert seen["$SYS/cluster/sessions/handover_holder_lost"] == b"0"


async def test_composite_subscription_is_matched_by_the_core_of_its_cssu() -> None:
    """(A|B)&C with its atoms published on other nodes: the subscription is kept by the CSSU
    of its GroupCode (seed 001), matched by the core, the event sent to the access node."""
    expression = "(dock/a | dock/b) & truck/+"
    async with cluster(4) as bs:
        canon = composite.canonical(expression)
        members = node_of(bs[0]).placement.members(node_of(bs[0]).placement._code(canon))  # type: ignore[union-attr]
        assert len(members) == 3
        access = next(b for b in bs if node_of(b).name != members[0])
        others = [b for b in bs if b is not access]
        async with (
            aiomqtt.Client("127.0.0.1", access.port, identifier="ops") as c,
            aiomqtt.Client("127.0.0.1", others[0].port, identifier="p1") as p1,
            aiomqtt.Client("127.0.0.1", others[1].port, identifier="p2") as p2,
        ):
            await c.subscribe(f"$composite/ship/{expression}", qos=1)
            await eventually(lambda: core_of(bs, canon) is not None)
            core = core_of(bs, canon)
            assert core is not None and node_of(core).name == members[0]
            # alpha copies of the CSGT, on the CSSU members
            await eventually(lambda: sorted(node_of(b).name for b in bs if tables_of(b)) == members)
            await routes_at_peers([core], 3)
            await p1.publish("dock/b", b'{"pallet": 7}', qos=1)
            await p2.publish("truck/9", b'{"plate": "X"}', qos=1)
            got = await drain(c)
            assert [m.topic.value for m in got] == ["$composite/ship"]
            event = json.loads(got[0].payload)
            assert sorted(x["topic"] for x in event["components"]) == ["dock/b", "truck/9"]


async def test_composite_delivery_survives_the_death_of_its_core() -> None:
    """The core of the CSSU stops: the next member takes over (re-election), registers the
    subscription and atom events published after that are merged and delivered."""
    expression = "alarm/on & door/+"
    async with cluster(5) as bs:
        canon = composite.canonical(expression)
        placement = node_of(bs[0]).placement
        assert placement is not None
        members = placement.members(placement._code(canon))
        access = next(b for b in bs if node_of(b).name not in members)
        pubs = [b for b in bs if b is not access and node_of(b).name != members[0]]
        async with aiomqtt.Client("127.0.0.1", access.port, identifier="guard") as c:
            await c.subscribe(f"$composite/intrusion/{expression}", qos=1)
            await eventually(lambda: core_of(bs, canon) is not None)
            old = core_of(bs, canon)
            assert old is not None and node_of(old).name == members[0]
            await eventually(lambda: sorted(node_of(b).name for b in bs if tables_of(b)) == members)
            await old.stop()  # the core dies (its links and UDP port close)
            alive = [b for b in bs if b is not old]
            await eventually(lambda: (core_of(alive, canon) or old) is not old, timeout=15)
            new = core_of(alive, canon)
            survivor = node_of(alive[0]).placement
            assert survivor is not None
            # the CSSU without the dead core (a core may take over on the old one's silent
            # heartbeats, before the overlay removes it: cluster._replicas)
            await eventually(
                lambda: node_of(old).name not in survivor.members(survivor._code(canon)), timeout=15
            )
            now_members = survivor.members(survivor._code(canon))
            # the replica that has merged longest among the survivors (cluster._replicas)
            assert new is not None and node_of(new).name in now_members
            await routes_at_peers([new], 2)
            async with (
                aiomqtt.Client("127.0.0.1", pubs[0].port, identifier="p1") as p1,
                aiomqtt.Client("127.0.0.1", pubs[-1].port, identifier="p2") as p2,
            ):
                await p1.publish("door/3", b"open", qos=1)
                await p2.publish("alarm/on", b"1", qos=1)
                got = await drain(c)
            assert [m.topic.value for m in got] == ["$composite/intrusion"]


async def test_a_persistent_session_moves_to_the_node_the_client_reconnects_to() -> None:
    async with cluster(2) as bs:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 300
        first = aiomqtt.Client(
            "127.0.0.1",
            bs[0].port,
            identifier="mover",
            protocol=aiomqtt.ProtocolVersion.V5,
            clean_start=False,
            properties=props,
        )
        async with first:
            await first.subscribe("jobs/#", qos=1)
            await first.unsubscribe("jobs/skip/#")  # partial: a negative entry moves too
        await routes_at_peers(bs[:1], 1)
        async with aiomqtt.Client("127.0.0.1", bs[1].port, identifier="p") as pub:
            for k in range(5):
                await pub.publish(f"jobs/{k}", str(k), qos=1)  # queued at node 0 for "mover"
        await eventually(lambda: len(bs[0].core.sessions["mover"].queue) == 5)
        second = aiomqtt.Client(
            "127.0.0.1",
            bs[1].port,
            identifier="mover",
            protocol=aiomqtt.ProtocolVersion.V5,
            clean_start=False,
            properties=props,
        )
        async with second:
            got = [m.payload for m in await drain(second, 0.5)]
            assert sorted(got) == [b"0", b"1", b"2", b"3", b"4"]  # the queue came along
            assert "mover" not in bs[0].core.sessions
            await routes_at_peers(bs[1:], 1)
            async with aiomqtt.Client("127.0.0.1", bs[0].port, identifier="p0") as pub0:
                await pub0.publish("jobs/late", b"L", qos=1)
                await pub0.publish("jobs/skip/x", b"S", qos=1)
            assert [m.payload for m in await drain(second)] == [b"L"]


async def test_a_connected_client_is_taken_over_by_its_connection_to_another_node() -> None:
    async with cluster(2) as bs:
        disconnected = asyncio.Event()
        loop = asyncio.get_running_loop()
        c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="roamer", protocol=paho.MQTTv5)
        c.on_disconnect = lambda *a: loop.call_soon_threadsafe(disconnected.set)
        c.connect("127.0.0.1", bs[0].port)
        c.loop_start()
        try:
            await eventually(lambda: "roamer" in bs[0].core.sessions)
            async with aiomqtt.Client("127.0.0.1", bs[1].port, identifier="roamer"):
                await asyncio.wait_for(disconnected.wait(), 5)  # 0x8E from node 0
                await eventually(lambda: "roamer" not in bs[0].core.sessions)
        finally:
            c.loop_stop()


async def test_the_bridge_records_which_node_delivered(tmp_path: Path) -> None:
    """Each node's bridge writes its node id with every delivery and publication (issue 17
    item 8; `siftmq analytics` groups them in `node_rate`) and subscription change (issue 29)."""
    from bridge import Bridge

    bridges = [Bridge(tmp_path / f"landing{i}", roll_interval=0.1) for i in range(2)]
    nodes = []
    brokers = []
    try:
        for i in range(2):
            join = [] if i == 0 else [("127.0.0.1", nodes[0].port or 0)]
            node = ClusterNode(("127.0.0.1", 0), join, SECRET, refresh=0.2, rpc_timeout=0.5)
            b = Broker("127.0.0.1", 0, hooks=[bridges[i], node])
            await b.start()
            nodes.append(node)
            brokers.append(b)
        await eventually(lambda: all(links_up(x) == 1 for x in nodes), timeout=15)
        async with (
            aiomqtt.Client("127.0.0.1", brokers[0].port, identifier="s") as sub,
            aiomqtt.Client("127.0.0.1", brokers[1].port, identifier="p") as pub,
        ):
            await sub.subscribe("n/#", qos=1)
            await routes_at_peers(brokers[:1], 1)
            for k in range(3):
                await pub.publish(f"n/{k}", b"x", qos=1)
            assert len(await drain(sub)) == 3
    finally:
        for b in brokers:
            await b.stop()
    table = pq.read_table(tmp_path / "landing0" / "deliveries")
    mine = [r for r in table.to_pylist() if r["subscriber_id"] == "s"]
    assert len(mine) == 3 and {r["node"] for r in mine} == {nodes[0].name}
    sent = pq.read_table(tmp_path / "landing1" / "deliveries").to_pylist()
    link = [r for r in sent if r["topic"].startswith("n/")]  # node 1 delivered to node 0's link
    assert len(link) == 3 and {r["node"] for r in link} == {nodes[1].name}
    # subscription changes too (issue 29): the subscriber's SUBSCRIBE, recorded by node 0
    changes = pq.read_table(tmp_path / "landing0" / "subscription_changes").to_pylist()
    subs = [r for r in changes if r["client_id"] == "s" and r["action"] == "subscribe"]
    assert len(subs) == 1 and subs[0]["node"] == nodes[0].name
