"""The composite-subscription engine: subscriptions, buffers, merging (seed 001 section 4.4, Fig. 8).

Semantics (the contract; docs/composite.md states it for users, the model test re-implements
it by brute force):

* A *composite subscription* is (canonical expression, window w, cap k).  Subscriber keys
  subscribe to it, each with its QoS; keys with the same triple share it and its buffers.
* It buffers, per distinct atom of its expression, the instances (component, arrival) offered
  to that atom since it was created, oldest first.  The clock T is the largest ``now`` seen.
* An instance is *live* while ``arrival >= T - w``; older ones expire (counted ``expired``).
* Offering to atom a appends one instance to every composite subscription using a; a buffer
  that then holds more than k instances drops its oldest (counted ``dropped``).
* A subscription is *satisfied* when its expression is true with "atom present" meaning
  "has a live buffered instance".  A satisfied subscription emits one
  :class:`~composite._event.CompositeEvent` and consumes the oldest live instance of every
  atom of the *maximal witness*: all operands of an ``&``, every satisfied operand of an
  ``|`` (unsatisfied branches keep their instances).  Between offers no subscription is
  satisfied, so one offer yields at most one event per subscription.
* ``begin``/``end`` are the earliest/latest arrival among the consumed instances; each
  delivery's QoS is min(subscriber's QoS, components' QoS).

Implementation: buffers are not copied per subscription.  Each atom keeps one shared log of
its recent instances (sequence numbers, arrival times, components); a subscription keeps one
integer per atom, its *cursor*: the instances it buffers are the log entries from its cursor
on, minus the expired and cap-dropped prefix (consumption always takes the oldest, so a
buffer is always a suffix of the log).  "Atom i present" is then ``cursor < end and
last_arrival >= T - w`` — O(1).  Users of an atom are grouped by (w, k) (:class:`_Group`);
a group keeps the *waiting* set, the users whose cursor is at the log's end.  An offer to a
only changes the users for which a was absent, so it visits the waiting set — or, when a's
newest instance had expired for the group, every user of the group — and no one else.
offer() is therefore O(1 + users of a for which a was absent), O(uses of a) at worst, and
an atom that stays present for its subscriptions costs an append.

Counting drops lazily: whether log entry s is dropped (rather than expired) for a group does
not depend on the subscription: it is dropped iff it is still live when entry s+k arrives.
Each group keeps ``dcum``, the running count of such entries, so a subscription's drops over
the range of entries it skips is a difference of two prefix counts, computed when its cursor
moves (:meth:`CompositeEngine._skip`).  A log keeps what some user may still consume —
entries among the last ``kmax`` (the largest cap) and live for ``wmax`` (the largest window)
— trimmed in batches (at most 2 x kmax + 16 entries); prefix counts (4-byte entries, rebased
to 0) are rebased when they outgrow the log by max(1024, 16 x users), which moves stale
cursors (amortised 1/16 of a visit per offer; at most 64 bytes per user and atom).

No clock is read here: every operation takes ``now`` (seconds, non-decreasing; a smaller
value is treated as the current clock).  The broker should pass wall-clock time so arrival,
begin and end in payloads are meaningful and survive restarts with :meth:`snapshot`.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from composite._elements import (
    AtomElement,
    AtomInfo,
    ElementTable,
    SatFn,
    WitFn,
    shape_of,
    tree_size,
)
from composite._event import Component, ComponentLike, CompositeEvent, Part
from composite._syntax import Expr, parse

__all__ = [
    "DEFAULT_MAX_BUFFER",
    "DEFAULT_WINDOW",
    "Change",
    "CompositeEngine",
    "EngineStats",
    "Loss",
    "SubscriptionStats",
]

Loss = tuple[str, float, int, str, int, int]
"""``(expression, window, max_buffer, element, expired, dropped)``: instances of atom
``element`` that the engine counted as gone for the composite subscription (expression, window,
max_buffer) since the previous :meth:`CompositeEngine.drain_losses`."""

DEFAULT_WINDOW = 60.0
DEFAULT_MAX_BUFFER = 64
_DCUM_SLACK = 1024
#: prefix counts are rebased when they outgrow the log by max(_DCUM_SLACK, this x users)
_DCUM_FACTOR = 16
_TRIM_SLACK = 16
SNAPSHOT_FORMAT = 1

_arrival = attrgetter("arrival")


@dataclass(frozen=True, slots=True)
class Change:
    """Atoms the broker must start (``added``) and stop (``removed``) matching."""

    added: tuple[AtomInfo, ...] = ()
    removed: tuple[AtomInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class SubscriptionStats:
    expression: str
    window: float
    max_buffer: int
    subscribers: int
    buffered: int
    events: int
    dropped: int
    expired: int


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counts; ``stored_entries`` is the paper's Fig. 10 measure with sharing (one entry per
    distinct element) and ``unshared_entries`` the same subscriptions without sharing (each
    subscriber key storing its whole decomposition: operators + atom occurrences)."""

    atoms: int
    composite_elements: int
    subscriptions: int
    subscribers: int
    stored_entries: int
    unshared_entries: int
    buffered: int
    logged: int
    events: int
    dropped: int
    expired: int


