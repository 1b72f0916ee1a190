"""Per-client publish quotas (issue 39, item 4): token buckets that pace a publisher (sans-IO).

A :class:`QuotaRule` (``BrokerConfig.quotas``; TOML ``[[quotas]]``, docs/broker.md, "Quotas")
selects clients by client id and/or authenticated user name (``fnmatch`` patterns) and/or the
listener they connected to (its ``name``, ``Listener.name``: the transport's
``ListenerPolicy.name``), and gives them a rate in messages/s and/or bytes/s, a burst, and an
action.  At CONNECT the first matching rule gives the connection a :class:`ClientQuota` (a
rare field of the connection: a client without a quota pays one attribute test per PUBLISH).

Each PUBLISH read from the client is charged to its buckets *after* it was processed
(:meth:`ClientQuota.charge`).  A :class:`TokenBucket` holds at most ``burst`` tokens, refills
at ``rate`` per second, and may go into debt by the last charge: a charge that leaves it
negative returns the seconds until the debt is refilled.  Then:

* action ``pace`` (the default): the connection is paused as flow control pauses a publisher
  (``Connection.blockers``, ``Link.throttle``: nothing more is read from its socket; the
  packets of the read that are not processed yet wait in ``pending``) and resumed at the
  first broker tick (``tick_interval``) at or after the refill (:class:`Quotas`).  Over any
  period the broker therefore processes at most ``burst + rate * elapsed`` plus one message
  (bytes: plus one message's size) of that client: the tokens refill continuously while it
  is paused, so resuming at a tick loses no rate as long as ``burst >= rate * tick_interval``
  (checked when the rule is made);
* action ``disconnect``: the client is disconnected (MQTT 5 DISCONNECT 0x96 Message rate too
  high; 3.1.1: closed), counted in ``Stats.quota_disconnects``.

Costs: a charge is O(1) (two buckets at most); the tick visits the paused connections only.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.core._msghooks import refused_publish
from broker.packets import Publish, ReasonCode

if TYPE_CHECKING:
    from broker.core._connection import Connection
    from broker.core._core import Core

__all__ = [
    "ClientQuota",
    "QuotaRule",
    "Quotas",
    "TokenBucket",
    "over_quota",
    "parse_quotas",
    "retained_refusal",
]

ACTIONS: tuple[str, ...] = ("pace", "disconnect")


class TokenBucket:
    """``burst`` tokens at most, refilled at ``rate`` per second; a charge may leave a debt."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst  # full at the start
        self.stamp = now

    def level(self, now: float) -> float:
        """The tokens at ``now`` (negative: a debt). O(1)."""
        return min(self.burst, self.tokens + (now - self.stamp) * self.rate)

    def take(self, cost: float, now: float) -> float:
        """Charge ``cost`` at ``now`` (not before the last charge); 0.0 when the bucket is not
        in debt after it, else the seconds until the debt is refilled. O(1)."""
        now = max(now, self.stamp)  # a clock that went back: no refill
        t = self.level(now) - cost
        self.tokens = t
        self.stamp = now
        return 0.0 if t >= 0 else -t / self.rate

    def _check(self) -> None:
        assert self.rate > 0
        assert self.tokens <= self.burst


@dataclass(frozen=True, slots=True)
class QuotaRule:
    """One ``[[quotas]]`` table: who (patterns; an unset one matches everyone) and how much."""

    #: fnmatch pattern of the client id (unset: every client)
    client_id: str | None = None
    #: fnmatch pattern of the *authenticated* user name (unset: every client)
    username: str | None = None
    #: the ``name`` of the listener the client connected to (unset: every listener)
    listener: str | None = None
    #: PUBLISHes per second (0: no message rate)
    messages_per_second: float = 0.0
    #: payload bytes per second (0: no byte rate); a rule needs this and/or messages_per_second
    bytes_per_second: float = 0.0
    #: the buckets hold this many seconds of their rate (the burst allowed)
    burst_seconds: float = 1.0
    #: over the quota: ``pace`` (the publisher's socket is not read until its buckets refill)
    #: or ``disconnect`` (MQTT 5 DISCONNECT 0x96)
    action: str = "pace"

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"quota action must be one of {ACTIONS}, not {self.action!r}")
        if self.messages_per_second < 0 or self.bytes_per_second < 0:
            raise ValueError("quota rates must be >= 0")
        if not self.messages_per_second and not self.bytes_per_second:
            raise ValueError("a quota needs messages_per_second and/or bytes_per_second")
        if self.burst_seconds <= 0:
            raise ValueError("quota burst_seconds must be > 0")

    def matches(self, client_id: str, username: str | None, listener: str | None = None) -> bool:
        """Whether this rule selects the client that connected to the listener named
        ``listener`` (None: an unnamed one) (O(pattern length))."""
        if self.listener is not None and listener != self.listener:
            return False
        if self.client_id is not None and not fnmatch.fnmatchcase(client_id, self.client_id):
            return False
        return self.username is None or (
            username is not None and fnmatch.fnmatchcase(username, self.username)
        )


