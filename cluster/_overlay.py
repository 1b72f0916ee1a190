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

The UDP port is hardened (issue 17: "not an attack surface"; issue 37: fresh and bound):
every datagram is sealed by :class:`~cluster._auth.DatagramGuard` (an HMAC keyed by the
cluster secret over the sender id, the destination id, a timestamp, a nonce and, in a reply,
the request's nonce) and dropped unparsed when it is over :data:`MAX_DATAGRAM` bytes, its MAC
is wrong, it is addressed to another node, it is outside the clock window, it was seen before,
or it is a reply to no request of ours; each drop is counted by reason
(``Overlay.refused``, ``$SYS/cluster/overlay/dropped/<reason>``) and logged at most once per
:data:`~broker.ext.LIMIT_LOG_INTERVAL` per reason.  The protocol therefore receives
and answers datagrams itself (:meth:`_Protocol.datagram_received`) instead of rpcudp's
``_solve_datagram``, and sends its requests through :meth:`_Protocol._call`, which knows the
id of the node asked; rpcudp's bare ``ping(address, ...)`` (the bootstrap's, to a seed
address) goes to the zero destination, which a receiver answers without admitting the sender
(docs/cluster.md, "Security").  The DHT's ``STORE`` and ``FIND_VALUE`` RPCs, which siftmq
does not use, are refused (no one can make a node hold data), and the wire format is msgpack
(``umsgpack``), never pickle.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import umsgpack
from kademlia.network import Server
from kademlia.node import Node
from kademlia.protocol import KademliaProtocol

from broker.ext import LIMIT_LOG_INTERVAL, LogLimiter, private_dir, write_private
from cluster._auth import ZERO_ID, DatagramGuard, Opened, Refusal, TokenChecker, datagram_key

__all__ = ["LOST_PROBED", "MAX_DATAGRAM", "Overlay", "freshness_metrics", "freshness_values", "load_node_id"]

log = logging.getLogger("siftmq.cluster")

#: datagrams longer than this are dropped before they are parsed
MAX_DATAGRAM: Final = 8192
#: seconds a node that stopped answering is probed (then only the refresh's lookups find it)
LOST_PROBED: Final = 300.0
#: the RPCs answered (rpc_stun, which tells a node its address, is not)
_RPCS: Final = frozenset({"ping", "find_node", "find_value", "store"})
_NO_ANSWER: Final = object()


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


class _SealingTransport:
    """Wraps the datagram transport: what rpcudp sends (its requests) is sealed by the
    protocol's guard for the node being asked (:attr:`_Protocol.asking`)."""

    def __init__(self, transport: asyncio.DatagramTransport, proto: _Protocol) -> None:
        self._t = transport
        self._proto = proto

    def sendto(self, data: bytes, addr: Any = None) -> None:
        proto = self._proto
        self._t.sendto(proto.guard.request(data, proto.asking, time.time()), addr)

    def close(self) -> None:
        self._t.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


