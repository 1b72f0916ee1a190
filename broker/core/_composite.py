"""Composite subscriptions inside the broker (issue 16, seed 001 sections 1, 4.1, 4.4, Fig. 8).

The engine (:mod:`composite`: expressions, shared reference-counted elements, buffers,
merging) is sans-IO; this module is its broker side:

* **Surface.**  A SUBSCRIBE to ``$composite/<name>`` is a composite subscription, the
  expression either in the filter itself, ``$composite/<name>/<expression>`` (MQTT 3.1.1 and
  5.0: the name ends at the first ``/``, so the expression may contain ``/``, ``#``, ``+``,
  spaces, anything), or, in MQTT 5, in the SUBSCRIBE's user property ``composite`` with the
  filter ``$composite/<name>`` (the in-filter expression wins when both are given, like
  ``$filter/`` over the ``filter`` property).  Optional MQTT 5 user properties
  ``composite-window`` (seconds) and ``composite-max-buffer`` set the subscription's window and
  cap (engine defaults otherwise).  The subscriber's identity in the engine is the key
  ``(client id, name)``: subscribing the same name again replaces the expression, UNSUBSCRIBE
  ``$composite/<name>`` (with or without the expression) and the end of the session remove
  it.  A bad expression or name is refused with SUBACK 0x8F (v5; 0x80 in 3.1.1) and a reason
  string (client input cut to 100 characters), logged at most once per 10 s
  (``Core.log_limit``, kind ``composite``).  With an authorize hook every atom's topic filter
  must be authorised for ``subscribe``.
* **Matching through the broker's index.**  Every atom the engine creates is entered into the
  router's :class:`topics.SubscriptionIndex` as the only subscription of a reserved client id,
  ``"\\x00composite/<atom id>"`` (U+0000 cannot occur in an MQTT client id), with QoS 2, the
  atom id as its subscription identifier and the atom's selector (reference-counted in the
  router's content engine like any selector).  ``Router.route`` therefore returns one route per
  atom the publication matches, through the same plan cache, topic tree and one
  ``engine.match`` per message as for every other subscriber: nothing scans composite
  subscriptions.  ``Core.publish`` collects those routes (they have no session) and hands the
  atom ids to :meth:`Composites.offer`.
* **Delivery.**  Each composite event the engine returns (``offer_many`` with the core's wall
  clock as ``now``) becomes one PUBLISH per subscriber on the topic ``$composite/<name>`` with
  the event's JSON payload (built once per event) and the QoS the engine computed (minimum of
  the subscription's and the components'), through ``Core.deliver``: flow control, QoS 1/2
  windows and queues, and the journal of persisted sessions apply as to any delivery.  The
  events of one publication are recorded for ``on_deliveries`` hooks as publications of their
  own (one call per composite event message), so the bridge sees them as deliveries on
  ``$composite/<name>``.

* **Observation** (hooks, ``broker.hooks``; the bridge records them).  ``on_composite_change``
  per subscribe / unsubscribe / session end / session expiry of a ``(client id, name)``;
  ``on_composite_event`` once per composite event the engine produces (with the firing
  subscription's buffer occupancy after the offer, ``CompositeEngine.occupancy``);
  ``on_composite_loss`` with the buffered instances the engine counted as expired or dropped
  (``CompositeEngine.track_losses`` only when a hook overrides the method), summed per
  (subscription, atom) in the engine and told at every tick, after an unsubscribe and at the
  broker's stop (:meth:`Composites.flush_losses`).  The engine counts those lazily, so
  :meth:`Composites.tick` (from ``Core.tick``) settles ``SWEEP_BUDGET`` subscriptions per
  call, round robin, while a loss hook is registered: an idle subscription's expiries are
  reported within about ``subscriptions / SWEEP_BUDGET`` ticks.  Nothing is built for a hook
  method no hook overrides; with none, a publication pays nothing here.  Before an unsubscribe
  the engine's clock is moved to the wall clock (``advance``), so components older than the
  window by then count as expired.

Costs: a publication matching no atom pays nothing here (no atom route); one matching k atoms
pays one ``offer_many`` (O(k + users for which an atom was absent), see the engine) plus the
deliveries.  Subscribe and unsubscribe cost the engine's operation plus one index entry per
atom created or removed.

Persistence (with a store): the composite subscriptions of persisted sessions, their buffers
and counters are journalled in the store (one row per subscribe, unsubscribe and offer to
their atoms, committed with the store's group commits: a SUBACK, UNSUBACK or PUBACK that
waits for the store waits for them) and snapshotted now and then beside the store
(``<store>.composite``, compaction of the journal): :mod:`broker.core._composite_log`; a
``kill -9`` loses nothing acknowledged, and an event stored for a persisted session is
never produced again.  docs/composite.md, "What persists".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from broker._logging import shown
from broker.core._atom_ids import RECENT_PER_ATOM, Atom, Recent, event_key, origin_in
from broker.core._composite_log import DURABLE, PENDING_MAX, CompositeLog
from broker.core._hooks import (
    CompositeAction,
    CompositeChange,
    CompositeEventRecord,
    CompositeLoss,
)
from broker.core._router import Subscribed, at_position
from broker.packets import NO_PROPERTIES, Properties, ReasonCode, SubscriptionRequest
from broker.values import ATOM_CLIENT, COMPOSITE_PREFIX, Message, SubOptions

if TYPE_CHECKING:
    import composite
    from broker.core._core import Core
    from broker.core._session import Session

__all__ = [
    "ATOM_CLIENT",
    "COMPOSITE_PREFIX",
    "SWEEP_BUDGET",
    "CompositeDelegate",
    "Composites",
    "split_composite",
]

# COMPOSITE_PREFIX, the filter prefix of a composite subscription (and the topic of its
# events), and ATOM_CLIENT, the index client id prefix of atoms, live in broker.values: the
# core tests them without importing this module (issue 42 item 1)
T = TypeVar("T")

#: composite subscriptions settled per :meth:`Composites.tick` while a hook observes losses
#: (about 1.5 ms per tick at 3 us each; with the default tick of 0.25 s, 2,000 per second)
SWEEP_BUDGET = 500


def split_composite(topic_filter: str) -> tuple[str, str | None]:
    """``$composite/<name>[/<expression>]`` -> (name, expression or None).

    Raises ValueError for an empty name or one with a wildcard.
    """
    rest = topic_filter[len(COMPOSITE_PREFIX) :]
    name, sep, expression = rest.partition("/")
    if not name or "+" in name or "#" in name:
        raise ValueError(f"{shown(topic_filter)}: $composite/<name>[/<expression>] expected")
    return name, (expression if sep else None)


class CompositeDelegate(Protocol):
    """Who matches the composite subscriptions of this broker's clients when this broker does
    not (the cluster: the core of the subscription's CSSU, seed 001; docs/cluster.md).  The
    events come back through :meth:`Composites.deliver_remote`."""

    def subscribe(self, client_id: str, name: str, expression: str, qos: int) -> None: ...

    def unsubscribe(self, client_id: str, name: str, expression: str) -> None: ...


class Composites:
    """The broker's composite subscriptions: the engine, the atoms' index entries, and the
    subscribers per client (for UNSUBSCRIBE and the end of a session)."""

    def __init__(self, core: Core) -> None:
        self.core = core
        #: the engine, made by the first use of :attr:`engine` (issue 42 item 1: a broker
        #: without composite subscriptions does not import :mod:`composite`)
        self._engine: composite.CompositeEngine | None = None
        self._track_losses = False
        #: client id -> name -> subscription identifiers (v5) of its composite subscriptions
        self.clients: dict[str, dict[str, tuple[int, ...]]] = {}
        self.offers = 0  # publications offered to the engine (matched at least one atom)
        self.events = 0  # composite events produced
        self.refused = 0  # composite subscriptions refused
        #: atom index client id -> its topic filter (what the cluster exports for atoms)
        self.atom_filters: dict[str, str] = {}
        #: told ``(atom client id, topic filter, added)`` when atoms come and go (the cluster)
        self.atom_listeners: list[Callable[[str, str, bool], None]] = []
        #: set by the cluster: clients' subscriptions are matched elsewhere (seed 001's CSSU)
        self.delegate: CompositeDelegate | None = None
        #: (client id, name) -> (canonical expression, qos) of the delegated subscriptions
        self.delegated: dict[tuple[str, str], tuple[str, int]] = {}
        self._by_expression: dict[str, set[tuple[str, str]]] = {}
        #: in a cluster (set by it): this process's origin id prefix (broker.core._atom_ids);
        #: atoms are then identified, offered at most once, and events delivered at most once
        self.origin_tag: str | None = None
        #: the origin id of the link copy being injected (set and cleared by the cluster)
        self.origin: str | None = None
        self._atoms_seen = Recent()
        self._by_atom: dict[int, deque[str]] = {}  # atom id -> origin ids offered lately
        #: set by the cluster: ``(message, atom ids, origin id)`` -> True if it keeps the offer
        self.hold: Callable[[Message, list[int], str], bool] | None = None
        self._events_seen = Recent()
        self.duplicate_atoms = 0  # atoms offered again (same origin id), not offered
        self.duplicate_events = 0  # remote events delivered already (same key), dropped
        #: the journal of the durable (persisted sessions') composite subscriptions
        self.log = CompositeLog(self)
        self._observe()

    @property
    def engine(self) -> composite.CompositeEngine:
        """The engine (:mod:`composite`), made and imported at the first use. O(1)."""
        eng = self._engine
        if eng is None:
            import composite

            eng = self._engine = composite.CompositeEngine()
            eng.track_losses(self._track_losses)
        return eng

    @engine.setter
    def engine(self, eng: composite.CompositeEngine) -> None:
        self._engine = eng

    def _observe(self) -> None:
        """Have the engine keep its losses when a hook wants them (after a restore too)."""
        self._track_losses = bool(self.core.obs.composite_loss)
        if self._engine is not None:
            self._engine.track_losses(self._track_losses)

    def flush_losses(self) -> None:
        """One ``on_composite_loss`` per (subscription, atom) with losses counted since the
        last flush (``CompositeEngine.drain_losses``: summed in the engine, a list increment
        per count); from :meth:`tick`, after an unsubscribe, before a restore and at the
        broker's stop."""
        core = self.core
        hooks = core.obs.composite_loss
        if not hooks or self._engine is None:  # no engine yet: nothing was lost
            return
        lost = self._engine.drain_losses()
        if not lost:
            return
        t = core.clock.wall()
        for expression, window, cap, element, expired, dropped in lost:
            loss = CompositeLoss(t, expression, window, cap, element, expired, dropped)
            core._call(hooks, "on_composite_loss", loss)

    def _tell(  # noqa: PLR0917
        self,
        client_id: str,
        name: str,
        action: CompositeAction,
        expression: str,
        window: float | None,
        cap: int | None,
        qos: int,
    ) -> None:
        core = self.core
        change = CompositeChange(
            core.clock.wall(),
            client_id,
            name,
            action,
            expression,
            window,
            cap,
            qos,
            len(self.clients.get(client_id, ())),
        )
        core._call(core.obs.composite_change, "on_composite_change", change)

    def tick(self) -> None:
        """Periodically (``Core.tick``): write the pending QoS 0 offers of the journal; settle
        the next ``SWEEP_BUDGET`` composite subscriptions at the wall clock, so that losses in
        idle ones reach the loss hooks, and tell the hooks the losses counted since the last
        tick (nothing of that without such a hook).  O(pending offers + SWEEP_BUDGET x atoms
        per subscription + (subscription, atom) pairs with losses)."""
        if self.log.pending:  # QoS 0 offers journalled at least once per tick
            self.log.flush()
        if self.core.obs.composite_loss and self.clients:
            self.engine.settle_some(self.core.clock.wall(), SWEEP_BUDGET)
            self.flush_losses()

    # ------------------------------------------------------------ subscriptions
    def subscribe_request(
        self,
        client_id: str,
        req: SubscriptionRequest,
        properties: Properties,
        sub_id: int | None,
        authorize: Callable[[str], bool] | None,
    ) -> Subscribed:
        """One ``$composite/...`` request of a SUBSCRIBE; a refusal changes nothing."""
        import composite  # the first composite subscription imports the engine (issue 42 item 1)

        full = req.topic_filter
        try:
            name, expression = split_composite(full)
            window: float | None = None
            cap: int | None = None
            for key, value in properties.user_properties:
                if key == "composite" and expression is None:
                    expression = value
                elif key == "composite-window":
                    window = _number(float, key, value)
                elif key == "composite-max-buffer":
                    cap = _number(int, key, value)
            if expression is None:
                raise ValueError(
                    f"{shown(full)}: no expression (user property 'composite' or "
                    "$composite/<name>/<expression>)"
                )
            expr = composite.parse(expression)
        except composite.CompositeSyntaxError as exc:
            return self._refuse(
                client_id, f"composite {shown(expression or '')}: {at_position(exc, exc.position)}"
            )
        except ValueError as exc:
            return self._refuse(client_id, str(exc)[:300])
        if authorize is not None:
            for atom in expr.atoms():
                if not authorize(atom.topic):
                    return Subscribed(ReasonCode.NOT_AUTHORIZED, f"{shown(atom.topic)}: not authorized")
        limits = self.core.router.limits
        names = self.clients.get(client_id)
        if names is not None and name not in names and len(names) >= limits.max_subscriptions:
            return Subscribed(
                ReasonCode.QUOTA_EXCEEDED,
                f"{shown(full)}: more than {limits.max_subscriptions} composite subscriptions",
                "subscriptions",
            )
        qos = min(req.qos, limits.maximum_qos)
        if self.delegate is not None:
            self._delegate(client_id, name, expr.text, qos, () if sub_id is None else (sub_id,))
            topic = COMPOSITE_PREFIX + name
            return Subscribed(ReasonCode(qos), None, None, topic, topic, expr.text, False)
        try:
            self.add(client_id, name, expr, qos, window, cap, () if sub_id is None else (sub_id,))
        except ValueError as exc:  # window / cap out of range
            return self._refuse(client_id, str(exc)[:300])
        topic = COMPOSITE_PREFIX + name
        return Subscribed(ReasonCode(qos), None, None, topic, topic, expr.text, False)

    def _refuse(self, client_id: str, reason: str) -> Subscribed:
        self.refused += 1
        self.core.log_limit("composite", client_id, f"composite subscription refused: {reason}")
        return Subscribed(ReasonCode.TOPIC_FILTER_INVALID, reason)

    def add(  # noqa: PLR0917
        self,
        client_id: str,
        name: str,
        expression: str | composite.Expr,
        qos: int,
        window: float | None = None,
        max_buffer: int | None = None,
        sub_ids: tuple[int, ...] = (),
    ) -> str:
        """Subscribe ``(client_id, name)`` (replacing what it had); returns the canonical
        expression.  Raises ``CompositeSyntaxError`` / ValueError (nothing changed then)."""
        if not name or "/" in name or "+" in name or "#" in name:
            raise ValueError(f"composite subscription name {shown(name)}: no '/', '+' or '#' allowed")
        log = self.log
        log.flush()  # pending offers name atoms by id: written before any atom can go
        self.engine.advance(self.core.clock.wall())  # a replaced subscription's losses by now
        change = self.engine.subscribe(
            (client_id, name),
            expression,
            qos=qos,
            window=window,
            max_buffer=max_buffer,
            partition=DURABLE if log.durable(client_id) else 0,
        )
        self._apply(change)
        self.clients.setdefault(client_id, {})[name] = sub_ids
        log.subscribed((client_id, name), sub_ids)
        sub = self.engine.subscription((client_id, name))
        assert sub is not None
        if self.core.obs.composite_change:
            self._tell(
                client_id, name, CompositeAction.SUBSCRIBE, sub.expression, sub.window, sub.max_buffer, qos
            )
        return sub.expression

    def _delegate(
        self, client_id: str, name: str, expression: str, qos: int, sub_ids: tuple[int, ...]
    ) -> None:
        """Subscribe through :attr:`delegate` (replacing what ``(client_id, name)`` had)."""
        assert self.delegate is not None
        self.remove(client_id, name)
        key = (client_id, name)
        self.delegated[key] = (expression, qos)
        self._by_expression.setdefault(expression, set()).add(key)
        self.clients.setdefault(client_id, {})[name] = sub_ids
        self.log.delegated(key, expression, qos, sub_ids)
        self.delegate.subscribe(client_id, name, expression, qos)
        if self.core.obs.composite_change:
            self._tell(client_id, name, CompositeAction.SUBSCRIBE, expression, None, None, qos)

    def deliver_remote(self, expression: str, body: bytes, qos: int, now: float) -> int:
        """A composite event of ``expression`` matched elsewhere: one PUBLISH per local
        subscriber of it (``$composite/<name>``); returns the number delivered."""
        core = self.core
        n = 0
        key = event_key(expression, body)
        if key is not None and not self._events_seen.add(key):
            self.duplicate_events += 1  # merged twice (two cores, a redelivered atom): once
            return 0
        store = core.journal.store
        before = 0 if store is None else store.submitted
        durable = False
        for client_id, name in sorted(self._by_expression.get(expression, ())):
            s = core.sessions.get(client_id)
            if s is None:
                continue
            topic = COMPOSITE_PREFIX + name
            sub_qos = self.delegated[(client_id, name)][1]
            msg = Message.create(topic, body, qos, False, NO_PROPERTIES, None, now)
            sub_ids = self.clients.get(client_id, {}).get(name, ())
            core.deliver(s, msg, min(qos, sub_qos), False, sub_ids, topic, None, now)
            durable = durable or (client_id, name) in self.log.keys
            n += 1
        if durable and key is not None and store is not None:  # kept across a restart
            self.log.delivered(key, store.submitted - before)
        self.events += n > 0
        return n

    def seen_events(self, keys: list[str]) -> None:
        """Remote events delivered before (restored from the journal): dropped if sent again."""
        for key in keys:
            self._events_seen.add(key)

    def remove(
        self, client_id: str, name: str, action: CompositeAction = CompositeAction.UNSUBSCRIBE
    ) -> bool:
        """Unsubscribe ``(client_id, name)``; False if there was nothing.  ``action``: what
        the change hooks are told (UNSUBSCRIBE, SESSION_END, EXPIRED)."""
        names = self.clients.get(client_id)
        if names is None or names.pop(name, None) is None:
            return False
        self.log.flush()  # pending offers name atoms by id: written before any atom can go
        if not names:
            del self.clients[client_id]
        tell = bool(self.core.obs.composite_change)
        gone = self.delegated.pop((client_id, name), None)
        if gone is not None:
            self.log.removed((client_id, name))
            keys = self._by_expression[gone[0]]
            keys.discard((client_id, name))
            if not keys:
                del self._by_expression[gone[0]]
            if self.delegate is not None:
                self.delegate.unsubscribe(client_id, name, gone[0])
            if tell:
                self._tell(client_id, name, action, gone[0], None, None, gone[1])
            return True
        key = (client_id, name)
        eng = self.engine
        eng.advance(self.core.clock.wall())  # components past the window by now: expired
        had = eng.subscription(key) if tell else None  # settles: losses are told first
        qos = eng.qos_of(key)
        change = eng.unsubscribe(key)
        self.log.removed(key)
        if change is not None:
            self._apply(change)
        self.flush_losses()  # its last losses before its removal
        if had is not None and qos is not None:
            self._tell(client_id, name, action, had.expression, had.window, had.max_buffer, qos)
        return True

    def unsubscribe_request(self, client_id: str, raw: str) -> Subscribed:
        """One ``$composite/...`` filter of an UNSUBSCRIBE (0x00, 0x11, or 0x8F)."""
        try:
            name, _ = split_composite(raw)
        except ValueError:
            return Subscribed(ReasonCode.TOPIC_FILTER_INVALID)
        topic = COMPOSITE_PREFIX + name
        if self.remove(client_id, name):
            return Subscribed(ReasonCode.SUCCESS, None, "removed", topic, topic)
        return Subscribed(ReasonCode.NO_SUBSCRIPTION_EXISTED)

    def drop_client(self, client_id: str, expired: bool = False) -> int:
        """The session of ``client_id`` ended (``expired``: its expiry interval elapsed):
        every composite subscription of it goes."""
        names = self.clients.get(client_id)
        if not names:
            return 0
        n = len(names)
        action = CompositeAction.EXPIRED if expired else CompositeAction.SESSION_END
        for name in list(names):
            self.remove(client_id, name, action)
        return n

    def _apply(self, change: composite.Change) -> None:
        """Enter the new atoms into the router's index (and content engine), remove the old."""
        router = self.core.router
        for atom in change.removed:
            cid = ATOM_CLIENT + str(atom.id)
            router.index.unsubscribe(cid, atom.topic_filter)
            if atom.selector is not None:
                router.release_selector(atom.selector)
            self.atom_filters.pop(cid, None)
            for listener in self.atom_listeners:
                listener(cid, atom.topic_filter, False)
        for atom in change.added:
            if atom.selector is not None and atom.filter is not None:
                router.add_selector(atom.selector, atom.filter)
            options = SubOptions(
                2, subscription_id=atom.id, selector=atom.selector, topic_filter=atom.topic_filter
            )
            cid = ATOM_CLIENT + str(atom.id)
            router.index.subscribe(cid, atom.topic_filter, options)
            self.atom_filters[cid] = atom.topic_filter
            for listener in self.atom_listeners:
                listener(cid, atom.topic_filter, True)

    def subscriptions_of(self, client_id: str) -> dict[str, str]:
        """name -> canonical expression of ``client_id``'s composite subscriptions."""
        out = {}
        for name in self.clients.get(client_id, {}):
            sub = self.engine.subscription((client_id, name))
            if sub is not None:
                out[name] = sub.expression
            elif (client_id, name) in self.delegated:
                out[name] = self.delegated[(client_id, name)][0]
        return out

    def sys_values(self) -> dict[str, str]:
        """``$SYS/broker/composite/...`` counters (O(clients with composite subscriptions))."""
        return {
            "$SYS/broker/composite/subscribers": str(sum(len(n) for n in self.clients.values())),
            "$SYS/broker/composite/offers": str(self.offers),
            "$SYS/broker/composite/events": str(self.events),
            "$SYS/broker/composite/refused": str(self.refused),
            "$SYS/broker/composite/duplicate_atoms": str(self.duplicate_atoms),
            "$SYS/broker/composite/duplicate_events": str(self.duplicate_events),
        }

    def _check(self) -> None:
        """Invariants: the subscriber keys here are the engine's, and every atom of the engine
        is exactly one index entry of its reserved client id, with its id and selector.
        O(subscribers + atoms)."""
        eng = self.engine
        keys = {(cid, name) for cid, names in self.clients.items() for name in names} - set(self.delegated)
        assert all(names for names in self.clients.values())
        assert set(self.delegated) <= {(cid, name) for cid, names in self.clients.items() for name in names}
        assert {k for ks in self._by_expression.values() for k in ks} == set(self.delegated)
        assert all(eng.subscription(k) is not None for k in keys)
        assert eng.stats().subscribers == len(keys)
        index = self.core.router.index
        for atom in eng.atoms():
            entries = index.entries(ATOM_CLIENT + str(atom.id))
            assert len(entries) == 1, atom
            (entry,) = entries
            assert entry.topic_filter == atom.topic_filter and entry.options is not None
            assert entry.options.subscription_id == atom.id
            assert entry.options.selector == atom.selector
        eng._check()
        self.log._check()

    # ------------------------------------------------------------ publications
    def offer(self, msg: Message, atom_ids: list[int], now: float) -> None:
        """``msg`` matched the atoms ``atom_ids`` (from ``Router.route``): offer it, deliver
        every composite event as one PUBLISH per subscriber (``now``: the core's monotonic time
        for delivery; the engine gets the wall clock).  ``msg`` itself is the component
        (``composite.ComponentLike``: no copy).  One Python frame besides the engine's when
        the offer completes nothing and is not journalled (the common case)."""
        tag = self.origin_tag
        if tag is None:
            self.offer_now(msg, atom_ids, now, msg)
            return
        # a cluster's node: atoms identified, offered at most once, held while a replica
        # of their composite subscription is being synchronised (cluster._placement)
        oid = self.origin or origin_in(msg.properties) or f"{tag}.{msg.message_id}"
        self.origin = None
        if not self._atoms_seen.add(oid):
            self.duplicate_atoms += 1
            return
        hold = self.hold
        if hold is not None and hold(msg, atom_ids, oid):
            return
        self.offer_now(msg, atom_ids, now, Atom(msg.topic, msg.payload, msg.qos, oid))

    def seen(self, origin: str) -> bool:
        """Whether an atom of origin id ``origin`` was offered here lately (or is held)."""
        return origin in self._atoms_seen

    def mark_seen(self, origins: list[str]) -> None:
        """Count ``origins`` as offered (a replica synchronised from another member)."""
        for o in origins:
            self._atoms_seen.add(o)

    def recent_origins(self, atom_id: int) -> list[str]:
        """The origin ids last offered to atom ``atom_id`` (oldest first)."""
        return list(self._by_atom.get(atom_id, ()))

    def install(self, parts: list[tuple[str, Atom]]) -> int:
        """Offer buffered instances copied from another node's engine, ``(element, atom)``
        oldest first, to this engine's atoms of those elements (a replica's synchronisation,
        cluster._placement); their origin ids count as offered.  Returns the number of
        composite events that produced (none when the copy is a consistent state)."""
        eng = self.engine
        n = 0
        now = self.core.clock.monotonic()
        for element, atom in parts:
            self._atoms_seen.add(atom.origin)
            atom_id = eng.atom_id(element)
            if atom_id is None:
                continue
            events = eng.offer(atom_id, atom, self.core.clock.wall())
            if events:
                n += len(events)
                self._deliver(events, now)
        return n

    def offer_now(
        self, msg: Message, atom_ids: list[int], now: float, component: composite.ComponentLike
    ) -> None:
        """:meth:`offer` without identification, deduplication and holding."""
        if component is not msg:
            by_atom = self._by_atom
            origin: str = component.origin  # type: ignore[attr-defined]
            for a in atom_ids:
                q = by_atom.get(a)
                if q is None:
                    q = by_atom[a] = deque(maxlen=RECENT_PER_ATOM)
                q.append(origin)
        self.offers += 1
        log = self.log
        durable = log.atoms
        journal = bool(durable) and not durable.keys().isdisjoint(atom_ids)
        if journal and msg.qos:
            self._offer_journalled(msg, atom_ids, now)  # after its events' messages: one commit
            return
        eng = self.engine
        if len(atom_ids) == 1:
            events = eng.offer(atom_ids[0], component, self.core.clock.wall())
        else:
            events = eng.offer_many(atom_ids, component, self.core.clock.wall())
        if journal:  # a QoS 0 offer: kept for the next OFFERS row
            pending = log.pending
            pending.append(msg)
            log.pending_clock.append(eng.clock)
            log.pending_atoms.append(atom_ids[0] if len(atom_ids) == 1 else sorted(set(atom_ids)))
            if len(pending) >= PENDING_MAX:
                log.flush()
        if events:
            self._deliver(events, now)  # QoS 0 offer: QoS 0 events, never stored

    def _offer_journalled(self, msg: Message, atom_ids: list[int], now: float) -> None:
        """The offer, then its journal row (``writes``: the store operations the events
        queued, committed with it); the publisher is paused while the store is too far behind
        (``Journal.bound``, as for its QoS 1/2 writes)."""
        core = self.core
        store = core.journal.store
        before = 0 if store is None else store.submitted
        if len(atom_ids) == 1:
            events = self.engine.offer(atom_ids[0], msg, core.clock.wall())
        else:
            events = self.engine.offer_many(atom_ids, msg, core.clock.wall())
        if events:
            self._deliver(events, now)
        self.log.offered(atom_ids, msg, 0 if store is None else store.submitted - before)
        conn = core.current
        if conn is not None:
            core.journal.bound(conn)

    def _deliver(self, events: list[composite.CompositeEvent], now: float) -> None:
        """Each composite event as one PUBLISH per subscriber (``Core.deliver``)."""
        core = self.core
        self.events += len(events)
        if core.obs.composite_event:
            self._record(events)
        sessions = core.sessions
        clients = self.clients
        obs = core.obs
        for ev in events:
            body = ev.payload()
            by_name: dict[str, Message] = {}
            for key, qos in ev.deliveries:
                client_id: str = key[0]  # type: ignore[index]
                name: str = key[1]  # type: ignore[index]
                s: Session | None = sessions.get(client_id)
                if s is None:
                    continue
                out = by_name.get(name)
                topic = COMPOSITE_PREFIX + name
                if out is None:
                    out = by_name[name] = Message.create(topic, body, ev.qos, False, NO_PROPERTIES, None, now)
                sub_ids = clients.get(client_id, {}).get(name, ())
                if not obs.recording:
                    core.deliver(s, out, qos, False, sub_ids, topic, None, now)
                    continue
                outer_msg, outer_fan = obs.fan_msg, obs.fan
                outer_call = obs.begin(out)
                core.deliver(s, out, qos, False, sub_ids, topic, None, now)
                obs.end(core.clock.wall(), out, 1, outer_msg, outer_fan, outer_call, core.stats)

    def _record(self, events: list[composite.CompositeEvent]) -> None:
        """One ``on_composite_event`` per event, with its subscription's occupancy now."""
        core = self.core
        t = core.clock.wall()
        occupancy = self.engine.occupancy
        hooks = core.obs.composite_event
        for ev in events:
            got = occupancy(ev)
            if got is None:
                continue
            window, cap, buffered = got
            rec = CompositeEventRecord(
                t,
                ev.expression,
                window,
                cap,
                tuple([key for key, _ in ev.deliveries]),  # type: ignore[misc]  # (client id, name)
                ev.begin,
                ev.end,
                len(ev.components),
                ev.end - ev.begin,
                buffered,
            )
            core._call(hooks, "on_composite_event", rec)

    # ------------------------------------------------------------ persistence
    def dump(self, keep: Callable[[Hashable], bool] | None = None) -> bytes:
        """The snapshot of the durable composite subscriptions (``keep``: of the subscriber
        keys it accepts instead): :meth:`CompositeLog.dump`.  O(state)."""
        return self.log.dump(keep)

    def load(self, raw: bytes | None, rows: list[tuple[Any, ...]], keep: Callable[[str], bool]) -> int:
        """Restore a snapshot plus the journal rows above it (:meth:`CompositeLog.load`)."""
        return self.log.load(raw, rows, keep)

    def persistence(self, client_id: str, persisted: bool) -> None:
        """``client_id``'s session became persisted (``True``: its composite subscriptions
        are journalled from now on) or stopped being (``False``: a resumption with expiry 0);
        from ``Journal.connected``.  Each of its composite subscriptions moves to the other
        partition of the engine, with fresh buffers (a journal cannot hold what it missed).
        Rare: O(its composite subscriptions)."""
        names = self.clients.get(client_id)
        if not names:
            return
        eng = self.engine
        log = self.log
        log.flush()
        for name, sub_ids in list(names.items()):
            key = (client_id, name)
            got = self.delegated.get(key)
            if got is not None:
                if persisted:
                    log.delegated(key, got[0], got[1], sub_ids)
                else:
                    log.removed(key)
                continue
            sub = eng.subscription_of(key)
            if sub is None or (sub[4] == DURABLE) == persisted:
                continue
            expression, window, cap, qos, _ = sub
            change = eng.subscribe(
                key, expression, qos=qos, window=window, max_buffer=cap, partition=DURABLE if persisted else 0
            )
            self._apply(change)
            log.subscribed(key, sub_ids)


def _number(kind: Callable[[str], T], key: str, value: str) -> T:
    """``kind(value)``, or a ValueError that shows at most 100 characters of ``value``."""
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"user property {key}: {shown(value)} is not a number") from None
