"""Durability of composite subscriptions: a journal in the store, snapshots as compaction.

The composite subscriptions of persisted sessions (session expiry > 0, with a store), their
buffers and counters survive a restart and a ``kill -9`` (issue 16, item 5; docs/composite.md,
"What persists").  The engine is a deterministic function of its calls
(:mod:`composite._journal`), so the state on disk is

* a **snapshot** file beside the store, ``<store>.composite`` (JSON of
  ``CompositeEngine.snapshot(keep=durable keys)``, the clients' subscription identifiers and
  the delegated subscriptions), which names the last journal row it includes (``journal``);
* the **journal**, the store's table ``composite_journal``: one row per call since, written
  through the store's queue like every other durable change, so it shares its group commits
  (no fsync of its own) and the acknowledgements that wait for them:

  ===================  ======================================================================
  kind                 fields
  ===================  ======================================================================
  1 ``OFFER``          clock, topic, payload, qos; ``data``: the atom's element text
  2 ``OFFER_MANY``     the same; ``data``: JSON list of element texts, in the order offered
  3 ``SUBSCRIBE``      clock, qos; ``data``: JSON [client id, name, expression, window, cap,
                       subscription identifiers]
  4 ``UNSUBSCRIBE``    clock; ``data``: JSON [client id, name]
  5 ``DELEGATE``       qos; ``data``: JSON [client id, name, expression, subscription ids]
  6 ``OFFERS``         QoS 0 offers, ``data``: JSON {"clock": [...], "atoms": [atom id or ids,
                       ...], "elements": {atom id: element text}, "topics": [...], "sizes":
                       [payload length, ...]}; ``payload``: the payloads, concatenated
  7 ``DELIVERED``      ``data``: the key of a remote composite event (``event_key``) delivered
                       to a durable (delegated) subscription; ``writes``: its stored messages
  ===================  ======================================================================

What is journalled, and when it is durable:

* A composite SUBSCRIBE of a persisted session writes its row before the SUBACK is queued,
  and the SUBACK of a persisted session waits for the store's commit (``Journal.hold``), as for
  any subscription; UNSUBSCRIBE, the end or expiry of the session likewise (``UNSUBSCRIBE``
  rows).  A delegated subscription (the cluster matches it elsewhere) is a ``DELEGATE`` row.
* Those subscriptions live in their own engine partition (:data:`DURABLE`): they never share
  buffers with subscriptions that are not journalled, so every instance they buffer came
  from a journalled offer.
* A publication that matches an atom used by at least one durable subscription writes one
  ``OFFER`` row after the composite events it completed were delivered.  QoS 0 ones are
  written in batches (``OFFERS`` rows of up to :data:`PENDING_MAX` offers: before any other
  row, at every broker tick, before a snapshot, or when the batch is full), nobody waiting for
  them: a ``kill -9`` loses those of the last tick at most (QoS 0).  A composite event completed
  by a QoS 0 offer contains that component, so its QoS is 0 and it is never stored: a batched
  offer has no event messages to commit with.  Its ``writes`` field counts the store operations its events
  queued (their messages for persisted sessions); the store never commits the row apart from
  them (``_store._batches``), so the components an event consumed and the event's stored
  messages are durable together: after a crash, either both or neither.  A QoS 1/2
  publication's PUBACK/PUBREC waits for that commit (the connection sees that the store was
  written).  Offers that touch no durable subscription write nothing.
* A composite event matched at another node (the cluster's core) and delivered here to a
  delegated subscription of a persisted session writes a ``DELIVERED`` row with the event's
  key, committed with the messages it stored.  The keys of the last :data:`EVENTS_MAX` such
  events are in the snapshot too, so after a restart (even ``kill -9``) an event a new core
  sends again (about a refresh's worth, ``cluster._replicas``) is still recognised and
  dropped (issue 30: the one doubled event of nemesis run 9, after a ``leave`` of the access
  node).
* Replay (:meth:`CompositeLog.load`, at start): the snapshot, then the rows above its
  ``journal`` through :func:`composite.replay` (no event delivered again: the events the
  replayed offers completed were delivered or stored before the crash), then the subscriptions
  of sessions that did not come back are dropped.

Costs on the event loop: a row is a tuple on the store's queue (O(1)); ``OFFER`` rows cost one
dict lookup per matched atom to decide.  :meth:`CompositeLog.dump` is O(durable state); the
broker takes it in a forked child process, so the event loop only pays the ``fork``
(``broker/_composite_saver.py``).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from broker.core._atom_ids import Recent

# composite, orjson and base64 are imported by the functions that use them: the core makes a
# CompositeLog at start, and a broker without composite subscriptions and without a store
# never calls them (issue 42 item 1, docs/performance.md "Footprint")
if TYPE_CHECKING:
    import composite
    from broker.core._composite import Composites
    from broker.durability import Store

__all__ = [
    "DELEGATE",
    "DELIVERED",
    "DURABLE",
    "EVENTS_MAX",
    "OFFER",
    "OFFERS",
    "OFFER_MANY",
    "PENDING_MAX",
    "SNAPSHOT_VERSION",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
    "CompositeLog",
]

#: the engine partition of the journalled (durable) composite subscriptions
DURABLE = 1
#: journal row kinds
OFFER, OFFER_MANY, SUBSCRIBE, UNSUBSCRIBE, DELEGATE, OFFERS, DELIVERED = 1, 2, 3, 4, 5, 6, 7
#: keys of remote events delivered to durable subscriptions that a snapshot keeps (the last
#: ones; a new core sends again about a refresh's worth of events: far fewer)
EVENTS_MAX = 16_384
#: QoS 0 offers kept for one ``OFFERS`` row at most
PENDING_MAX = 256
#: format of :meth:`CompositeLog.dump` (1: snapshots without journal, every subscription in
#: partition 0)
SNAPSHOT_VERSION = 2

Key = tuple[str, str]  # (client id, name)


class CompositeLog:
    """Which composite subscriptions are durable, and their journal rows (see the module
    docstring).  ``keys``: durable key -> ids of the atoms it uses (() when delegated);
    ``atoms``: atom id -> number of durable keys using it (what an offer checks)."""

    def __init__(self, comps: Composites) -> None:
        self.comps = comps
        self.keys: dict[Key, tuple[int, ...]] = {}
        self.atoms: dict[int, int] = {}
        self.seq = 0  # the last journal row written
        self.rows = 0  # rows (offers, for batches) written since the last snapshot
        #: QoS 0 offers not written yet, in three columns appended by ``Composites.offer``:
        #: the messages, the engine's clock after each offer, and the atom id (or the sorted
        #: distinct ids) offered to; :meth:`flush` names the atoms by element text
        #: (``Composites`` flushes before any change that can remove an atom)
        self.pending: list[composite.ComponentLike] = []
        self.pending_clock: list[float] = []
        self.pending_atoms: list[int | list[int]] = []
        self.replayed = 0  # rows replayed by the last load
        #: keys of the remote events delivered to durable subscriptions lately (oldest first)
        self.events = Recent(EVENTS_MAX)

    @property
    def store(self) -> Store | None:
        return self.comps.core.journal.store

    def durable(self, client_id: str) -> bool:
        """Whether ``client_id``'s composite subscriptions are journalled now: its session is
        persisted (which implies a store)."""
        s = self.comps.core.sessions.get(client_id)
        return s is not None and s.persisted and self.store is not None

    def _write(  # noqa: PLR0917
        self,
        kind: int,
        clock: float,
        topic: str | None = None,
        payload: bytes | None = None,
        qos: int | None = None,
        data: str | None = None,
        writes: int = 0,
    ) -> None:
        store = self.store
        if store is None:
            return
        if self.pending:  # rows stay in call order
            self.flush()
        self.seq += 1
        self.rows += 1
        store.composite_record((self.seq, kind, _finite(clock), topic, payload, qos, data, writes))

    def flush(self) -> None:
        """Write the pending QoS 0 offers as one ``OFFERS`` row (columns: a few C-level passes
        over them).  O(pending)."""
        msgs = self.pending
        if not msgs:
            return
        clocks, atoms = self.pending_clock, self.pending_atoms
        self.pending, self.pending_clock, self.pending_atoms = [], [], []
        store = self.store
        if store is None:
            return
        ids = _flat(atoms)
        eng = self.comps.engine
        elements = {str(i): t for i in ids if (t := eng.element_of(i)) is not None}
        data = _json(
            {
                "clock": clocks,
                "atoms": atoms,
                "elements": elements,
                "topics": [m.topic for m in msgs],
                "sizes": [len(m.payload) for m in msgs],
            }
        )
        self.seq += 1
        self.rows += len(msgs)
        payloads = b"".join([m.payload for m in msgs])
        store.composite_record((self.seq, OFFERS, clocks[-1], None, payloads, 0, data, 0))

    # ------------------------------------------------------------ records
    def subscribed(self, key: Key, sub_ids: tuple[int, ...]) -> None:
        """``key`` was just subscribed in the engine (``Composites.add``): journal it when it
        is in the durable partition, and count its atoms.  O(atoms)."""
        eng = self.comps.engine
        old = self.keys.pop(key, None)
        if old is not None:
            self._release(old)
        got = eng.subscription_of(key)
        if got is None:
            return
        expression, window, cap, qos, partition = got
        if partition != DURABLE:
            if old is not None:  # no longer journalled: forget it on replay
                self._write(UNSUBSCRIBE, eng.clock, data=_json([key[0], key[1]]))
            return
        self.keys[key] = ids = _atom_ids(eng, expression)
        atoms = self.atoms
        for i in ids:
            atoms[i] = atoms.get(i, 0) + 1
        self._write(
            SUBSCRIBE,
            eng.clock,
            qos=qos,
            data=_json([key[0], key[1], expression, window, cap, list(sub_ids)]),
        )

    def delegated(self, key: Key, expression: str, qos: int, sub_ids: tuple[int, ...]) -> None:
        """``key`` was delegated to the cluster (``Composites._delegate``)."""
        if not self.durable(key[0]):
            return
        self.keys[key] = ()
        self._write(DELEGATE, self.comps.engine.clock, qos=qos, data=_json([*key, expression, list(sub_ids)]))

    def removed(self, key: Key) -> None:
        """``key`` was removed (unsubscribe, session end or expiry, replacement)."""
        ids = self.keys.pop(key, None)
        if ids is None:
            return
        self._release(ids)
        self._write(UNSUBSCRIBE, self.comps.engine.clock, data=_json([key[0], key[1]]))

    def _release(self, ids: tuple[int, ...]) -> None:
        atoms = self.atoms
        for i in ids:
            n = atoms[i] - 1
            if n:
                atoms[i] = n
            else:
                del atoms[i]

    def offered(self, atom_ids: list[int], comp: composite.ComponentLike, writes: int) -> None:
        """The offer of ``comp`` to ``atom_ids`` (some used by a durable key) just happened;
        ``writes``: store operations its composite events queued (their messages)."""
        eng = self.comps.engine
        if len(atom_ids) == 1:
            elements = eng.elements_of(atom_ids)
            kind, data = OFFER, elements[0] if elements else ""
        else:
            kind, data = OFFER_MANY, _json(eng.elements_of(sorted(set(atom_ids))))
        self._write(kind, eng.clock, comp.topic, comp.payload, comp.qos, data, writes)

    def delivered(self, key: str, writes: int) -> None:
        """The remote composite event ``key`` was delivered to durable subscriptions;
        ``writes``: the store operations the deliveries queued (committed with the row)."""
        self.events.add(key)
        self._write(DELIVERED, self.comps.engine.clock, data=key, writes=writes)

    # ------------------------------------------------------------ snapshot and replay
    def dump(self, keep: Callable[[Hashable], bool] | None = None) -> bytes:
        """The snapshot: the durable keys' composite subscriptions (``keep``: other keys,
        e.g. all of them for a benchmark), their buffers and counters, their clients'
        subscription identifiers, the delegated ones, and the last journal row it includes.
        O(state); the cyclic garbage collector is off meanwhile (a large snapshot's million
        small containers would otherwise trigger collections over the whole heap)."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._dump(self.keys.__contains__ if keep is None else keep)
        finally:
            if enabled:
                gc.enable()

    def _dump(self, keep: Callable[[Hashable], bool]) -> bytes:
        from base64 import b64encode

        import orjson

        comps = self.comps
        data = comps.engine.snapshot(keep)
        for a in data["atoms"]:
            a["entries"] = [[t, topic, b64encode(p).decode(), q] for t, topic, p, q in a["entries"]]
        for sub in data["subscriptions"]:
            sub["subscribers"] = [[list(key), q] for key, q in sub["subscribers"]]
        data["clock"] = _finite(data["clock"])
        clients: dict[str, dict[str, list[int]]] = {}
        for cid, names in comps.clients.items():
            for name, ids in names.items():
                if keep((cid, name)):
                    clients.setdefault(cid, {})[name] = list(ids)
        delegated = [[cid, n, e, q] for (cid, n), (e, q) in sorted(comps.delegated.items()) if keep((cid, n))]
        doc = {
            "version": SNAPSHOT_VERSION,
            "journal": self.seq,
            "engine": data,
            "clients": clients,
            "delegated": delegated,
            "events": self.events.keys(),
        }
        return orjson.dumps(doc)

    def load(self, raw: bytes | None, rows: list[tuple[Any, ...]], keep: Callable[[str], bool]) -> int:
        """Replace the composite state by the snapshot ``raw`` (None: none) plus the journal
        ``rows`` above it, keeping the clients ``keep`` accepts (the sessions the store brought
        back); atoms are indexed again.  Delegated subscriptions are restored in
        ``Composites.delegated`` without telling the delegate (its owner re-sends them when it
        is up; without a delegate they are added to the engine).  Returns the subscribers
        restored.  Raises ValueError (or KeyError, TypeError) for a snapshot or row it cannot
        read.  The garbage collector is off meanwhile."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._load(raw, rows, keep)
        finally:
            if enabled:
                gc.enable()

    def _load(self, raw: bytes | None, rows: list[tuple[Any, ...]], keep: Callable[[str], bool]) -> int:
        eng, clients, delegated, after, keys = _read(raw, self.comps.engine)
        events = Recent(EVENTS_MAX)
        for key in keys:
            events.add(key)
        seq = after
        replayed = 0
        for row in rows:
            if row[0] <= after:
                continue
            seq = max(seq, int(row[0]))
            if row[1] == DELIVERED:
                events.add(str(row[6]))
            else:
                _apply_row(eng, row, clients, delegated)
            replayed += 1
        # sessions that did not come back (expired while the broker was down, ...)
        for cid in [c for c in clients if not keep(c)]:
            for name in clients.pop(cid):
                delegated.pop((cid, name), None)
                eng.unsubscribe((cid, name))
        self.seq = seq
        self.rows = self.replayed = replayed
        self.events = events
        self.comps.seen_events(events.keys())
        return self._install(eng, clients, delegated)

    def _install(
        self,
        eng: composite.CompositeEngine,
        clients: dict[str, dict[str, tuple[int, ...]]],
        delegated: dict[Key, tuple[str, int]],
    ) -> int:
        """Make ``eng`` the broker's engine (atoms indexed) with these clients and delegated
        subscriptions, all durable; returns the number of subscribers."""
        import composite

        comps = self.comps
        self.pending, self.pending_clock, self.pending_atoms = [], [], []  # (none at start)
        comps._apply(composite.Change((), tuple(comps.engine.atoms())))
        comps.flush_losses()  # what the replaced engine counted
        comps.engine = eng
        comps._observe()
        comps._apply(composite.Change(tuple(eng.atoms()), ()))
        comps.clients = {}
        comps.delegated = {}
        comps._by_expression = {}
        self.keys = {}
        self.atoms = {}
        n = 0
        for cid, names in clients.items():
            for name, ids in names.items():
                key = (cid, name)
                n += 1
                got = delegated.get(key)
                if got is None:
                    sub = eng.subscription_of(key)
                    assert sub is not None
                    self.keys[key] = atom_ids = _atom_ids(eng, sub[0])
                    for i in atom_ids:
                        self.atoms[i] = self.atoms.get(i, 0) + 1
                elif comps.delegate is None:  # no cluster any more: matched here from now on
                    comps.add(cid, name, got[0], got[1], sub_ids=ids)
                    continue
                else:  # the delegate is told by its owner once it can reach its peers
                    comps.delegated[key] = got
                    comps._by_expression.setdefault(got[0], set()).add(key)
                    self.keys[key] = ()
                comps.clients.setdefault(cid, {})[name] = ids
        return n

    def _check(self) -> None:
        """Invariants: the durable keys are the engine's partition-DURABLE keys plus durable
        delegated ones, and ``atoms`` counts their atoms.  O(durable keys x atoms)."""
        eng = self.comps.engine
        counts: dict[int, int] = {}
        for key, ids in self.keys.items():
            got = eng.subscription_of(key)
            if got is None:
                assert key in self.comps.delegated and ids == ()
                continue
            assert got[4] == DURABLE
            assert sorted(ids) == sorted(_atom_ids(eng, got[0]))
            for i in ids:
                counts[i] = counts.get(i, 0) + 1
        assert counts == self.atoms
        for cid, names in self.comps.clients.items():
            for name in names:
                got = eng.subscription_of((cid, name))
                assert got is None or (got[4] == DURABLE) == ((cid, name) in self.keys)


_Clients = dict[str, dict[str, tuple[int, ...]]]


def _read(
    raw: bytes | None, current: composite.CompositeEngine
) -> tuple[composite.CompositeEngine, _Clients, dict[Key, tuple[str, int]], int, list[str]]:
    """A snapshot (:meth:`CompositeLog.dump`; None: none) as (engine, client id -> name ->
    subscription identifiers, delegated key -> (expression, QoS), last journal row in it,
    keys of the remote events delivered to durable subscriptions, oldest first).
    Every subscription it restores is in the durable partition.  Without a snapshot, an empty
    engine with ``current``'s defaults."""
    from base64 import b64decode

    import orjson

    import composite

    clients: dict[str, dict[str, tuple[int, ...]]] = {}
    delegated: dict[Key, tuple[str, int]] = {}
    if raw is None:
        return composite.CompositeEngine(current.window, current.max_buffer), clients, delegated, 0, []
    doc = orjson.loads(raw)
    version = doc.get("version")
    if version not in (1, SNAPSHOT_VERSION):
        raise ValueError(f"unknown composite snapshot version {version!r}")
    data = doc["engine"]
    if data["clock"] is None:
        data["clock"] = float("-inf")
    for sub in data["subscriptions"]:
        sub["subscribers"] = [[tuple(key), q] for key, q in sub["subscribers"]]
        sub["partition"] = DURABLE  # (version 1 had no partitions)
    for a in data["atoms"]:
        a["entries"] = [[t, topic, b64decode(p), q] for t, topic, p, q in a["entries"]]
    eng = composite.CompositeEngine.restore(data)
    ids = doc["clients"]
    for sub in data["subscriptions"]:
        for (cid, name), _ in sub["subscribers"]:
            clients.setdefault(cid, {})[name] = tuple(ids.get(cid, {}).get(name, ()))
    for cid, name, expression, qos in doc.get("delegated", ()):
        delegated[(cid, name)] = (expression, int(qos))
        clients.setdefault(cid, {})[name] = tuple(ids.get(cid, {}).get(name, ()))
    events = [str(k) for k in doc.get("events", ())]
    return eng, clients, delegated, int(doc.get("journal", 0)), events