def parse_quotas(value: Any) -> tuple[QuotaRule, ...]:
    """The ``quotas`` option from TOML (an array of tables) or Python (rules or dicts)."""
    if not isinstance(value, (list, tuple)):
        raise ValueError("quotas must be an array of tables ([[quotas]])")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, QuotaRule):
            out.append(item)
            continue
        if not isinstance(item, dict):
            raise ValueError(f"quota {i + 1}: a table expected")
        try:
            out.append(QuotaRule(**{k.replace("-", "_"): v for k, v in item.items()}))
        except TypeError as exc:
            raise ValueError(f"quota {i + 1}: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"quota {i + 1}: {exc}") from None
    return tuple(out)


class ClientQuota:
    """The buckets of one connection under a rule (made at CONNECT)."""

    __slots__ = ("admitted", "bytes", "disconnect", "messages", "since")

    def __init__(self, rule: QuotaRule, now: float) -> None:
        burst = rule.burst_seconds
        self.messages = (
            TokenBucket(rule.messages_per_second, max(1.0, rule.messages_per_second * burst), now)
            if rule.messages_per_second
            else None
        )
        self.bytes = (
            TokenBucket(rule.bytes_per_second, rule.bytes_per_second * burst, now)
            if rule.bytes_per_second
            else None
        )
        self.disconnect = rule.action == "disconnect"
        self.since = now  # when the buckets were made (the broker's monotonic clock)
        self.admitted = 0  # PUBLISHes charged so far

    def charge(self, size: int, now: float) -> float:
        """One PUBLISH of ``size`` payload bytes read at ``now``: seconds to wait (0: none). O(1)."""
        self.admitted += 1
        wait = 0.0
        if self.messages is not None:
            wait = self.messages.take(1.0, now)
        if self.bytes is not None:
            wait = max(wait, self.bytes.take(float(size), now))
        return wait


class Quotas:
    """The broker's quota rules and the connections paused by them (``Core.quotas``)."""

    def __init__(self, core: Core, rules: tuple[QuotaRule, ...]) -> None:
        self.core = core
        self.rules = rules
        self.paused: dict[Connection, float] = {}  # connection -> monotonic time to resume

    def attach(self, conn: Connection, client_id: str, username: str | None, now: float) -> None:
        """At CONNECT: the first matching rule gives ``conn`` its buckets. O(rules)."""
        # the listener's name: on its admission policy, which the transport keeps (None for a
        # connection without one: a plugin's link, a test's)
        listener = getattr(getattr(conn.link, "policy", None), "name", None)
        for rule in self.rules:
            if rule.matches(client_id, username, listener):
                conn.quota = ClientQuota(rule, now)
                return

    def over(self, conn: Connection, wait: float, now: float) -> None:
        """``conn`` went over its quota: pause it for ``wait`` seconds, or disconnect it."""
        core = self.core
        quota = conn.quota
        assert quota is not None
        if quota.disconnect:
            core.stats.quota_disconnects += 1
            core.log_limit("quota", conn.client_id, "publish quota exceeded: disconnecting")
            conn.disconnect(ReasonCode.MESSAGE_RATE_TOO_HIGH, "message rate too high")
            return
        if conn in self.paused:
            return
        self.paused[conn] = now + wait
        core.stats.quota_pauses += 1
        core.block(conn)

    def tick(self, now: float) -> None:
        """Resume the paused connections whose buckets refilled (O(paused))."""
        if not self.paused:
            return
        due = [c for c, t in self.paused.items() if t <= now]
        for conn in due:
            self.release(conn, now)

    def release(self, conn: Connection, now: float) -> None:
        """End ``conn``'s quota pause at ``now`` (its buckets refilled): the packets it read
        before the pause are processed with this time (``Connection.resume``)."""
        if self.paused.pop(conn, None) is None:
            return
        conn.clock = max(conn.clock, now)
        if conn.blockers > 0:
            self.core.unblock(conn)


def over_quota(conn: Connection, p: Publish, now: float) -> bool:
    """Charge ``p`` (read from ``conn``, which has a quota) to its buckets: over its quota the
    connection is paced after ``p`` (:meth:`Quotas.over`: paused) or disconnected (True). O(1)."""
    quota = conn.quota
    assert quota is not None
    wait = quota.charge(len(p.payload), now)
    if wait > 0.0:
        quotas = conn.core.quotas
        assert quotas is not None
        quotas.over(conn, wait, now)
    return conn.close_requested


def retained_refusal(conn: Connection, p: Publish, topic: str) -> Callable[[], None] | None:
    """A retained PUBLISH (non-empty) past ``max_retained_messages`` / ``max_retained_bytes``:
    the refusal to answer (0x97 Quota exceeded; 3.1.1: acknowledged, dropped), counted in
    ``Stats.refused_retained_quota`` and logged at most once per 10 s; None when it fits.
    O(topic levels)."""
    core = conn.core
    cfg = core.config
    if core.router.retained_fits(topic, len(p.payload), cfg.max_retained_messages, cfg.max_retained_bytes):
        return None
    core.stats.refused_retained_quota += 1
    core.log_limit("retained_quota", conn.client_id, "retained store full: publication refused")
    return refused_publish(conn, p.qos, p.packet_id, ReasonCode.QUOTA_EXCEEDED, "retained store full")
