"""Listener admission, sans-IO: who may open a connection (issue 7, item 3).

:class:`ConnectionLimits` counts open connections across all listeners and keeps one token
bucket per source IP (``connection_rate`` / ``connection_burst``); :class:`ListenerPolicy` is
what one listener admits (the shared limits plus its anonymous-client rule, certificate
identity and slow-consumer policy).  The transport asks the policy at accept and screens the
first packet with the answer (:class:`Refusal`), so refused CONNECTs never reach the core.
Decisions take the time as an argument; nothing here does I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from broker._config import BrokerConfig
from broker.core import Stats
from broker.packets import ReasonCode

__all__ = ["ConnectionLimits", "ListenerPolicy", "Refusal"]


class Refusal(enum.Enum):
    """Why a listener refuses a CONNECT: (MQTT 5 reason code, reason string)."""

    MAX_CONNECTIONS = (ReasonCode.QUOTA_EXCEEDED, "too many connections")
    CONNECTION_RATE = (ReasonCode.CONNECTION_RATE_EXCEEDED, "connection rate exceeded")
    ANONYMOUS = (ReasonCode.NOT_AUTHORIZED, "anonymous clients are not allowed on this listener")
    NO_IDENTITY = (ReasonCode.NOT_AUTHORIZED, "client certificate without a common name")
    NOT_PEER = (ReasonCode.NOT_AUTHORIZED, "this listener serves cluster peer links only")

    @property
    def reason_code(self) -> ReasonCode:
        return self.value[0]

    @property
    def text(self) -> str:
        return self.value[1]


class ConnectionLimits:
    """Broker-wide connection count and per-source-IP token buckets.

    ``admit`` and ``release`` are O(1) (amortised: the bucket table is swept when it has
    doubled since the last sweep).
    """

    __slots__ = ("buckets", "burst", "max_connections", "open", "rate", "starved", "stats", "sweep_at")

    #: the bucket table is not swept below this size
    MIN_SWEEP = 4096

    def __init__(self, config: BrokerConfig, stats: Stats) -> None:
        self.max_connections = config.max_connections
        self.rate = config.connection_rate
        self.burst = float(max(1, config.connection_burst))
        self.stats = stats
        self.open = 0
        #: source IP -> (tokens, time of the last update)
        self.buckets: dict[str, tuple[float, float]] = {}
        self.sweep_at = self.MIN_SWEEP
        #: acceptors paused for want of descriptors: resumed when a connection closes
        self.starved: list[Callable[[], None]] = []

    def admit(self, ip: str, now: float) -> Refusal | None:
        """Count a new connection; the refusal it deserves, if any (it stays counted)."""
        self.open += 1
        if self.max_connections and self.open > self.max_connections:
            self.stats.refused_max_connections += 1
            return Refusal.MAX_CONNECTIONS
        rate = self.rate
        if rate > 0.0:
            buckets = self.buckets
            held = buckets.get(ip)
            tokens = self.burst if held is None else min(self.burst, held[0] + (now - held[1]) * rate)
            if tokens < 1.0:
                buckets[ip] = (tokens, now)
                self.stats.refused_connection_rate += 1
                return Refusal.CONNECTION_RATE
            buckets[ip] = (tokens - 1.0, now)
            if len(buckets) >= self.sweep_at:
                self._sweep(now)
        return None

    def _sweep(self, now: float) -> None:
        rate, burst = self.rate, self.burst
        self.buckets = {ip: b for ip, b in self.buckets.items() if b[0] + (now - b[1]) * rate < burst}
        self.sweep_at = max(self.MIN_SWEEP, 2 * len(self.buckets))

    def release(self) -> None:
        self.open -= 1
        if self.starved:  # a descriptor is free again: the paused acceptors try at once
            waiting, self.starved = self.starved, []
            for resume in waiting:
                resume()

    def _check(self) -> None:
        assert self.open >= 0
        assert all(t <= self.burst for t, _ in self.buckets.values())
        assert len(self.buckets) < max(self.sweep_at, self.MIN_SWEEP) or self.rate == 0.0


class ListenerPolicy:
    """What one listener admits: the shared limits plus its anonymous-client rule."""

    __slots__ = ("anonymous", "identity", "limits", "name", "peers_only", "proxy", "slow_consumer")

    def __init__(
        self,
        limits: ConnectionLimits,
        anonymous: bool,
        identity: bool = False,
        slow_consumer: str | None = None,
        *,
        proxy: bool = False,
        peers_only: bool = False,
        name: str | None = None,
    ) -> None:
        self.limits = limits
        #: the listener's name (``Listener.name``: ``[[quotas]]`` select clients by it)
        self.name = name
        self.anonymous = anonymous
        #: cluster peer links only (``Listener.peers_only``)
        self.peers_only = peers_only
        #: the client certificate's CN replaces the CONNECT user name
        self.identity = identity
        #: the listener's slow-consumer policy (None: the broker's)
        self.slow_consumer = slow_consumer
        #: connections start with a PROXY protocol header (admission waits for its address)
        self.proxy = proxy

    def admit(self, ip: str, now: float) -> Refusal | None:
        return self.limits.admit(ip, now)

    def release(self) -> None:
        self.limits.release()

    def refuse_anonymous(self, why: Refusal) -> Refusal:
        """Count a refusal for a missing identity (no user name, or no certificate CN)."""
        self.limits.stats.refused_anonymous += 1
        return why