class _Group:
    """The users of one atom with one (window, cap): cursor index per user, the waiting set
    (cursor == atom.end) and the prefix counts of entries dropped (see the module docstring:
    ``dcum[j]`` counts the dropped entries below sequence number ``dbase + j``; it covers the
    decided entries, those with s + cap < end)."""

    __slots__ = ("atom", "cap", "dbase", "dcum", "users", "waiting", "window")

    def __init__(self, atom: AtomElement, window: float, cap: int) -> None:
        self.atom = atom
        self.window = window
        self.cap = cap
        self.users: dict[_Sub, int] = {}
        self.waiting: set[_Sub] = set()
        self.dbase = atom.end
        self.dcum = array("i", [0])


class _Sub:
    """A composite subscription (the paper's CSGT entry: CSub, Subscribers, Elements)."""

    __slots__ = (
        "atoms",
        "cap",
        "cur",
        "deliveries",
        "dropped",
        "events",
        "expired",
        "expr",
        "groups",
        "partition",
        "qmax",
        "root",
        "sat",
        "skey",
        "subscribers",
        "window",
        "witness",
    )

    def __init__(self, expr: Expr, window: float, cap: int) -> None:
        self.expr = expr
        self.window = window
        self.cap = cap
        self.subscribers: dict[Hashable, int] = {}
        self.events = 0
        self.dropped = 0
        self.expired = 0
        self.root: Any = None
        self.atoms: tuple[AtomElement, ...] = ()
        self.groups: tuple[_Group, ...] = ()
        self.cur: list[int] = []
        self.sat: SatFn = _never
        self.witness: WitFn = _none
        self.deliveries: tuple[tuple[Hashable, int], ...] = ()
        self.qmax = 0
        self.partition = 0
        self.skey: object = None  # its key in CompositeEngine._subs

    def refresh(self) -> None:
        """Recompute the cached deliveries after a change of subscribers."""
        self.deliveries = tuple(self.subscribers.items())
        self.qmax = max(self.subscribers.values(), default=0)


def _never(c: list[int], a: tuple[AtomElement, ...], lim: float) -> bool:
    return False


def _none(c: list[int], a: tuple[AtomElement, ...], lim: float) -> list[int]:
    return []


def _keep_loss(lost: dict[_Sub, list[int]], sub: _Sub, i: int, expired: int, dropped: int) -> None:
    """Add to ``sub``'s row of losses kept for ``drain_losses``: per atom, expired then dropped."""
    row = lost.get(sub)
    if row is None:
        row = lost[sub] = [0] * (2 * len(sub.atoms))
    row[i] += expired
    row[len(sub.atoms) + i] += dropped


def _policy(window: float, cap: int) -> tuple[float, int]:
    w = float(window)
    if not (w > 0 and math.isfinite(w)):
        raise ValueError(f"window must be a positive number of seconds, not {window!r}")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"max_buffer must be an int >= 1, not {cap!r}")
    return w, cap