def _atom_ids(eng: composite.CompositeEngine, expression: str) -> tuple[int, ...]:
    """The ids of the (distinct) atoms of ``expression`` in ``eng``.  O(atoms)."""
    import composite

    return tuple(i for a in composite.parse(expression).atoms() if (i := eng.atom_id(a.text)) is not None)


def _apply_row(
    eng: composite.CompositeEngine,
    row: tuple[Any, ...],
    clients: dict[str, dict[str, tuple[int, ...]]],
    delegated: dict[Key, tuple[str, int]],
) -> None:
    """Replay one journal row on ``eng`` and the clients' maps (no event delivered)."""
    import orjson

    import composite

    _seq, kind, clock, topic, payload, qos, data, _writes = row
    clock = float("-inf") if clock is None else float(clock)
    if kind == OFFERS:
        doc = orjson.loads(data)
        names = doc["elements"]
        at = 0
        calls = []
        for t, ids, topic_, n in zip(doc["clock"], doc["atoms"], doc["topics"], doc["sizes"], strict=True):
            texts = tuple(names[str(i)] for i in ([ids] if isinstance(ids, int) else ids) if str(i) in names)
            comp = composite.Component(topic_, bytes(payload[at : at + n]), 0)
            at += n
            calls.append(composite.Offered(float(t), texts, comp))
        composite.replay(eng, calls)
        return
    if kind in (OFFER, OFFER_MANY):
        elements = (data,) if kind == OFFER else tuple(orjson.loads(data))
        comp = composite.Component(topic, bytes(payload), int(qos))
        composite.replay(eng, [composite.Offered(clock, elements, comp)])
        return
    fields = orjson.loads(data)
    key: Key = (fields[0], fields[1])
    if kind == SUBSCRIBE:
        _, _, expression, window, cap, ids = fields
        delegated.pop(key, None)
        call = composite.Subscribed(clock, key, expression, int(qos), float(window), int(cap), DURABLE)
        composite.replay(eng, [call])
        clients.setdefault(key[0], {})[key[1]] = tuple(ids)
    elif kind == UNSUBSCRIBE:
        if delegated.pop(key, None) is None:
            composite.replay(eng, [composite.Unsubscribed(clock, key)])
        names = clients.get(key[0])
        if names is not None:
            names.pop(key[1], None)
            if not names:
                del clients[key[0]]
    elif kind == DELEGATE:
        _, _, expression, ids = fields
        composite.replay(eng, [composite.Unsubscribed(clock, key)])
        delegated[key] = (expression, int(qos))
        clients.setdefault(key[0], {})[key[1]] = tuple(ids)
    else:
        raise ValueError(f"unknown composite journal row kind {kind!r}")


def _flat(atoms: list[int | list[int]]) -> set[int]:
    """The atom ids of pending offers, some to several atoms."""
    singles = [x for x in atoms if isinstance(x, int)]
    if len(singles) == len(atoms):  # the usual case: one C-level pass more
        return set(singles)
    out: set[int] = set()
    for x in atoms:
        if isinstance(x, int):
            out.add(x)
        else:
            out.update(x)
    return out


def _json(value: object) -> str:
    import orjson

    return orjson.dumps(value).decode()


def _finite(t: float) -> float | None:
    """JSON has no infinity: -inf (no time yet) as None."""
    return t if math.isfinite(t) else None
