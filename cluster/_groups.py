"""Seed 001's routing of composite subscriptions over a Kademlia network, sans-IO.

Implements ``001_6a6247c7b716f50f.txt`` section 4 (Figs 3-8) as a state machine per broker,
:class:`GroupNode`, whose inputs are method calls (a subscription from a local client, a
message from another node, a timer tick, a node found dead) and whose outputs are lists of
:class:`Send` (to another node) and :class:`Deliver` (to a local subscriber).  No sockets, no
clock: the discrete-event simulator (``benchmarks/sim_cluster.py``) drives 1,024 of them in
one process.

* **GroupCode** (Definition 1): ``2^n * Hash(CSub) / groupNum`` with ``Hash`` in
  ``[1, groupNum]`` (SHA-1 of the canonical expression, :func:`composite.canonical`, so
  ``(B|A)&C`` and ``(A|B)&C`` are one subscription); ``n`` = 160 bits.
* **CSSU** (Definition 2): the ``alpha`` live nodes closest to the GroupCode by XOR
  (``Directory.closest``: Kademlia's ``FIND_NODE``); the **core** is the one with the smallest
  ID (section 4.1).
* **CSGT** (Definition 3, Fig 4): per GroupCode, entries ``CSub -> <Subscribers, Elements,
  LogicTimer, TimeExpired>`` and the flag ``InCoreBroker``; **AST**: ``atom -> Subscribers``
  at the atom's information service (``Directory.producer(atom)``, the seed's IS_Address).
* **Subscribe** (Fig 6): the access node sends the subscription to every CSSU member (in
  ID order); every member stores it; the core decomposes it (``Elements`` = the operands of its
  top operator) and forwards each element, a composite element to its own CSSU, an atom to
  its producer, with itself as ``source``.
* **Unsubscribe** (Fig 7): the subscriber leaves ``Subscribers``; an entry without subscribers
  counts ``TimeExpired`` up at each tick and is deleted past ``expire_after``; only the core
  withdraws its elements, and only those no other entry of the node uses.
* **Events** (Fig 8): an atom event goes from its producer to every source of its AST entry;
  a core buffers the events per element of each entry that uses it, and when the entry's
  expression is satisfied (``&``: every element, ``|``: any) it sends the composite event to
  every subscriber (a client's access node, or a parent core, which treats it as an element
  event) and clears the buffers it used.
* **Heartbeats** (section 4.5): every ``heartbeat_every`` ticks each member sends
  ``<ISID, GroupCode, digest>`` to the other alpha-1 members (the digest: 128 bits of SHA-256
  over the sorted CSub and Subscribers); a mismatch fetches the sender's table and merges it
  entry by entry, the larger ``LogicTimer`` winning.  Core election: a member whose ID is the
  smallest among the live members it knows sets ``InCoreBroker`` and, if it was not the core,
  re-subscribes the elements of every entry (the seed's "resubscribe").

Deviations (docs/cluster-simulation.md): node failure is learnt from the directory
(``node_down``), standing for Kademlia's failed RPCs; a new core re-subscribes at once rather
than after a round of heartbeats; the buffered element events of a core that dies are lost
(the seed keeps them only at the core; replicas hold subscriptions, not events); composite
events to a subscriber that is down are dropped, not retried.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from composite import Atom, Op, canonical, parse

__all__ = [
    "AtomEvent",
    "Deliver",
    "Directory",
    "ElementEvent",
    "FetchTable",
    "GroupNode",
    "Heartbeat",
    "Send",
    "SubMsg",
    "TableCopy",
    "cssu",
    "group_code",
]

BITS = 160


def group_code(csub: str, group_num: int, bits: int = BITS) -> int:
    """Definition 1: ``2^n * Hash(CSub) / groupNum``, ``Hash`` in [1, groupNum]. O(len)."""
    h = int.from_bytes(hashlib.sha1(csub.encode()).digest(), "big") % group_num + 1
    top: int = 1 << bits
    return (top * h // group_num) % top


def cssu(code: int, members: Iterable[int], alpha: int) -> list[int]:
    """Definition 2: the ``alpha`` members closest to ``code`` by XOR, in ID order (the core
    first). O(members log members)."""
    nearest: list[int] = sorted(members, key=lambda m: m ^ code)[:alpha]
    return sorted(nearest)


class Directory(Protocol):
    """What the overlay tells a node (the live cluster: Kademlia; the simulator: its model)."""

    def closest(self, key: int, count: int) -> list[int]:
        """The ``count`` live nodes closest to ``key`` by XOR (``FIND_NODE``)."""
        ...

    def producer(self, atom: str) -> int:
        """The node where events of ``atom`` are produced (the seed's IS_Address)."""
        ...


# ---------------------------------------------------------------- messages (Fig 3)
@dataclass(frozen=True, slots=True)
class SubMsg:
    """A subscription (``add``) or unsubscription of ``sub`` (composite or atom) for
    ``source`` (a node ID: the access node of a client, or a core)."""

    sub: str
    source: int
    add: bool = True
    atomic: bool = False


@dataclass(frozen=True, slots=True)
class AtomEvent:
    """An atom event ``event_id`` of kind ``atom`` sent by its producer to a core."""

    atom: str
    event_id: int


@dataclass(frozen=True, slots=True)
class ElementEvent:
    """A composite event of ``sub`` (made of ``events``) sent to a subscriber of ``sub``."""

    sub: str
    events: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    isid: int
    code: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class FetchTable:
    code: int


@dataclass(frozen=True, slots=True)
class TableCopy:
    code: int
    entries: tuple[tuple[str, frozenset[int], int, int], ...]  # csub, subscribers, timer, expired


Message = SubMsg | AtomEvent | ElementEvent | Heartbeat | FetchTable | TableCopy


@dataclass(frozen=True, slots=True)
class Send:
    dest: int
    msg: Message


@dataclass(frozen=True, slots=True)
class Deliver:
    """A composite event for the local client subscription ``sub``."""

    sub: str
    events: tuple[int, ...]


Output = Send | Deliver


# ---------------------------------------------------------------- tables (Fig 4)
@dataclass(slots=True)
class Entry:
    """A CSGT row: ``<CSub, Subscribers, Elements, LogicTimer, TimeExpired>`` plus the core's
    buffers of element events (element text -> event ids, oldest first)."""

    csub: str
    op: str
    elements: tuple[str, ...]
    subscribers: set[int] = field(default_factory=set)
    logic_timer: int = 0
    time_expired: int = 0
    buffers: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)


