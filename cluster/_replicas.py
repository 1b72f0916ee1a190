"""Replicated merging of composite subscriptions over their CSSU (issue 30; docs/cluster.md,
"Composite subscriptions: one merge, replicated").

Seed 001 has one core per CSSU that merges and loses its buffers with it.  A core change then
loses the atoms it had buffered and the atoms sent to it but not to its successor (whose atom
routes take a while to reach the publishers), and a core that comes back merges again what
its link sessions kept for it: with FIFO pairing (docs/composite.md, "Semantics" 5) one atom
lost or merged twice shifts every later pair.  Here:

* **Every member merges.**  Each member of the CSSU holds the composite subscription in its
  own engine (an in-process subscription, so its atom routes are held at every node by its
  durable link sessions), and every atom reaches every member, in publication order from each
  origin node.  FIFO pairing over per-atom queues does not depend on how the queues interleave,
  so members that saw the same atoms per queue in the same order hold the same buffers and
  compute the same events, with the same identities (broker.core._atom_ids: the sorted origin
  ids of their components).
* **One member emits**: the *core*, the synchronised member that has merged longest among the
  members this node sees (the smallest ``since``, then the smallest ID), while they are a
  majority of the CSSU (:meth:`cluster._placement.Placement.quorate`).  A core that stops,
  restarts, is cut off or is paused is replaced by the next one, which already holds the
  merge state; the old one does not take over again after a restart (its ``since`` is new).
  Members that do not emit keep the events they computed for :data:`REPLAY_S`, minus those
  up to the last one the core says (in its heartbeats) it sent; a member that becomes core
  sends the rest (about a refresh's worth; the access nodes drop those already delivered,
  ``Composites.deliver_remote``), which covers the events the old core merged but did not
  get out.
* **A new replica synchronises.**  A member that starts merging (restarted, or newly in the
  CSSU) holds the offers to its subscription's atoms (``Composites.hold``) and asks the core
  for its state: the core's buffered instances with their origin ids and the origin ids it
  offered lately per atom (``sync``).  The replica offers the core's instances, then the held
  offers the core had not seen, and merges on its own from then on.  Only the first member of
  a group (no synchronised member heard of within :data:`GRACE_TICKS` refreshes) starts from
  empty buffers.

Heartbeats carry each member's ``since`` and whether it is synchronised per expression.
Costs: every atom is forwarded to the ``alpha`` members instead of one (alpha x the link
messages and engine work for atoms), events go out once (plus the replay after a takeover),
a synchronisation is one control message of the core's buffers (at most the cap per atom)
and origin ids.

Not covered (documented): atoms of one atom queue published at several nodes can interleave
differently at two members (then their pairs may differ); a replica's synchronisation races
with atoms published at its very start whose route to it was not held yet; link sessions
expire after the peer expiry; expiry is by arrival at each member.
"""

from __future__ import annotations

import base64
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from broker.ext import Atom, event_key

if TYPE_CHECKING:
    from broker.ext import LocalCompositeSubscription, Message
    from cluster._placement import Csgt, Placement

__all__ = ["GRACE_TICKS", "REPLAY_S", "Replicas"]

log = logging.getLogger("siftmq.cluster")

#: seconds a member keeps the events it computed without emitting them (a takeover sends them)
REPLAY_S: Final = 30.0
#: events kept per expression for a takeover
RECENT_EVENTS: Final = 4096
#: refreshes a new replica waits for a synchronised member before it starts on its own
GRACE_TICKS: Final = 3
#: refreshes between two synchronisation requests of a waiting replica
RESYNC_TICKS: Final = 3
#: a replica waiting longer than this many refreshes starts on its own (logged)
GIVE_UP_TICKS: Final = 40
#: a member's heartbeat older than this many refreshes is not taken into account
STALE_TICKS: Final = 4


@dataclass(slots=True)
class _Mine:
    sub: LocalCompositeSubscription
    since: float  # wall clock: when this merge state began
    synced: bool = False
    waited: int = 0  # refreshes since it started waiting


