"""Helpers of the cluster tests: a cluster of real brokers in one event loop (ports 0)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt

from broker import Broker
from cluster import ClusterNode
from tests.waiting import eventually

SECRET = b"test-cluster-secret"


@contextlib.asynccontextmanager
async def cluster(n: int, secret: bytes = SECRET, **options: object) -> AsyncIterator[list[Broker]]:
    """``n`` brokers joined through the first; yields once every link is up."""
    brokers: list[Broker] = []
    nodes: list[ClusterNode] = []
    try:
        for i in range(n):
            join = [] if i == 0 else [("127.0.0.1", nodes[0].port or 0)]
            node = ClusterNode(("127.0.0.1", 0), join, secret, refresh=0.2, rpc_timeout=0.5)
            b = Broker("127.0.0.1", 0, hooks=[node], **options)
            await b.start()
            brokers.append(b)
            nodes.append(node)
        await eventually(lambda: all(links_up(x) == n - 1 for x in nodes), timeout=15)
        yield brokers
    finally:
        for b in brokers:
            await b.stop()


def node_of(b: Broker) -> ClusterNode:
    return next(h for h in b.hooks if isinstance(h, ClusterNode))


def links_up(node: ClusterNode) -> int:
    return sum(1 for link in node.links.values() if link.connected)


async def routes_at_peers(brokers: list[Broker], count: int) -> None:
    """Wait until every link of every node holds ``count`` subscriptions at its peer."""

    def held() -> bool:
        return all(
            len(link._held) == len(node_of(b).table) == count
            for b in brokers
            for link in node_of(b).links.values()
        )

    await eventually(held, timeout=5)


async def drain(c: aiomqtt.Client, quiet: float = 0.3) -> list[aiomqtt.Message]:
    """Every message until ``quiet`` seconds pass without one."""
    got: list[aiomqtt.Message] = []
    with contextlib.suppress(TimeoutError):
        while True:
            got.append(await asyncio.wait_for(anext(aiter(c.messages)), quiet))
    return got


def tables_of(b: Broker) -> int:
    placement = node_of(b).placement
    return 0 if placement is None else len(placement.tables)


def core_of(bs: list[Broker], expression: str) -> Broker | None:
    """The broker that emits ``expression``'s events now (the core of its CSSU; every member
    merges, cluster._replicas)."""
    cores = [b for b in bs if (p := node_of(b).placement) is not None and expression in p.replicas.emitting]
    assert len(cores) <= 1
    return cores[0] if cores else None


async def start_node(data: Path, join: Broker | None, **options: object) -> Broker:
    """A started broker of the cluster with its store and node ID in ``data`` (the node ID's
    file creates the directory), joining through ``join``'s cluster port."""
    seeds = [] if join is None else [("127.0.0.1", node_of(join).port or 0)]
    node = ClusterNode(("127.0.0.1", 0), seeds, SECRET, data_dir=data, refresh=0.2, rpc_timeout=0.5)
    b = Broker("127.0.0.1", 0, hooks=[node], store_path=str(data / "broker.db"), **options)
    await b.start()
    return b


async def all_linked(brokers: list[Broker]) -> None:
    """Until every node's links to all the others are up."""
    n = len(brokers)
    await eventually(lambda: all(links_up(node_of(b)) == n - 1 for b in brokers), timeout=15)
