"""A journal of engine calls, replayed after a restore (persistence without O(state) writes).

The engine is a deterministic function of its sequence of calls: subscribe, unsubscribe and
offer, each at a time ``now`` (the order of the events one offer returns is the only thing
left unspecified, and nothing depends on it).  A store can therefore keep a
:meth:`~composite.CompositeEngine.snapshot` taken now and then and, between two snapshots,
one small record per call; after a crash, :func:`replay` applies the records written since
the snapshot to :meth:`~composite.CompositeEngine.restore`'s engine and obtains the engine the
calls produced, without delivering the events the replayed offers complete again (they
were delivered, or stored as messages, before the crash).

The records:

* :class:`Subscribed`: ``subscribe(key, expression, qos, window, max_buffer, partition)``
  with the window and cap resolved (a restored engine's defaults may differ);
* :class:`Unsubscribed`: ``unsubscribe(key)``;
* :class:`Offered`: one publication offered to the atoms ``elements``, **by canonical
  element text and in the order the engine offered them** (``offer_many`` goes by ascending
  atom id, and the ids of a restored engine are new: the order matters, since an offer to one
  atom can complete an expression before the next atom of the same publication arrives).

Each record carries ``clock``: the engine's time right after the call (the largest ``now``
seen so far, so also when the wall clock stepped back), and :func:`replay` first moves the
replaying engine's clock there.  The replaying engine's time never exceeds the original's
(it only ever takes recorded values), so every replayed call sees the time the original
call saw.

A journal may leave out calls that concern no subscription kept: the behaviour of one
composite subscription depends only on the offers to its own atoms since it was created, its
window and cap, and the clock at each offer (docs/composite.md, "Semantics"), so a snapshot
restricted to some subscriber keys (``snapshot(keep=...)``) plus the records of those keys and
of the offers to their atoms replays to exactly their state -- provided the kept keys never
share a composite subscription with keys left out (whose buffers would hold offers the
journal does not have): give them a ``partition`` of their own (the model test checks it:
tests/composite/test_engine_model.py).  An offer record may name atoms that the replaying
engine does not have (used only by subscriptions that were left out): they are skipped.

Costs: recording is O(atoms of the call); :func:`replay` is the cost of the calls, minus
the building of event payloads (never asked for).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from composite._engine import CompositeEngine
from composite._event import ComponentLike

__all__ = ["Call", "Offered", "Subscribed", "Unsubscribed", "offered", "replay", "subscribed"]


@dataclass(frozen=True, slots=True)
class Subscribed:
    """``key`` subscribed to ``expression`` (canonical) with its resolved window and cap."""

    clock: float
    key: Hashable
    expression: str
    qos: int
    window: float
    max_buffer: int
    partition: int = 0


@dataclass(frozen=True, slots=True)
class Unsubscribed:
    """``key``'s composite subscription was removed."""

    clock: float
    key: Hashable


@dataclass(frozen=True, slots=True)
class Offered:
    """``component`` was offered to the atoms ``elements`` (canonical texts, in that order)."""

    clock: float
    elements: tuple[str, ...]
    component: ComponentLike


Call = Subscribed | Unsubscribed | Offered


def subscribed(engine: CompositeEngine, key: Hashable) -> Subscribed | None:
    """The record of ``key``'s subscription as it stands (right after ``subscribe``).
    O(1)."""
    sub = engine.subscription_of(key)
    if sub is None:
        return None
    expression, window, cap, qos, partition = sub
    return Subscribed(engine.clock, key, expression, qos, window, cap, partition)


def offered(engine: CompositeEngine, atom_ids: Sequence[int], component: ComponentLike) -> Offered:
    """The record of the offer just made to ``atom_ids`` (``offer`` for one id, ``offer_many``
    otherwise: the same distinct ids in ascending order).  O(k log k) for k ids."""
    ids = atom_ids if len(atom_ids) == 1 else sorted(set(atom_ids))
    return Offered(engine.clock, tuple(engine.elements_of(ids)), component)


def replay(engine: CompositeEngine, calls: Iterable[Call]) -> int:
    """Apply ``calls`` to ``engine`` in order, as the original engine received them;
    returns the number of composite events the replayed offers produced (not delivered:
    no payload is built).  Unknown atoms of an offer are skipped; removing a key that has
    no subscription is a no-op.  Raises ValueError for a record the engine refuses (a
    journal from another engine version)."""
    events = 0
    for call in calls:
        engine.advance(call.clock)
        if isinstance(call, Offered):
            for element in call.elements:
                atom_id = engine.atom_id(element)
                if atom_id is not None:
                    events += len(engine.offer(atom_id, call.component, call.clock))
        elif isinstance(call, Subscribed):
            engine.subscribe(
                call.key,
                call.expression,
                qos=call.qos,
                window=call.window,
                max_buffer=call.max_buffer,
                partition=call.partition,
            )
        else:
            engine.unsubscribe(call.key)
    return events
