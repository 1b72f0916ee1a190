"""Captured cluster messages cannot be replayed or redirected (issue 37, item 2; cluster._auth).

Real nodes on loopback.  Node A joins through a relay the test controls (a UDP socket that
passes datagrams between A and node B and records them, and a TCP listener on the same port
that takes A's link CONNECT to "B" and keeps it), so the test holds bytes A really sent to B:

* a datagram A sent to B, replayed by the test to B, is not answered and is counted as
  replayed; replayed to node C it is dropped as addressed to another node;
* A's link CONNECT to B, replayed to C, is refused (the token names B); the same bytes are
  accepted by B once (they were fresh) and refused there the second time.

"Not answered" is checked with a barrier: after the replay the test sends a ping of its own
(sealed with the secret, as a joining node would) and waits for that answer: a reply to the
replay would have come first (one socket, one loop, loopback).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiomqtt
import pytest
import umsgpack

from broker import Broker
from broker.packets import Connect, Decoder
from cluster import ClusterNode
from cluster._auth import ZERO_ID, DatagramGuard, Opened, Refusal, datagram_key
from tests.cluster._support import SECRET, cluster, node_of
from tests.waiting import eventually

_SENDER = slice(17, 37)  # tag (16), version (1), sender id (20), destination id (20)
_DEST = slice(37, 57)
_KIND = 89  # then time (8), nonce (12), reply-to (12): rpcudp's kind byte (0: request)


@dataclass
class Relay(asyncio.DatagramProtocol):
    """Passes datagrams between node A (the first other sender) and ``b``; records A's."""

    b: tuple[str, int]
    a: Any = None
    from_a: list[bytes] = field(default_factory=list)
    transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if addr == self.b:
            if self.a is not None:
                self.transport.sendto(data, self.a)
        else:
            self.a = addr
            self.from_a.append(data)
            self.transport.sendto(data, self.b)