class CompositeEngine:
    """Composite subscriptions with shared elements and buffered merging (sans-IO).

    ``window`` (seconds) and ``max_buffer`` (instances per atom per subscription) are the
    defaults for subscriptions that give none.  See the module docstring for the semantics and
    the costs; the broker-facing interface is described in the package docstring.
    """

    def __init__(self, window: float = DEFAULT_WINDOW, max_buffer: int = DEFAULT_MAX_BUFFER) -> None:
        self.window, self.max_buffer = _policy(window, max_buffer)
        self._table = ElementTable()
        self._atoms = self._table.atoms  # id -> atom (the same dict, one lookup less per offer)
        self._subs: dict[object, _Sub] = {}
        self._by_key: dict[Hashable, _Sub] = {}
        self._active: dict[int, AtomElement] = {}
        self._clock = float("-inf")
        self._events = 0
        self._gone_dropped = 0
        self._gone_expired = 0
        # losses counted since the last drain_losses, per subscription: [expired per atom...,
        # dropped per atom...]; None while nobody tracks them (see track_losses)
        self._lost: dict[_Sub, list[int]] | None = None
        self._sweep: list[_Sub] = []  # what settle_some has still to visit in this round
        # batch sizes of the log trimming and prefix-count rebasing (tests make them tiny)
        self._trim_slack = _TRIM_SLACK
        self._dcum_slack = _DCUM_SLACK
        self._dcum_factor = _DCUM_FACTOR

    # ------------------------------------------------------------ subscriptions

    def subscribe(
        self,
        key: Hashable,
        expression: str | Expr,
        *,
        qos: int = 2,
        window: float | None = None,
        max_buffer: int | None = None,
        partition: int = 0,
    ) -> Change:
        """Subscribe ``key`` (any hashable: the broker's identity of one subscription, e.g.
        (client id, filter)) to ``expression``; replaces what ``key`` had (a new expression,
        window, cap or partition is a new composite subscription with empty buffers; the same
        one only updates the QoS).  Raises :class:`~composite.CompositeSyntaxError` or
        ValueError.

        ``partition``: keys share a composite subscription (and its buffers) only with keys
        of the same partition.  A broker that journals some subscriptions (those of persisted
        sessions, :mod:`composite._journal`) puts them in a partition of their own, so that
        their buffers never hold instances offered before any of them existed (such offers
        are not in the journal).

        O(parse + elements created + atoms of the expression).
        """
        expr = parse(expression) if isinstance(expression, str) else expression
        w, k = _policy(
            self.window if window is None else window, self.max_buffer if max_buffer is None else max_buffer
        )
        if qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, not {qos!r}")
        if not isinstance(partition, int) or partition < 0:
            raise ValueError(f"partition must be an int >= 0, not {partition!r}")
        skey = self._skey(expr.text, w, k, partition)
        sub = self._subs.get(skey)
        old = self._by_key.get(key)
        added: list[AtomInfo] = []
        removed: list[AtomInfo] = []
        if sub is None:
            sub = self._create(expr, w, k, added)
            sub.partition = partition
            sub.skey = skey
            self._subs[skey] = sub
        sub.subscribers[key] = qos
        sub.refresh()
        self._by_key[key] = sub
        if old is not None and old is not sub:
            self._leave(old, key, removed)
        return Change(tuple(added), tuple(removed))

    def unsubscribe(self, key: Hashable) -> Change | None:
        """Remove ``key``'s subscription; ``None`` if it had none.  A composite subscription
        without subscribers is dropped with its buffers, and its elements are released (an
        element shared with another subscription stays).  O(atoms + elements removed)."""
        sub = self._by_key.pop(key, None)
        if sub is None:
            return None
        removed: list[AtomInfo] = []
        self._leave(sub, key, removed)
        return Change((), tuple(removed))

    def _skey(self, text: str, w: float, k: int, partition: int = 0) -> object:
        """The key of a composite subscription: its text when the policy is the default."""
        if partition:
            return (text, w, k, partition)
        return text if w == self.window and k == self.max_buffer else (text, w, k)

    def _create(self, expr: Expr, w: float, k: int, added: list[AtomInfo]) -> _Sub:
        table = self._table
        root = table.acquire(expr, added)
        sub = _Sub(root.expr, w, k)  # the stored expression, shared with the element table
        sub.root = root
        atom_exprs = sub.expr.atoms()
        sub.atoms = atoms = tuple(table.atom(a.text) for a in atom_exprs)
        sub.sat, sub.witness = shape_of(sub.expr, atom_exprs)
        groups = []
        for i, atom in enumerate(atoms):
            g = self._group(atom, w, k)
            g.users[sub] = i
            g.waiting.add(sub)
            groups.append(g)
        sub.groups = tuple(groups)
        sub.cur = [a.end for a in atoms]
        return sub

    def _group(self, atom: AtomElement, w: float, k: int) -> _Group:
        group: _Group
        for group in atom.groups:
            if group.window == w and group.cap == k:
                return group
        g = _Group(atom, w, k)
        atom.groups.append(g)
        self._limits(atom)
        return g

    @staticmethod
    def _limits(atom: AtomElement) -> None:
        groups: list[_Group] = atom.groups
        atom.kmax = max((g.cap for g in groups), default=0)
        atom.wmax = max((g.window for g in groups), default=0.0)

    def _leave(self, sub: _Sub, key: Hashable, removed: list[AtomInfo]) -> None:
        del sub.subscribers[key]
        if sub.subscribers:
            sub.refresh()
            return
        self._settle(sub)
        self._gone_dropped += sub.dropped
        self._gone_expired += sub.expired
        del self._subs[sub.skey]
        for atom, g in zip(sub.atoms, sub.groups, strict=True):
            del g.users[sub]
            g.waiting.discard(sub)
            if not g.users:
                atom.groups.remove(g)
                self._limits(atom)
        self._table.release(sub.root, removed)
        for info in removed:
            self._active.pop(info.id, None)
        for atom in sub.atoms:
            if atom.groups:  # a cap or window may have shrunk
                self._trim(atom, self._clock)

    # ------------------------------------------------------------ the broker's side

    def atoms(self) -> list[AtomInfo]:
        """Every atom currently in use (what the broker indexes), by id."""
        return [a.info for _, a in sorted(self._table.atoms.items())]

    def atom(self, atom_id: int) -> AtomInfo | None:
        a = self._table.atoms.get(atom_id)
        return None if a is None else a.info

    def atom_id(self, element: str) -> int | None:
        """The id of the atom whose canonical text is ``element`` (e.g. to replay a journal
        of offers recorded by element text after :meth:`restore`), ``None`` if absent."""
        el = self._table.elements.get(element)
        return el.info.id if isinstance(el, AtomElement) else None

    def element_of(self, atom_id: int) -> str | None:
        """The canonical text of atom ``atom_id`` (None: no such atom).  O(1)."""
        a = self._atoms.get(atom_id)
        return None if a is None else a.expr.text

    def elements_of(self, atom_ids: Iterable[int]) -> list[str]:
        """The canonical texts of the atoms ``atom_ids`` (in that order; unknown ids are left
        out): what a journal records of an offer (:mod:`composite._journal`).  O(ids)."""
        atoms = self._table.atoms
        return [a.expr.text for i in atom_ids if (a := atoms.get(i)) is not None]

    def elements(self) -> dict[str, int]:
        """Every stored element (canonical text) with its reference count: the number of
        composite elements and composite subscriptions that use it (seed 001 Fig. 5/7)."""
        return {text: el.refs for text, el in self._table.elements.items()}

    @property
    def clock(self) -> float:
        """The engine's time: the largest ``now`` seen (-inf before the first)."""
        return self._clock

    def offer(self, atom_id: int, component: ComponentLike, now: float) -> list[CompositeEvent]:
        """A publication matched atom ``atom_id`` at time ``now``; the composite events it
        completes (at most one per composite subscription, in no particular order).

        O(1 + users of the atom for which it was absent) plus O(shape) per such user and
        O(atoms consumed) per event; an unknown id (an atom removed meanwhile) yields [].
        """
        T = self._clock
        if now > T:
            self._clock = T = now
        atom = self._atoms.get(atom_id)
        if atom is None:
            return []
        e = atom.end
        start = atom.start
        prev = atom.last
        arr = atom.arr
        arr.append(T)
        atom.comps.append(component)
        atom.end = e + 1
        atom.last = T
        if e == start:
            self._active[atom_id] = atom
        out: list[CompositeEvent] = []
        for g in atom.groups:
            lim = T - g.window
            s = e - g.cap
            if s >= g.dbase:  # entry s is decided: dropped iff still live now
                dcum = g.dcum
                last = dcum[-1]
                dcum.append(last + 1 if s >= start and arr[s - start] >= lim else last)
            if prev < lim:  # the atom's newest instance had expired: absent for every user
                cands: Iterable[_Sub] = list(g.users)
            elif g.waiting:
                cands = g.waiting
            else:
                continue
            g.waiting = set()
            for sub in cands:
                if sub.sat(sub.cur, sub.atoms, lim):
                    out.append(self._fire(sub, T, lim))  # noqa: PERF401 (side effects)
        if e + 1 - start > 2 * atom.kmax + self._trim_slack:
            self._trim(atom, T)
        return out

    def offer_many(
        self, atom_ids: Iterable[int], component: ComponentLike, now: float
    ) -> list[CompositeEvent]:
        """:meth:`offer` to each distinct id in ascending order (a publication matching
        several atoms; it may then complete an expression on its own, e.g. ``a/# & a/b``)."""
        out: list[CompositeEvent] = []
        for atom_id in sorted(set(atom_ids)):
            out.extend(self.offer(atom_id, component, now))
        return out

    def advance(self, now: float) -> None:
        """Move the clock to ``now`` (if later) without trimming anything: O(1).  The broker
        calls it before an unsubscribe or a settle, so that instances older than the window
        by the wall clock are counted as expired, not as discarded with the subscription."""
        self._clock = max(self._clock, now)

    def settle_some(self, now: float, budget: int) -> int:
        """Advance the clock to ``now`` and settle up to ``budget`` composite subscriptions,
        round robin: every subscription is settled once per ``len(subscriptions) / budget``
        calls, so instances that expire in an idle subscription are counted (and reach
        :meth:`drain_losses`) within a bounded time.  Returns how many were settled.
        O(budget x atoms per subscription), plus O(subscriptions) to start a round."""
        self.advance(now)
        if not self._sweep:
            self._sweep = list(self._subs.values())
        todo = self._sweep
        n = 0
        while todo and n < budget:
            sub = todo.pop()
            if sub.subscribers:  # not removed meanwhile (a removed one has none)
                self._settle(sub)
                n += 1
        return n

    def tick(self, now: float) -> None:
        """Advance the clock and free the log entries no subscription can use any more
        (expired for every window, or beyond every cap).  Expiry itself needs no tick (it is
        exact at every offer); this only bounds memory.  O(atoms with logged entries)."""
        self._clock = max(self._clock, now)
        for atom in list(self._active.values()):
            self._trim(atom, self._clock)

    def _fire(self, sub: _Sub, T: float, lim: float) -> CompositeEvent:
        """Consume the oldest live instance of every atom of the maximal witness."""
        atoms, cur, cap = sub.atoms, sub.cur, sub.cap
        parts = []
        qmin = 2
        for i in sub.witness(cur, atoms, lim):
            atom = atoms[i]
            j = cur[i]
            end = atom.end
            k = j - atom.start
            if j < end - cap or k < 0 or atom.arr[k] < lim:  # gone instances come first
                j = self._skip(sub, i, lim)
                k = j - atom.start
            comp = atom.comps[k]
            parts.append(Part(atom.text, comp, atom.arr[k]))
            if comp.qos < qmin:  # noqa: PLR1730 (no call on the hot path)
                qmin = comp.qos
            cur[i] = j = j + 1
            if j == end:
                sub.groups[i].waiting.add(sub)
        if len(parts) > 1:
            parts.sort(key=_arrival)  # stable: ties stay in canonical atom order
        sub.events += 1
        self._events += 1
        deliveries = sub.deliveries
        if qmin < sub.qmax:
            if len(deliveries) == 1:
                deliveries = ((deliveries[0][0], qmin),)
            else:
                deliveries = tuple((key, q if q < qmin else qmin) for key, q in deliveries)
        return CompositeEvent(
            sub.expr.text, deliveries, tuple(parts), parts[0].arrival, parts[-1].arrival, source=sub
        )

    def _skip(self, sub: _Sub, i: int, lim: float) -> int:
        """Move atom i's cursor past the instances gone (dropped by the cap or expired),
        counting them; the new cursor.  O(log cap)."""
        atom = sub.atoms[i]
        c = sub.cur[i]
        lo = max(c, atom.end - sub.cap, atom.start)
        j = bisect_left(atom.arr, lim, lo - atom.start) + atom.start
        if j > c:
            self._count(sub, i, c, j)
            sub.cur[i] = j
        return j

    def _count(self, sub: _Sub, i: int, c: int, j: int) -> None:
        """Count entries c..j-1 of atom i, all gone for ``sub``: dropped per the group's
        ``dcum``, the rest expired (and keep them for :meth:`drain_losses` when tracked)."""
        g = sub.groups[i]
        dcum, base = g.dcum, g.dbase
        top = base + len(dcum) - 1
        d = dcum[min(j, top) - base] - dcum[min(c, top) - base]
        sub.dropped += d
        sub.expired += j - c - d
        lost = self._lost
        if lost is not None:
            _keep_loss(lost, sub, i, j - c - d, d)

    def track_losses(self, on: bool) -> None:
        """Keep (``on``) or stop keeping what :meth:`drain_losses` returns.  Counting is lazy
        (module docstring): instances are counted gone when a cursor moves past them, at a
        consumption, a prefix-count rebase, or a settle (``stats``, ``subscription(s)``,
        ``snapshot``, ``unsubscribe``, :meth:`settle_some`)."""
        self._lost = ({} if self._lost is None else self._lost) if on else None

    def drain_losses(self) -> list[Loss]:
        """The losses counted since the previous call (while tracked), summed per composite
        subscription and atom; every dropped and expired instance is in exactly one call's
        answer.  O(subscriptions with losses x their atoms)."""
        lost = self._lost
        if not lost:
            return []
        self._lost = {}
        out: list[Loss] = []
        for sub, row in lost.items():
            n = len(sub.atoms)
            text, w, k = sub.expr.text, sub.window, sub.cap
            for i, atom in enumerate(sub.atoms):
                if row[i] or row[n + i]:
                    out.append((text, w, k, atom.expr.text, row[i], row[n + i]))
        return out

    def _settle(self, sub: _Sub) -> None:
        """Bring every cursor of ``sub`` past its gone instances (for counts and snapshots)."""
        lim = self._clock - sub.window
        for i, atom in enumerate(sub.atoms):
            if self._skip(sub, i, lim) == atom.end:
                sub.groups[i].waiting.add(sub)

    def _trim(self, atom: AtomElement, T: float) -> None:
        """Drop the log prefix no user can use: beyond the largest cap or older than the
        largest window.  Amortised O(1) per offer (batches of >= kmax + 16 entries)."""
        keep = max(atom.end - atom.kmax, atom.start)
        to = bisect_left(atom.arr, T - atom.wmax, keep - atom.start) + atom.start
        if to > atom.start:
            n = to - atom.start
            del atom.arr[:n]
            del atom.comps[:n]
            atom.start = to
        if atom.start == atom.end:
            self._active.pop(atom.info.id, None)
        for g in atom.groups:
            if atom.start - g.dbase > max(self._dcum_slack, self._dcum_factor * len(g.users)):
                self._rebase(g)

    def _rebase(self, g: _Group) -> None:
        """Move the prefix counts' base up to the log start; stale cursors move there first."""
        atom = g.atom
        start = atom.start
        dcum, base = g.dcum, g.dbase
        top = base + len(dcum) - 1
        at_start = dcum[min(start, top) - base]
        at_end = start == atom.end
        lost = self._lost
        for sub, i in g.users.items():  # _count inlined: every user may be stale (hot atoms)
            cur = sub.cur
            c = cur[i]
            if c < start:
                d = at_start - dcum[min(c, top) - base]
                sub.dropped += d
                sub.expired += start - c - d
                if lost is not None:
                    _keep_loss(lost, sub, i, start - c - d, d)
                cur[i] = start
                if at_end:
                    g.waiting.add(sub)
        # only differences of prefix counts are ever used: the kept ones (at most the log's
        # length) restart from 0, so they stay small (4-byte entries)
        if start <= top:
            kept = dcum[start - base :]
            first = kept[0]
            g.dcum = array("i", [x - first for x in kept]) if first else kept
        else:
            g.dcum = array("i", [0])
        g.dbase = start

    # ------------------------------------------------------------ observation

    def subscription(self, key: Hashable) -> SubscriptionStats | None:
        """The composite subscription ``key`` is subscribed to, settled at the clock."""
        sub = self._by_key.get(key)
        return None if sub is None else self._stats(sub)

    def subscriptions(self) -> list[SubscriptionStats]:
        """Every composite subscription (for analytics: events, buffer occupancy, drops,
        expiries).  O(total atoms of all subscriptions)."""
        return [self._stats(s) for s in self._subs.values()]

    def occupancy(self, event: CompositeEvent) -> tuple[float, int, int] | None:
        """(window, max_buffer, instances buffered now) of the composite subscription that
        produced ``event``, its buffers settled at the clock; None for an event from elsewhere.
        Called right after the offer, the occupancy after the event.  O(atoms of the
        subscription), a bisection only for an atom whose oldest buffered instance is gone."""
        sub = event.source
        if not isinstance(sub, _Sub):
            return None
        lim = self._clock - sub.window
        cap = sub.cap
        cur = sub.cur
        n = 0
        for i, atom in enumerate(sub.atoms):
            c = cur[i]
            end = atom.end
            if c < end:
                start = atom.start
                if c < start or c < end - cap or atom.arr[c - start] < lim:  # gone ones first
                    c = self._skip(sub, i, lim)
                    if c == end:
                        sub.groups[i].waiting.add(sub)
                n += end - c
        return sub.window, cap, n

    def subscription_of(self, key: Hashable) -> tuple[str, float, int, int, int] | None:
        """(canonical expression, window, max_buffer, QoS, partition) of ``key``'s
        subscription, without settling anything (O(1)); None if it has none."""
        sub = self._by_key.get(key)
        if sub is None:
            return None
        return sub.expr.text, sub.window, sub.cap, sub.subscribers[key], sub.partition

    def qos_of(self, key: Hashable) -> int | None:
        """The QoS ``key`` subscribed with (None: no composite subscription)."""
        sub = self._by_key.get(key)
        return None if sub is None else sub.subscribers[key]

    def _stats(self, sub: _Sub) -> SubscriptionStats:
        self._settle(sub)
        buffered = sum(a.end - c for a, c in zip(sub.atoms, sub.cur, strict=True))
        return SubscriptionStats(
            sub.expr.text,
            sub.window,
            sub.cap,
            len(sub.subscribers),
            buffered,
            sub.events,
            sub.dropped,
            sub.expired,
        )

    def stats(self) -> EngineStats:
        """Engine-wide counts (settles every subscription: O(total atoms of all))."""
        per = self.subscriptions()
        t = self._table
        return EngineStats(
            atoms=len(t.atoms),
            composite_elements=t.count_composites(),
            subscriptions=len(self._subs),
            subscribers=len(self._by_key),
            stored_entries=len(t.elements),
            unshared_entries=sum(tree_size(s.expr) * len(s.subscribers) for s in self._subs.values()),
            buffered=sum(s.buffered for s in per),
            logged=sum(a.end - a.start for a in t.atoms.values()),
            events=self._events,
            dropped=self._gone_dropped + sum(s.dropped for s in per),
            expired=self._gone_expired + sum(s.expired for s in per),
        )

    def buffers(self, key: Hashable) -> dict[str, list[Part]] | None:
        """The live buffered instances of ``key``'s subscription per atom, oldest first."""
        sub = self._by_key.get(key)
        if sub is None:
            return None
        self._settle(sub)
        out: dict[str, list[Part]] = {}
        for atom, c in zip(sub.atoms, sub.cur, strict=True):
            out[atom.expr.text] = [
                Part(atom.expr.text, atom.comps[s - atom.start], atom.arr[s - atom.start])
                for s in range(c, atom.end)
            ]
        return out

    # ------------------------------------------------------------ persistence

    def snapshot(self, keep: Callable[[Hashable], bool] | None = None) -> dict[str, Any]:
        """The whole state as plain data (dict, list, str, int, float, bytes, None and the
        subscriber keys as given): defaults, clock, counters, every composite subscription
        with its subscribers, counters and buffer lengths, and every atom's live log entries
        ``[arrival, topic, payload, qos]``.  A buffer of n instances is the atom's last n
        entries.  ``keep``: only the subscriber keys it accepts (and the subscriptions and
        atom entries they use; the engine-wide counters stay whole).  O(state)."""
        need: dict[AtomElement, int] = {}
        subs = []
        for sub in self._subs.values():
            subscribers = [[key, q] for key, q in sub.subscribers.items() if keep is None or keep(key)]
            if not subscribers:
                continue
            self._settle(sub)
            buffered = {}
            for atom, c in zip(sub.atoms, sub.cur, strict=True):
                buffered[atom.expr.text] = atom.end - c
                need[atom] = max(need.get(atom, 0), atom.end - c)
            subs.append(
                {
                    "expression": sub.expr.text,
                    "window": sub.window,
                    "max_buffer": sub.cap,
                    "partition": sub.partition,
                    "subscribers": subscribers,
                    "events": sub.events,
                    "dropped": sub.dropped,
                    "expired": sub.expired,
                    "buffered": buffered,
                }
            )
        atoms = []
        for atom, n in need.items():
            if n:
                lo = atom.end - n - atom.start
                entries = [
                    [t, c.topic, c.payload, c.qos]
                    for t, c in zip(atom.arr[lo:], atom.comps[lo:], strict=True)
                ]
                atoms.append({"element": atom.expr.text, "entries": entries})
        return {
            "format": SNAPSHOT_FORMAT,
            "window": self.window,
            "max_buffer": self.max_buffer,
            "clock": self._clock,
            "events": self._events,
            "dropped": self._gone_dropped,
            "expired": self._gone_expired,
            "subscriptions": subs,
            "atoms": atoms,
        }

    @classmethod
    def restore(cls, data: dict[str, Any]) -> CompositeEngine:
        """An engine in the state :meth:`snapshot` described (atom ids are new: index
        :meth:`atoms` again).  Raises ValueError on an unknown format."""
        if data.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"unknown composite snapshot format {data.get('format')!r}")
        eng = cls(window=data["window"], max_buffer=data["max_buffer"])
        eng._clock = float(data["clock"])
        eng._events = int(data["events"])
        eng._gone_dropped = int(data["dropped"])
        eng._gone_expired = int(data["expired"])
        subs: list[_Sub] = []
        for s in data["subscriptions"]:
            part = int(s.get("partition", 0))
            for key, q in s["subscribers"]:
                eng.subscribe(
                    key,
                    s["expression"],
                    qos=q,
                    window=s["window"],
                    max_buffer=s["max_buffer"],
                    partition=part,
                )
            subs.append(eng._by_key[s["subscribers"][0][0]])
        for a in data["atoms"]:
            atom = eng._table.atom(a["element"])
            entries = a["entries"]
            atom.arr = [float(t) for t, _, _, _ in entries]
            atom.comps = [Component(topic, bytes(payload), int(q)) for _, topic, payload, q in entries]
            atom.start, atom.end = 0, len(entries)
            atom.last = atom.arr[-1] if entries else float("-inf")
            if entries:
                eng._active[atom.info.id] = atom
            for g in atom.groups:
                g.dbase = max(0, atom.end - g.cap)
        for s, sub in zip(data["subscriptions"], subs, strict=True):
            sub.events, sub.dropped, sub.expired = int(s["events"]), int(s["dropped"]), int(s["expired"])
            for i, atom in enumerate(sub.atoms):
                sub.cur[i] = atom.end - int(s["buffered"].get(atom.expr.text, 0))
                g = sub.groups[i]
                if sub.cur[i] == atom.end:
                    g.waiting.add(sub)
                else:
                    g.waiting.discard(sub)
        return eng

    # ------------------------------------------------------------ invariants

    def _check(self) -> None:
        """Invariants: refcounts, groups and waiting sets, cursors, logs, prefix counts, and
        no subscription satisfied between offers."""
        t = self._table
        t._check([s.root for s in self._subs.values()])
        for key, sub in self._by_key.items():
            assert (
                key in sub.subscribers
                and self._subs[self._skey(sub.expr.text, sub.window, sub.cap, sub.partition)] is sub
                and sub.skey == self._skey(sub.expr.text, sub.window, sub.cap, sub.partition)
            )
        assert sum(len(s.subscribers) for s in self._subs.values()) == len(self._by_key)
        users: dict[int, dict[_Sub, int]] = {}
        for sub in self._subs.values():
            assert sub.subscribers
            assert [a.expr.text for a in sub.atoms] == [a.text for a in sub.expr.atoms()]
            for i, (atom, g) in enumerate(zip(sub.atoms, sub.groups, strict=True)):
                assert t.atoms.get(atom.info.id) is atom
                assert g in atom.groups and g.users.get(sub) == i
                assert (g.window, g.cap) == (sub.window, sub.cap)
                c = sub.cur[i]
                assert g.dbase <= c <= atom.end
                assert (sub in g.waiting) == (c == atom.end), "waiting set out of step"
                users.setdefault(id(g), {})[sub] = i
            assert not sub.sat(sub.cur, sub.atoms, self._clock - sub.window)
        for atom in t.atoms.values():
            assert atom.groups, "atom without users"
            assert len(atom.arr) == len(atom.comps) == atom.end - atom.start >= 0
            assert all(x <= y for x, y in zip(atom.arr, atom.arr[1:], strict=False))
            assert not atom.arr or atom.last == atom.arr[-1]
            assert atom.end - atom.start <= 2 * atom.kmax + self._trim_slack
            assert (self._active.get(atom.info.id) is atom) == (atom.end > atom.start)
            groups: list[_Group] = atom.groups
            assert len({(g.window, g.cap) for g in groups}) == len(groups)
            assert atom.kmax == max(g.cap for g in groups) and atom.wmax == max(g.window for g in groups)
            for g in groups:
                assert g.users == users.get(id(g), {}), "group users out of step"
                assert g.waiting <= set(g.users)
                assert len(g.dcum) == max(g.dbase, atom.end - g.cap) - g.dbase + 1
                assert all(x <= y for x, y in zip(g.dcum, g.dcum[1:], strict=False))
        assert set(self._active) <= set(t.atoms)
