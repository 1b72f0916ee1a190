"""A siftmq cluster node as the remote of an outbound bridge (issue 40: "a bridge ... to a
siftmq cluster node").

Two real cluster nodes (tests/cluster/_support.py: brokers with a ClusterNode hook, real
links over loopback, ports 0) and an edge broker whose bridge connects to the first node:
messages published at the edge reach a subscriber on the *other* node (out, QoS 1 and 2, in
order, each once), and messages published on the other node reach the edge's subscriber
(in).  With both nodes in the bridge's failover list, stopping the node it uses moves it to
the other one, and what the edge publishes meanwhile arrives there.
"""

from __future__ import annotations

import asyncio

import aiomqtt

from broker import Broker
from tests.cluster._support import cluster
from tests.waiting import eventually
from uplink import BridgeConfig, Direction, TopicRule, Uplink


def _bridge(*ports: int) -> BridgeConfig:
    return BridgeConfig(
        name="hq",
        urls=tuple(f"mqtt://127.0.0.1:{p}" for p in ports),
        topics=(
            TopicRule("sensors/#", Direction.OUT, 2, remote_prefix="edge/"),
            TopicRule("cmd/#", Direction.IN, 1, remote_prefix="edge/"),
        ),
        backoff_min=0.05,
        backoff_max=0.2,
    )


async def _collect(c: aiomqtt.Client, into: list[tuple[str, bytes, int]]) -> None:
    async for m in c.messages:
        into.append((str(m.topic), bytes(m.payload), m.qos))  # type: ignore[arg-type]


async def _routed(port: int, topic: str, seen: list[tuple[str, bytes, int]]) -> None:
    """Publish probes on ``topic`` until one shows in ``seen`` (the cluster spreads routes
    asynchronously)."""
    async with aiomqtt.Client("127.0.0.1", port) as c, asyncio.timeout(15):
        while not any(p == b"probe" for _, p, _ in seen):
            await c.publish(topic, b"probe", qos=1)
            await asyncio.sleep(0.1)


def _real(got: list[tuple[str, bytes, int]]) -> list[tuple[str, bytes, int]]:
    return [m for m in got if m[1] != b"probe"]


async def test_a_bridge_to_a_cluster_node_both_ways() -> None:
    async with cluster(2) as (a, b):
        uplink = Uplink([_bridge(a.port)])
        async with (
            Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge,
            aiomqtt.Client("127.0.0.1", b.port, identifier="hq-sub") as hq_sub,
            aiomqtt.Client("127.0.0.1", edge.port, identifier="edge-sub") as edge_sub,
        ):
            await hq_sub.subscribe("edge/sensors/#", qos=2)
            await edge_sub.subscribe("cmd/#", qos=1)
            await asyncio.wait_for(uplink.bridges["hq"].wait_connected(), 10)
            # the bridge's window: the remote's Receive Maximum (1024), not the edge's
            # max_inflight for ordinary clients (20)
            conn = edge.core.sessions["$uplink/hq"].conn
            assert conn is not None and conn.window == 1024
            at_hq: list[tuple[str, bytes, int]] = []
            at_edge: list[tuple[str, bytes, int]] = []
            readers = [asyncio.create_task(_collect(hq_sub, at_hq))]
            readers.append(asyncio.create_task(_collect(edge_sub, at_edge)))
            await _routed(edge.port, "sensors/probe", at_hq)  # the cluster's routes are in place
            await _routed(b.port, "edge/cmd/probe", at_edge)
            async with aiomqtt.Client("127.0.0.1", edge.port, identifier="edge-pub") as pub:
                for i in range(100):
                    await pub.publish(f"sensors/{i % 2}", str(i).encode(), qos=2 if i % 2 else 1)
            async with aiomqtt.Client("127.0.0.1", b.port, identifier="hq-pub") as pub:
                for i in range(20):
                    await pub.publish("edge/cmd/reboot", str(i).encode(), qos=1)
            await eventually(lambda: len(_real(at_hq)) >= 100 and len(_real(at_edge)) >= 20, 20)
            for r in readers:
                r.cancel()
        at_hq, at_edge = _real(at_hq), _real(at_edge)
        assert [int(p) for t, p, _ in at_hq if t == "edge/sensors/0"] == list(range(0, 100, 2))
        assert [int(p) for t, p, _ in at_hq if t == "edge/sensors/1"] == list(range(1, 100, 2))
        assert {q for t, _, q in at_hq if t == "edge/sensors/1"} == {2}  # QoS 2 all the way
        assert [(t, int(p)) for t, p, _ in at_edge] == [("cmd/reboot", i) for i in range(20)]
        assert uplink.bridges["hq"].state.sent >= 100


async def test_the_bridge_fails_over_between_cluster_nodes() -> None:
    async with cluster(2) as (a, b):
        uplink = Uplink([_bridge(a.port, b.port)])
        async with (
            Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=":memory:", hooks=[uplink]) as edge,
            aiomqtt.Client("127.0.0.1", b.port, identifier="hq-sub") as hq_sub,
        ):
            await hq_sub.subscribe("edge/sensors/#", qos=1)
            bridge = uplink.bridges["hq"]
            await asyncio.wait_for(bridge.wait_connected(), 10)
            assert bridge.state.remote == f"mqtt://127.0.0.1:{a.port}"
            got: list[tuple[str, bytes, int]] = []
            reader = asyncio.create_task(_collect(hq_sub, got))
            async with aiomqtt.Client("127.0.0.1", edge.port, identifier="edge-pub") as pub:
                await pub.publish("sensors/x", b"0", qos=1)
                await eventually(lambda: len(got) == 1, 10)
                await a.stop()  # the node the bridge uses goes away
                for i in range(1, 50):  # PUBACKed by the edge: queued while it moves
                    await pub.publish("sensors/x", str(i).encode(), qos=1)
                await eventually(lambda: bridge.state.remote == f"mqtt://127.0.0.1:{b.port}", 20)
                await eventually(lambda: len({p for _, p, _ in got}) == 50, 20)
            reader.cancel()
        assert sorted({int(p) for _, p, _ in got}) == list(range(50))
