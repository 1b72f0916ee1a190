"""One outbound bridge at run time: a durable local session piped to a remote broker.

Design (docs/bridging-out.md, "How it works").  A bridge is two MQTT connections driven by
paho-mqtt, each with manual acknowledgements:

* **local**: a client of this broker (loopback, MQTT 5, client id ``$uplink/<name>``,
  clean start off, session expiry "never") subscribed at QoS 1 to the ``out`` rules with
  *no local* (what the bridge itself publishes locally is never sent back out) and *retain as
  published*.  Its session is an ordinary persistent session: while the remote is away the
  broker queues the bridge's messages in it and, with persistence on, writes them to SQLite
  before the local publisher's PUBACK, so they survive a restart and ``kill -9``.
* **remote**: a client of the remote broker (``mqtt``/``mqtts``/``ws``/``wss``, MQTT 5 or
  3.1.1) subscribed to the ``in`` rules (no local on MQTT 5; on 3.1.1 the CONNECT carries
  mosquitto's bridge bit, protocol level 0x84, which mosquitto and siftmq treat as no local).

A message delivered on one side is published on the other and acknowledged on its side only
when the other side acknowledged it (QoS 1: PUBACK; QoS 2: PUBCOMP).  Nothing is kept in this
process that its source does not still hold (a message that comes while the other side is
still connecting waits, unacknowledged, until both are up): when either connection drops,
both are closed, and the next connection (clean start off) makes the broker that holds the
unacknowledged messages send them again, in order, then its queue.  Delivery is at least
once end to end; per topic order is kept.

The supervisor coroutine connects the remote first (failover list in order, jittered
exponential back-off between rounds, bounded by ``backoff_max``), then the local side.  paho
runs each connection's network loop on its own thread; the callbacks only touch this object's
counters (ints under the GIL) and the pending map (under a lock), and wake the supervisor with
``call_soon_threadsafe``.  Per message the work is O(rules) to find the matching rule plus
O(payload) for a content filter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

import content
import topics
from uplink._config import BridgeConfig, Remote, TopicRule

__all__ = ["Bridge", "BridgeState", "LocalEndpoint"]

log = logging.getLogger("siftmq.uplink")

#: seconds between two log lines of the same kind per bridge (every event is counted)
LOG_INTERVAL = 10.0
#: MQTT 5 "never expires"
NEVER = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class LocalEndpoint:
    """Where and as whom the bridge reaches its own broker."""

    host: str
    port: int
    #: the per-process password the Uplink hook accepts for the bridge's client id
    password: str


@dataclass(slots=True)
class BridgeState:
    """Counters and state of one bridge ($SYS and /metrics read them)."""

    connected: bool = False
    remote: str = ""
    #: out messages acknowledged by the remote
    sent: int = 0
    #: in messages acknowledged by the local broker
    received: int = 0
    #: messages whose payload the rule's content filter refused (acknowledged, not crossed)
    filtered: int = 0
    #: messages that could not cross (bigger than the remote's maximum packet size, no rule)
    dropped: int = 0
    #: connection attempts and failures by reason (refused, tls, unreachable, lost, ...)
    connects: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    last_error: str = ""

    def fail(self, reason: str, error: str) -> None:
        self.failures[reason] = self.failures.get(reason, 0) + 1
        self.last_error = error


def _connect_properties() -> Properties:
    return Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]


def _finish(client: paho.Client) -> None:
    """Stop a client's network thread and close its sockets (blocks: run it in an executor).

    ``loop_stop`` only joins the thread: the socket pair ``loop_start`` made (paho's wake-up
    pipe, a loopback TCP connection) is closed by the client's ``__del__`` alone
    (eclipse-paho/paho.mqtt.python#627).  Our clients sit in reference cycles (their callbacks
    hold their ``_Side``), so that was left to the cycle collector, which finalizes the
    sockets and the client in no set order and, when a socket goes first, warns
    ``ResourceWarning: unclosed socket``.  ``reinitialise`` is paho's public call that closes
    them (and leaves a fresh, unconnected client, which is then dropped).
    """
    client.loop_stop()
    client.reinitialise()


class _Side:
    """One paho connection and the events the supervisor waits on."""

    def __init__(self, client: paho.Client, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.connack: asyncio.Future[tuple[int, Any]] = loop.create_future()
        self.lost = asyncio.Event()
        self.max_packet: int | None = None
        #: CONNACK accepted (a disconnect after it is a lost connection, not a refusal)
        self.up = False
        #: we are closing it (its disconnect is not an error)
        self.closing = False

    def resolve(self, rc: int, props: Any) -> None:
        def set_result() -> None:
            if not self.connack.done():
                self.connack.set_result((rc, props))

        self.loop.call_soon_threadsafe(set_result)

    def drop(self) -> None:
        self.loop.call_soon_threadsafe(self.lost.set)


class Bridge:
    """Runs one :class:`BridgeConfig` against a local endpoint until :meth:`stop`."""

    def __init__(self, config: BridgeConfig, local: LocalEndpoint) -> None:
        self.config = config
        self.local_endpoint = local
        self.state = BridgeState()
        self._filters = [None if r.filter is None else content.compile(r.filter) for r in config.topics]
        self._lock = threading.Lock()
        #: message id on the publishing side -> (receiving side, its message id, qos); per
        #: connection generation (a stale acknowledgement never acknowledges a newer delivery)
        self._pending_out: dict[int, tuple[int, int]] = {}
        self._pending_in: dict[int, tuple[int, int]] = {}
        #: acknowledgements that came before ``publish`` returned their message id
        self._early_out: set[int] = set()
        self._early_in: set[int] = set()
        #: messages that came while the other side was still connecting (unacknowledged)
        self._held: list[tuple[_Side, paho.MQTTMessage]] = []
        self._both_up = False
        self._local: _Side | None = None
        self._remote: _Side | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._logged: dict[str, float] = {}
        self._attempt = 0
        self._up = asyncio.Event()

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"uplink-{self.config.name}")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._close()

    async def wait_connected(self) -> None:
        """Wait until both sides are up (tests, embedding programs; put a timeout around it)."""
        await self._up.wait()

    async def _run(self) -> None:
        cfg = self.config
        await self._ensure_local_session()
        delay = cfg.backoff_min
        index = 0
        while not self._stopping:
            remote = cfg.remotes[index % len(cfg.remotes)]
            index += 1
            ok = await self._connect(remote)
            if ok:
                delay = cfg.backoff_min
                index -= 1  # stay on the remote that answered
                assert self._local is not None and self._remote is not None
                lost_local = asyncio.ensure_future(self._local.lost.wait())
                lost_remote = asyncio.ensure_future(self._remote.lost.wait())
                try:
                    await asyncio.wait({lost_local, lost_remote}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    lost_local.cancel()
                    lost_remote.cancel()
                self.state.connected = False
                self._up.clear()
                self._log(
                    "lost",
                    logging.WARNING,
                    "bridge %s: connection to %s lost (%s)",
                    cfg.name,
                    remote.url,
                    self.state.last_error,
                )
            await self._close()
            if self._stopping:
                break
            if ok or index % len(cfg.remotes) == 0:  # a full round of the failover list failed
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, cfg.backoff_max)

    async def _ensure_local_session(self) -> None:
        """Create the durable local session and its subscriptions before anything else, so
        that messages published while the remote was never reachable are kept (retried
        until the local broker answers)."""
        while not self._stopping:
            side = self._local_client()
            try:
                if await self._open(side, self.local_endpoint.host, self.local_endpoint.port, "local"):
                    await self._subscribe_local(side)
                    side.closing = True
                    side.client.disconnect()
                    await asyncio.get_running_loop().run_in_executor(None, _finish, side.client)
                    return
            except Exception as exc:  # a refused subscription: said once, then retried
                self._log("local", logging.ERROR, "bridge %s: local session: %s", self.config.name, exc)
            await asyncio.get_running_loop().run_in_executor(None, _finish, side.client)
            await asyncio.sleep(self.config.backoff_min)

    async def _connect(self, remote: Remote) -> bool:
        cfg = self.config
        self.state.connects += 1
        self._attempt += 1
        with self._lock:
            self._pending_out.clear()
            self._pending_in.clear()
            self._early_out.clear()
            self._early_in.clear()
            self._held.clear()
            self._both_up = False
        try:
            rside = self._remote_client(remote)
        except (OSError, ValueError, ssl.SSLError) as exc:
            self._failed("tls", remote, f"TLS setup: {exc}")
            return False
        self._remote = rside
        if not await self._open(rside, remote.host, remote.port, "remote", remote):
            return False
        lside = self._local_client()
        self._local = lside
        if not await self._open(lside, self.local_endpoint.host, self.local_endpoint.port, "local"):
            return False
        try:
            await self._subscribe_local(lside)
            inbound = [(i, r) for i, r in enumerate(cfg.topics) if r.direction.inbound]
            if inbound:
                await self._subscribe(rside, [(r.remote_filter, r.qos) for _, r in inbound], "remote")
        except (RuntimeError, TimeoutError) as exc:
            self._failed("subscribe", remote, str(exc))
            return False
        self.state.connected = True
        self.state.remote = remote.url
        self._release()
        self._up.set()
        log.info("bridge %s: connected to %s (MQTT %s)", cfg.name, remote.url, cfg.protocol)
        return True

    async def _close(self) -> None:
        for side in (self._local, self._remote):
            if side is None:
                continue
            side.closing = True
            with contextlib.suppress(Exception):
                side.client.disconnect()
            await asyncio.get_running_loop().run_in_executor(None, _finish, side.client)
        with self._lock:
            self._both_up = False
            self._held.clear()
        self._local = self._remote = None

    # ---- connections -----------------------------------------------------------------------

    def _local_client(self) -> _Side:
        loop = asyncio.get_running_loop()
        c = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.config.local_client_id,
            protocol=paho.MQTTv5,
            manual_ack=True,
        )
        c.username_pw_set("$uplink", self.local_endpoint.password)
        c.max_inflight_messages_set(self.config.max_inflight)
        side = _Side(c, loop)
        self._callbacks(side, "local")
        c.on_message = lambda _c, _u, msg: self._from_local(side, msg)
        c.on_publish = lambda _c, _u, mid, _rc, _p: self._acked_locally(side, mid)
        return side

    def _remote_client(self, remote: Remote) -> _Side:
        cfg = self.config
        loop = asyncio.get_running_loop()
        v5 = cfg.protocol == "5"
        c = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=cfg.remote_client_id,
            clean_session=None if v5 else cfg.clean_start,
            protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
            transport="websockets" if remote.websocket else "tcp",
            manual_ack=True,
        )
        if not v5:
            c.enable_bridge_mode()  # protocol level 0x84: mosquitto's try_private (no local)
        if remote.websocket:
            c.ws_set_options(path=remote.path)
        if remote.tls:
            ctx = ssl.create_default_context(cafile=cfg.cafile)
            if cfg.certfile is not None:
                ctx.load_cert_chain(cfg.certfile, cfg.keyfile)
            if cfg.insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            c.tls_set_context(ctx)
        if cfg.username is not None:
            c.username_pw_set(cfg.username, cfg.password)
        c.max_inflight_messages_set(cfg.max_inflight)
        side = _Side(c, loop)
        self._callbacks(side, "remote")
        c.on_message = lambda _c, _u, msg: self._from_remote(side, msg)
        c.on_publish = lambda _c, _u, mid, _rc, _p: self._acked_remotely(side, mid)
        return side

    def _callbacks(self, side: _Side, which: str) -> None:
        def on_connect(_c: paho.Client, _u: object, _f: object, rc: Any, props: Any) -> None:
            if which == "remote" and props is not None and hasattr(props, "MaximumPacketSize"):
                side.max_packet = int(props.MaximumPacketSize)
            code = int(rc.value) if hasattr(rc, "value") else int(rc)
            side.up = code == 0
            side.resolve(code, rc)

        def on_disconnect(_c: paho.Client, _u: object, _f: object, rc: Any, _p: object) -> None:
            if side.up and not side.closing:
                self.state.last_error = f"{which} disconnected: {rc}"
            side.resolve(-1, rc)
            side.drop()

        side.client.on_connect = on_connect
        side.client.on_disconnect = on_disconnect

    async def _open(
        self, side: _Side, host: str, port: int, which: str, remote: Remote | None = None
    ) -> bool:
        """Connect one side and wait for its CONNACK; False (counted, logged) on failure."""
        cfg = self.config
        c = side.client
        where = remote if remote is not None else Remote(f"mqtt://{host}:{port}", host, port, False, False)
        props = None
        if which == "local" or cfg.protocol == "5":
            props = _connect_properties()
            props.SessionExpiryInterval = NEVER if which == "local" else cfg.session_expiry
        clean: bool = False if which == "local" else cfg.clean_start
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(cfg.connect_timeout):
                if which == "local" or cfg.protocol == "5":
                    await loop.run_in_executor(
                        None,
                        lambda: c.connect(
                            host,
                            port,
                            cfg.keep_alive if which == "remote" else 60,
                            clean_start=clean,
                            properties=props,
                        ),
                    )
                else:
                    await loop.run_in_executor(None, lambda: c.connect(host, port, cfg.keep_alive))
                c.loop_start()
                rc, reason = await side.connack
        except ssl.SSLError as exc:
            self._failed("tls", where, f"TLS: {exc}")
            return False
        except TimeoutError:
            self._failed("timeout", where, f"no CONNACK within {cfg.connect_timeout:g} s")
            return False
        except OSError as exc:
            self._failed("unreachable", where, f"{type(exc).__name__}: {exc}")
            return False
        if rc != 0:
            self._failed("refused" if rc > 0 else "lost", where, f"CONNECT refused: {reason}")
            return False
        return True

    async def _subscribe_local(self, side: _Side) -> None:
        out = [(r.local_filter, 1) for r in self.config.topics if r.direction.outbound]
        if out:
            await self._subscribe(side, out, "local", v5=True)

    async def _subscribe(
        self, side: _Side, filters: list[tuple[str, int]], which: str, v5: bool | None = None
    ) -> None:
        if v5 is None:
            v5 = self.config.protocol == "5"
        loop = asyncio.get_running_loop()
        done: asyncio.Future[list[Any]] = loop.create_future()

        def on_subscribe(_c: paho.Client, _u: object, _mid: int, codes: list[Any], _p: object) -> None:
            def resolve() -> None:
                if not done.done():
                    done.set_result(codes)

            loop.call_soon_threadsafe(resolve)

        side.client.on_subscribe = on_subscribe
        if v5:
            # retain handling 1: retained messages only for a new subscription (not at
            # every reconnection); no local: what this bridge publishes there is not echoed
            subs: list[tuple[str, Any]] = [
                (f, SubscribeOptions(qos=q, noLocal=True, retainAsPublished=True, retainHandling=1))
                for f, q in filters
            ]
            side.client.subscribe(subs)
        else:
            side.client.subscribe(filters)
        codes = await asyncio.wait_for(done, self.config.connect_timeout)
        bad = [
            (f, c) for (f, _), c in zip(filters, codes, strict=False) if int(getattr(c, "value", c)) >= 0x80
        ]
        if bad:
            raise RuntimeError(f"{which} SUBSCRIBE refused: " + ", ".join(f"{f} ({c})" for f, c in bad))

    # ---- message flow (paho threads) -------------------------------------------------------

    def _rule(self, topic: str, outbound: bool) -> int | None:
        for i, r in enumerate(self.config.topics):
            if outbound and r.direction.outbound and topics.matches(r.local_filter, topic):
                return i
            if not outbound and r.direction.inbound and topics.matches(r.remote_filter, topic):
                return i
        return None

    def _passes(self, i: int, payload: bytes | bytearray) -> bool:
        flt = self._filters[i]
        if flt is None:
            return True
        try:
            return flt.matches(content.attributes(payload))
        except (ValueError, TypeError):
            return False

    def _hold(self, side: _Side, msg: paho.MQTTMessage) -> bool:
        """True if ``msg`` came before both sides were up: kept (unacknowledged) and handled
        when they are (:meth:`_release`); a stale side's message is left to be sent again."""
        with self._lock:
            if side is not self._local and side is not self._remote:
                return True
            if not self._both_up:
                self._held.append((side, msg))
                return True
        return False

    def _release(self) -> None:
        """Both sides are up: handle the messages held meanwhile, in their order (those that
        come while this runs are held too and handled in the next round, so nothing
        overtakes them), then let the callbacks forward directly."""
        while True:
            with self._lock:
                held, self._held = self._held, []
                if not held:
                    self._both_up = True
                    return
            for side, msg in held:
                if side is self._local:
                    self._from_local(side, msg, released=True)
                else:
                    self._from_remote(side, msg, released=True)

    def _route(self, side: _Side, msg: paho.MQTTMessage, outbound: bool) -> TopicRule | None:
        """The rule that forwards ``msg``; None when no rule of its direction matches (counted
        dropped) or its content filter refuses it (counted filtered): then it is acknowledged."""
        i = self._rule(msg.topic, outbound)
        if i is None:
            self.state.dropped += 1
        elif self._passes(i, msg.payload):
            return self.config.topics[i]
        else:
            self.state.filtered += 1
        side.client.ack(msg.mid, msg.qos)
        return None

    def _from_local(self, side: _Side, msg: paho.MQTTMessage, released: bool = False) -> None:
        if not released and self._hold(side, msg):
            return
        remote = self._remote
        if remote is None:
            return  # not acknowledged: sent again at the next connection
        rule = self._route(side, msg, True)
        if rule is None:
            return
        topic = rule.to_remote(msg.topic)
        if remote.max_packet is not None and len(msg.payload) + len(topic) + 16 > remote.max_packet:
            self.state.dropped += 1
            self._log(
                "too_large",
                logging.WARNING,
                "bridge %s: message on %s (%d bytes) is bigger than the remote's maximum packet size %d: "
                "dropped",
                self.config.name,
                msg.topic,
                len(msg.payload),
                remote.max_packet,
            )
            side.client.ack(msg.mid, msg.qos)
            return
        self._forward(remote, source=side, msg=msg, topic=topic, rule=rule, pending=self._pending_out)

    def _from_remote(self, side: _Side, msg: paho.MQTTMessage, released: bool = False) -> None:
        if not released and self._hold(side, msg):
            return
        local = self._local
        if local is None:
            return
        rule = self._route(side, msg, False)
        if rule is None:
            return
        self._forward(
            local, source=side, msg=msg, topic=rule.to_local(msg.topic), rule=rule, pending=self._pending_in
        )

    def _forward(
        self,
        to: _Side,
        *,
        source: _Side,
        msg: paho.MQTTMessage,
        topic: str,
        rule: TopicRule,
        pending: dict[int, tuple[int, int]],
    ) -> None:
        qos = min(rule.qos, 2)
        # never hold our lock while calling paho: its callbacks run under its own mutexes
        info = to.client.publish(topic, msg.payload, qos, msg.retain)
        if qos == 0:  # best effort: the source's message is done with
            if info.rc == paho.MQTT_ERR_SUCCESS:
                self._count_crossed(pending)
            if msg.qos > 0:
                source.client.ack(msg.mid, msg.qos)
            return
        if info.rc != paho.MQTT_ERR_SUCCESS:
            # the other side is going away: left unacknowledged, so sent again by the source
            # at the next connection
            return
        with self._lock:  # the acknowledgement may have come before publish returned
            acked = self._early_out if pending is self._pending_out else self._early_in
            early = info.mid in acked
            if early:
                acked.discard(info.mid)
            else:
                pending[info.mid] = (msg.mid, msg.qos)
        if early:
            self._count_crossed(pending)
            if msg.qos > 0:
                source.client.ack(msg.mid, msg.qos)

    def _count_crossed(self, pending: dict[int, tuple[int, int]]) -> None:
        if pending is self._pending_out:
            self.state.sent += 1
        else:
            self.state.received += 1

    def _acked_remotely(self, side: _Side, mid: int) -> None:
        self._ack(side, mid, self._pending_out, self._local)

    def _acked_locally(self, side: _Side, mid: int) -> None:
        self._ack(side, mid, self._pending_in, self._remote)

    def _ack(self, side: _Side, mid: int, pending: dict[int, tuple[int, int]], source: _Side | None) -> None:
        with self._lock:
            entry = pending.pop(mid, None)
            if entry is None:
                (self._early_out if pending is self._pending_out else self._early_in).add(mid)
        if entry is None or source is None:
            return
        self._count_crossed(pending)
        if entry[1] > 0:
            source.client.ack(entry[0], entry[1])

    # ---- reporting -----------------------------------------------------------------------

    def _failed(self, reason: str, remote: Remote, error: str) -> None:
        self.state.fail(reason, error)
        self._log(reason, logging.WARNING, "bridge %s: %s: %s", self.config.name, remote.url, error)

    def _log(self, kind: str, level: int, fmt: str, *args: object) -> None:
        now = time.monotonic()
        last = self._logged.get(kind)
        if last is None or now - last >= LOG_INTERVAL:
            self._logged[kind] = now
            log.log(level, fmt, *args)

    def queued(self, session_length: Callable[[str], int]) -> int:
        return session_length(self.config.local_client_id)