@dataclass(slots=True)
class Table:
    """A CSGT: ``<GroupCode, InCoreBroker>`` and its rows."""

    code: int
    in_core: bool = False
    entries: dict[str, Entry] = field(default_factory=dict)

    def digest(self) -> bytes:
        """128-bit abstract of CSub and Subscribers (section 4.5). O(table)."""
        h = hashlib.sha256()
        for csub in sorted(self.entries):
            e = self.entries[csub]
            h.update(csub.encode())
            h.update(b"|" + b",".join(str(s).encode() for s in sorted(e.subscribers)) + b"\n")
        return h.digest()[:16]


def decompose(csub: str) -> tuple[str, tuple[str, ...]]:
    """``decomposeSub``: (top operator, canonical texts of its operands); an atom -> ("", ())."""
    expr = parse(csub)
    if isinstance(expr, Atom):
        return "", ()
    assert isinstance(expr, Op)
    return expr.op, tuple(x.text for x in expr.operands)


def is_atom(text: str) -> bool:
    return isinstance(parse(text), Atom)


class GroupNode:
    """One broker's part of seed 001's routing (see the module docstring).

    Every input method returns the outputs it causes.  Complexity: a subscription O(alpha +
    elements); an element event O(entries using the element); a tick O(tables x alpha).
    """

    def __init__(  # noqa: PLR0917
        self,
        node_id: int,
        alpha: int,
        group_num: int,
        directory: Directory,
        expire_after: int = 3,
        heartbeat_every: int = 1,
    ) -> None:
        self.id = node_id
        self.alpha = alpha
        self.group_num = group_num
        self.directory = directory
        self.expire_after = expire_after
        self.heartbeat_every = heartbeat_every
        self.tables: dict[int, Table] = {}
        self.ast: dict[str, set[int]] = {}  # atom -> sources (cores) interested
        self.uses: dict[str, set[str]] = {}  # element text -> csubs of core tables using it
        self.local: dict[str, int] = {}  # client subscriptions made here -> count
        self.dead: set[int] = set()
        self.ticks = 0
        self._codes: dict[str, int] = {}

    # ------------------------------------------------------------ helpers
    def code(self, csub: str) -> int:
        c = self._codes.get(csub)
        if c is None:
            c = self._codes[csub] = group_code(csub, self.group_num)
        return c

    def cssu(self, csub: str) -> list[int]:
        return sorted(self.directory.closest(self.code(csub), self.alpha))

    def _forward(self, sub: str, source: int, add: bool) -> list[Output]:
        """``forwardMsg``: an atom to its producer, a composite to every member of its CSSU."""
        if is_atom(sub):
            return [Send(self.directory.producer(sub), SubMsg(sub, source, add, True))]
        return [Send(m, SubMsg(sub, source, add)) for m in self.cssu(sub)]

    # ------------------------------------------------------------ client inputs
    def subscribe(self, csub: str) -> list[Output]:
        """A local client subscribes to the composite ``csub`` (this node is its access point)."""
        csub = canonical(csub)
        self.local[csub] = self.local.get(csub, 0) + 1
        return self._forward(csub, self.id, True)

    def unsubscribe(self, csub: str) -> list[Output]:
        csub = canonical(csub)
        n = self.local.get(csub, 0)
        if n == 0:
            return []
        if n > 1:
            self.local[csub] = n - 1
            return []
        del self.local[csub]
        return self._forward(csub, self.id, False)

    def publish_atom(self, atom: str, event_id: int) -> list[Output]:
        """An atom event produced here (this node is the atom's information service)."""
        return [Send(src, AtomEvent(atom, event_id)) for src in sorted(self.ast.get(atom, ()))]

    # ------------------------------------------------------------ network inputs
    def receive(self, src: int, msg: Message) -> list[Output]:
        match msg:
            case SubMsg(atomic=True):
                return self._recv_atomic(msg)
            case SubMsg():
                return self._recv_sub(msg) if msg.add else self._recv_unsub(msg)
            case AtomEvent(atom=atom, event_id=eid):
                return self._element_event(atom, (eid,))
            case ElementEvent(sub=sub, events=events):
                out: list[Output] = []
                if sub in self.local:
                    out.append(Deliver(sub, events))
                out.extend(self._element_event(sub, events))
                return out
            case Heartbeat():
                return self._heartbeat(src, msg)
            case FetchTable(code=code):
                t = self.tables.get(code)
                rows = (
                    ()
                    if t is None
                    else tuple(
                        (e.csub, frozenset(e.subscribers), e.logic_timer, e.time_expired)
                        for e in t.entries.values()
                    )
                )
                return [Send(src, TableCopy(code, rows))]
            case TableCopy():
                return self._merge(msg)
        raise TypeError(f"unknown message {msg!r}")

    def _recv_atomic(self, msg: SubMsg) -> list[Output]:
        subs = self.ast.setdefault(msg.sub, set())
        if msg.add:
            subs.add(msg.source)
        else:
            subs.discard(msg.source)
            if not subs:
                del self.ast[msg.sub]
        return []

    def _table(self, csub: str) -> Table:
        code = self.code(csub)
        t = self.tables.get(code)
        if t is None:
            t = self.tables[code] = Table(code)
            t.in_core = self._is_core(csub)
        return t

    def _is_core(self, csub: str) -> bool:
        members = [m for m in self.cssu(csub) if m not in self.dead]
        return bool(members) and members[0] == self.id

    def _recv_sub(self, msg: SubMsg) -> list[Output]:
        t = self._table(msg.sub)
        e = t.entries.get(msg.sub)
        out: list[Output] = []
        if e is not None:
            e.subscribers.add(msg.source)
            e.time_expired = 0
        else:
            op, elements = decompose(msg.sub)
            e = t.entries[msg.sub] = Entry(msg.sub, op, elements, {msg.source})
            if t.in_core:
                out.extend(self._take_elements(e))
        e.logic_timer += 1
        return out

    def _take_elements(self, e: Entry) -> list[Output]:
        """The core subscribes to the elements of ``e`` (new ones only are forwarded)."""
        out: list[Output] = []
        for el in e.elements:
            users = self.uses.setdefault(el, set())
            if not users:
                out.extend(self._forward(el, self.id, True))
            users.add(e.csub)
        return out

    def _drop_elements(self, e: Entry) -> list[Output]:
        out: list[Output] = []
        for el in e.elements:
            users = self.uses.get(el)
            if users is None:
                continue
            users.discard(e.csub)
            if not users:
                del self.uses[el]
                out.extend(self._forward(el, self.id, False))
        return out

    def _recv_unsub(self, msg: SubMsg) -> list[Output]:
        t = self.tables.get(self.code(msg.sub))
        e = None if t is None else t.entries.get(msg.sub)
        if e is None:
            return []
        e.subscribers.discard(msg.source)
        e.logic_timer += 1
        return []

    def _element_event(self, element: str, events: tuple[int, ...]) -> list[Output]:
        """Buffer an element's event in every core entry using it; emit what completes."""
        out: list[Output] = []
        for csub in sorted(self.uses.get(element, ())):
            t = self.tables.get(self.code(csub))
            e = None if t is None or not t.in_core else t.entries.get(csub)
            if e is None:
                continue
            if e.op == "|":
                done: tuple[int, ...] | None = events
            else:
                e.buffers.setdefault(element, []).append(events)
                if all(e.buffers.get(x) for x in e.elements):
                    done = tuple(i for x in e.elements for i in e.buffers[x].pop(0))
                else:
                    done = None
            if done is not None:
                out.extend(Send(s, ElementEvent(csub, done)) for s in sorted(e.subscribers))
        return out

    # ------------------------------------------------------------ heartbeats, election
    def tick(self) -> list[Output]:
        """One heartbeat period: TimeExpired counting, deletions, heartbeats, election."""
        self.ticks += 1
        out: list[Output] = []
        for t in list(self.tables.values()):
            for csub, e in list(t.entries.items()):
                if e.subscribers:
                    continue
                e.time_expired += 1
                if e.time_expired > self.expire_after:
                    if t.in_core:
                        out.extend(self._drop_elements(e))
                    del t.entries[csub]
            if not t.entries:
                del self.tables[t.code]
        if self.ticks % self.heartbeat_every == 0:
            for t in self.tables.values():
                digest = t.digest()
                hb = Heartbeat(self.id, t.code, digest)
                out.extend(Send(m, hb) for m in self.directory.closest(t.code, self.alpha) if m != self.id)
        return out

    def node_down(self, node: int) -> list[Output]:
        """``node`` failed: re-elect the core of every table whose CSSU held it."""
        self.dead.add(node)
        return self._elect()

    def node_up(self, node: int) -> list[Output]:
        self.dead.discard(node)
        return self._elect()

    def _elect(self) -> list[Output]:
        out: list[Output] = []
        for t in self.tables.values():
            if not t.entries:
                continue
            any_csub = next(iter(t.entries))
            core = self._is_core(any_csub)
            if core and not t.in_core:  # the new core re-subscribes the table's elements
                t.in_core = True
                for e in t.entries.values():
                    out.extend(self._take_elements(e))
            elif not core and t.in_core:
                t.in_core = False
                for e in t.entries.values():
                    for el in e.elements:
                        users = self.uses.get(el)
                        if users is not None:
                            users.discard(e.csub)
                            if not users:
                                del self.uses[el]
        return out

    def _heartbeat(self, src: int, hb: Heartbeat) -> list[Output]:
        t = self.tables.get(hb.code)
        if t is None or t.digest() != hb.digest:
            return [Send(src, FetchTable(hb.code))]
        return []

    def _merge(self, copy: TableCopy) -> list[Output]:
        """Merge a peer's copy entry by entry: the larger LogicTimer wins (section 4.5)."""
        out: list[Output] = []
        if not copy.entries:
            return out
        t = self._table(copy.entries[0][0])
        for csub, subscribers, timer, expired in copy.entries:
            e = t.entries.get(csub)
            if e is None:
                op, elements = decompose(csub)
                e = t.entries[csub] = Entry(csub, op, elements, set(subscribers), timer, expired)
                if t.in_core:
                    out.extend(self._take_elements(e))
            elif timer > e.logic_timer:
                e.subscribers = set(subscribers)
                e.logic_timer = timer
                e.time_expired = expired
        return out

    # ------------------------------------------------------------ accounting
    def stored_entries(self) -> int:
        """AST + CSGT rows held here (Fig 10's measure)."""
        return len(self.ast) + sum(len(t.entries) for t in self.tables.values())

    def _check(self) -> None:
        """Invariants: Elements = decompose(CSub); a core table's elements are in ``uses``;
        ``uses`` names only entries of core tables; InCoreBroker iff smallest live member."""
        for t in self.tables.values():
            for csub, e in t.entries.items():
                assert (e.op, e.elements) == decompose(csub)
                assert self.code(csub) == t.code
                if t.in_core:
                    for el in e.elements:
                        assert csub in self.uses.get(el, set()), (csub, el)
            if t.entries:
                assert t.in_core == self._is_core(next(iter(t.entries)))
        for el, users in self.uses.items():
            assert users, el
            for csub in users:
                owner = self.tables.get(self.code(csub))
                assert owner is not None and owner.in_core and csub in owner.entries, (el, csub)
