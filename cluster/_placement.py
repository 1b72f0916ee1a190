"""Seed 001's placement of composite subscriptions in the live cluster (docs/cluster.md).

A composite subscription made at an access node is not matched there: its canonical
expression goes to the CSSU of its GroupCode (the ``alpha`` members nearest by XOR,
``Overlay.closest``, :func:`cluster._groups.group_code`), every member keeps the CSGT row
``<CSub, Subscribers, LogicTimer, TimeExpired>`` (``Subscribers`` are access nodes), and the
core (the member with the smallest ID) matches it: it registers the expression in its own
broker as an in-process composite subscription, whose atoms the cluster's route table then
holds at every node (atom events from anywhere reach the core), and sends each composite event
to every access node in ``Subscribers``, which delivers it to its clients
(:meth:`broker.core._composite.Composites.deliver_remote`).  Heartbeats ``<ISID, GroupCode,
digest>`` go to the other members every refresh; a digest mismatch fetches the sender's table
and merges it by LogicTimer; membership changes re-elect the core, and a new core registers
the table's expressions (the seed's re-subscription).  What the seed's core buffered is lost
with it: atom events that arrived at a dead core and were waiting for their partners.

Control messages travel as QoS 1 MQTT messages on ``$cluster/ctl/<node id>`` over the links
(each link holds that filter at its peer); their payload is JSON.

Sans-IO where it matters: the table logic (:class:`Csgt`) is plain data; the I/O (publishing
control messages, the in-process composite subscriptions) stays in :class:`Placement`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cluster._groups import group_code
from cluster._replicas import Replicas

if TYPE_CHECKING:
    from broker.ext import Broker, LocalCompositeSubscription
    from cluster._overlay import Overlay

__all__ = ["CTL_PREFIX", "Csgt", "Placement"]

log = logging.getLogger("siftmq.cluster")

#: topic prefix of the control messages to a node
CTL_PREFIX = "$cluster/ctl/"
GROUP_NUM = 4096


@dataclass(slots=True)
class Row:
    subscribers: set[str] = field(default_factory=set)  # access node ids (hex)
    timer: int = 0
    expired: int = 0


@dataclass(slots=True)
class Csgt:
    """One group's table (Definition 3, without Elements: the broker's engine decomposes)."""

    code: int
    rows: dict[str, Row] = field(default_factory=dict)

    def digest(self) -> str:
        h = hashlib.sha256()
        for expr in sorted(self.rows):
            h.update(expr.encode() + b"|" + ",".join(sorted(self.rows[expr].subscribers)).encode() + b"\n")
        return h.hexdigest()[:32]  # 128 bits

    def dump(self) -> list[list[Any]]:
        return [[e, sorted(r.subscribers), r.timer, r.expired] for e, r in sorted(self.rows.items())]

    def merge(self, rows: list[list[Any]]) -> bool:
        """Merge a peer's copy: per row the larger LogicTimer wins. True if anything changed."""
        changed = False
        for expr, subscribers, timer, expired in rows:
            mine = self.rows.get(expr)
            if mine is None or int(timer) > mine.timer:
                self.rows[expr] = Row(set(subscribers), int(timer), int(expired))
                changed = True
        return changed