class Replicas:
    """This node's replicas of composite subscriptions (see the module docstring)."""

    def __init__(self, placement: Placement) -> None:
        self.p = placement
        self.mine: dict[str, _Mine] = {}
        #: expression -> member -> (since, synchronised, tick heard), from the heartbeats
        self.peers: dict[str, dict[str, tuple[float, bool, int]]] = {}
        self.ticks = 0
        self.emitting: set[str] = set()
        #: expression -> (time, body, qos, key) of the events computed lately
        self.recent: dict[str, deque[tuple[float, str, int, str | None]]] = {}
        #: expression -> key of the last event this node sent (told in its heartbeats)
        self.last_sent: dict[str, str | None] = {}
        self.held: list[tuple[Message, list[int], str]] = []
        self.syncs = 0  # synchronisations from a core
        self.takeovers = 0  # times this node became the core of an expression
        self.replayed = 0  # events sent again at a takeover
        placement.broker.core.composite.hold = self._hold

    # ------------------------------------------------------------ this node's replicas
    def started(self, expression: str, sub: LocalCompositeSubscription) -> None:
        self.mine[expression] = _Mine(sub, time.time())

    def stopped(self, expression: str) -> None:
        self.mine.pop(expression, None)
        self.recent.pop(expression, None)
        self.last_sent.pop(expression, None)
        self.emitting.discard(expression)
        self._release()

    def states(self, t: Csgt) -> dict[str, list[Any]]:
        """What the heartbeats of table ``t`` say about this node's replicas."""
        return {e: [m.since, m.synced, self.last_sent.get(e)] for e, m in self.mine.items() if e in t.rows}

    def heard(self, src: str, states: dict[str, list[Any]]) -> None:
        for expr, (since, synced, *last) in states.items():
            self.peers.setdefault(expr, {})[src] = (float(since), bool(synced), self.ticks)
            if last and last[0] is not None:
                self._sent_by_core(expr, str(last[0]))

    def _sent_by_core(self, expression: str, key: str) -> None:
        """A member sent the event ``key``: this replica's events up to it need no replay
        (a takeover then sends about a refresh's worth of events, not :data:`REPLAY_S`; an
        access node restarted meanwhile has forgotten what it delivered)."""
        q = self.recent.get(expression)
        if not q or all(k != key for _t, _b, _q, k in q):
            return
        while q:
            if q.popleft()[3] == key:
                break

    def core(self, expression: str, members: list[str]) -> str | None:
        """The member that emits ``expression``'s events among ``members``: the
        synchronised one that has merged longest (smallest ID on a tie)."""
        best: tuple[float, str] | None = None
        mine = self.mine.get(expression)
        if mine is not None and mine.synced:
            best = (mine.since, self.p.me)
        for m, (since, synced) in self._heard(expression, members).items():
            if synced and (best is None or (since, m) < best):
                best = (since, m)
        return None if best is None else best[1]

    def _heard(self, expression: str, members: list[str]) -> dict[str, tuple[float, bool]]:
        """What the other ``members`` said lately (within :data:`STALE_TICKS` refreshes: a
        member that restarted is not taken for what it was before)."""
        peers = self.peers.get(expression, {})
        out: dict[str, tuple[float, bool]] = {}
        for m in members:
            st = peers.get(m)
            if m != self.p.me and st is not None and self.ticks - st[2] <= STALE_TICKS:
                out[m] = (st[0], st[1])
        return out

    # ------------------------------------------------------------ emitting
    def emit(self, expressions: set[str]) -> None:
        """Become (or stay) the core of exactly ``expressions``; a new one sends the events
        it computed lately (the access nodes drop those already delivered)."""
        now = time.monotonic()
        for expr in expressions - self.emitting:
            self.takeovers += 1
            kept = [(b, q) for t, b, q, _k in self.recent.get(expr, ()) if now - t <= REPLAY_S]
            log.info("composite %s: core here, %d recent events sent again", expr[:60], len(kept))
            for body, qos in kept:
                self.replayed += 1
                self.p.send_event(expr, body, qos)
        self.emitting = set(expressions)

    def emitted(self, expression: str, body: str, qos: int) -> bool:
        """An event this node's replica computed: kept for a takeover; True if it is sent."""
        key = event_key(expression, body.encode())
        if expression in self.emitting:
            self.last_sent[expression] = key
            return True
        q = self.recent.get(expression)
        if q is None:
            q = self.recent[expression] = deque(maxlen=RECENT_EVENTS)
        q.append((time.monotonic(), body, qos, key))
        return False

    # ------------------------------------------------------------ synchronisation
    def tick(self) -> None:
        """Every refresh: waiting replicas ask the core again, or start on their own."""
        self.ticks += 1
        changed = False
        for expr, m in list(self.mine.items()):
            if m.synced:
                continue
            m.waited += 1
            members = self.p.members(self.p._code(expr))
            core = self.core(expr, members)
            if core is not None and core != self.p.me:
                if m.waited == 1 or m.waited % RESYNC_TICKS == 0:
                    self.p.send(core, {"t": "sync?", "expr": expr, "src": self.p.me})
                if m.waited < GIVE_UP_TICKS:
                    continue
                log.warning("composite %s: no state from the core %s, starting empty", expr[:60], core[:8])
            elif m.waited < GRACE_TICKS:
                continue
            elif not self._first(expr, m, members) and m.waited < GIVE_UP_TICKS:
                continue  # another new replica starts first; this one copies it
            m.synced = True
            changed = True
            self._release()
        if changed:
            self.p.reconcile()

    def _first(self, expression: str, m: _Mine, members: list[str]) -> bool:
        """Whether this replica is the one that starts a group's merge state: the smallest ID
        of the members heard of (none is synchronised), seed 001's core, on the side of a
        majority of the CSSU (a replica cut off with a minority waits for the core)."""
        if not self.p.quorate(self.p._code(expression), members):
            return False
        return all(self.p.me <= x for x in self._heard(expression, members))

    def sync_asked(self, expression: str, src: str) -> None:
        """A new replica asks for this node's merge state of ``expression``."""
        m = self.mine.get(expression)
        if m is None or not m.synced:
            return
        comp = self.p.broker.core.composite
        eng = comp.engine
        buffers = eng.buffers((m.sub.client_id, m.sub.name)) or {}
        parts = sorted(
            ((p.arrival, e, p.component) for e, ps in buffers.items() for p in ps),
            key=lambda x: x[0],
        )
        out = [
            [e, c.origin, c.topic, base64.b64encode(c.payload).decode(), c.qos, arrival]
            for arrival, e, c in parts
            if isinstance(c, Atom)
        ]
        seen: list[str] = []
        for element in buffers:
            atom_id = eng.atom_id(element)
            if atom_id is not None:
                seen.extend(comp.recent_origins(atom_id))
        self.p.send(src, {"t": "sync", "expr": expression, "parts": out, "seen": seen, "src": self.p.me})

    def synced_from(self, expression: str, msg: dict[str, Any]) -> None:
        """The core's merge state: offer its instances, then the held offers it had not."""
        m = self.mine.get(expression)
        if m is None or m.synced:
            return
        comp = self.p.broker.core.composite
        parts = [
            (str(e), Atom(str(topic), base64.b64decode(payload), int(qos), str(origin)))
            for e, origin, topic, payload, qos, _arrival in msg["parts"]
        ]
        known = {str(o) for o in msg["seen"]} | {a.origin for _e, a in parts}
        comp.mark_seen(sorted(known))
        produced = comp.install(parts)
        if produced:
            log.warning("composite %s: the core's state produced %d events here", expression[:60], produced)
        m.synced = True
        m.since = time.time()  # ranks after the core it copied (the core stays the core)
        self.syncs += 1
        self._release(known)
        self.p.reconcile()

    def _unsynced_atoms(self) -> set[int]:
        eng = self.p.broker.core.composite.engine
        out: set[int] = set()
        for m in self.mine.values():
            if not m.synced:
                for element in eng.buffers((m.sub.client_id, m.sub.name)) or {}:
                    atom_id = eng.atom_id(element)
                    if atom_id is not None:
                        out.add(atom_id)
        return out

    def _hold(self, msg: Message, atom_ids: list[int], origin: str) -> bool:
        """``Composites.hold``: keep offers to the atoms of a replica that waits for its
        state (in order, released by :meth:`_release`)."""
        if all(m.synced for m in self.mine.values()):
            return False
        if self.held or not self._unsynced_atoms().isdisjoint(atom_ids):
            self.held.append((msg, atom_ids, origin))
            return True
        return False

    def _release(self, known: set[str] | frozenset[str] = frozenset()) -> None:
        """Offer the held offers no waiting replica needs held any more (in order), except
        those of origin ids in ``known`` (the core had them)."""
        if not self.held:
            return
        waiting = self._unsynced_atoms()
        comp = self.p.broker.core.composite
        now = comp.core.clock.monotonic()
        keep: list[tuple[Message, list[int], str]] = []
        for msg, atom_ids, origin in self.held:
            if keep or not waiting.isdisjoint(atom_ids):
                keep.append((msg, atom_ids, origin))
            elif origin not in known:
                comp.offer_now(msg, atom_ids, now, Atom(msg.topic, msg.payload, msg.qos, origin))
        self.held = keep
        comp.core.flush()

    def sys_values(self) -> dict[str, str]:
        return {
            "$SYS/cluster/cssu/replicas": str(len(self.mine)),
            "$SYS/cluster/cssu/replicas_synchronised": str(sum(m.synced for m in self.mine.values())),
            "$SYS/cluster/cssu/syncs": str(self.syncs),
            "$SYS/cluster/cssu/takeovers": str(self.takeovers),
            "$SYS/cluster/cssu/events_replayed": str(self.replayed),
        }
