"""Picklable plans a driver hands to a load-generator worker process.

A plan is a list of :class:`GroupSpec` (publishers and subscribers whose deliveries are counted
together and paced by one window), optional idle connections and an optional retained-subscribe
workload. Everything is pre-encoded bytes so a worker does no encoding on its hot path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._codec import Block

__all__ = ["ClientSpec", "GroupSpec", "RetainedSpec", "WorkerPlan", "WorkerResult"]


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """One connection: CONNECT bytes, setup packets (each answered by one SUBACK/UNSUBACK/PUBACK)
    and, for publishers, the blocks it cycles through."""

    connect: bytes
    setup: tuple[bytes, ...] = ()
    blocks: tuple[Block, ...] = ()
    version: int = 4
    #: the broker port of this connection (0: the worker's; a cluster benchmark spreads clients)
    port: int = 0


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """Publishers and subscribers paced together.

    ``window``: most expected deliveries outstanding (sent, not yet received) before the
    publishers wait: closed loop, so the generator follows the broker's pace. ``rate``: when
    non-zero, publish that many messages per second instead (open loop, for latency at a fixed
    load; the window still caps the backlog).
    """

    publishers: tuple[ClientSpec, ...]
    subscribers: tuple[ClientSpec, ...]
    window: int
    rate: float = 0.0


@dataclass(frozen=True, slots=True)
class RetainedSpec:
    """Prefill ``topics`` retained messages, then each subscriber repeatedly subscribes to
    ``filter`` and waits for all of them."""

    prefill: ClientSpec
    prefill_count: int
    subscribers: tuple[ClientSpec, ...]
    subscribe: bytes
    expected: int


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    groups: tuple[GroupSpec, ...] = ()
    idle: tuple[bytes, ...] = ()  # CONNECT packets of connections that only stay open
    retained: RetainedSpec | None = None


@dataclass(slots=True)
class WorkerResult:
    """What one worker measured inside the window [t_start, t_end]."""

    delivered: int = 0
    published: int = 0
    lost: int = 0
    cpu_s: float = 0.0
    window_s: float = 0.0
    latencies_ns: list[int] = field(default_factory=list)  # subsample
    cycle_ns: list[int] = field(default_factory=list)  # retained: subscribe -> last message
    setup_s: float = 0.0
    connections: int = 0
    error: str = ""
