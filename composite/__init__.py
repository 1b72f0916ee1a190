"""Composite subscriptions (seed 001, sections 1, 4.1, 4.4, Fig. 3-8): expressions such as
``(A|B)&C`` over topic/content atoms, decomposed into shared reference-counted elements, with
buffered merging of component events into composite events.

Sans-IO and broker-agnostic: no clock, no sockets, no asyncio; this package imports only
``topics`` and ``content`` (never ``broker`` or ``bridge``).  docs/composite.md is the user
documentation (grammar, semantics, payload, figures).

Modules:

* ``_syntax`` — the language: :func:`parse` (errors are :class:`CompositeSyntaxError` with a
  ``.position``), canonical form (:func:`canonical`), :class:`Atom` / :class:`Op` values.
* ``_elements`` — decomposeSub with sharing: one element per canonical text, reference
  counted (Fig. 5, Fig. 7); compiled per-shape satisfaction and witness functions.
* ``_engine`` — :class:`CompositeEngine`: composite subscriptions, per-atom shared logs with
  per-subscription cursors, merging (Fig. 8), expiry, caps, counters, snapshot/restore.
* ``_event`` — :class:`Component` (offered), :class:`CompositeEvent` and :class:`Part`
  (produced) and the event's JSON payload.
* ``_journal`` — records of the engine's calls (:class:`Subscribed`, :class:`Unsubscribed`,
  :class:`Offered`; :func:`subscribed`, :func:`offered` make them) and :func:`replay`, which
  applies them to a restored engine (persistence: snapshot + journal).

How a broker drives it (the interface; every call is synchronous and cheap)::

    eng = CompositeEngine(window=60.0, max_buffer=64)        # the defaults

    # SUBSCRIBE: key = the broker's identity of this subscription (hashable and, if it is
    # persisted with snapshot(), storable), e.g. (client_id, "$composite/<name>").
    change = eng.subscribe(key, expression, qos=granted_qos, window=None, max_buffer=None)
    for atom in change.added:      # start matching: atom.id, atom.topic_filter, atom.selector,
        index.add(atom.id, ...)    # atom.filter (content.Filter or None)
    for atom in change.removed:    # stop matching
        index.remove(atom.id)
    # CompositeSyntaxError (a ValueError with .position) -> SUBACK 0x8F (v5) / 0x80 (3.1.1)

    # UNSUBSCRIBE / session end
    change = eng.unsubscribe(key)   # None if key had no composite subscription

    # PUBLISH: the broker matches the message against its own topic index and content engine
    # holding the atoms (never a scan over composite subscriptions), then
    comp = Component(topic, payload, qos)
    for ev in eng.offer_many(matched_atom_ids, comp, now):   # or eng.offer(one_id, comp, now)
        body = ev.payload()                                   # JSON, built once per event
        for key, qos in ev.deliveries:                        # QoS already min'ed
            deliver(key, body, qos)

    eng.tick(now)                   # now and then: frees log entries nobody can use any more
    eng.track_losses(True); eng.drain_losses()   # instances counted dropped/expired since the last drain
    eng.occupancy(event)            # (window, max_buffer, buffered now) of the subscription that fired
    data = eng.snapshot()           # plain data; CompositeEngine.restore(data) rebuilds it
    eng.subscriptions(); eng.stats()   # counters for $SYS, analytics and Fig. 10

``now`` is seconds on any non-decreasing clock (wall-clock time is best: arrival, begin and
end appear in payloads and must survive restarts); a smaller value than seen before is read as
the current time.  The engine is a deterministic function of its sequence of calls (only the
order of the events returned by one offer is unspecified), so persistence can be a snapshot
plus a journal of the calls since, replayed after :meth:`CompositeEngine.restore` (offers
recorded by atom element text, in the order they were offered; :func:`replay` maps them to
the new ids)::

    data = eng.snapshot(keep=lambda key: ...)      # now and then (compaction)
    journal.append(subscribed(eng, key))            # after each subscribe of a kept key
    journal.append(Unsubscribed(eng.clock, key))    # after each unsubscribe
    journal.append(offered(eng, atom_ids, comp))    # after each offer to their atoms
    # after a crash:
    eng = CompositeEngine.restore(data); replay(eng, journal)   # no event delivered again

Seam (docs/architecture.md, "Seams"): this module is the package's public face, for the
broker (its core drives :class:`CompositeEngine`) and for users who parse expressions; nobody
outside ``composite`` imports its ``_``-modules (``tests/test_layers.py``). Stable: the names
in ``__all__`` and the interface above, within a release.
"""

from __future__ import annotations

from composite._elements import AtomInfo
from composite._engine import (
    DEFAULT_MAX_BUFFER,
    DEFAULT_WINDOW,
    Change,
    CompositeEngine,
    EngineStats,
    Loss,
    SubscriptionStats,
)
from composite._event import Component, ComponentLike, CompositeEvent, Delivery, Part
from composite._journal import Call, Offered, Subscribed, Unsubscribed, offered, replay, subscribed
from composite._syntax import (
    MAX_ATOMS,
    MAX_DEPTH,
    MAX_EXPRESSION_LENGTH,
    Atom,
    CompositeSyntaxError,
    Expr,
    Op,
    canonical,
    parse,
)

__all__ = [
    "DEFAULT_MAX_BUFFER",
    "DEFAULT_WINDOW",
    "MAX_ATOMS",
    "MAX_DEPTH",
    "MAX_EXPRESSION_LENGTH",
    "Atom",
    "AtomInfo",
    "Call",
    "Change",
    "Component",
    "ComponentLike",
    "CompositeEngine",
    "CompositeEvent",
    "CompositeSyntaxError",
    "Delivery",
    "EngineStats",
    "Expr",
    "Loss",
    "Offered",
    "Op",
    "Part",
    "Subscribed",
    "SubscriptionStats",
    "Unsubscribed",
    "canonical",
    "offered",
    "parse",
    "replay",
    "subscribed",
]
