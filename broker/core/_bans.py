"""Bans: clients refused at CONNECT by client id, user name, address or network (issue 39).

Sans-IO: a :class:`BanList` is plain data the core asks at CONNECT time
(:func:`ban_refusal`, called from one statement of ``connect_refusal`` in
``broker/core/_connect.py``, before any authenticate hook) and the admin API
(``broker/_admin.py``) edits; persistence (the store's ``bans`` table, the ``bans_file``)
is the caller's.

A :class:`Ban` has a ``kind`` (:class:`BanKind`: ``client_id``, ``username``, ``address``),
a ``value`` (an exact client id, an exact user name, or an IP address / CIDR network in
canonical form: ``10.0.0.0/8``, ``::1/128``), an optional wall-clock expiry and a reason.
A CONNECT is refused (MQTT 5: CONNACK 0x8A Banned; 3.1/3.1.1: return code 5, not
authorized) when any ban that has not expired matches the client id it asks for, the user
name it claims (whatever its password: the check runs before authentication, so a banned
name costs no scrypt) or the address it connects from.

Cost: client-id and user-name bans are dict probes, O(1); address bans are a list of
networks tested in turn, O(address bans) per CONNECT -- never on PUBLISH. Expired bans are
dropped when a CONNECT or a listing finds them (:meth:`BanList.sweep`).
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.packets import ReasonCode

if TYPE_CHECKING:
    from collections.abc import Callable

    from broker.core._connection import Connection
    from broker.packets import Connect

__all__ = ["Ban", "BanKind", "BanList", "ban_refusal", "canonical", "peer_address"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class BanKind(enum.Enum):
    CLIENT_ID = "client_id"
    USERNAME = "username"
    ADDRESS = "address"


@dataclass(frozen=True, slots=True)
class Ban:
    """One ban; ``expires_at`` is a wall-clock time (``time.time()``), None = never."""

    kind: BanKind
    value: str
    expires_at: float | None = None
    reason: str = ""
    created_at: float = 0.0

    def to_json(self, now: float) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "value": self.value,
            "expires_at": self.expires_at,
            "expires_in": None if self.expires_at is None else max(0.0, round(self.expires_at - now, 1)),
            "reason": self.reason,
            "created_at": self.created_at,
        }


def canonical(kind: BanKind, value: str) -> str:
    """The stored form of a ban's value: an address becomes its network (``10.1.2.3`` ->
    ``10.1.2.3/32``, ``10.1.2.3/8`` is refused as it has host bits: ValueError). Client ids
    and user names are kept as given (1..65535 characters)."""
    if not value or len(value) > 65535:
        raise ValueError(f"a {kind.value} ban needs a value of 1 to 65535 characters")
    if kind is BanKind.ADDRESS:
        return str(ipaddress.ip_network(value, strict=True))
    return value


def peer_address(peer: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address of a connection's ``peer`` (a socket peername tuple), or None (a Unix
    socket, an in-process connection). IPv4-mapped IPv6 addresses give the IPv4 address."""
    if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
        return None
    try:
        addr = ipaddress.ip_address(peer[0].partition("%")[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


class BanList:
    """The bans in force, by kind (see the module docstring for the costs)."""

    __slots__ = ("_by_key", "_networks", "refused", "watchers")

    def __init__(self) -> None:
        #: CONNECTs refused by a ban (``siftmq_banned_total`` in /metrics)
        self.refused = 0
        self._by_key: dict[tuple[BanKind, str], Ban] = {}
        self._networks: list[tuple[Network, Ban]] = []
        #: told of each change an operator makes here (:meth:`announce`): the cluster, which
        #: sends it to the other nodes (cluster/_node.py); (ban, removed) -> None
        self.watchers: list[Callable[[Ban, bool], None]] = []

    def announce(self, ban: Ban, removed: bool) -> None:
        """Tell the watchers that an operator added (or removed) ``ban`` on this node (not
        called for a change received from another node, nor for an expiry). O(watchers)."""
        for watcher in self.watchers:
            watcher(ban, removed)

    def get(self, kind: BanKind, value: str) -> Ban | None:
        """The ban of ``(kind, value)`` (canonical value), expired or not. O(1)."""
        return self._by_key.get((kind, value))

    def __len__(self) -> int:
        return len(self._by_key)

    def add(self, ban: Ban) -> None:
        """Add or replace the ban of ``(kind, value)``; ``value`` must be canonical."""
        key = (ban.kind, ban.value)
        self._by_key[key] = ban
        if ban.kind is BanKind.ADDRESS:
            self._networks = [(n, b) for n, b in self._networks if b.value != ban.value]
            self._networks.append((ipaddress.ip_network(ban.value), ban))

    def remove(self, kind: BanKind, value: str) -> Ban | None:
        """Lift a ban; the ban removed, or None when there was none."""
        ban = self._by_key.pop((kind, value), None)
        if ban is not None and kind is BanKind.ADDRESS:
            self._networks = [(n, b) for n, b in self._networks if b.value != value]
        return ban

    def sweep(self, now: float) -> list[Ban]:
        """Remove the bans expired at wall time ``now``; returns them. O(bans)."""
        gone = [b for b in self._by_key.values() if b.expires_at is not None and b.expires_at <= now]
        for b in gone:
            self.remove(b.kind, b.value)
        return gone

    def all(self) -> list[Ban]:
        """Every ban, sorted by kind then value."""
        return sorted(self._by_key.values(), key=lambda b: (b.kind.value, b.value))

    def match(self, client_id: str, username: str | None, peer: object, now: float) -> Ban | None:
        """The first ban in force that matches (client id, user name, then address), or None."""
        if not self._by_key:
            return None
        by_key = self._by_key
        found = by_key.get((BanKind.CLIENT_ID, client_id))
        if found is None and username is not None:
            found = by_key.get((BanKind.USERNAME, username))
        if found is None and self._networks:
            addr = peer_address(peer)
            if addr is not None:
                found = next((b for n, b in self._networks if addr in n), None)
        if found is not None and found.expires_at is not None and found.expires_at <= now:
            self.remove(found.kind, found.value)
            return self.match(client_id, username, peer, now)
        return found


def ban_refusal(conn: Connection, p: Connect) -> tuple[ReasonCode, str] | None:
    """(0x8A Banned, the reason) when a ban matches this CONNECT, else None (one dict probe
    when there are no bans). The codec sends 0x8A as return code 5 to MQTT 3.1/3.1.1."""
    core = conn.core
    bans = core.bans
    if not len(bans):
        return None
    ban = bans.match(p.client_id, p.username, conn.peer, core.clock.wall())
    if ban is None:
        return None
    bans.refused += 1  # logged by the refusal (client.refused, rate-limited)
    return ReasonCode.BANNED, "banned" + (f": {ban.reason[:200]}" if ban.reason else "")
