"""One broker-to-broker link: this broker as an MQTT 5 client of a peer (docs/cluster.md).

A link is how this broker receives what is published at the peer for its own clients: it
connects to the peer's cluster listener as ``$cluster/<our node id>`` with a persistent
session (``clean_start`` false, ``session_expiry`` = the cluster's peer expiry), authenticates
with a token of the shared secret (:mod:`cluster._auth`), and holds at the peer the
subscriptions of the :class:`~cluster._routes.RouteTable` (QoS 2, retain as published, retained
messages sent only for new subscriptions).  Everything the peer's broker already does for a
client then holds for the link: in-flight windows (our ``receive_maximum``), queues, pacing of
the peer's publishers when we are slow (the cluster listener's slow-consumer policy is
``pace``), and the peer's store keeps our QoS 1/2 messages while the link is down.

The codec is the broker's own sans-IO one (:mod:`broker.packets`); this module adds the
client-side state: CONNECT/CONNACK, SUBSCRIBE/UNSUBSCRIBE of route changes, the receive side
of QoS 1 and 2 with acknowledgements sent in order once the local store made the injected
message durable (``deliver`` returns the store's future), keep-alive, and reconnection with
backoff.  The link never publishes.

Bad input never ends a link silently (issue 37): a packet the link cannot use (a control
message of the wrong shape, an injection that raises) is reported to ``problem``
(``"unparseable"``: counted and logged rate-limited by the node) and the link goes on with
the next packet; bytes that do not decode as MQTT end the connection (its stream is lost)
and are reported the same way before the reconnection.  Any other exception ending a
connection is logged (one line at ERROR, the traceback at DEBUG), reported as a
``"restart"``, and the link reconnects with back-off; should the task itself end while the
link is open, it is started again (after 1 s, doubling to 30 s while no session comes up).

The receive side is an :class:`asyncio.Protocol`: each read is decoded, injected into the
local broker and flushed to the local subscribers inside ``data_received``, with the garbage
collector held off while the read's packets are alive, and acknowledgements are written at
once unless one waits for the store before them (latency at moderate load, docs/cluster.md
"Where the time went").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import logging
from collections.abc import Callable
from typing import Final

from broker.ext import address, fields
from broker.packets import (
    NO_PROPERTIES,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    MalformedPacket,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    encode,
)
from cluster._auth import make_token
from cluster._qos2 import ReceivedQos2
from cluster._routes import CTL_ID, FETCH_ID, PLAIN_ID, RouteChange, RouteTable

__all__ = ["Deliver", "DeliverPlain", "PeerLink", "Problem"]

log = logging.getLogger("siftmq.cluster")

#: ``deliver(peer, publish, for_plain, groups, replay)``: inject a message forwarded by
#: ``peer`` into the local broker (``replay``: a peer's retained message sent for a new link
#: subscription); returns the store's durable signal to wait for before acknowledging, or None
Deliver = Callable[
    [str, Publish, bool, frozenset[tuple[str, str]], bool], "concurrent.futures.Future[None] | None"
]
#: ``deliver_plain(peer, publishes)``: inject a run of plain QoS 0 copies (no subscription
#: identifier, nothing to acknowledge) forwarded by ``peer``, in order
DeliverPlain = Callable[[str, list[Publish]], None]
#: ``problem(kind, detail)``: bad input from the peer (``"unparseable"``) or an unexpected
#: error that restarted the link (``"restart"``): counted and logged by the node
Problem = Callable[[str, str], None]

_NO_GROUPS: frozenset[tuple[str, str]] = frozenset()
KEEP_ALIVE: Final = 10
RECEIVE_MAXIMUM: Final = 256


class PeerLink:
    """The link from this broker to one peer (``run`` until ``close``)."""

    def __init__(  # noqa: PLR0917
        self,
        me: str,
        peer: str,
        address: tuple[str, int],
        secret: bytes,
        table: RouteTable,
        deliver: Deliver,
        session_expiry: int,
        flush: Callable[[], None] = lambda: None,
        control: Callable[[str, bytes], None] = lambda _p, _b: None,
        deliver_plain: DeliverPlain | None = None,
        on_up: Callable[[str], None] = lambda _peer: None,
        qos2: ReceivedQos2 | None = None,
        problem: Problem | None = None,
    ) -> None:
        self.client_id = f"$cluster/{me}"
        self.peer = peer
        self.address = address
        self.secret = secret
        self.table = table
        self.deliver = deliver
        self.deliver_plain = deliver_plain or self._plain_one_by_one
        self.flush = flush  # after the packets of one read were delivered
        self.control = control  # control(peer, payload): a message for this node ($cluster/ctl/<me>)
        self.problem = problem or _log_problem
        self.restarts = 0  # times an unexpected error ended a connection or the task
        self.bad = 0  # packets from the peer that could not be used (dropped)
        self._restart_delay = 1.0  # before the task is started again (``_ended``)
        self._restart_connects = -1  # ``connects`` at the last restart (none since: back off)
        self.on_up = on_up  # the link is up (its route subscriptions sent): on_up(peer)
        self.session_expiry = session_expiry
        self.connected = False
        self.received = 0  # PUBLISHes received over this link
        self.connects = 0
        self.last_error: str | None = None
        self._held: dict[str, int] = {}  # what the peer holds for us: filter -> subscription id
        self._writer: asyncio.WriteTransport | None = None
        self._loop = loop = asyncio.get_running_loop()
        self._lost: asyncio.Future[None] = loop.create_future()
        self._connack: asyncio.Future[tuple[Connack, list[Packet]]] = loop.create_future()
        self._dec = Decoder(5, server=False)
        self._established = False
        self._early: list[Packet] = []
        self._last_rx = 0.0
        self._pid = 0
        # the peer's QoS 2 ids received and not released: kept by the node beyond this
        # object's life and, in the store, across restarts (cluster._qos2; issue 30, finding 6)
        self.qos2 = qos2 if qos2 is not None else ReceivedQos2()
        self._qos2 = self.qos2.of(peer)
        self._acks: asyncio.Queue[tuple[concurrent.futures.Future[None] | None, bytes]] = asyncio.Queue()
        self._acks_queued = 0  # acknowledgements in _acks (a later one must wait behind them)
        self._closing = False
        self._wake = asyncio.Event()  # cuts the wait before a reconnection short (wake)
        self._task: asyncio.Task[None] | None = None
        self.up = asyncio.Event()
        self._unacked: set[int] = set()  # SUBSCRIBE / UNSUBSCRIBE packet ids not acknowledged
        self._barriers: list[tuple[set[int], Callable[[], None]]] = []

    def start(self) -> None:
        self._task = task = asyncio.create_task(self.run(), name=f"cluster link to {self.peer[:8]}")
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The task ended: expected when closing; otherwise (``run`` catches every
        ``Exception``, so something got past it) logged and started again after a pause."""
        if self._closing or task is not self._task or self._loop.is_closed():
            return
        exc = None if task.cancelled() else task.exception()
        self.restarts += 1
        log.error("cluster link to %s: its task ended (%r); restarting", self.peer[:8], exc)
        if exc is not None:
            log.debug("cluster link to %s: the task's end", self.peer[:8], exc_info=exc)
        self.problem("restart", f"link task to {self.peer[:8]} ended: {exc!r}")
        self.connected = False
        self.up.clear()
        # back-off: 1 s, doubling to 30 s while the task keeps ending without a session
        delay = self._restart_delay if self.connects == self._restart_connects else 1.0
        self._restart_delay, self._restart_connects = min(2 * delay, 30.0), self.connects
        self._loop.call_later(delay, self._restart)

    def _restart(self) -> None:
        if not self._closing:
            self.start()

    async def close(self) -> None:
        self._closing = True
        w = self._writer
        if w is not None and not w.is_closing():
            with contextlib.suppress(Exception):
                w.write(encode(Disconnect(ReasonCode.SUCCESS), 5))
            w.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task

    # ------------------------------------------------------------ route changes
    def apply(self, change: RouteChange) -> None:
        """Send a route change now if connected (else it is applied on the next connect)."""
        if not self.connected or self._writer is None:
            return
        self._send_changes(
            [(f, i) for f, i in change.subscribe if self._held.get(f) != i],
            [f for f in change.unsubscribe if f in self._held],
        )

    def when_held(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` once the peer acknowledged every SUBSCRIBE and UNSUBSCRIBE sent
        so far (it holds the route table as it is now: a session handover's barrier); False,
        and never called, when the link is down (or goes down before)."""
        if not self.connected or self._writer is None:
            return False
        if self._unacked:
            self._barriers.append((set(self._unacked), callback))
        else:
            asyncio.get_running_loop().call_soon(callback)
        return True

    def _acked(self, pid: int) -> None:
        self._unacked.discard(pid)
        if not self._barriers:
            return
        due = []
        for waiting, callback in self._barriers:
            waiting.discard(pid)
            if not waiting:
                due.append(callback)
        if due:
            self._barriers = [b for b in self._barriers if b[0]]
            for callback in due:
                callback()

    def _send_changes(self, sub: list[tuple[str, int]], unsub: list[str]) -> None:
        w = self._writer
        assert w is not None
        by_id: dict[int, list[str]] = {}
        fetch: list[str] = []
        for f, i in sub:
            if i == PLAIN_ID and f not in self._held:
                fetch.append(f)
            by_id.setdefault(i, []).append(f)
            self._held[f] = i
        if fetch:  # first with FETCH_ID (retained messages come with it), replaced at once
            self._subscribe(w, fetch, FETCH_ID, 0)
        for i, fs in by_id.items():
            self._subscribe(w, fs, i, 1)
        if unsub:
            for f in unsub:
                self._held.pop(f, None)
            pid = self._next_pid()
            self._unacked.add(pid)
            w.write(encode(Unsubscribe(pid, tuple(unsub)), 5))

    def _subscribe(self, w: asyncio.WriteTransport, filters: list[str], sub_id: int, rh: int) -> None:
        reqs = tuple(SubscriptionRequest(f, 2, False, True, rh) for f in filters)
        props = NO_PROPERTIES if sub_id == PLAIN_ID else Properties(subscription_identifiers=(sub_id,))
        pid = self._next_pid()
        self._unacked.add(pid)
        w.write(encode(Subscribe(pid, reqs, props), 5))

    def _next_pid(self) -> int:
        self._pid = self._pid % 65535 + 1
        return self._pid

    # ------------------------------------------------------------ connection
    def wake(self) -> None:
        """The peer answers again (it re-entered the overlay): retry now if waiting."""
        self._wake.set()

    async def run(self) -> None:
        delay = 0.05
        while not self._closing:
            connects = self.connects
            try:
                await self._session()
                delay = 0.05
            except (OSError, asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
            except _Refused as exc:
                self.last_error = str(exc)
                log.warning(
                    "cluster link to %s refused: %s",
                    self.peer[:8],
                    exc,
                    extra=fields("cluster.link_refused", address=self._where(), reason=str(exc)),
                )
            except MalformedPacket as exc:  # the stream is lost: a new connection
                self.last_error = f"malformed packet: {exc}"
                self.bad += 1
                self.problem("unparseable", f"from {self.peer[:8]}: malformed packet ({exc})")
            except Exception as exc:  # a bug: never a silent end of the link (issue 37)
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.restarts += 1
                log.error("cluster link to %s failed (%s); reconnecting", self.peer[:8], self.last_error)
                log.debug("cluster link to %s: the failure", self.peer[:8], exc_info=exc)
                self.problem("restart", f"link to {self.peer[:8]}: {self.last_error[:200]}")
            finally:
                if self.connected and not self._closing:
                    log.info(
                        "cluster link to %s down: %s",
                        self.peer[:8],
                        self.last_error or "closed",
                        extra=fields("cluster.link_down", address=self._where(), reason=self.last_error),
                    )
                self.connected = False
                self.up.clear()
            if self._closing:
                return
            if self.connects != connects:  # a session was established: a new outage
                delay = 0.05
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            delay = min(delay * 2, 2.0)

    def _where(self) -> str:
        """The peer node's id and address, for the log's ``address`` field."""
        return f"{self.peer[:8]}@{address(tuple(self.address))}"

    async def _session(self) -> None:
        """One connection: the MQTT session over a protocol whose ``data_received`` decodes,
        injects and flushes in the same callback (no stream reader, no task per read: that
        cost a wake-up of the reading task, and with ``wait_for`` a new task, per read; see
        docs/cluster.md, "Where the time went")."""
        self._loop = loop = asyncio.get_running_loop()
        self._lost = loop.create_future()
        self._connack = loop.create_future()
        self._dec = Decoder(5, server=False)
        self._established = False
        self._early = []
        transport, _ = await asyncio.wait_for(
            loop.create_connection(lambda: _LinkProtocol(self), *self.address), 5
        )
        self._writer = transport
        self._last_rx = loop.time()
        acks = asyncio.create_task(self._ack_writer(transport))
        try:
            await self._connected(transport)
        finally:
            for fut in (self._connack, self._lost):  # retrieved: no "never retrieved" warning
                if fut.done() and not fut.cancelled():
                    fut.exception()
            acks.cancel()
            self._acks = asyncio.Queue()
            self._acks_queued = 0
            self._unacked.clear()
            self._barriers.clear()
            self._established = False
            transport.close()
            self._writer = None

    async def _connected(self, transport: asyncio.WriteTransport) -> None:
        props = Properties(session_expiry_interval=self.session_expiry, receive_maximum=RECEIVE_MAXIMUM)
        connect = Connect(
            self.client_id,
            5,
            False,
            KEEP_ALIVE,
            None,
            "siftmq-cluster",
            make_token(self.secret, self.client_id, self.peer),  # bound to this peer (cluster._auth)
            props,
        )
        transport.write(encode(connect, 5))
        ack, early = await asyncio.wait_for(self._connack, 5)  # fails if the connection ends
        if ack.reason_code != ReasonCode.SUCCESS:
            raise _Refused(f"CONNACK {ack.reason_code.name}")
        if not ack.session_present:
            self._held.clear()
            self.qos2.clear(self.peer)
        self.connects += 1
        self.connected = True
        self.last_error = None
        wanted = dict(self.table.wanted())
        self._send_changes(
            [(f, i) for f, i in wanted.items() if self._held.get(f) != i],
            [f for f in self._held if f not in wanted],
        )
        self._subscribe(transport, [f"$cluster/ctl/{self.client_id[9:]}"], CTL_ID, 0)
        self.up.set()
        log.info(
            "cluster link to %s up (%s:%d)",
            self.peer[:8],
            *self.address,
            extra=fields("cluster.link_up", address=self._where()),
        )
        self.on_up(self.peer)
        ping = asyncio.create_task(self._pinger(transport))
        try:
            self._established = True
            early.extend(self._early)  # what the peer sent right behind its CONNACK (a resumed queue)
            self._early = []
            if early:
                self._packets(early, transport)
                self.flush()
            await self._lost
        finally:
            ping.cancel()

    def _data(self, data: bytes) -> None:
        """Bytes from the peer (``_LinkProtocol.data_received``): decoded and, once the
        session is up, delivered and flushed at once."""
        self._last_rx = self._loop.time()
        transport = self._writer
        if transport is None or self._lost.done():
            return
        # no garbage collection while a read's packets are alive: a busy link's read holds
        # thousands of them at once, which would start collections that promote them all to
        # older generations, and the full collections those cause stall for milliseconds
        # (docs/cluster.md, "Where the time went"); they are freed when the read is done
        collecting = gc.isenabled()
        if collecting:
            gc.disable()
        try:
            pkts = self._dec.feed(data)
            if not self._established:
                if not self._connack.done():
                    if not pkts:
                        return
                    first = pkts[0]
                    if not isinstance(first, Connack):
                        raise _Refused(f"{type(first).__name__} before CONNACK")
                    self._connack.set_result((first, list(pkts[1:])))
                else:
                    self._early.extend(pkts)
                return
            self._packets(pkts, transport)
            self.flush()
        except Exception as exc:  # ends this connection (a DISCONNECT, a malformed packet ...)
            self._end(exc)
        finally:
            if collecting:
                gc.enable()

    def _end(self, exc: BaseException) -> None:
        self._failed(exc)
        if self._writer is not None:
            self._writer.abort()

    def _connection_lost(self, exc: Exception | None) -> None:
        self._failed(exc or ConnectionError("closed by the peer"))

    def _failed(self, exc: BaseException) -> None:
        """The connection ends with ``exc`` (raised where :meth:`_connected` waits)."""
        for fut in (self._connack, self._lost):
            if not fut.done():
                fut.set_exception(exc)

    async def _pinger(self, transport: asyncio.WriteTransport) -> None:
        """PINGREQ every half keep-alive; a peer silent for two keep-alives is dead."""
        while True:
            await asyncio.sleep(KEEP_ALIVE / 2)
            if self._loop.time() - self._last_rx > 2 * KEEP_ALIVE:
                self._end(TimeoutError(f"nothing from the peer for {2 * KEEP_ALIVE} s"))
                return
            transport.write(encode(Pingreq(), 5))

    def _packets(self, pkts: list[Packet], writer: asyncio.WriteTransport) -> None:
        """The packets of one read, in order; consecutive plain QoS 0 copies (the bulk of a
        busy link) go to ``deliver_plain`` as one run: one call per run, not three per
        message (docs/cluster.md, "Measured")."""
        run: list[Publish] = []
        for pkt in pkts:
            if type(pkt) is Publish and pkt.qos == 0 and not pkt.properties.subscription_identifiers:
                run.append(pkt)
                continue
            if run:
                self._plain_run(run)
                run = []
            try:
                self._packet(pkt, writer)
            except ConnectionError:  # the peer's DISCONNECT: this connection ends
                raise
            except Exception as exc:  # this packet is dropped, the link goes on (issue 37)
                self._bad(pkt, exc)
        if run:
            self._plain_run(run)

    def _plain_run(self, run: list[Publish]) -> None:
        self.received += len(run)
        try:
            self.deliver_plain(self.peer, run)
        except Exception as exc:  # the rest of the run is lost with it: counted and logged
            self._bad(run[0], exc)

    def _bad(self, pkt: object, exc: Exception) -> None:
        """A packet from the peer that could not be used: counted, reported, dropped (a
        QoS 1/2 PUBLISH is acknowledged: resent, it would fail again and hold a slot of the
        peer's in-flight window for good)."""
        self.bad += 1
        ctl = type(pkt) is Publish and CTL_ID in pkt.properties.subscription_identifiers
        if type(pkt) is Publish and pkt.packet_id is not None and not ctl:  # (ctl: acked already)
            if pkt.qos == 1:
                self._ack(None, encode(Puback(pkt.packet_id), 5))
            elif pkt.qos == 2 and pkt.packet_id not in self._qos2:
                self._ack(None, encode(Pubrec(pkt.packet_id), 5))
        topic = getattr(pkt, "topic", "")
        log.debug("cluster link to %s: %s dropped", self.peer[:8], type(pkt).__name__, exc_info=exc)
        self.problem(
            "unparseable",
            f"from {self.peer[:8]}: {type(pkt).__name__} {topic[:60]!r} dropped "
            f"({type(exc).__name__}: {str(exc)[:120]})",
        )

    def _plain_one_by_one(self, peer: str, run: list[Publish]) -> None:
        for p in run:
            self.deliver(peer, p, True, _NO_GROUPS, False)

    def _packet(self, pkt: object, writer: asyncio.WriteTransport) -> None:
        match pkt:
            case Publish():
                self._publish(pkt)
            case Pubrel(packet_id=pid):  # PUBCOMP once the release is durable (cluster._qos2)
                self._ack(self.qos2.discard(self.peer, pid), encode(Pubcomp(pid), 5))
            case Suback(packet_id=pid, reason_codes=codes):
                self._acked(pid)
                bad = [c for c in codes if c >= 0x80]
                if bad:
                    log.warning("cluster link to %s: subscriptions refused (%s)", self.peer[:8], bad)
            case Unsuback(packet_id=pid):
                self._acked(pid)
            case Pingresp():
                pass
            case Disconnect(reason_code=code):
                raise ConnectionError(f"DISCONNECT {code.name} from the peer")
            case _:
                log.debug("cluster link to %s: unexpected %s", self.peer[:8], type(pkt).__name__)

    def _publish(self, p: Publish) -> None:
        self.received += 1
        ids = p.properties.subscription_identifiers
        qos = p.qos
        if not ids and qos == 0:  # the common case: a plain QoS 0 copy
            self.deliver(self.peer, p, True, _NO_GROUPS, False)
            return
        pid = p.packet_id
        if CTL_ID in ids:
            try:
                self.control(self.peer, p.payload)
            finally:  # acknowledged even when it was bad: it would only come again
                if qos == 1 and pid is not None:
                    self._ack(None, encode(Puback(pid), 5))
            return
        plain, groups = self.table.groups_of(ids)
        if qos == 2 and pid in self._qos2:  # a resent QoS 2 message we already have
            self._ack(None, encode(Pubrec(pid), 5))
            return
        replay = p.retain and FETCH_ID in ids
        durable = self.deliver(self.peer, p, plain, groups, replay) if (plain or groups) else None
        if qos == 1:
            assert pid is not None
            self._ack(durable, encode(Puback(pid), 5))
        elif qos == 2:
            assert pid is not None
            self._qos2.add(pid)  # stored with the injection's copies (ClusterNode._inject)
            self._ack(durable, encode(Pubrec(pid), 5))

    def _ack(self, durable: concurrent.futures.Future[None] | None, data: bytes) -> None:
        """An acknowledgement: written at once when its message is durable (or needs not be)
        and none waits before it, else queued for :meth:`_ack_writer` (order is kept)."""
        w = self._writer
        if (
            not self._acks_queued
            and w is not None
            and (durable is None or (durable.done() and not durable.exception()))
        ):
            w.write(data)
            return
        self._acks_queued += 1
        self._acks.put_nowait((durable, data))

    async def _ack_writer(self, writer: asyncio.WriteTransport) -> None:
        """Acknowledgements leave in order, each once its message is durable here."""
        queue = self._acks
        while True:
            durable, data = await queue.get()
            if durable is not None:
                # shielded: this task is cancelled when the link goes down, and a cancelled
                # wrapper would cancel the store's shared durable signal, on which the
                # journal releases every other client's held acknowledgements (found by the
                # nemesis, issue 30: a subscriber's deliveries stuck for good)
                await asyncio.shield(asyncio.wrap_future(durable))
            writer.write(data)
            self._acks_queued -= 1


def _log_problem(kind: str, detail: str) -> None:
    """The default ``problem``: a log line (a node counts them and limits the lines)."""
    log.warning("cluster link: %s: %s", kind, detail)


class _Refused(Exception):
    """The peer refused the link (bad secret, ...)."""


class _LinkProtocol(asyncio.Protocol):
    """The link's transport callbacks, handed to its :class:`PeerLink`."""

    def __init__(self, link: PeerLink) -> None:
        self.link = link

    def data_received(self, data: bytes) -> None:
        self.link._data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.link._connection_lost(exc)
