"""What this broker asks of every other broker of the cluster: its aggregated route table.

Sans-IO (no sockets, no clock).  The local clients' subscriptions come in as
:meth:`RouteTable.add` / :meth:`RouteTable.remove` / :meth:`RouteTable.drop_client`; the table
answers with :class:`RouteChange` values (filters to subscribe to, filters to unsubscribe
from), which the node applies to the link it keeps to each peer, and :meth:`wanted` gives the
whole set for a link that starts without a session.

Aggregation (issue 17: "one copy per remote node, not per remote subscriber"): plain filters
are reduced to a *cover*, the filters not included (:func:`topics.includes`, the patent's
topicIncludes, seed 002) by another local filter; a peer forwards a message once per link
anyway (one route per session), so the cover only keeps the peers' indexes small.  Content
filters (``$filter/<selector>/``) are exported as their topic filter: the selector is
evaluated by the subscriber's broker.  Negative entries (partial unsubscribe) stay local for
the same reason.  Shared subscriptions are exported one by one as ``$share/<group>/<filter>``,
each with its own MQTT 5 subscription identifier, so a forwarded copy says which group it is
for (:meth:`RouteTable.groups_of`); plain filters carry none (:data:`PLAIN_ID` stands for "no
identifier": the forwarded PUBLISH then has no properties to decode, the common case).  Filters whose first
level starts with ``$`` (``$SYS``, ``$cluster``) are this broker's own and never exported.

Complexity: with ``F`` distinct local plain filters and ``C`` filters in the cover, ``add`` is
O(C) includes tests, ``remove`` of a filter in the cover O(F x C) (the filters it covered are
re-examined), other removes O(1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import topics

__all__ = ["CTL_ID", "FETCH_ID", "PLAIN_ID", "RouteChange", "RouteTable"]

#: the exported plain filters' "identifier": none is sent (0 is not a valid identifier)
PLAIN_ID = 0
#: identifier of a plain filter's first subscription at a peer, replaced at once by the same
#: filter with :data:`PLAIN_ID`: what arrives with it are the peer's retained messages
FETCH_ID = 2
#: identifier of the link's subscription to this node's control topic (``$cluster/ctl/<id>``)
CTL_ID = 3
_SHARE = "$share/"
_NONE: frozenset[tuple[str, str]] = frozenset()


@dataclass(slots=True)
class RouteChange:
    """Filters to subscribe to (with their subscription identifier) and to unsubscribe from."""

    subscribe: list[tuple[str, int]] = field(default_factory=list)
    unsubscribe: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.subscribe or self.unsubscribe)


def exported(full_filter: str) -> bool:
    """Whether a local subscription's filter is exported to peers (not a ``$`` topic's)."""
    plain = full_filter
    if full_filter.startswith(_SHARE):
        parts = full_filter.split("/", 2)
        plain = parts[2] if len(parts) == 3 else ""
    return bool(plain) and not plain.startswith("$")


class RouteTable:
    """Local subscriptions (per client) -> the subscriptions this broker holds at its peers."""

    def __init__(self) -> None:
        self._clients: dict[str, set[str]] = {}  # client id -> its exported full filters
        self._plain: dict[str, int] = {}  # plain filter -> local subscriptions on it
        self._cover: set[str] = set()
        self._shared: dict[str, int] = {}  # "$share/g/f" -> local subscriptions on it
        self._ids: dict[str, int] = {}  # "$share/g/f" -> its subscription identifier
        self._groups: dict[int, tuple[str, str]] = {}  # identifier -> (group, filter)
        self._next_id = CTL_ID + 1

    # ------------------------------------------------------------ inputs
    def add(self, client_id: str, full_filter: str) -> RouteChange:
        """``client_id`` subscribed to ``full_filter`` (``$share/g/f`` or a plain filter)."""
        change = RouteChange()
        if not exported(full_filter):
            return change
        mine = self._clients.setdefault(client_id, set())
        if full_filter in mine:
            return change
        mine.add(full_filter)
        if full_filter.startswith(_SHARE):
            n = self._shared.get(full_filter, 0)
            self._shared[full_filter] = n + 1
            if n == 0:
                sid = self._next_id
                self._next_id += 1
                _, group, plain = full_filter.split("/", 2)
                self._ids[full_filter] = sid
                self._groups[sid] = (group, plain)
                change.subscribe.append((full_filter, sid))
            return change
        n = self._plain.get(full_filter, 0)
        self._plain[full_filter] = n + 1
        if n == 0:
            self._cover_add(full_filter, change)
        return change

    def remove(self, client_id: str, full_filter: str) -> RouteChange:
        """``client_id`` unsubscribed from ``full_filter``."""
        change = RouteChange()
        mine = self._clients.get(client_id)
        if mine is None or full_filter not in mine:
            return change
        mine.discard(full_filter)
        if not mine:
            del self._clients[client_id]
        self._release(full_filter, change)
        return change

    def drop_client(self, client_id: str) -> RouteChange:
        """``client_id``'s session ended (or was replaced by a clean one)."""
        change = RouteChange()
        for f in self._clients.pop(client_id, ()):
            self._release(f, change)
        return change

    # ------------------------------------------------------------ outputs
    def wanted(self) -> list[tuple[str, int]]:
        """Every subscription a peer must hold for this broker (a link without a session)."""
        out = [(f, PLAIN_ID) for f in sorted(self._cover)]
        out.extend((f, self._ids[f]) for f in sorted(self._shared))
        return out

    def groups_of(self, sub_ids: tuple[int, ...]) -> tuple[bool, frozenset[tuple[str, str]]]:
        """(for the plain subscriptions?, the shared groups) a forwarded copy is for."""
        if not sub_ids:
            return True, _NONE
        plain = (
            not sub_ids or FETCH_ID in sub_ids or any(i not in self._groups and i != CTL_ID for i in sub_ids)
        )
        groups = frozenset(g for i in sub_ids if (g := self._groups.get(i)) is not None)
        return plain, groups

    @property
    def cover(self) -> frozenset[str]:
        return frozenset(self._cover)

    def __len__(self) -> int:
        """Subscriptions held at each peer."""
        return len(self._cover) + len(self._shared)

    # ------------------------------------------------------------ internals
    def _release(self, f: str, change: RouteChange) -> None:
        if f.startswith(_SHARE):
            n = self._shared[f] - 1
            if n:
                self._shared[f] = n
                return
            del self._shared[f]
            sid = self._ids.pop(f)
            del self._groups[sid]
            change.unsubscribe.append(f)
            return
        n = self._plain[f] - 1
        if n:
            self._plain[f] = n
            return
        del self._plain[f]
        if f not in self._cover:
            return
        self._cover.discard(f)
        change.unsubscribe.append(f)
        for g in self._plain:  # filters only ``f`` covered come back into the cover
            if g not in self._cover and topics.includes(f, g):
                self._cover_add(g, change)

    def _cover_add(self, f: str, change: RouteChange) -> None:
        cover = self._cover
        if any(topics.includes(c, f) for c in cover):
            return
        gone = [c for c in cover if topics.includes(f, c)]
        for c in gone:
            cover.discard(c)
            change.unsubscribe.append(c)
        cover.add(f)
        change.subscribe.append((f, PLAIN_ID))
        # a filter first unsubscribed then subscribed in one change cancels out
        if f in change.unsubscribe:
            change.unsubscribe.remove(f)
            change.subscribe.remove((f, PLAIN_ID))

    def _check(self) -> None:
        """Invariants: the cover covers every local plain filter, and is minimal."""
        for f in self._plain:
            assert any(topics.includes(c, f) for c in self._cover), f
        for c in self._cover:
            assert c in self._plain
            assert not any(d != c and topics.includes(d, c) for d in self._cover), c
        counted: dict[str, int] = {}
        for fs in self._clients.values():
            for f in fs:
                counted[f] = counted.get(f, 0) + 1
        assert counted == {**self._plain, **self._shared}
        assert set(self._ids) == set(self._shared)
