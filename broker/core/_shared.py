"""Which member of a shared subscription group gets a message (issue 39 item 5), no I/O.

``$share/<group>/<filter>`` delivers each message to one member of the group.  The router
hands this module the members the message may go to (:class:`Members`, built once per routing
plan, so once per change of the group for a cached topic) and :class:`SharedPolicy` picks one,
under the group's strategy (the names EMQX users know):

``round_robin`` (the default)
    the members in turn (a counter per group).
``random``
    a uniformly random member (``random.Random(seed)``: a configured seed makes it
    reproducible, for tests).
``sticky``
    the same member until it leaves the group (or stops matching), then the next in turn.
``hash_clientid``
    ``zlib.crc32(publisher client id) % members``: one publisher's messages always reach the
    same member while the group is unchanged (a stable hash: the same member after a restart
    with the same members in the same order, unlike Python's salted ``hash()``).
``hash_topic``
    ``zlib.crc32(topic name) % members``: one topic's messages always reach the same member.
``local``
    in a cluster, a member connected to this node first (round robin among them); only when
    there is none, round robin over all (the links of the other nodes are members too:
    docs/cluster.md).  On a single broker it is ``round_robin``.

Cost: :meth:`SharedPolicy.pick` is O(1) for every strategy (a counter, one RNG draw, one dict
lookup of the sticky member, one CRC of the publisher id or topic name); no strategy scans the
members.  :meth:`Members.of` is O(members); :class:`Groups` keeps each group's :class:`Members`
(all of them, the local ones a peer's message goes to, the reachable ones while a cluster node is
down) from one membership change to the next, so a message pays O(1) per group whether its topic
has a routing plan or not and whether it was published here or forwarded by a peer: the O(members)
build is paid once per change of the group (a SUBSCRIBE / UNSUBSCRIBE of ``$share/<group>/...``, a
member's session ending) or of the unreachable nodes.  Only a group whose members carry content
filters is still filtered per message (its candidates depend on the payload).  State: one counter
and one sticky client id per group, and the cached :class:`Members`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from enum import Enum

from broker.values import PEER_PREFIX, SubOptions

__all__ = ["Groups", "Members", "SharedPolicy", "Strategy", "group_strategies", "reachable"]


class Strategy(Enum):
    """How a shared subscription group picks the member that receives a message (the values
    are the names of the configuration, ``broker._config.SHARED_STRATEGIES``)."""

    ROUND_ROBIN = "round_robin"
    RANDOM = "random"
    STICKY = "sticky"
    HASH_CLIENTID = "hash_clientid"
    HASH_TOPIC = "hash_topic"
    LOCAL = "local"


def group_strategies(rules: tuple[str, ...]) -> dict[str, Strategy]:
    """``("g1=sticky", ...)`` as ``{"g1": Strategy.STICKY}``; ValueError on a malformed rule
    (the configuration refuses those first: ``broker._config.shared_group_strategies``).
    O(rules)."""
    out: dict[str, Strategy] = {}
    for rule in rules:
        group, sep, name = rule.partition("=")
        if not sep or not group or any(c in group for c in "/+#"):
            raise ValueError(rule)
        out[group] = Strategy(name)
    return out


@dataclass(frozen=True, slots=True)
class Members:
    """The members of one group a message may go to, with what the strategies look up in O(1).

    ``members``: ``(client id, options)`` in subscription order; ``positions``: client id ->
    its index (sticky); ``local``: the indexes of members that are not another node's link
    (local); ``selective``: some member carries a content filter (its candidates depend on the
    message).  Built in O(members).
    """

    members: list[tuple[str, SubOptions]]
    positions: dict[str, int]
    local: list[int]
    selective: bool

    @staticmethod
    def of(members: list[tuple[str, SubOptions]]) -> Members:
        positions: dict[str, int] = {}
        local: list[int] = []
        selective = False
        for i, (cid, o) in enumerate(members):
            positions[cid] = i
            if not cid.startswith(PEER_PREFIX):
                local.append(i)
            if o.selector is not None:
                selective = True
        return Members(members, positions, local, selective)


def reachable(group: Members, unavailable: AbstractSet[str]) -> Members:
    """``group`` without the members in ``unavailable``; ``group`` itself when that leaves
    none or removes none (nobody reachable: every member again, in turn). O(members).

    The one home of the rule: :meth:`Groups.reachable` keeps its result per group, the
    router's content-filter branch (``Router._route_shared``, candidates depend on the
    payload) calls it per message."""
    reachable = [m for m in group.members if m[0] not in unavailable]
    if reachable and len(reachable) < len(group.members):
        return Members.of(reachable)
    return group


class Groups:
    """The :class:`Members` of each shared group ``(group, filter)``, built at first use and
    kept until the group changes (:meth:`drop`, called by the router's index on every
    subscription change of the group) or the unreachable nodes do (:meth:`reachable`).

    ``built`` counts the :class:`Members` built (tests: a message on a topic without a routing
    plan, or from a peer, builds none while the group is unchanged).  Space: O(members of the
    groups messages went to).
    """

    __slots__ = ("_all", "_local", "_reach", "_unavailable", "built")

    def __init__(self) -> None:
        self._all: dict[tuple[str, str], Members] = {}
        self._local: dict[tuple[str, str], Members] = {}
        # (group key, local) -> (the group it was computed from, its reachable members)
        self._reach: dict[tuple[tuple[str, str], bool], tuple[Members, Members]] = {}
        self._unavailable: AbstractSet[str] = frozenset()
        self.built = 0

    def of(self, key: tuple[str, str], members: list[tuple[str, SubOptions]]) -> Members:
        """The group's members; ``members`` (the index's list for ``key``) is read only when
        the group changed since the last call. O(1) amortized."""
        group = self._all.get(key)
        if group is None:
            group = self._all[key] = Members.of(members)
            self.built += 1
        return group

    def local(self, key: tuple[str, str], members: list[tuple[str, SubOptions]]) -> Members:
        """The group's members that are not another node's link (where a message a peer
        forwarded for this group goes). O(1) amortized."""
        group = self._local.get(key)
        if group is None:
            full = self.of(key, members)
            group = full
            if len(full.local) < len(full.members):
                group = Members.of([full.members[i] for i in full.local])
                self.built += 1
            self._local[key] = group
        return group

    def reachable(
        self, key: tuple[str, str], group: Members, unavailable: AbstractSet[str], local: bool
    ) -> Members:
        """``group`` (what :meth:`of` or, ``local``, :meth:`local` returned for ``key``)
        without the members in ``unavailable`` while one is left.  O(1) amortized: computed
        again when the group or the ``unavailable`` set (a new object each time the cluster's
        view changes: ``Router.unavailable``) is not the one it was computed for."""
        if unavailable is not self._unavailable:
            self._reach.clear()
            self._unavailable = unavailable
        at = (key, local)
        entry = self._reach.get(at)
        if entry is not None and entry[0] is group:
            return entry[1]
        out = reachable(group, unavailable)
        if out is not group:
            self.built += 1
        self._reach[at] = (group, out)
        return out

    def kept(self) -> bool:
        """Some group is kept (a removed session's groups need dropping). O(1)."""
        return bool(self._all)

    def drop(self, key: tuple[str, str]) -> None:
        """Forget what was built for ``key`` (its membership changed). O(1)."""
        self._all.pop(key, None)
        self._local.pop(key, None)
        self._reach.pop((key, False), None)
        self._reach.pop((key, True), None)

    def check(self, shared: dict[tuple[str, str], list[tuple[str, SubOptions]]]) -> None:
        """Assert that every group kept for a key of ``shared`` (the index's members of the
        groups matching some topic) equals one built afresh. O(their members)."""
        for key, members in shared.items():
            fresh = Members.of(members)
            kept = self._all.get(key)
            assert kept is None or kept == fresh, key
            kept = self._local.get(key)
            assert kept is None or kept == Members.of([fresh.members[i] for i in fresh.local]), key


def _generator(seed: int | None) -> Callable[[], float]:
    """``random.Random(seed).random``: the ``random`` module imported at the first draw."""
    import random

    return random.Random(seed).random


def _crc32() -> Callable[[bytes], int]:
    """``zlib.crc32``, imported at the first hashed pick."""
    import zlib

    return zlib.crc32


class SharedPolicy:
    """The strategies of a broker's shared groups and the state they keep (one counter and
    one sticky member per group, keyed by ``(group, filter)``)."""

    __slots__ = ("_crc32", "_groups", "_random", "_rr", "_seed", "_sticky", "strategy")

    def __init__(
        self,
        strategy: Strategy = Strategy.ROUND_ROBIN,
        groups: Mapping[str, Strategy] | None = None,
        seed: int | None = None,
    ) -> None:
        self.strategy = strategy
        self._groups: dict[str, Strategy] = dict(groups or {})
        # random and zlib are imported by the first group whose strategy needs them (issue 42
        # item 1: a broker without shared groups does not load them; the seeded generator
        # made at its first draw gives the same draws as one made here)
        self._seed = seed
        self._random: Callable[[], float] | None = None
        self._crc32: Callable[[bytes], int] | None = None
        self._rr: dict[tuple[str, str], int] = {}
        self._sticky: dict[tuple[str, str], str] = {}

    def _hash(self, text: str) -> int:
        """CRC-32 of ``text``'s UTF-8 (the hashed strategies' pick; zlib imported at the
        first). O(len(text))."""
        crc = self._crc32
        if crc is None:
            crc = self._crc32 = _crc32()
        return crc(text.encode())

    def pick(self, key: tuple[str, str], group: Members, publisher: str | None, topic: str) -> int:
        """The index in ``group.members`` (not empty) of the member that gets a message
        published by ``publisher`` on ``topic``. O(1) (plus the CRC of the hashed string)."""
        n = len(group.members)
        groups = self._groups
        strategy = groups.get(key[0], self.strategy) if groups else self.strategy
        rr = self._rr
        match strategy:
            case Strategy.ROUND_ROBIN:
                turn = rr.get(key, 0)
                rr[key] = turn + 1
                return turn % n
            case Strategy.RANDOM:
                draw = self._random
                if draw is None:
                    draw = self._random = _generator(self._seed)
                return int(draw() * n)  # randrange(n) costs twice as much
            case Strategy.STICKY:
                chosen = self._sticky.get(key)
                if chosen is not None:
                    i = group.positions.get(chosen)
                    if i is not None:
                        return i
                turn = rr.get(key, 0)
                rr[key] = turn + 1
                i = turn % n
                self._sticky[key] = group.members[i][0]
                return i
            case Strategy.HASH_CLIENTID:
                return self._hash(publisher or "") % n
            case Strategy.HASH_TOPIC:
                return self._hash(topic) % n
            case Strategy.LOCAL:
                turn = rr.get(key, 0)
                rr[key] = turn + 1
                local = group.local
                return local[turn % len(local)] if local else turn % n
