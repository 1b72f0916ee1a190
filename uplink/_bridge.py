"""One outbound bridge at run time: a durable local session piped to a remote broker.

Design (docs/bridging-out.md, "How it works").  A bridge is two MQTT client connections
(:class:`uplink._client.Link`: the broker's own codec, in the broker's event loop):

* **local**: a client of this broker (loopback, MQTT 5, client id ``$uplink/<name>``,
  clean start off, session expiry "never") subscribed to the ``out`` rules at each rule's
  QoS with *no local* (what the bridge itself publishes locally is never sent back out) and
  *retain as published*.  Its session is an ordinary persistent session: while the remote
  is away the broker queues the bridge's messages in it and, with persistence on, writes them
  to SQLite before the local publisher's PUBACK, so they survive a restart and ``kill -9``.
* **remote**: a client of the remote broker (``mqtt``/``mqtts``/``ws``/``wss``, MQTT 5 or
  3.1.1) subscribed to the ``in`` rules (no local on MQTT 5; on 3.1.1 the CONNECT carries
  mosquitto's bridge bit, protocol level 0x84, which mosquitto and siftmq treat as no local).

**A relay of packets, not of messages.**  A PUBLISH delivered on one side with packet
identifier *p* is published on the other side at the same QoS *with the same identifier p*,
and every acknowledgement is relayed the other way with that identifier: PUBACK for QoS 1;
PUBREC, PUBREL and PUBCOMP for QoS 2 (the source gets its PUBREC when the destination sent
its PUBREC: the destination owns the message then; the destination gets its PUBREL when the
source released the message).  The bridge therefore keeps no per-message state and holds
nothing the source does not still hold: when either connection drops, both are closed, and
the next connection (clean start off on both sides) makes each broker send again what was not
acknowledged, with the same identifiers.  Because identifiers are the source's, a QoS 2
message sent again after a reconnection reaches the destination under the identifier it
already knows, which discards the duplicate: **QoS 2 is exactly once end to end** (and QoS 1
at least once), in order per topic.  The local window is the remote's Receive Maximum (and
``max_inflight``), so the remote never sees more unacknowledged identifiers than it allows;
the local broker's own ``max_inflight`` (meant for ordinary clients) does not narrow it
(``widen``, given by the Uplink hook).

The supervisor coroutine connects the remote first (failover list in order, jittered
exponential back-off between rounds, bounded by ``backoff_max``), then the local side; packets
that come on one side before both are up are held (unacknowledged) and relayed in order once
they are.  Per message the work is O(rules) to find the matching rule plus O(payload) for a
content filter and the codec; no thread, no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import content
import topics
from broker.ext import LogLimiter
from broker.packets import (
    NO_PROPERTIES,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    encode_publish,
)
from uplink._client import Link, LinkError, open_link
from uplink._config import BridgeConfig, Remote, TopicRule

__all__ = ["Bridge", "BridgeState", "LocalEndpoint", "unsubscribe_local"]

log = logging.getLogger("siftmq.uplink")

#: seconds between two log lines of the same kind per bridge (every event is counted)
LOG_INTERVAL = 10.0
#: MQTT 5 "never expires"
NEVER = 0xFFFFFFFF
#: the packet identifier of the bridge's SUBSCRIBE requests (its PUBLISH identifiers are the
#: other broker's, which start from 1)
SUBSCRIBE_ID = 65535
#: messages in flight to a 3.1.1 remote (it announces no Receive Maximum) when ``max_inflight``
#: is 0: mosquitto's default ``max_inflight_messages``
V311_WINDOW = 20
#: the Receive Maximum the bridge announces to an MQTT 5 remote when ``max_inflight`` is 0
IN_WINDOW = 100
#: topics whose rule is remembered per direction (the cache is emptied when full)
RULE_CACHE = 4096


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
    #: out messages acknowledged by the remote (QoS 1 PUBACK, QoS 2 PUBREC; QoS 0 when sent)
    sent: int = 0
    #: in messages acknowledged by the local broker
    received: int = 0
    #: messages whose payload the rule's content filter refused (acknowledged, not crossed)
    filtered: int = 0
    #: messages that could not cross, in total and by reason: bigger than the remote's maximum
    #: packet size (``too_large``), no rule matches their topic (``no_rule``), refused by the
    #: destination with a reason code (``refused``); ``dropped`` is their sum
    dropped: int = 0
    too_large: int = 0
    no_rule: int = 0
    refused: int = 0
    #: connection attempts and failures by reason (refused, tls, unreachable, lost, ...)
    connects: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    last_error: str = ""
    #: Unix time of the latest failure; since when both sides are up (None: not connected);
    #: successful connections (the admin API's status, uplink._status)
    last_error_at: float | None = None
    connected_since: float | None = None
    connections: int = 0

    def undeliverable(self, reason: str) -> None:
        """One message that could not cross, for ``reason`` (``too_large``, ``no_rule`` or
        ``refused``), counted in its counter and in ``dropped`` (O(1))."""
        match reason:
            case "too_large":
                self.too_large += 1
            case "no_rule":
                self.no_rule += 1
            case _:
                self.refused += 1
        self.dropped += 1

    def fail(self, reason: str, error: str) -> None:
        self.failures[reason] = self.failures.get(reason, 0) + 1
        self.last_error = error
        self.last_error_at = time.time()


def _puback(pid: int) -> bytes:
    """A successful PUBACK for ``pid``: the same four bytes in MQTT 3.1.1 and 5 (MQTT 5
    3.4.2.1: reason code 0 without properties may be left out), made without a ``Puback``
    object and the generic encoder: the relay sends one per QoS 1 message. O(1).

    Not ``broker.packets.encode(Puback(pid), version)``: the codec, compiled, is slower on this
    path by about 0.2 us per relayed message (``flock /work/bench.lock .venv/bin/python
    benchmarks/bench_uplink_puback.py`` after ``make build``, 2026-11-29: 107-110 ns here
    against 320-352 ns, 3.0-3.2x, same run), about 2 % of the in-memory edge's whole CPU per
    bridged message (~11 us, docs/bridging-out.md "Performance").  Both give the same bytes
    (tests/uplink/test_uplink_puback.py)."""
    return b"\x40\x02" + pid.to_bytes(2, "big")


def _reason(code: ReasonCode) -> str:
    """``NOT_AUTHORIZED`` -> ``Not authorized``."""
    return code.name.replace("_", " ").capitalize()


def _forwarded(props: Properties) -> Properties:
    """The message's own properties (not the subscription identifiers nor a topic alias of
    the connection it came on), O(1)."""
    if props is NO_PROPERTIES or (not props.subscription_identifiers and props.topic_alias is None):
        return props
    return Properties(
        payload_format_indicator=props.payload_format_indicator,
        message_expiry_interval=props.message_expiry_interval,
        content_type=props.content_type,
        response_topic=props.response_topic,
        correlation_data=props.correlation_data,
        user_properties=props.user_properties,
    )


class Bridge:
    """Runs one :class:`BridgeConfig` against a local endpoint until :meth:`stop`."""

    def __init__(
        self, config: BridgeConfig, local: LocalEndpoint, widen: Callable[[str, int], None] | None = None
    ) -> None:
        self.config = config
        #: asked to let the local broker keep ``window`` messages in flight to the bridge's
        #: session (its ``max_inflight``, 20 by default, bounds ordinary clients): the Uplink hook
        self._widen = widen
        self.local_endpoint = local
        self.state = BridgeState()
        self._filters = [None if r.filter is None else content.compile(r.filter) for r in config.topics]
        #: topic -> the index of its rule (or None), per direction (:meth:`_rule`)
        self._rules_out: dict[str, int | None] = {}
        self._rules_in: dict[str, int | None] = {}
        self._v5 = config.protocol == "5"
        self._local: Link | None = None
        self._remote: Link | None = None
        self._remote_max_packet: int | None = None
        #: packets that came while the other side was still connecting (unacknowledged)
        self._held: list[tuple[Link, Packet]] = []
        self._both_up = False
        #: QoS 2 identifiers acknowledged here without crossing (filtered, dropped, refused by
        #: the destination): their PUBREL is answered here, per direction
        self._here_out: set[int] = set()
        self._here_in: set[int] = set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._logged = LogLimiter(LOG_INTERVAL)
        self._lost = asyncio.Event()
        self._up = asyncio.Event()
        #: remote filters of ``in`` rules a reload removed: unsubscribed at the next connection
        self._retired: tuple[str, ...] = ()

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"uplink-{self.config.name}")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # the task had ended on an error: stopping it is not one
                log.error(
                    "bridge %s: had stopped on an error: %s: %s", self.config.name, type(exc).__name__, exc
                )
        await self._close()

    async def reconnect(self) -> None:
        """Close both connections and connect again at once, without the back-off wait (the
        admin API's ``POST /api/v1/bridges/<name>/reconnect``); nothing is lost: what was
        not acknowledged is sent again on the next connections, as after any drop."""
        await self.stop()
        self.state.connected = False
        self.state.connected_since = None
        self._up.clear()
        self._stopping = False
        log.info("bridge %s: reconnecting (asked by an admin)", self.config.name)
        self.start()

    def retire_remote(self, filters: tuple[str, ...]) -> None:
        """Unsubscribe ``filters`` at the remote at the next connection (a reload removed their
        ``in`` rules; the remote session, kept across connections, still has them). O(1)."""
        self._retired = filters

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
                await self._serve()
                self.state.connected = False
                if not self._stopping:
                    self.state.fail("lost", self.state.last_error)
                self._up.clear()
                self._log(
                    "lost",
                    logging.WARNING,
                    "bridge %s: connection to %s lost (%s)",
                    cfg.name,
                    remote.shown,
                    self.state.last_error,
                )
            await self._close()
            if self._stopping:
                break
            if ok or index % len(cfg.remotes) == 0:  # a full round of the failover list failed
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, cfg.backoff_max)

    async def _serve(self) -> None:
        """Until either side is lost: keep-alive of both links (O(1) per tick)."""
        cfg = self.config
        intervals = [(self._local, 60.0)]
        if cfg.keep_alive:
            intervals.append((self._remote, float(cfg.keep_alive)))
        tick = min(i for _, i in intervals) / 4
        while not self._lost.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), tick)
            for link, interval in intervals:
                if link is not None and not link.closed:
                    link.keep_alive(interval)

    async def _ensure_local_session(self) -> None:
        """Create the durable local session and its subscriptions before anything else, so
        that messages published while the remote was never reachable are kept (retried
        until the local broker answers)."""
        while not self._stopping:
            try:
                async with asyncio.timeout(self.config.connect_timeout):
                    link, connack = await open_link(
                        self.local_endpoint.host,
                        self.local_endpoint.port,
                        self._local_connect(1),
                        on_packet=lambda _p: None,  # a restored queue is sent again later
                        on_lost=lambda _why: None,
                    )
                    try:
                        if connack.reason_code < 0x80:
                            await self._subscribe_local(link)
                            link.send(Disconnect())
                            return
                        raise LinkError(f"CONNECT refused: {_reason(connack.reason_code)}")
                    finally:
                        await link.close()
            except (OSError, TimeoutError, LinkError, RuntimeError) as exc:  # said once, retried
                self._log("local", logging.ERROR, "bridge %s: local session: %s", self.config.name, exc)
            await asyncio.sleep(self.config.backoff_min)

    def _local_connect(self, receive_maximum: int) -> Connect:
        props = Properties(session_expiry_interval=NEVER, receive_maximum=receive_maximum)
        return Connect(
            self.config.local_client_id,
            5,
            clean_start=False,
            keep_alive=60,
            username="$uplink",
            password=self.local_endpoint.password.encode(),
            properties=props,
        )

    def _remote_connect(self) -> Connect:
        cfg = self.config
        props = NO_PROPERTIES
        if self._v5:
            props = Properties(
                session_expiry_interval=cfg.session_expiry, receive_maximum=cfg.max_inflight or IN_WINDOW
            )
        return Connect(
            cfg.remote_client_id,
            5 if self._v5 else 4,
            clean_start=cfg.clean_start,
            keep_alive=cfg.keep_alive,
            username=cfg.username,
            password=None if cfg.password is None else cfg.password.encode(),
            properties=props,
            bridge=not self._v5,  # protocol level 0x84: mosquitto's try_private (no local)
        )

    def _tls(self) -> ssl.SSLContext:
        cfg = self.config
        ctx = ssl.create_default_context(cafile=cfg.cafile)
        if cfg.certfile is not None:
            ctx.load_cert_chain(cfg.certfile, cfg.keyfile)
        if cfg.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    async def _connect(self, remote: Remote) -> bool:
        cfg = self.config
        self.state.connects += 1
        self._held.clear()
        self._both_up = False
        self._here_out.clear()
        self._here_in.clear()
        self._lost.clear()
        try:
            tls = self._tls() if remote.tls else None
        except (OSError, ValueError, ssl.SSLError) as exc:
            self._failed("tls", remote, f"TLS setup: {exc}")
            return False
        rlink = await self._open(remote, self._remote_connect(), self._from_remote, tls)
        if rlink is None:
            return False
        self._remote, rconnack = rlink
        self._remote.release()
        rprops = rconnack.properties
        self._remote_max_packet = rprops.maximum_packet_size
        if self._v5:  # the remote's Receive Maximum, unless max_inflight is lower
            window = min(cfg.max_inflight or 65535, rprops.receive_maximum or 65535)
        else:  # a 3.1.1 remote announces none: mosquitto's default max_inflight_messages
            window = cfg.max_inflight or V311_WINDOW
        local = Remote(f"mqtt://{self.local_endpoint.host}:{self.local_endpoint.port}", "", 0, False, False)
        llink = await self._open(local, self._local_connect(window), self._from_local, None)
        if llink is None:
            return False
        self._local = llink[0]
        self._local.release()
        if self._widen is not None:
            self._widen(cfg.local_client_id, window)
        try:
            async with asyncio.timeout(cfg.connect_timeout):
                await self._subscribe_local(self._local)
                inbound = [r for r in cfg.topics if r.direction.inbound]
                if inbound:
                    await self._subscribe(self._remote, [(r.remote_filter, r.qos) for r in inbound], "remote")
                if self._retired:  # UNSUBACK ignored (_from_remote): the remote acts in order
                    self._remote.send(Unsubscribe(SUBSCRIBE_ID - 1, self._retired))
                    self._retired = ()
        except (RuntimeError, TimeoutError, LinkError) as exc:
            self._failed("subscribe", remote, str(exc) or "no SUBACK")
            return False
        self.state.connected = True
        self.state.remote = remote.url
        self.state.connected_since = time.time()
        self.state.connections += 1
        self._release()
        self._up.set()
        log.info("bridge %s: connected to %s (MQTT %s)", cfg.name, remote.shown, cfg.protocol)
        return True

    async def _open(
        self,
        remote: Remote,
        connect: Connect,
        on_packet: Callable[[Link, Packet], None],
        tls: ssl.SSLContext | None,
    ) -> tuple[Link, Connack] | None:
        """Connect one side and wait for its CONNACK; None (counted, logged) on failure."""
        host, port = (
            (remote.host, remote.port)
            if remote.host
            else (self.local_endpoint.host, self.local_endpoint.port)
        )
        holder: list[Link] = []

        def packet(p: Packet) -> None:  # replaced below: the link holds its packets until release
            on_packet(holder[0], p)

        def lost(why: str) -> None:
            if holder and (holder[0] is self._local or holder[0] is self._remote):
                if not self._stopping and not self._lost.is_set():
                    self.state.last_error = why
                self._lost.set()

        try:
            async with asyncio.timeout(self.config.connect_timeout):
                link, connack = await open_link(
                    host,
                    port,
                    connect,
                    on_packet=packet,
                    on_lost=lost,
                    tls=tls,
                    ws_path=remote.path if remote.websocket else None,
                )
        except ssl.SSLError as exc:
            self._failed("tls", remote, f"TLS: {exc}")
            return None
        except TimeoutError:
            self._failed("timeout", remote, f"no CONNACK within {self.config.connect_timeout:g} s")
            return None
        except OSError as exc:
            why = os.strerror(exc.errno) if exc.errno else str(exc)  # "Connection refused"
            self._failed("unreachable", remote, f"{type(exc).__name__}: {why}")
            return None
        except LinkError as exc:
            self._failed("lost", remote, str(exc))
            return None
        holder.append(link)
        # packets reach ``on_packet`` only from ``release`` on (the caller's, after this
        # returns): from then on each one without a Python frame in between
        link.on_packet = partial(on_packet, link)
        if connack.reason_code >= 0x80:
            self._failed("refused", remote, f"CONNECT refused: {_reason(connack.reason_code)}")
            await link.close()
            return None
        return link, connack

    async def _close(self) -> None:
        links = [x for x in (self._local, self._remote) if x is not None]
        self._local = self._remote = None
        self._both_up = False
        self._held.clear()
        for link in links:
            if not link.closed:
                link.send(Disconnect())
                await link.close()

    async def _subscribe_local(self, link: Link) -> None:
        out = [(r.local_filter, r.qos) for r in self.config.topics if r.direction.outbound]
        if out:
            await self._subscribe(link, out, "local")

    async def _subscribe(self, link: Link, filters: list[tuple[str, int]], which: str) -> None:
        # retain handling 1: retained messages only for a new subscription (not at every
        # reconnection); no local: what this bridge publishes there is not echoed
        reqs = tuple(SubscriptionRequest(f, q, True, True, 1) for f, q in filters)
        suback = await link.subscribe(SUBSCRIBE_ID, reqs)
        bad = [(f, c) for (f, _), c in zip(filters, suback.reason_codes, strict=False) if c >= 0x80]
        if bad:
            raise RuntimeError(
                f"{which} SUBSCRIBE refused: " + ", ".join(f"{f} ({_reason(c)})" for f, c in bad)
            )

    # ---- the relay (event loop) ------------------------------------------------------------

    def _rule(self, topic: str, outbound: bool) -> int | None:
        """The first rule of the direction matching ``topic`` (O(1) for a topic seen before:
        a bounded cache; else O(rules))."""
        cache = self._rules_out if outbound else self._rules_in
        hit = cache.get(topic, -2)
        if hit != -2:
            return hit
        found: int | None = None
        for i, r in enumerate(self.config.topics):
            if outbound and r.direction.outbound and topics.matches(r.local_filter, topic):
                found = i
                break
            if not outbound and r.direction.inbound and topics.matches(r.remote_filter, topic):
                found = i
                break
        if len(cache) >= RULE_CACHE:
            cache.clear()
        cache[topic] = found
        return found

    def _passes(self, i: int, payload: bytes) -> bool:
        flt = self._filters[i]
        if flt is None:
            return True
        try:
            return flt.matches(content.attributes(payload))
        except (ValueError, TypeError):
            return False

    def _release(self) -> None:
        """Both sides are up: relay the packets held meanwhile, in their order, then let
        packets pass directly."""
        held, self._held = self._held, []
        self._both_up = True
        for link, p in held:
            if link is self._local:
                self._from_local(link, p)
            elif link is self._remote:
                self._from_remote(link, p)

    def _from_local(self, link: Link, p: Packet) -> None:
        if link is not self._local:
            return  # a stale connection's packet: sent again at the next one
        remote = self._remote
        if not self._both_up or remote is None:
            self._held.append((link, p))
            return
        match p:
            case Publish():
                self._publish(link, remote, p, outbound=True)
            case Pubrel(packet_id=pid):  # the local broker released an out message
                if pid in self._here_out:
                    self._here_out.discard(pid)
                    link.send(Pubcomp(pid))
                else:
                    remote.send(Pubrel(pid))
            case Puback(packet_id=pid, reason_code=rc):  # an in message taken by the local broker
                self._count_in(rc)
                if rc == 0 or not self._v5:
                    remote.write(_puback(pid))
                else:
                    remote.send(Puback(pid, rc))
            case Pubrec(packet_id=pid, reason_code=rc):
                self._count_in(rc)
                remote.send(Pubrec(pid, rc) if self._v5 else Pubrec(pid))
            case Pubcomp(packet_id=pid):
                remote.send(Pubcomp(pid))
            case Disconnect():
                link.abort("the local broker sent DISCONNECT")
            case _:
                pass

    def _from_remote(self, link: Link, p: Packet) -> None:
        if link is not self._remote:
            return
        local = self._local
        if not self._both_up or local is None:
            self._held.append((link, p))
            return
        match p:
            case Publish():
                self._publish(link, local, p, outbound=False)
            case Puback(packet_id=pid, reason_code=rc):  # an out message taken by the remote
                self._count_out(rc)
                local.write(_puback(pid))
            case Pubrec(packet_id=pid, reason_code=rc):
                if rc >= 0x80:  # refused: the flow ends here at the remote, not locally
                    self._here_out.add(pid)
                self._count_out(rc)
                local.send(Pubrec(pid))
            case Pubcomp(packet_id=pid):
                local.send(Pubcomp(pid))
            case Pubrel(packet_id=pid):  # the remote released an in message
                if pid in self._here_in:
                    self._here_in.discard(pid)
                    link.send(Pubcomp(pid))
                else:
                    local.send(Pubrel(pid))
            case Disconnect(reason_code=rc):
                link.abort(f"the remote sent DISCONNECT: {_reason(rc)}")
            case _:
                pass

    def _count_out(self, rc: int) -> None:
        if rc >= 0x80:
            self.state.undeliverable("refused")
            self._log(
                "refused_out",
                logging.WARNING,
                "bridge %s: the remote refused a message (0x%02x)",
                self.config.name,
                rc,
            )
        else:
            self.state.sent += 1

    def _count_in(self, rc: int) -> None:
        if rc >= 0x80:
            self.state.undeliverable("refused")
        else:
            self.state.received += 1

    def _publish(self, source: Link, to: Link, p: Publish, *, outbound: bool) -> None:
        """Relay one PUBLISH under its own packet identifier (O(rules + payload))."""
        qos = p.qos
        i = self._rule(p.topic, outbound)
        if i is None:
            self.state.undeliverable("no_rule")
            self._ack_here(source, p, outbound)
            return
        if not self._passes(i, p.payload):
            self.state.filtered += 1
            self._ack_here(source, p, outbound)
            return
        rule: TopicRule = self.config.topics[i]
        topic = rule.to_remote(p.topic) if outbound else rule.to_local(p.topic)
        props = _forwarded(p.properties) if (self._v5 or not outbound) else NO_PROPERTIES
        data = encode_publish(topic, p.payload, qos, p.retain, p.dup, p.packet_id, props, to.version)
        limit = self._remote_max_packet if outbound else None
        if limit is not None and len(data) > limit:
            self.state.undeliverable("too_large")
            self._log(
                "too_large",
                logging.WARNING,
                "bridge %s: message on %s (%d bytes) is bigger than the remote's maximum packet size %d: "
                "dropped",
                self.config.name,
                p.topic,
                len(p.payload),
                limit,
            )
            self._ack_here(source, p, outbound)
            return
        to.write(data)
        if qos == 0:
            if outbound:
                self.state.sent += 1
            else:
                self.state.received += 1

    def _ack_here(self, source: Link, p: Publish, outbound: bool) -> None:
        """Acknowledge ``p`` to its source without crossing (QoS 2: its PUBREL too)."""
        pid = p.packet_id
        if pid is None or p.qos == 0:
            return
        if p.qos == 1:
            source.write(_puback(pid))
        else:
            (self._here_out if outbound else self._here_in).add(pid)
            source.send(Pubrec(pid))

    # ---- reporting -----------------------------------------------------------------------

    def _failed(self, reason: str, remote: Remote, error: str) -> None:
        self.state.fail(reason, error)
        self._log(reason, logging.WARNING, "bridge %s: %s: %s", self.config.name, remote.shown, error)

    def _log(self, kind: str, level: int, fmt: str, *args: object) -> None:
        if self._logged.due(kind, time.monotonic()):
            log.log(level, fmt, *args)

    def queued(self, session_length: Callable[[str], int]) -> int:
        return session_length(self.config.local_client_id)


async def unsubscribe_local(local: LocalEndpoint, config: BridgeConfig, filters: tuple[str, ...]) -> None:
    """Unsubscribe ``filters`` of the bridge's local session, keeping its queue (a reload
    removed the bridge or some of its ``out`` rules); the bridge itself is stopped.  Raises
    OSError, TimeoutError (``connect_timeout``) or RuntimeError."""
    done: asyncio.Future[Unsuback] = asyncio.get_running_loop().create_future()

    def packet(p: Packet) -> None:  # a queued PUBLISH is not acknowledged: sent again later
        if isinstance(p, Unsuback) and not done.done():
            done.set_result(p)

    connect = Bridge(config, local)._local_connect(1)
    async with asyncio.timeout(config.connect_timeout):
        try:
            link, connack = await open_link(
                local.host, local.port, connect, on_packet=packet, on_lost=lambda _why: None
            )
        except LinkError as exc:
            raise RuntimeError(str(exc)) from None
        try:
            if connack.reason_code >= 0x80:
                raise RuntimeError(f"CONNECT refused: {_reason(connack.reason_code)}")
            link.release()
            link.send(Unsubscribe(SUBSCRIBE_ID, filters))
            await done
            link.send(Disconnect())
        finally:
            await link.close()
