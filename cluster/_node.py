"""A broker of the cluster: overlay membership, links to every peer, route table, injection.

:class:`ClusterNode` is a :class:`broker.hooks.Hooks` registered in the broker it extends
(``siftmq serve --cluster-listen HOST:PORT --join HOST:PORT`` builds one, or
``Broker(hooks=[ClusterNode(...)])``).  When the broker serves it

1. opens the cluster listener (MQTT over TCP, peer links only: a CONNECT that is not a link
   with a valid token of the secret is refused; slow-consumer policy ``pace``) and the
   Kademlia node on the same port number over UDP (:mod:`cluster._overlay`);
2. keeps one :class:`~cluster._link.PeerLink` to every member the overlay knows, and closes
   the link of a member that left the overlay;
3. turns its local clients' subscription changes into route changes
   (:class:`~cluster._routes.RouteTable`) sent on every link;
4. injects what a link receives into the local broker, for local sessions only
   (:meth:`broker.core._router.Router.route_peer`): a message crosses at most one link.

Consistency model (docs/cluster.md): a message published at node B reaches a subscriber at A
once A's subscription is held at B (the route change travelled the link); per publisher and
topic, order is kept (one link per pair, in-order MQTT); QoS 1/2 are acknowledged to the
publisher when B stored them for A's link session, and A acknowledges B once its own store
made them durable, so an acknowledged message is lost only if B's store and A both fail.
The control plane is closed (issue 37; docs/cluster.md, "Security"): the core verifies the
token of every client id ``$cluster/...`` through :meth:`ClusterNode._peer_auth` on any
listener and marks the connection a peer link; only such a link may PUBLISH or SUBSCRIBE on
``$cluster/...`` topics, so only the peers' nodes write control messages.  Each one is
checked against its kind's shape (:mod:`cluster._control`, with its ``src`` the node whose
link delivered it) before a handler reads it; a bad one, or one whose handler fails, is
counted (``siftmq_cluster_peer_unparseable``), logged rate-limited and dropped, and the
link goes on.  Retained messages are one register per topic, last writer wins by stamp, replicated to every
member by control messages (:mod:`cluster._retained`); forwarded copies are delivered, not
stored.  Under partitions (docs/cluster.md, "Partitions"): link sessions queue up to
``link_queue`` messages for the peer expiry, pace their publishers for the failure timeout at
most, shared groups skip unreachable peers, the peers' received QoS 2 ids are kept in the
store (:mod:`cluster._qos2`), and a graceful stop closes the links before the store.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.ext import ORIGIN_PROPERTY, PEER_PREFIX, Listener, Message, Route, boot_tag, split_origin
from broker.hooks import Hooks, SubscriptionAction, SubscriptionChange
from broker.packets import NO_PROPERTIES, Properties, Publish
from cluster._auth import TokenChecker
from cluster._bans import SharedBans
from cluster._control import BadControl, check
from cluster._link import PeerLink
from cluster._overlay import Overlay, freshness_metrics, freshness_values, load_node_id
from cluster._placement import CTL_PREFIX, Placement
from cluster._placement import encode as encode_control
from cluster._qos2 import ReceivedQos2
from cluster._retained import MAX_AHEAD_MS, Received, RetainedRegister
from cluster._routes import RouteChange, RouteTable
from cluster._takeover import Takeover

if TYPE_CHECKING:
    from broker.ext import Broker

__all__ = ["AclClusterNode", "ClusterNode"]

log = logging.getLogger("siftmq.cluster")

_NO_GROUPS: frozenset[tuple[str, str]] = frozenset()

#: control messages of session handovers (``cluster._takeover``)
_TAKEOVER = frozenset({"takeover", "none", "session", "fencereq", "fence", "tail", "more"})


class ClusterNode(Hooks):
    """This broker's membership of a cluster (see the module docstring)."""

    def __init__(  # noqa: PLR0917
        self,
        listen: tuple[str, int],
        join: list[tuple[str, int]],
        secret: bytes,
        data_dir: Path | None = None,
        node_id: bytes | None = None,
        peer_expiry: int = 60,
        refresh: float = 2.0,
        alpha: int = 3,
        rpc_timeout: float = 5.0,
        takeover_timeout: float = 2.0,
        link_queue: int = 1_000_000,
    ) -> None:
        if not secret:
            raise ValueError("a cluster needs a shared secret (--cluster-secret-file)")
        self.listen_at = listen
        self.join = join
        self.secret = secret
        self.node_id = node_id if node_id is not None else load_node_id(data_dir)
        self.name = self.node_id.hex()
        self.peer_expiry = peer_expiry
        self.refresh_every = refresh
        self.alpha = alpha
        self.takeover_timeout = takeover_timeout
        self.rpc_timeout = rpc_timeout
        self.link_queue = link_queue
        self.qos2 = ReceivedQos2()  # per peer, beyond a link's life, in the store (issue 30)
        self._peers_seen: set[str] = set()  # every peer that had a link (hex ids)
        # one converging register per retained topic (issue 30, finding 3)
        self.retained = RetainedRegister(self.name, data_dir, self._store_retained)
        #: the cluster's side of this node's bans (made when attached to its broker)
        self.bans: SharedBans | None = None
        self._injecting = False  # a peer's message is being published here
        self._origin_tag = ""  # this process's origin id prefix (broker.core._atom_ids)
        self.placement: Placement | None = None
        self.takeover: Takeover | None = None
        self.table = RouteTable()
        self.links: dict[bytes, PeerLink] = {}
        self.checker = TokenChecker(secret, self.name)  # refuses tokens for other nodes
        probe = max(0.05, refresh / 4)  # a lost node is pinged this often (cluster._overlay)
        self.overlay = Overlay(self.node_id, secret, rpc_timeout=rpc_timeout, probe_every=probe)
        self.broker: Broker | None = None
        self.port: int | None = None
        self.injected = 0
        self.refused_links = 0
        self._task: asyncio.Task[None] | None = None
        #: ids of the members that joined since the last _sync_now (non-empty: one is scheduled)
        self._rejoined: set[bytes] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._bare: dict[tuple[int, ...], Properties] = {}
        self._diverted: dict[str, Any] = {}

    # ------------------------------------------------------------ life cycle
    def attach(self, broker: Broker) -> None:
        self.broker = broker
        self._core = broker.core
        broker.core.node = self.name
        # a link session queues up to link_queue QoS 1/2 messages (its real bound is the peer
        # expiry), and a congested link paces its publishers for the failure timeout at most
        # (docs/cluster.md, "Partitions")
        broker.core.peer_queue_limit = max(self.link_queue, broker.core.config.max_queued_messages)
        broker.core.peer_pace_limit = self.rpc_timeout
        broker.core.retain_hook = self._retain_hook
        # bans added or lifted here reach every node (cluster._bans)
        self.bans = SharedBans(
            broker, self._send_control, lambda: [link.peer for link in self.links.values()]
        )
        broker.core.peer_auth = self._peer_auth  # client ids $cluster/... (issue 37)
        # atoms identified across nodes (broker.core._atom_ids, docs/composite.md)
        self._origin_tag = broker.core.composite.origin_tag = boot_tag(self.name)
        broker.core.stamp_hook = self._stamp
        broker.core.sys_sources.append(self.sys_values)
        broker.core.sys_sources.append(functools.partial(freshness_values, self.overlay, self.checker))
        broker.core.metric_sources.append(functools.partial(freshness_metrics, self.overlay, self.checker))
        self.placement = Placement(
            self.name, self.overlay, broker, self._send_control, self.alpha, forget=float(self.peer_expiry)
        )
        self.takeover = Takeover(
            self.name,
            broker.core,
            self._send_control,
            lambda delay, callback: asyncio.get_running_loop().call_later(delay, callback),
            self._when_held,
            self.takeover_timeout,
            linger=float(self.peer_expiry),
            peers=lambda: [link.peer for link in self.links.values() if link.connected],
        )
        self._diverted = self.takeover.diversions.by_peer
        broker.core.composite.delegate = self.placement
        broker.core.sys_sources.append(self.placement.sys_values)
        broker.dashboard_providers["cluster"] = self.dashboard_data

    async def ready(self) -> None:
        broker = self.broker
        assert broker is not None
        host, port = self.listen_at
        self.port = await broker.listen(
            Listener("tcp", host, port, allow_anonymous=False, slow_consumer_policy="pace", peers_only=True)
        )
        # the peers' received QoS 2 ids go in the broker's store, with the injected messages
        self.qos2.attach(broker.core.journal.store, broker.restored_qos2_in)
        await self.overlay.start(host, self.port, self.join)
        for client_id, full_filter in self._local_subscriptions():
            self.table.add(client_id, full_filter)
        composites = broker.core.composite
        for atom_id, topic_filter in composites.atom_filters.items():
            self.table.add(atom_id, topic_filter)
        composites.atom_listeners.append(self._atom_changed)
        self._sync_links()
        self._delegate_restored()
        self._task = asyncio.create_task(self._maintain(), name="cluster membership")
        self.overlay.on_member = self._member_joined
        log.info(
            "cluster node %s on %s:%d (udp+tcp), %d peer(s) known",
            self.name[:8],
            host,
            self.port,
            len(self.links),
        )

    def _delegate_restored(self) -> None:
        """The composite subscriptions of persisted sessions that the store's composite
        snapshot brought back (``Composites.load``: delegated, not yet sent anywhere) go to
        their CSSUs again; the refresh loop re-sends them to the CSSU as membership is learnt,
        and the core, whose CSGT row still lists this node, keeps sending their events here
        (those sent while this node was down waited in the core's store for this node's link
        session, up to ``--cluster-peer-expiry``)."""
        assert self.broker is not None and self.placement is not None
        restored = sorted(self.broker.core.composite.delegated.items())
        for (client_id, name), (expression, qos) in restored:
            self.placement.subscribe(client_id, name, expression, qos)
        if restored:
            log.info("cluster: %d restored composite subscription(s) delegated again", len(restored))

    async def stopping(self) -> None:
        """The links close first: a link that went on receiving while the broker's store
        closes would acknowledge messages (PUBACK) that are then lost with the process (found
        by the nemesis's ``leave``, issue 30); closed now, the peers keep them queued for this
        node's link sessions and resend them when it is back."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
        await asyncio.gather(*(link.close() for link in self.links.values()))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self.placement is not None:
            await self.placement.close()
        await asyncio.gather(*(link.close() for link in self.links.values()))
        self.links.clear()
        self.overlay.stop()
        self.retained.close()

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_every)
            try:
                await self.overlay.refresh()
            except Exception:
                log.exception("cluster overlay refresh failed")
            self._sync_links()
            if self.placement is not None:
                self.placement.tick()
                for expression in self.placement.local:  # idempotent: repairs a lost one
                    self.placement.subscribe_again(expression)

    def _member_joined(self, node_id: bytes) -> None:
        """A node entered the overlay's routing table (new, or back after a partition or a
        restart): its link is made on the next turn of the loop, not at the next refresh,
        which may wait a failure timeout for pings to silent nodes (retained values and link
        backlogs after a heal, issue 30)."""
        if self._task is None:
            return
        if not self._rejoined:
            asyncio.get_running_loop().call_soon(self._sync_now)
        self._rejoined.add(node_id)

    def _sync_now(self) -> None:
        rejoined, self._rejoined = self._rejoined, set()
        if self._task is None:
            return
        self._sync_links()
        for node_id in rejoined:  # a link waiting to reconnect tries now
            link = self.links.get(node_id)
            if link is not None:
                link.wake()

    def _sync_links(self) -> None:
        """One link per member the overlay knows; the link of a member that left closes."""
        members = self.overlay.members()
        for node_id, (host, port) in members.items():
            link = self.links.get(node_id)
            if link is not None and link.address != (host, port):
                self._close_later(link)  # the member came back elsewhere
                link = None
            if link is None:
                link = PeerLink(
                    self.name,
                    node_id.hex(),
                    (host, port),
                    self.secret,
                    self.table,
                    self._inject,
                    self.peer_expiry,
                    self._flush,
                    self._control,
                    self._inject_plain,
                    self._link_up,
                    self.qos2,
                    self._link_problem,
                )
                self.links[node_id] = link
                link.start()
        for node_id in [n for n in self.links if n not in members]:
            log.info("cluster member %s left", node_id.hex()[:8])
            self._close_later(self.links.pop(node_id))
            if self.takeover is not None:  # it counts as fenced in the handovers under way
                self.takeover.peer_gone(node_id.hex())
        self._mark_unavailable()

    def _mark_unavailable(self) -> None:
        """The router's shared-group round robin skips the link sessions of peers this node
        cannot reach (left the membership, or link down) while a reachable member is left
        (issue 30, finding 4)."""
        if self.broker is None:
            return
        self._peers_seen.update(link.peer for link in self.links.values())
        up = {link.peer for link in self.links.values() if link.connected}
        self.broker.core.router.unavailable = {PEER_PREFIX + p for p in self._peers_seen - up}

    def _peer_names(self) -> list[str]:
        """The members this node has a link to (hex ids). O(members)."""
        return [link.peer for link in self.links.values()]

    def _link_up(self, peer: str) -> None:
        self._mark_unavailable()
        # the peer's whole retained register: repairs what an expired session, a restart or
        # a join missed (the values merge by stamp, cluster._retained)
        self._send_control(peer, {"t": "ret?", "src": self.name})
        self._send_control(peer, {"t": "ban?", "src": self.name})  # and its bans (cluster._bans)
        if self.takeover is not None:
            self.takeover.link_up(peer)

    def _close_later(self, link: PeerLink) -> None:
        task = asyncio.create_task(link.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _local_subscriptions(self) -> list[tuple[str, str]]:
        """(client id, full filter) of every subscription of a local session (at start:
        sessions restored from the store do not announce themselves)."""
        assert self.broker is not None
        core = self.broker.core
        out: list[tuple[str, str]] = []
        for client_id in list(core.sessions):
            if client_id.startswith(PEER_PREFIX):
                continue
            # "$share/g/f" entries keep their full filter
            out.extend(
                (client_id, e.topic_filter) for e in core.router.index.entries(client_id) if e.positive
            )
        return out

    # ------------------------------------------------------------ hooks
    def hold_connack(self, client_id: str, clean_start: bool, release: Callable[[bool], None]) -> bool:
        """Every other node gives up the client's session; unless the client asked for a
        clean start, the CONNACK waits (``takeover_timeout`` at most) for the session to come
        (``cluster._takeover``)."""
        if self.takeover is None:
            return False
        peers = [link.peer for link in self.links.values() if link.connected]
        return self.takeover.connecting(client_id, clean_start, release, peers)

    def _when_held(self, peer: str, callback: Callable[[], None]) -> bool:
        link = self.links.get(bytes.fromhex(peer))
        return link is not None and link.when_held(callback)

    def on_subscription_change(self, change: SubscriptionChange) -> None:
        cid = change.client_id
        if cid.startswith(PEER_PREFIX):
            return
        match change.action:
            case SubscriptionAction.SUBSCRIBE if change.topic_filter is not None:
                rc = self.table.add(cid, change.topic_filter)
            case SubscriptionAction.UNSUBSCRIBE if change.topic_filter is not None:
                rc = self.table.remove(cid, change.topic_filter)
            case SubscriptionAction.SESSION_END | SubscriptionAction.TAKEOVER:
                rc = self.table.drop_client(cid)
            case _:
                return
        if rc:
            self._apply(rc)

    def _atom_changed(self, atom_id: str, topic_filter: str, added: bool) -> None:
        """A composite subscription's atom came or went: its events must reach this node
        from every node (the composite is matched and merged here, at its subscriber's node)."""
        rc = self.table.add(atom_id, topic_filter) if added else self.table.remove(atom_id, topic_filter)
        if rc:
            self._apply(rc)

    def _apply(self, change: RouteChange) -> None:
        for link in self.links.values():
            link.apply(change)

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> bool | None:
        """A link ``$cluster/<id>`` reaches the hooks only once the core verified its token
        (:meth:`_peer_auth`, asked first, refuses the others): accepted ahead of a password
        file.  Other clients are the other hooks' (or the listener's: the cluster listener
        refuses them)."""
        return True if client_id.startswith(PEER_PREFIX) else None

    def _peer_auth(self, client_id: str, password: bytes | None) -> str | None:
        """``Core.peer_auth``: None when ``password`` is a valid token of the secret for the
        link ``client_id``, else why not (counted, and logged rate-limited per reason). O(1)."""
        why = self.checker.check(client_id, password)
        if why is not None:
            self.refused_links += 1
            self._core.log_limit(f"cluster_token_{self.checker.last_refusal}", client_id[:30], why)
        return why

    # ------------------------------------------------------------ injection
    def _inject(
        self, peer: str, p: Publish, plain: bool, groups: frozenset[tuple[str, str]], replay: bool
    ) -> concurrent.futures.Future[None] | None:
        """Route a message the link to ``peer`` received to this broker's local sessions
        (without the deliveries a session handover leaves to the other node)."""
        core = self._core
        now = core.clock.monotonic()
        props = p.properties
        ids = props.subscription_identifiers
        if ids:  # ours, not the message's: drop them (cheaply when they are all there is)
            bare = self._bare.get(ids)
            if bare is None:
                bare = self._bare[ids] = Properties(subscription_identifiers=ids)
            props = (
                NO_PROPERTIES if props == bare else dataclasses.replace(props, subscription_identifiers=())
            )
        if props.topic_alias is not None:
            props = dataclasses.replace(props, topic_alias=None)
        if replay:  # retained messages come from the register (cluster._retained), not here
            return None
        origin = None
        if props.user_properties:  # the origin id: for composite atoms, not for subscribers
            origin, users = split_origin(props)
            if origin is not None:
                props = dataclasses.replace(props, user_properties=users)
        msg = Message.create(p.topic, p.payload, p.qos, p.retain, props, None, now)
        journal = core.journal
        before = journal.submitted
        store = journal.store
        routes = core.router.route_peer(msg, plain, groups, replay)
        if self._diverted and self.takeover is not None:  # a session is moving
            routes = self.takeover.diversions.routes_from(peer, msg, routes)
        # a QoS 2 copy reaches the local subscribers only once the peer's packet id is durable
        # with it: a crash before that commit, then the peer's resend, would deliver it twice
        defer = p.qos == 2 and core.defer_qos2(True)
        self._injecting = True
        core.composite.origin = origin
        try:
            core.publish(msg, now, routes)
        finally:
            self._injecting = False
            core.composite.origin = None
            deferred = core.take_deferred() if defer else None
        self.injected += 1
        if p.qos == 2 and p.packet_id is not None:
            # the received id joins the store transaction of the copies just journalled: a
            # restart finds both or neither (cluster._qos2)
            self.qos2.received(peer, p.packet_id)
        if deferred:  # after the id: they leave with the commit that holds it
            journal.hold_writes(deferred)
        if p.qos == 2 and store is not None:
            return store.sync()
        if store is not None and journal.submitted != before:
            return store.sync()
        return None

    def _stamp(self, msg: Message, routes: list[Route]) -> Message:
        """``Core.stamp_hook``: a local client's QoS 1/2 publication that crosses a link gets
        its origin id (``<tag>.<message number>``) as a user property of the link copies."""
        if (
            self._injecting
            or msg.topic.startswith("$")
            or not any(r.client_id.startswith(PEER_PREFIX) for r in routes)
        ):
            return msg
        props = msg.properties
        props = dataclasses.replace(
            props,
            user_properties=(
                *props.user_properties,
                (ORIGIN_PROPERTY, f"{self._origin_tag}.{msg.message_id}"),
            ),
        )
        return Message(
            msg.topic,
            msg.payload,
            msg.qos,
            msg.retain,
            props,
            msg.publisher_id,
            msg.message_id,
            msg.received,
            msg.expires_at,
        )

    def _inject_plain(self, peer: str, run: list[Publish]) -> None:
        """:meth:`_inject` for a run of plain QoS 0 copies of one read (no subscription
        identifier, no acknowledgement, no durable signal): one clock read and one frame for
        the run (the receiving side of a link is interpreted; this is its bulk).  QoS 0 is
        never diverted by a session handover (``cluster._moving.Diversions``)."""
        core = self._core
        now = core.clock.monotonic()
        route_peer = core.router.route_peer
        publish = core.publish
        create = Message.create
        self._injecting = True
        try:
            for p in run:
                props = p.properties
                if props.topic_alias is not None:
                    props = dataclasses.replace(props, topic_alias=None)
                msg = create(p.topic, p.payload, 0, p.retain, props, None, now)
                publish(msg, now, route_peer(msg, True, _NO_GROUPS, False))
        finally:
            self._injecting = False
        self.injected += len(run)

    # ------------------------------------------------------------ retained register
    def _retain_hook(self, msg: Message) -> bool:
        """Core.retain_hook: a peer's forwarded copy is not stored (the register decides);
        a local retained publication is stamped and sent to every member."""
        if self._injecting:
            return False
        topic = msg.topic
        if topic.startswith("$"):
            return True
        ctl = self.retained.local(topic, msg.payload, msg.qos, msg.properties.message_expiry_interval)
        loop = asyncio.get_running_loop()
        for link in self.links.values():  # after this publication (no re-entrant publish)
            loop.call_soon(self._send_control, link.peer, ctl)
        return True

    def _store_retained(self, topic: str, payload: bytes, qos: int, expiry: int | None) -> None:
        """The register's value for ``topic`` becomes this node's retained message (stored,
        journalled, not delivered: retained messages go out on SUBSCRIBE)."""
        core = self._core
        now = core.clock.monotonic()
        props = NO_PROPERTIES if expiry is None else Properties(message_expiry_interval=expiry)
        msg = Message.create(topic, payload, qos, True, props, None, now)
        core.journal.retain(msg, now)

    def _held_retained(self, topic: str) -> tuple[bytes, int, int | None] | None:
        msg = self._core.router.retained.get(topic)
        if msg is None:
            return None
        expiry = None
        if msg.expires_at is not None:
            expiry = max(1, int(msg.expires_at - self._core.clock.monotonic()))
        return msg.payload, msg.qos, expiry

    # ------------------------------------------------------------ control messages
    def _send_control(self, dest: str, msg: dict[str, Any]) -> None:
        """A control message to node ``dest`` (QoS 1 on ``$cluster/ctl/<dest>``, which that
        node's link holds here); to this node itself on the next loop turn."""
        if dest == self.name:
            asyncio.get_running_loop().call_soon(self._control, self.name, encode_control(msg))
            return
        core = self._core
        now = core.clock.monotonic()
        msg_ = Message.create(CTL_PREFIX + dest, encode_control(msg), 1, False, NO_PROPERTIES, None, now)
        core.publish(msg_, now, None, True)  # internal: not the clients' messages_received
        core.flush()

    def _control(self, sender: str, payload: bytes) -> None:
        """A control message the link to ``sender`` delivered (or this node sent itself):
        checked (:func:`cluster._control.check`), then handled; a bad one, or one whose
        handler fails, is counted, logged (rate-limited) and dropped: the link goes on."""
        if self.placement is None:
            return
        try:
            msg = check(payload, sender)
            self._handle(msg)
        except BadControl as exc:
            self._link_problem("unparseable", f"control message from {sender[:8]} dropped: {exc}")
        except Exception as exc:  # a handler met a value of the wrong shape deeper down
            log.debug("cluster: control message from %s failed", sender[:8], exc_info=exc)
            self._link_problem(
                "unparseable",
                f"control message from {sender[:8]} dropped ({type(exc).__name__}: {str(exc)[:120]})",
            )

    def _handle(self, msg: dict[str, Any]) -> None:
        assert self.placement is not None
        kind = msg["t"]
        if kind in _TAKEOVER:
            if self.takeover is not None:
                self.takeover.receive(msg)
        elif kind == "ret":
            if self.retained.receive(msg) is Received.AHEAD:
                self._core.stats.cluster_peer_values_refused += 1
                self._core.log_limit(
                    "cluster_stamp",
                    "$cluster",
                    f"cluster: retained value for {msg['topic'][:60]!r} refused: its stamp is more "
                    f"than {MAX_AHEAD_MS / 1000:g} s ahead of this node's clock",
                )
        elif kind == "ret?":  # to the asking node only (check: src is the sender)
            for ctl in self.retained.dump(self._held_retained):
                self._send_control(msg["src"], ctl)
        elif kind == "ban":
            if self.bans is not None:
                self.bans.receive(msg)
        elif kind == "ban?":  # to the asking node only
            if self.bans is not None:
                for ctl in self.bans.dump():
                    self._send_control(msg["src"], ctl)
        else:
            self.placement.receive(msg)

    def _link_problem(self, kind: str, detail: str) -> None:
        """A link's bad input (``unparseable``) or unexpected restart (``restart``): counted
        in the core's stats ($SYS, /metrics) and logged at most once per interval per kind."""
        core = self._core
        if kind == "restart":
            core.stats.cluster_link_restarts += 1
        else:
            core.stats.cluster_peer_unparseable += 1
        core.log_limit(f"cluster_{kind}", "$cluster", detail)

    def _flush(self) -> None:
        self._core.flush()

    # ------------------------------------------------------------ observability
    def dashboard_data(self) -> dict[str, Any]:
        """The dashboard's cluster section (``Broker.dashboard_providers``): this node, its
        links to the other members, and the routes it holds at its peers (first 500)."""
        wanted = self.table.wanted()
        return {
            "node_id": self.name,
            "link_port": self.port,
            "members": len(self.links) + 1,
            "links": [
                {
                    "peer": link.peer,
                    "address": f"{link.address[0]}:{link.address[1]}",
                    "state": "up" if link.connected else "down",
                    "connects": link.connects,
                    "received": link.received,
                }
                for link in self.links.values()
            ],
            "route_count": len(wanted),
            "routes": [f for f, _ in wanted[:500]],
            "forwarded_received": self.injected,
            "refused_links": self.refused_links,
        }

    def sys_values(self) -> dict[str, str]:
        up = [link for link in self.links.values() if link.connected]
        out = {
            "$SYS/cluster/node_id": self.name,
            "$SYS/cluster/members": str(len(self.links) + 1),
            "$SYS/cluster/links/up": str(len(up)),
            "$SYS/cluster/routes": str(len(self.table)),
            "$SYS/cluster/forwarded/received": str(self.injected),
            "$SYS/cluster/links/refused": str(self.refused_links),
            "$SYS/cluster/links/unreachable": str(len(self._core.router.unavailable)),
            "$SYS/cluster/retained/topics": str(len(self.retained.stamps)),
            "$SYS/cluster/retained/applied": str(self.retained.applied),
            "$SYS/cluster/retained/stale": str(self.retained.stale),
            "$SYS/cluster/retained/refused_ahead": str(self._core.stats.cluster_peer_values_refused),
            "$SYS/cluster/control/unparseable": str(self._core.stats.cluster_peer_unparseable),
            "$SYS/cluster/links/restarts": str(self._core.stats.cluster_link_restarts),
        }
        if self.takeover is not None:
            out.update(self.takeover.sys_values())
        for link in self.links.values():
            base = f"$SYS/cluster/links/{link.peer[:16]}"
            out[f"{base}/state"] = "up" if link.connected else "down"
            out[f"{base}/received"] = str(link.received)
        return out


class AclClusterNode(ClusterNode):
    """A :class:`ClusterNode` for a broker with an ACL (``--acl-file``): it lets the links
    subscribe to anything, ahead of the ACL, and refuses their PUBLISHes (a link only
    receives).  A separate class because a hook overriding ``authorize`` is asked about every
    delivery, a cost the cluster does not add to brokers without an ACL."""

    def authorize(self, client_id: str, username: str | None, action: str, topic: str) -> bool | None:
        if not client_id.startswith(PEER_PREFIX):
            return None
        return action != "publish"