class Placement:
    """Composite subscriptions placed on CSSUs (see the module docstring)."""

    def __init__(  # noqa: PLR0917
        self,
        me: str,
        overlay: Overlay,
        broker: Broker,
        send: Callable[[str, dict[str, Any]], None],
        alpha: int = 3,
        expire_after: int = 3,
        forget: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.me = me
        self.overlay = overlay
        self.broker = broker
        self.send = send
        self.alpha = alpha
        self.expire_after = expire_after
        self.tables: dict[int, Csgt] = {}
        self.local: dict[str, int] = {}  # expressions subscribed by local clients -> count
        self.matching: dict[str, tuple[LocalCompositeSubscription, asyncio.Task[None]]] = {}
        self.events_sent = 0
        self.heartbeats = 0
        # quorum of a CSSU (issue 30, finding 5): the largest size of each group's CSSU seen
        # lately, (size, since when a smaller one has been seen)
        self.forget = forget
        self.clock = clock
        self._sizes: dict[int, tuple[int, float | None]] = {}
        self.stepped_down = 0  # times this node was the smallest ID it saw without a quorum
        # replicas (issue 30: exactly-once merging, docs/cluster.md): every member merges,
        # one emits; see :class:`Replicas`
        self.replicas = Replicas(self)

    # ------------------------------------------------------------ CompositeDelegate
    def subscribe(self, client_id: str, name: str, expression: str, qos: int) -> None:
        n = self.local.get(expression, 0)
        self.local[expression] = n + 1
        if n == 0:
            self._to_cssu(expression, {"t": "sub", "expr": expression, "src": self.me, "add": True})

    def unsubscribe(self, client_id: str, name: str, expression: str) -> None:
        n = self.local.get(expression, 0)
        if n <= 1:
            self.local.pop(expression, None)
            self._to_cssu(expression, {"t": "sub", "expr": expression, "src": self.me, "add": False})
        else:
            self.local[expression] = n - 1

    def subscribe_again(self, expression: str) -> None:
        """Re-send a local expression to its (current) CSSU: repairs a lost control message
        and reaches members that joined the CSSU since (idempotent for the rows)."""
        if expression in self.local:
            self._to_cssu(expression, {"t": "sub", "expr": expression, "src": self.me, "add": True})

    def _code(self, expression: str) -> int:
        return group_code(expression, GROUP_NUM)

    def members(self, code: int) -> list[str]:
        """The CSSU of ``code``: the alpha live nodes nearest by XOR, smallest ID first."""
        return [f"{i:040x}" for i in sorted(self.overlay.closest(code, self.alpha))]

    def _to_cssu(self, expression: str, msg: dict[str, Any]) -> None:
        for m in self.members(self._code(expression)):
            self.send(m, msg)

    # ------------------------------------------------------------ control messages
    def receive(self, msg: dict[str, Any]) -> None:
        match msg.get("t"):
            case "sub":
                self._row_change(str(msg["expr"]), str(msg["src"]), bool(msg["add"]))
            case "ev":
                core = self.broker.core
                core.composite.deliver_remote(
                    str(msg["expr"]), str(msg["body"]).encode(), int(msg["qos"]), core.clock.monotonic()
                )
                core.flush()
            case "hb":
                t = self.tables.get(int(msg["code"]))
                if t is None or t.digest() != msg["digest"]:
                    self.send(str(msg["src"]), {"t": "fetch", "code": msg["code"], "src": self.me})
                self.replicas.heard(str(msg["src"]), msg.get("m") or {})
            case "sync?":
                self.replicas.sync_asked(str(msg["expr"]), str(msg["src"]))
            case "sync":
                self.replicas.synced_from(str(msg["expr"]), msg)
            case "fetch":
                t = self.tables.get(int(msg["code"]))
                rows = [] if t is None else t.dump()
                self.send(str(msg["src"]), {"t": "table", "code": msg["code"], "rows": rows})
            case "table":
                code = int(msg["code"])
                if msg["rows"]:
                    t = self.tables.setdefault(code, Csgt(code))
                    if t.merge(msg["rows"]):
                        self.reconcile()
            case other:
                log.debug("cluster control: unknown message %s", repr(other)[:200])  # a peer's, bounded

    def _row_change(self, expression: str, src: str, add: bool) -> None:
        code = self._code(expression)
        t = self.tables.setdefault(code, Csgt(code))
        row = t.rows.setdefault(expression, Row())
        if add:
            row.subscribers.add(src)
            row.expired = 0
        else:
            row.subscribers.discard(src)
        row.timer += 1
        self.reconcile()

    # ------------------------------------------------------------ periodic
    def tick(self) -> None:
        """Expiry, heartbeats to the other members, re-election (membership may have moved)."""
        for code, t in list(self.tables.items()):
            for expr, row in list(t.rows.items()):
                if not row.subscribers:
                    row.expired += 1
                    if row.expired > self.expire_after:
                        del t.rows[expr]
            if not t.rows:
                del self.tables[code]
                continue
            digest = t.digest()
            mine = self.replicas.states(t)
            for m in self.members(code):
                if m != self.me:
                    self.heartbeats += 1
                    self.send(m, {"t": "hb", "code": code, "digest": digest, "src": self.me, "m": mine})
        self.reconcile()
        self.replicas.tick()

    def quorate(self, code: int, members: list[str]) -> bool:
        """Whether ``members`` (the CSSU this node sees) are a majority of the group's CSSU:
        of the largest size seen, or of a smaller size seen for ``forget`` seconds (members
        that died for good).  The side of a partition without a majority has no core: two
        cores at once would match the same atoms twice (issue 30, finding 5)."""
        size, since = self._sizes.get(code, (0, None))
        now = self.clock()
        if len(members) >= size:
            self._sizes[code] = (len(members), None)
            return True
        if since is None:
            self._sizes[code] = (size, now)
        elif now - since >= self.forget:
            self._sizes[code] = (len(members), None)
            return True
        return len(members) > size // 2

    def reconcile(self) -> None:
        """Match (as a replica) exactly the expressions of the tables this node is a member
        of; emit the events of those it is the core of: the synchronised replica that has
        merged longest among the members it sees (smallest ID on a tie), if those are a
        majority of the CSSU (:class:`Replicas`)."""
        wanted: set[str] = set()
        emit: set[str] = set()
        for code, t in self.tables.items():
            members = self.members(code)
            quorum = self.quorate(code, members)  # every time: it tracks the CSSU's size
            if self.me not in members:
                continue
            exprs = [e for e, r in t.rows.items() if r.subscribers]
            wanted.update(exprs)
            core = [e for e in exprs if self.replicas.core(e, members) == self.me]
            if core and not quorum:
                if any(e in self.replicas.emitting for e in core):
                    self.stepped_down += 1
                    log.warning(
                        "composite group %x: %d of its CSSU reachable, no quorum: not emitting",
                        code,
                        len(members),
                    )
                continue
            emit.update(core)
        for expr in [e for e in self.matching if e not in wanted]:
            _sub, task = self.matching.pop(expr)
            task.cancel()
            self.replicas.stopped(expr)
        for expr in wanted - set(self.matching):
            self._match(expr)
        self.replicas.emit(emit & set(self.matching))

    def _match(self, expression: str) -> None:
        name = hashlib.sha1(expression.encode()).hexdigest()[:16]
        sub = self.broker.subscribe_composite(expression, qos=1, name=name)
        task = asyncio.create_task(self._forward(expression, sub), name=f"cssu core {name}")
        self.matching[expression] = (sub, task)
        self.replicas.started(expression, sub)

    async def _forward(self, expression: str, sub: LocalCompositeSubscription) -> None:
        """Run the in-process composite subscription; send each event to the access nodes."""
        try:
            async with sub:
                async for msg in sub:
                    t = self.tables.get(self._code(expression))
                    row = None if t is None else t.rows.get(expression)
                    if row is None:
                        continue
                    body = msg.payload.decode()
                    if not self.replicas.emitted(expression, body, msg.qos):
                        continue  # a replica's event: kept for a takeover, not sent
                    self.send_event(expression, body, msg.qos)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("composite core for %s failed", expression[:80])

    def send_event(self, expression: str, body: str, qos: int) -> None:
        """A composite event to every access node of ``expression``."""
        t = self.tables.get(self._code(expression))
        row = None if t is None else t.rows.get(expression)
        if row is None:
            return
        for node in sorted(row.subscribers):
            self.events_sent += 1
            self.send(node, {"t": "ev", "expr": expression, "body": body, "qos": qos})

    async def close(self) -> None:
        tasks = [task for _, task in self.matching.values()]
        self.matching.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    def sys_values(self) -> dict[str, str]:
        return {
            "$SYS/cluster/cssu/tables": str(len(self.tables)),
            "$SYS/cluster/cssu/core_of": str(len(self.replicas.emitting)),
            "$SYS/cluster/cssu/events_sent": str(self.events_sent),
            "$SYS/cluster/cssu/heartbeats": str(self.heartbeats),
            "$SYS/cluster/cssu/stepped_down": str(self.stepped_down),
            **self.replicas.sys_values(),
        }


def encode(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode()
