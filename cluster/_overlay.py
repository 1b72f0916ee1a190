"""Membership of the cluster: the Kademlia overlay (the ``kademlia`` package), seed 001 section 3.

Every broker is a Kademlia node with a 160-bit ID kept in its data directory (the seed: "once
an information service has an ID it must never change", or events could not find their way
back).  The overlay gives the two operations the seed's P2P layer offers:
``FIND_NODE(GroupCode)`` -> :meth:`Overlay.closest` (the alpha known live nodes nearest by XOR)
and the member list the MQTT links are opened to (:meth:`Overlay.members`).

Failure detection is Kademlia's own: a node that does not answer an RPC is dropped from the
routing table (``KademliaProtocol.handle_call_response``), and :meth:`Overlay.refresh` pings
every known node each ``refresh`` seconds so a dead one disappears within one refresh plus
the RPC timeout.  A restarted node bootstraps from ``--join`` again with the same ID; the
others re-learn its (possibly new) address when it contacts them.

Coming back is event-driven (issue 30): a node that stopped answering is remembered and
pinged every ``refresh / 4`` seconds (for :data:`LOST_PROBED` seconds), and a node entering
the routing table (its first answer or request) tells the cluster at once
(``Overlay.on_member``), which opens its link on the next turn of the loop.  Before, a healed
partition waited for the next refresh's lookups, which themselves waited a failure timeout
for the seeds still unreachable: retained values converged 2.05-2.17 s after a heal of a
partition in a 100-fault nemesis run (refresh 1 s; target 2 x refresh), docs/fault.md.

The UDP port is hardened (issue 17: "not an attack surface"): every datagram carries an
HMAC-SHA256 tag (first 16 bytes) keyed by the cluster secret and is dropped unread when the
tag is wrong or the datagram is over :data:`MAX_DATAGRAM` bytes; the DHT's ``STORE`` and
``FIND_VALUE`` RPCs, which siftmq does not use, are refused (no one can make a node hold data),
and the wire format is msgpack (``umsgpack``), never pickle.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from kademlia.network import Server
from kademlia.node import Node
from kademlia.protocol import KademliaProtocol

from broker._files import private_dir, write_private

__all__ = ["LOST_PROBED", "MAX_DATAGRAM", "Overlay", "load_node_id"]

log = logging.getLogger("siftmq.cluster")

#: datagrams longer than this are dropped before they are parsed
MAX_DATAGRAM: Final = 8192
#: seconds a node that stopped answering is probed (then only the refresh's lookups find it)
LOST_PROBED: Final = 300.0
_TAG = 16


def load_node_id(data_dir: Path | None) -> bytes:
    """This broker's 160-bit node ID: read from ``<data_dir>/cluster-node-id``, created there
    (hex, once) if missing; a fresh random ID without a data directory."""
    if data_dir is None:
        return secrets.token_bytes(20)
    path = data_dir / "cluster-node-id"
    try:
        text = path.read_text().strip()
        node_id = bytes.fromhex(text)
        if len(node_id) != 20:
            raise ValueError(f"{path}: a 160-bit (40 hex digits) node ID expected")
        return node_id
    except FileNotFoundError:
        pass
    node_id = secrets.token_bytes(20)
    private_dir(data_dir)  # 0700 / 0600 whatever the umask (broker/_files.py)
    write_private(path, (node_id.hex() + "\n").encode())
    return node_id


class _SignedTransport:
    """Wraps the datagram transport: appends the HMAC tag to everything sent."""

    def __init__(self, transport: asyncio.DatagramTransport, key: bytes) -> None:
        self._t = transport
        self._key = key

    def sendto(self, data: bytes, addr: Any = None) -> None:
        tag = hmac.new(self._key, data, hashlib.sha256).digest()[:_TAG]
        self._t.sendto(tag + data, addr)

    def close(self) -> None:
        self._t.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


class _Protocol(KademliaProtocol):  # type: ignore[misc]  # untyped base class
    """Kademlia's protocol with signed datagrams, a size bound and no DHT storage."""

    key: bytes = b""
    dropped = 0
    #: called when a node joins the routing table (set by :class:`Overlay`)
    on_member: Callable[[bytes], None] | None = None
    #: nodes that stopped answering: id -> (node, since) (set by :class:`Overlay`)
    lost: dict[bytes, tuple[Node, float]] | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(_SignedTransport(transport, self.key))

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if len(data) > MAX_DATAGRAM or len(data) <= _TAG:
            type(self).dropped += 1
            return
        tag, body = data[:_TAG], data[_TAG:]
        if not hmac.compare_digest(tag, hmac.new(self.key, body, hashlib.sha256).digest()[:_TAG]):
            type(self).dropped += 1
            return
        super().datagram_received(body, addr)

    def _timeout(self, msg_id: bytes) -> None:
        # rpcudp sets the result of a future that may be cancelled already (a lookup
        # abandoned at stop): InvalidStateError in a loop callback. Skip those.
        entry = self._outstanding.get(msg_id)
        if entry is None or entry[0].done():
            self._outstanding.pop(msg_id, None)
            return
        super()._timeout(msg_id)

    def _accept_response(self, msg_id: bytes, data: Any, address: Any) -> None:
        # the same for a response that comes after its future was cancelled (a graceful stop
        # cancels the refresh while the datagram socket still reads): rpcudp's set_result then
        # raised InvalidStateError in a task nobody awaits, logged as a traceback (seen in a
        # 100-fault nemesis run, at two `leave`s of one node)
        entry = self._outstanding.get(msg_id)
        if entry is not None and entry[0].done():
            entry[1].cancel()
            del self._outstanding[msg_id]
            return
        super()._accept_response(msg_id, data, address)

    def handle_call_response(self, result: Any, node: Node) -> Any:
        # a node that did not answer leaves the table (Kademlia): remember it, to probe it
        # until it answers again (:meth:`Overlay._probe_lost`)
        lost = self.lost
        if lost is not None:
            if result[0]:
                lost.pop(node.id, None)
            elif self.router.is_new_node(node):
                # not in the table (a probe of a lost node, or a node never admitted): nothing
                # for Kademlia to drop, and no warning per probe; probed from its first silence
                lost.setdefault(node.id, (node, time.monotonic()))
                return result
            else:  # a member silent: Kademlia drops it below; probed from now on
                lost[node.id] = (node, time.monotonic())
        return super().handle_call_response(result, node)

    def welcome_if_new(self, node: Node) -> None:
        # a node this one did not know (new, or back after a failed ping removed it: a
        # healed partition, a restart): the cluster connects its link now, not at its next
        # refresh (which may be blocked for a failure timeout in pings to silent nodes)
        new = bool(self.router.is_new_node(node))
        if self.lost is not None:  # it answers or asks: alive
            self.lost.pop(node.id, None)
        super().welcome_if_new(node)
        if new and self.on_member is not None:
            self.on_member(node.id)

    def rpc_store(self, sender: Any, nodeid: bytes, key: bytes, value: Any) -> bool:
        return False

    def rpc_find_value(self, sender: Any, nodeid: bytes, key: bytes) -> Any:
        return self.rpc_find_node(sender, nodeid, key)


