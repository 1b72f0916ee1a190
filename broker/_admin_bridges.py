"""What the admin API, the dashboard and ``siftmq ctl`` show of outbound bridges (issue 40, item 4).

The bridges are a plugin's (``uplink``, a layer above the broker): the broker never imports
it. The seam is the other way round: a hook registered in the broker that runs bridges
implements :class:`BridgeSource` (``uplink.Uplink`` does), and the admin API finds such hooks
among ``Broker.hooks`` (:func:`bridge_sources`). Each bridge is reported as one
:class:`BridgeStatus`, a frozen snapshot taken when asked: nothing is computed between two
requests, so a broker that nobody looks at pays nothing. ``uplink`` imports both names from
:mod:`broker.ext` (its public seam; docs/architecture.md, "Seams").

Cost: a snapshot is O(bridges) (counters read, no queue walked); :func:`find_bridge` is
O(bridges) too. Both run only on an admin or dashboard request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from broker._broker import Broker

__all__ = ["BridgeSource", "BridgeStatus", "bridge_sources", "find_bridge", "list_bridges"]


@dataclass(frozen=True, slots=True)
class BridgeStatus:
    """One outbound bridge as an operator sees it (the JSON of ``GET /api/v1/bridges``).

    Counters count since the broker started; times are Unix times (seconds) or None."""

    name: str
    #: both sides up (the remote and the bridge's local session)
    connected: bool
    #: the remote in use (the last one connected), "" before the first connection
    remote: str
    #: the failover list, in order (URLs without any ``user:password@``)
    remotes: tuple[str, ...]
    #: ``"5"`` or ``"3.1.1"``
    protocol: str
    #: messages waiting for the remote in the bridge's local session (queued + in flight)
    queued_messages: int
    #: bytes of their topics and payloads when the bridge has a queue bound of its own (the
    #: broker counts no bytes otherwise: None)
    queued_bytes: int | None
    #: ``out`` messages the remote acknowledged
    sent: int
    #: ``in`` messages the local broker acknowledged
    received: int
    #: messages that did not cross, by reason (``filtered``: a rule's content filter;
    #: ``queue_bound``: the bridge's own queue bound; ``too_large``: bigger than the remote's
    #: Maximum Packet Size; ``no_rule``: no rule matches the topic; ``refused``: refused by the
    #: destination with a reason code)
    dropped: Mapping[str, int] = field(default_factory=dict)
    #: connection attempts, and failed or lost connections by reason (``unreachable``,
    #: ``refused``, ``tls``, ``timeout``, ``subscribe``, ``lost``)
    connects: int = 0
    failures: Mapping[str, int] = field(default_factory=dict)
    #: times the bridge connected again after its first connection
    reconnects: int = 0
    #: the latest error and when it happened
    last_error: str = ""
    last_error_at: float | None = None
    #: since when both sides are up (None while not connected)
    connected_since: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The API's JSON object (O(fields))."""
        return {
            "name": self.name,
            "connected": self.connected,
            "remote": self.remote,
            "remotes": list(self.remotes),
            "protocol": self.protocol,
            "queued": {"messages": self.queued_messages, "bytes": self.queued_bytes},
            "sent": self.sent,
            "received": self.received,
            "dropped": dict(self.dropped),
            "dropped_total": sum(self.dropped.values()),
            "connects": self.connects,
            "failures": dict(self.failures),
            "reconnects": self.reconnects,
            "last_error": {"text": self.last_error, "at": self.last_error_at} if self.last_error else None,
            "connected_since": self.connected_since,
        }


@runtime_checkable
class BridgeSource(Protocol):
    """A hook that runs outbound bridges (``uplink.Uplink``)."""

    def bridge_status(self) -> Sequence[BridgeStatus]:
        """A snapshot of each bridge, in configuration order."""
        ...

    async def reconnect_bridge(self, name: str) -> bool:
        """Close the bridge ``name``'s connections and connect again now (no back-off wait);
        False when it has no bridge of that name."""
        ...


def bridge_sources(broker: Broker) -> list[BridgeSource]:
    """The broker's hooks that run bridges (O(hooks))."""
    return [h for h in broker.hooks if isinstance(h, BridgeSource)]


def list_bridges(broker: Broker) -> list[BridgeStatus]:
    """Every bridge of every source, sorted by name (O(bridges log bridges))."""
    return sorted((s for src in bridge_sources(broker) for s in src.bridge_status()), key=lambda s: s.name)


def find_bridge(broker: Broker, name: str) -> tuple[BridgeSource, BridgeStatus] | None:
    """The source running the bridge ``name`` and its snapshot; None when there is none."""
    for src in bridge_sources(broker):
        for s in src.bridge_status():
            if s.name == name:
                return src, s
    return None