@dataclass
class Connects:
    """The first packet of every TCP connection to the relay's port (A's link CONNECTs)."""

    packets: list[bytes] = field(default_factory=list)

    async def take(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            head = await reader.readexactly(1)
            length, shift, size = 0, 0, b""
            while True:
                byte = await reader.readexactly(1)
                size += byte
                length |= (byte[0] & 0x7F) << shift
                shift += 7
                if not byte[0] & 0x80:
                    break
            self.packets.append(head + size + await reader.readexactly(length))
        writer.close()


@contextlib.asynccontextmanager
async def relay_to(b: tuple[str, int]) -> AsyncIterator[tuple[int, Relay, Connects]]:
    """A UDP relay to ``b`` and a CONNECT recorder on one port number (a cluster port)."""
    loop = asyncio.get_running_loop()
    connects = Connects()
    for _ in range(20):  # the UDP port of a free TCP port is almost always free too
        server = await asyncio.start_server(connects.take, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            transport, relay = await loop.create_datagram_endpoint(
                lambda: Relay(b), local_addr=("127.0.0.1", port)
            )
        except OSError:
            server.close()
            continue
        try:
            yield port, relay, connects
        finally:
            transport.close()
            server.close()
        return
    raise AssertionError("no port free for both TCP and UDP")


class Probe(asyncio.DatagramProtocol):
    """The test's own overlay socket: replays bytes, and pings with the secret as a barrier."""

    def __init__(self) -> None:
        self.guard = DatagramGuard(datagram_key(SECRET), b"\x7f" * 20)
        self.received: list[bytes] = []
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.received.append(data)

    async def barrier(self, to: tuple[str, int]) -> list[bytes]:
        """Ping ``to`` (first contact) and wait for the answer: what came before it."""
        body = b"\x00" + secrets.token_bytes(20) + umsgpack.packb(["ping", [self.guard.me]])
        self.transport.sendto(self.guard.request(body, ZERO_ID, _now()), to)
        checked = 0
        answer: list[int] = []

        def answered() -> bool:
            nonlocal checked
            for i in range(checked, len(self.received)):
                if isinstance(self.guard.open(self.received[i], _now()), Opened):
                    answer.append(i)
                    return True
            checked = len(self.received)
            return False

        await eventually(answered)
        before = self.received[: answer[0]]
        del self.received[: answer[0] + 1]
        return before


def _now() -> float:
    return time.time()


async def connack(port: int, connect: bytes) -> int:
    """Send a captured CONNECT to ``port``: its CONNACK's reason code."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(connect)
        head = await asyncio.wait_for(reader.readexactly(2), 5)
        assert head[0] == 0x20  # CONNACK
        body = await asyncio.wait_for(reader.readexactly(head[1]), 5)
        return body[1]
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def a_through_relay() -> AsyncIterator[tuple[Broker, Broker, Broker, Relay, Connects]]:
    """Nodes B and C linked; node A joined through a relay in front of B."""
    async with cluster(2, sys_interval=0.2, metrics_listen="127.0.0.1:0") as (b, c):
        b_port = node_of(b).port
        assert b_port is not None
        async with relay_to(("127.0.0.1", b_port)) as (port, relay, connects):
            node = ClusterNode(("127.0.0.1", 0), [("127.0.0.1", port)], SECRET, refresh=0.2, rpc_timeout=0.5)
            a = Broker("127.0.0.1", 0, hooks=[node])
            await a.start()
            try:
                yield a, b, c, relay, connects
            finally:
                await a.stop()


def _refused(b: Broker, why: Refusal) -> int:
    return node_of(b).overlay.refused()[why]


async def test_a_captured_datagram_is_not_answered_again_nor_elsewhere() -> None:
    async with a_through_relay() as (a, b, c, relay, _):
        a_id, b_id = node_of(a).node_id, node_of(b).node_id

        # a request A addressed to B by its id (the crawl's FIND_NODE, then the pings)
        def to_b() -> list[bytes]:
            return [d for d in relay.from_a if d[_DEST] == b_id and d[_SENDER] == a_id and d[_KIND] == 0]

        await eventually(lambda: bool(to_b()))
        captured = to_b()[0]
        b_addr = ("127.0.0.1", node_of(b).port)
        c_addr = ("127.0.0.1", node_of(c).port)
        loop = asyncio.get_running_loop()
        transport, probe = await loop.create_datagram_endpoint(Probe, local_addr=("127.0.0.1", 0))
        try:
            replayed, elsewhere = _refused(b, Refusal.REPLAYED), _refused(c, Refusal.WRONG_DESTINATION)
            transport.sendto(captured, b_addr)
            await eventually(lambda: _refused(b, Refusal.REPLAYED) == replayed + 1)
            assert await probe.barrier(b_addr) == []  # no answer to the replay
            transport.sendto(captured, c_addr)
            await eventually(lambda: _refused(c, Refusal.WRONG_DESTINATION) == elsewhere + 1)
            assert await probe.barrier(c_addr) == []
            # the replayer's address did not become a member anywhere
            probe_port = transport.get_extra_info("sockname")[1]
            for x in (a, b, c):
                assert all(port != probe_port for _, port in node_of(x).overlay.members().values())
        finally:
            transport.close()
        # counted in $SYS and /metrics
        async with aiomqtt.Client("127.0.0.1", b.port, identifier="ops") as ops:
            await ops.subscribe("$SYS/cluster/overlay/dropped/replayed")
            await counted(ops)
        assert b.metrics_port is not None
        text = await asyncio.to_thread(_scrape, b.metrics_port)
        assert 'siftmq_cluster_overlay_dropped_total{reason="replayed"}' in text


async def counted(ops: aiomqtt.Client) -> None:
    """Until the subscribed $SYS counter is published above 0 (its retained value may be from
    before the refusal: the next publication, sys_interval later, has it)."""
    async with asyncio.timeout(5):
        async for m in ops.messages:
            if int(m.payload) >= 1:  # type: ignore[arg-type]
                return


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


async def test_a_captured_link_connect_is_refused_by_another_node() -> None:
    async with a_through_relay() as (a, b, c, _, connects):
        a_client = f"$cluster/{node_of(a).name}"

        def a_connect() -> bytes | None:
            for packet in connects.packets:
                (p,) = Decoder().feed(packet)
                if isinstance(p, Connect) and p.client_id == a_client:
                    return packet
            return None

        await eventually(lambda: a_connect() is not None, timeout=10)
        captured = a_connect()
        assert captured is not None
        at_c, at_b = node_of(c).checker, node_of(b).checker
        wrong = at_c.refused[Refusal.WRONG_DESTINATION]
        assert await connack(node_of(c).port or 0, captured) != 0  # a token for B, at C
        assert at_c.refused[Refusal.WRONG_DESTINATION] == wrong + 1
        # B, its destination, accepts it once: the refusal at C was for the destination
        assert await connack(node_of(b).port or 0, captured) == 0
        assert await connack(node_of(b).port or 0, captured) != 0
        assert at_b.refused[Refusal.REPLAYED] >= 1
        async with aiomqtt.Client("127.0.0.1", c.port, identifier="ops") as ops:
            await ops.subscribe("$SYS/cluster/links/refused/wrong_destination")
            await counted(ops)


async def test_first_contact_pings_are_answered_without_admitting_the_sender(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node joining through a seed address pings it at the zero destination: answered (the
    joiner learns the id), but the sender only becomes a member with a request addressed to
    the node by its id, so a captured first-contact ping opens no link to its replayer."""
    async with cluster(1) as (b,):
        loop = asyncio.get_running_loop()
        transport, probe = await loop.create_datagram_endpoint(Probe, local_addr=("127.0.0.1", 0))
        try:
            assert await probe.barrier(("127.0.0.1", node_of(b).port)) == []
            assert node_of(b).overlay.members() == {}
            assert not node_of(b).links
        finally:
            transport.close()
        caplog.set_level(logging.WARNING, "siftmq.cluster")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # not even parsed
            for _ in range(3):
                s.sendto(b"\x00" * 9000, ("127.0.0.1", node_of(b).port or 0))
        await eventually(lambda: _refused(b, Refusal.MALFORMED) == 3)
        # counted each time, logged once (rate-limited)
        assert sum("dropped: malformed" in r.getMessage() for r in caplog.records) == 1