class Overlay:
    """This broker's Kademlia node: membership, ``FIND_NODE``, failure detection."""

    def __init__(
        self,
        node_id: bytes,
        secret: bytes,
        ksize: int = 20,
        rpc_timeout: float = 5.0,
        probe_every: float = 0.25,
    ) -> None:
        key = hashlib.sha256(b"siftmq-cluster-udp|" + secret).digest()
        proto = type("_KeyedProtocol", (_Protocol,), {"key": key})
        self.server = Server(ksize=ksize, node_id=node_id)
        self.server.protocol_class = proto
        self.node_id = node_id
        self.rpc_timeout = rpc_timeout  # an unanswered RPC marks the node dead after this
        self.seeds: list[tuple[str, int]] = []
        #: called (on the event loop) when a node enters the routing table
        self.on_member: Callable[[bytes], None] | None = None
        #: nodes that stopped answering a ping, probed every ``probe_every`` seconds for
        #: ``LOST_PROBED`` seconds (a healed partition, a restarted node: back in the table
        #: at its first answer, not at the next refresh's lookups)
        self.lost: dict[bytes, tuple[Node, float]] = {}
        self.probe_every = probe_every
        self._probes: set[bytes] = set()
        self._probe_task: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int, join: list[tuple[str, int]]) -> None:
        # their INFO lines are per RPC; rpcudp logs a dead peer's silence as an ERROR (Kademlia
        # says it once, as a WARNING, when it drops the node)
        for name, level in (("kademlia", logging.WARNING), ("rpcudp", logging.CRITICAL)):
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(level)
        await self.server.listen(port, interface=host)
        self.server.protocol._wait_timeout = self.rpc_timeout
        self.server.protocol.on_member = self._member
        self.server.protocol.lost = self.lost
        self._probe_task = asyncio.create_task(self._probe_lost(), name="overlay probes")
        self.seeds = [await _resolve(h, p) for h, p in join]
        if self.seeds:
            await self.server.bootstrap(self.seeds)

    def _member(self, node_id: bytes) -> None:
        if self.on_member is not None:
            self.on_member(node_id)

    async def _probe_lost(self) -> None:
        """Ping every lost node (one ping in flight per node) until it answers or has been
        lost for ``LOST_PROBED`` seconds.  A datagram per lost node per ``probe_every``."""
        while True:
            await asyncio.sleep(self.probe_every)
            proto = self.server.protocol
            if proto is None:
                continue
            now = time.monotonic()
            for node_id, (node, since) in list(self.lost.items()):
                if now - since > LOST_PROBED:
                    del self.lost[node_id]
                elif node_id not in self._probes:
                    self._probes.add(node_id)
                    task = asyncio.create_task(proto.call_ping(node))
                    task.add_done_callback(functools.partial(self._probed, node_id))

    def _probed(self, node_id: bytes, task: asyncio.Task[Any]) -> None:
        self._probes.discard(node_id)
        if not task.cancelled():
            task.exception()  # retrieved (a stop closes the socket under a ping)

    def stop(self) -> None:
        if self._probe_task is not None:
            self._probe_task.cancel()
            self._probe_task = None
        self.server.stop()

    def members(self) -> dict[bytes, tuple[str, int]]:
        """The other nodes this node knows alive: id -> (host, port). O(known nodes)."""
        proto = self.server.protocol
        if proto is None:
            return {}
        return {n.id: (n.ip, n.port) for b in proto.router.buckets for n in b.get_nodes()}

    def closest(self, key: int, count: int) -> list[int]:
        """``FIND_NODE`` on the local routing table: the ``count`` known nodes (this one
        included) nearest to ``key`` by XOR, as integers. O(known nodes log known nodes)."""
        ids = [int.from_bytes(i, "big") for i in self.members()]
        ids.append(int.from_bytes(self.node_id, "big"))
        ids.sort(key=lambda i: i ^ key)
        return ids[:count]

    async def refresh(self) -> None:
        """Ping every known node (the silent ones leave the table) and look ourselves up
        through the seeds and the live members (new nodes are learnt)."""
        proto = self.server.protocol
        if proto is None:
            return
        nodes = [n for b in proto.router.buckets for n in b.get_nodes()]
        await asyncio.gather(*(proto.call_ping(n) for n in nodes), return_exceptions=True)
        contacts = list({*self.seeds, *((n.ip, n.port) for n in nodes)})
        if contacts:
            try:
                await self.server.bootstrap(contacts)
            except Exception as exc:  # a lookup through a vanished seed must not stop the loop
                log.debug("overlay refresh: %s", exc)

    @staticmethod
    def node(node_id: bytes, host: str, port: int) -> Node:
        return Node(node_id, host, port)


async def _resolve(host: str, port: int) -> tuple[str, int]:
    """Kademlia wants IP addresses: resolve a host name once."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    return str(infos[0][4][0]), port
