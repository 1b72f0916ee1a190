"""Per-address back-off of failed logins (issue 37, item 3; docs/security.md, "Failed logins").

Sans-IO: the CONNECT path asks :meth:`LoginBackoff.blocked` before any authenticate hook
runs for a CONNECT that carries credentials (a user name or a password) and reports each
refusal of such a CONNECT by a hook with :meth:`LoginBackoff.failed`.

The rule, per source address (the IP, without the port):

* ``failures`` failed logins within ``window`` seconds (counted from the first of them)
  start a back-off: for ``base`` seconds every CONNECT with credentials from that address is
  refused at once, without asking the hooks (no scrypt, no call to an auth service);
* each further back-off of the same address doubles the period, up to ``cap`` seconds;
* an address that has not failed for ``cap`` seconds after its last back-off ended starts
  again from ``base``.

A successful login does not reset an address: behind one NAT address a guesser and a good
client look the same, and the good client's success must not buy the guesser new tries.
Anonymous CONNECTs (no credentials) are never blocked: they cost no password check.

Memory is bounded: at most ``addresses`` entries, the least recently failed dropped first
(an ``OrderedDict`` used as an LRU), so a scan from many addresses cannot grow it without
end; dropping an entry forgets its back-off (an attacker with that many addresses gains
nothing a single address would not have from the next window anyway).
Every operation is O(1).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["DEFAULT_ADDRESSES", "LoginBackoff", "address_of"]

#: addresses remembered at most (about 100 bytes each)
DEFAULT_ADDRESSES = 10_000


def address_of(peer: object) -> str:
    """The source address of a transport's peer name: the host of ``(host, port, ...)``,
    else its text (a Unix socket path, a test's fixed peer). O(1)."""
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return str(peer)


@dataclass(slots=True)
class _Address:
    """One address's failures in the current window and its back-off state."""

    window_start: float
    failures: int = 0
    blocked_until: float = 0.0
    level: int = 0  # back-offs so far (the next lasts base * 2**level, capped)


class LoginBackoff:
    """Failed logins per source address and their exponential back-off (O(1) per call).

    ``failures`` 0 turns it off (nothing is recorded, nothing blocked).
    """

    __slots__ = ("_entries", "addresses", "base", "cap", "failures", "window")

    def __init__(
        self,
        failures: int = 5,
        window: float = 60.0,
        base: float = 1.0,
        cap: float = 300.0,
        addresses: int = DEFAULT_ADDRESSES,
    ) -> None:
        if failures < 0 or window <= 0 or base <= 0 or cap < base or addresses < 1:
            raise ValueError("login back-off: failures >= 0, window > 0, 0 < base <= cap, addresses >= 1")
        self.failures = failures
        self.window = window
        self.base = base
        self.cap = cap
        self.addresses = addresses
        self._entries: OrderedDict[str, _Address] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def retune(self, failures: int, window: float, base: float, cap: float) -> None:
        """New parameters (a reload: ``broker._reload``), keeping every address's state: a
        back-off running now runs to its end; counts at or above a lowered ``failures`` are
        cut to one below it, so the next failure starts a back-off. O(addresses)."""
        if failures < 0 or window <= 0 or base <= 0 or cap < base:
            raise ValueError("login back-off: failures >= 0, window > 0, 0 < base <= cap")
        self.failures, self.window, self.base, self.cap = failures, window, base, cap
        top = max(failures, 1) - 1
        for entry in self._entries.values():
            entry.failures = min(entry.failures, top)

    def _check(self) -> None:
        assert len(self._entries) <= self.addresses
        for entry in self._entries.values():
            assert 0 <= entry.failures < max(self.failures, 1)
            assert entry.level >= 0

    def blocked(self, address: str, now: float) -> float:
        """Seconds ``address`` is still blocked at ``now`` (0.0: not blocked). O(1)."""
        entry = self._entries.get(address)
        if entry is None or now >= entry.blocked_until:
            return 0.0
        return entry.blocked_until - now

    def failed(self, address: str, now: float) -> float:
        """Record a failed login; returns the back-off it started (seconds), else 0.0. O(1)."""
        if not self.failures:
            return 0.0
        entries = self._entries
        entry = entries.get(address)
        if entry is None:
            entry = entries[address] = _Address(now)
            if len(entries) > self.addresses:
                entries.popitem(last=False)
        else:
            entries.move_to_end(address)
            if entry.level and now >= entry.blocked_until + self.cap:
                entry.level = 0  # quiet for long enough: start again from ``base``
            if now - entry.window_start > self.window:
                entry.window_start, entry.failures = now, 0
        entry.failures += 1
        if entry.failures < self.failures:
            return 0.0
        period = min(self.base * (1 << min(entry.level, 30)), self.cap)
        entry.level += 1
        entry.failures = 0
        entry.window_start = now
        entry.blocked_until = now + period
        return period