class _Protocol(KademliaProtocol):  # type: ignore[misc]  # untyped base class
    """Kademlia's protocol with sealed datagrams, a size bound and no DHT storage."""

    key: bytes = b""
    #: called when a node joins the routing table (set by :class:`Overlay`)
    on_member: Callable[[bytes], None] | None = None
    #: nodes that stopped answering: id -> (node, since) (set by :class:`Overlay`)
    lost: dict[bytes, tuple[Node, float]] | None = None

    def __init__(self, source_node: Node, storage: Any, ksize: int) -> None:
        super().__init__(source_node, storage, ksize)
        self.guard = DatagramGuard(self.key, source_node.id)
        #: the id of the node the request being sent goes to (zero: an address only)
        self.asking = ZERO_ID
        self.raw: asyncio.DatagramTransport | None = None
        self._logged = LogLimiter(LIMIT_LOG_INTERVAL)  # per Refusal

    @property
    def dropped(self) -> int:
        """Datagrams dropped, every reason."""
        return sum(self.guard.refused.values())

    def connection_made(self, transport: Any) -> None:
        self.raw = transport
        super().connection_made(_SealingTransport(transport, self))

    def datagram_received(self, data: bytes, addr: Any) -> None:
        guard = self.guard
        if len(data) > MAX_DATAGRAM:
            guard.refused[Refusal.MALFORMED] += 1
            self._refused(Refusal.MALFORMED, addr)
            return
        now = time.time()
        opened = guard.open(data, now)
        if isinstance(opened, Refusal):
            self._refused(opened, addr)
            return
        body = opened.body
        msg_id = body[1:21]
        try:
            payload = umsgpack.unpackb(body[21:])
        except Exception:  # a member's bug: authentic, unreadable
            guard.refused[Refusal.MALFORMED] += 1
            self._refused(Refusal.MALFORMED, addr)
            return
        if body[0] == 1:
            self._accept_response(msg_id, payload, addr)
            return
        try:
            response = self._answer(opened, payload, addr)
        except Exception as exc:  # bad arguments from a member: no answer, the node goes on
            log.debug("overlay request from %s: %s", addr, repr(exc)[:200])  # may quote the request
            response = _NO_ANSWER
        if response is _NO_ANSWER:
            guard.refused[Refusal.MALFORMED] += 1
            self._refused(Refusal.MALFORMED, addr)
            return
        if self.raw is not None:
            reply = b"\x01" + msg_id + umsgpack.packb(response)
            self.raw.sendto(guard.reply(reply, opened, now), addr)

    def _answer(self, opened: Opened, payload: Any, addr: Any) -> Any:
        """The answer to an accepted request (``_NO_ANSWER``: none). A request's ``nodeid``
        argument must be its sender's id (the one the MAC covers)."""
        match payload:
            case [str(name), [bytes(nodeid), *args]] if nodeid == opened.sender:
                pass
            case _:
                return _NO_ANSWER
        if opened.first_contact:  # a ping to the zero destination (guard): answered only
            return self.source_node.id
        func = getattr(self, f"rpc_{name}", None) if name in _RPCS else None
        if func is None:
            return _NO_ANSWER
        return func(addr, nodeid, *args)

    def _refused(self, why: Refusal, addr: Any) -> None:
        """Log a dropped datagram at most once per reason per LIMIT_LOG_INTERVAL."""
        if self._logged.due(why, time.monotonic()):
            log.warning(
                "cluster overlay: datagram from %s dropped: %s (further %s drops not logged for %g s)",
                addr,
                why.value,
                why.value,
                LIMIT_LOG_INTERVAL,
            )

    def _call(self, node: Node, name: str, *args: Any) -> Any:
        """Send RPC ``name`` to ``node`` (its id in the datagram's destination): the future of
        rpcudp's ``(answered, result)``."""
        self.asking = node.id
        try:
            return getattr(self, name)((node.ip, node.port), self.source_node.id, *args)
        finally:
            self.asking = ZERO_ID

    async def call_ping(self, node_to_ask: Node) -> Any:
        result = await self._call(node_to_ask, "ping")
        return self.handle_call_response(result, node_to_ask)

    async def call_find_node(self, node_to_ask: Node, node_to_find: Node) -> Any:
        result = await self._call(node_to_ask, "find_node", node_to_find.id)
        return self.handle_call_response(result, node_to_ask)

    async def call_find_value(self, node_to_ask: Node, node_to_find: Node) -> Any:
        result = await self._call(node_to_ask, "find_value", node_to_find.id)
        return self.handle_call_response(result, node_to_ask)

    async def call_store(self, node_to_ask: Node, key: bytes, value: Any) -> Any:
        result = await self._call(node_to_ask, "store", key, value)
        return self.handle_call_response(result, node_to_ask)

    def _timeout(self, msg_id: bytes) -> None:
        # rpcudp sets the result of a future that may be cancelled already (a lookup
        # abandoned at stop): InvalidStateError in a loop callback. Skip those.
        self.guard.forget(msg_id, time.time())
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
        proto = type("_KeyedProtocol", (_Protocol,), {"key": datagram_key(secret)})
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

    def refused(self) -> dict[Refusal, int]:
        """Datagrams dropped since :meth:`start`, by reason (O(1))."""
        proto = self.server.protocol
        return dict.fromkeys(Refusal, 0) if proto is None else dict(proto.guard.refused)


def freshness_values(overlay: Overlay, checker: TokenChecker) -> dict[str, str]:
    """``$SYS/cluster/overlay/dropped/<reason>`` and ``$SYS/cluster/links/refused/<reason>``."""
    out = {f"$SYS/cluster/overlay/dropped/{why}": str(n) for why, n in overlay.refused().items()}
    for why, n in checker.refused.items():
        if why is not Refusal.UNSOLICITED:
            out[f"$SYS/cluster/links/refused/{why}"] = str(n)
    return out


def freshness_metrics(overlay: Overlay, checker: TokenChecker) -> dict[str, dict[str, int]]:
    """The same counters for ``/metrics`` (``Core.metric_sources``): ``siftmq_<name>_total``
    by ``reason``."""
    tokens = {str(why): n for why, n in checker.refused.items() if why is not Refusal.UNSOLICITED}
    return {
        "cluster_overlay_dropped": {str(why): n for why, n in overlay.refused().items()},
        "cluster_link_tokens_refused": tokens,
    }


async def _resolve(host: str, port: int) -> tuple[str, int]:
    """Kademlia wants IP addresses: resolve a host name once."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    return str(infos[0][4][0]), port
