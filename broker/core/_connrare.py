"""The rarely used state of a connection, kept out of its object until first set (issue 27, item 2).

A compiled (mypyc) :class:`~broker.core._connection.Connection` has a fixed C layout: every
attribute costs 8 bytes in every connection whether it is ever used or not. Most of its
state is the same for almost every idle device: flow control (congested since, the paused
publishers, slow, the blockers, the store gate, the packets read while paused), topic
aliases (MQTT 5 clients that allow them), the acknowledgements held for the store's
durable signal, the gated CONNACK of a persisted session, the CONNECT held while an
authenticate hook's awaitable runs (``authenticating``), the mosquitto-bridge flag, the
cluster peer-link mark, the
MQTT 5 request-problem-information flag, the will-on-close flag, the close reason, the
listener's slow-consumer policy and a fixed peer address (unit tests). Those 20 fields
live in one :class:`Rare` object that a connection creates the first time one of them is
set to something other than its default (:class:`RareFields`): an idle connection holds one
``None`` instead of 20 slots (152 B less).

The fields stay attributes to every reader and writer (``conn.blockers += 1``,
``conn.feeders is NO_FEEDERS``): :class:`RareFields` defines them as properties whose
getter answers the default while there is no :class:`Rare`, and whose setter creates it
only for a value other than the default. The shared empty containers (``NO_FEEDERS``,
``NO_ALIASES_OUT``, ``NO_ALIASES_IN``, the empty pending list) are the defaults: written to
never (``Connection._check``); a connection that needs its own assigns a new one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from broker.packets import Packet

if TYPE_CHECKING:
    from broker.core._connection import Connection
    from broker.core._quota import ClientQuota

__all__ = ["NO_ALIASES_IN", "NO_ALIASES_OUT", "NO_FEEDERS", "NO_PACKETS", "Rare", "RareFields"]

#: shared empty containers of the connections that never need their own: written to never
NO_FEEDERS: Final[set[Connection]] = set()
NO_ALIASES_OUT: Final[dict[str, int]] = {}
NO_ALIASES_IN: Final[dict[int, str]] = {}
NO_PACKETS: Final[list[Packet]] = []
#: the close reason of a connection nobody closed on purpose
LOST: Final = "connection lost"


class Rare:
    """The rarely used fields of one connection (their meaning: ``Connection.__init__``)."""

    def __init__(self) -> None:
        self.congested_since: float | None = None
        self.feeders: set[Connection] = NO_FEEDERS
        self.slow = False
        self.blockers = 0
        self.store_wait = False
        self.pending: list[Packet] = NO_PACKETS
        self.listener_policy: str | None = None
        self.fixed_peer: object = None
        self.client_alias_max = 0
        self.alias_out: dict[str, int] = NO_ALIASES_OUT
        self.alias_in: dict[int, str] = NO_ALIASES_IN
        self.held = 0
        self.held_writes = 0
        self.gated = False
        self.authenticating = False
        self.bridge = False
        self.peer_link = False
        self.problem_info = True
        self.will_on_close = True
        self.close_reason = LOST
        self.quota: ClientQuota | None = None  # publish quota (issue 39; core/_quota.py)


class RareFields:
    """The base of ``Connection``: its rarely used fields, in a :class:`Rare` made on demand."""

    def __init__(self) -> None:
        self.rare: Rare | None = None

    def _rare(self) -> Rare:
        r = self.rare
        if r is None:
            r = self.rare = Rare()
        return r

    @property
    def congested_since(self) -> float | None:
        r = self.rare
        return None if r is None else r.congested_since

    @congested_since.setter
    def congested_since(self, value: float | None) -> None:
        if value is not None or self.rare is not None:
            self._rare().congested_since = value

    @property
    def feeders(self) -> set[Connection]:
        r = self.rare
        return NO_FEEDERS if r is None else r.feeders

    @feeders.setter
    def feeders(self, value: set[Connection]) -> None:
        if value is not NO_FEEDERS or self.rare is not None:
            self._rare().feeders = value

    @property
    def slow(self) -> bool:
        r = self.rare
        return False if r is None else r.slow

    @slow.setter
    def slow(self, value: bool) -> None:
        if value or self.rare is not None:
            self._rare().slow = value

    @property
    def blockers(self) -> int:
        r = self.rare
        return 0 if r is None else r.blockers

    @blockers.setter
    def blockers(self, value: int) -> None:
        if value or self.rare is not None:
            self._rare().blockers = value

    @property
    def store_wait(self) -> bool:
        r = self.rare
        return False if r is None else r.store_wait

    @store_wait.setter
    def store_wait(self, value: bool) -> None:
        if value or self.rare is not None:
            self._rare().store_wait = value

    @property
    def pending(self) -> list[Packet]:
        r = self.rare
        return NO_PACKETS if r is None else r.pending

    @pending.setter
    def pending(self, value: list[Packet]) -> None:
        if value is not NO_PACKETS or self.rare is not None:
            self._rare().pending = value

    @property
    def listener_policy(self) -> str | None:
        r = self.rare
        return None if r is None else r.listener_policy

    @listener_policy.setter
    def listener_policy(self, value: str | None) -> None:
        if value is not None or self.rare is not None:
            self._rare().listener_policy = value

    @property
    def fixed_peer(self) -> object:
        r = self.rare
        return None if r is None else r.fixed_peer

    @fixed_peer.setter
    def fixed_peer(self, value: object) -> None:
        if value is not None or self.rare is not None:
            self._rare().fixed_peer = value

    @property
    def client_alias_max(self) -> int:
        r = self.rare
        return 0 if r is None else r.client_alias_max

    @client_alias_max.setter
    def client_alias_max(self, value: int) -> None:
        if value or self.rare is not None:
            self._rare().client_alias_max = value

    @property
    def alias_out(self) -> dict[str, int]:
        r = self.rare
        return NO_ALIASES_OUT if r is None else r.alias_out

    @alias_out.setter
    def alias_out(self, value: dict[str, int]) -> None:
        if value is not NO_ALIASES_OUT or self.rare is not None:
            self._rare().alias_out = value

    @property
    def alias_in(self) -> dict[int, str]:
        r = self.rare
        return NO_ALIASES_IN if r is None else r.alias_in

    @alias_in.setter
    def alias_in(self, value: dict[int, str]) -> None:
        if value is not NO_ALIASES_IN or self.rare is not None:
            self._rare().alias_in = value

    @property
    def held(self) -> int:
        r = self.rare
        return 0 if r is None else r.held

    @held.setter
    def held(self, value: int) -> None:
        if value or self.rare is not None:
            self._rare().held = value

    @property
    def held_writes(self) -> int:
        r = self.rare
        return 0 if r is None else r.held_writes

    @held_writes.setter
    def held_writes(self, value: int) -> None:
        if value or self.rare is not None:
            self._rare().held_writes = value

    @property
    def gated(self) -> bool:
        r = self.rare
        return False if r is None else r.gated

    @gated.setter
    def gated(self, value: bool) -> None:
        if value or self.rare is not None:
            self._rare().gated = value

    @property
    def peer_link(self) -> bool:
        """A cluster peer's link whose token the cluster verified at CONNECT (``Core.peer_auth``):
        the only kind of client that may use the broker's internal topics (``$cluster/...``)."""
        r = self.rare
        return False if r is None else r.peer_link

    @peer_link.setter
    def peer_link(self, value: bool) -> None:
        if value or self.rare is not None:
            self._rare().peer_link = value

    @property
    def authenticating(self) -> bool:
        r = self.rare
        return False if r is None else r.authenticating

    @authenticating.setter
    def authenticating(self, value: bool) -> None:
        if value or self.rare is not None:
            self._rare().authenticating = value

    @property
    def bridge(self) -> bool:
        r = self.rare
        return False if r is None else r.bridge

    @bridge.setter
    def bridge(self, value: bool) -> None:
        if value or self.rare is not None:
            self._rare().bridge = value

    @property
    def problem_info(self) -> bool:
        r = self.rare
        return True if r is None else r.problem_info

    @problem_info.setter
    def problem_info(self, value: bool) -> None:
        if not value or self.rare is not None:
            self._rare().problem_info = value

    @property
    def will_on_close(self) -> bool:
        r = self.rare
        return True if r is None else r.will_on_close

    @will_on_close.setter
    def will_on_close(self, value: bool) -> None:
        if not value or self.rare is not None:
            self._rare().will_on_close = value

    @property
    def close_reason(self) -> str:
        r = self.rare
        return LOST if r is None else r.close_reason

    @close_reason.setter
    def close_reason(self, value: str) -> None:
        if value != LOST or self.rare is not None:
            self._rare().close_reason = value

    @property
    def quota(self) -> ClientQuota | None:
        r = self.rare
        return None if r is None else r.quota

    @quota.setter
    def quota(self, value: ClientQuota | None) -> None:
        if value is not None or self.rare is not None:
            self._rare().quota = value
