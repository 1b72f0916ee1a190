"""Bans shared by every node of the cluster (issue 39; docs/cluster.md, "Bans").

A ban added or lifted through one node's admin API (``BanList.announce``, broker/_admin.py) is
sent to every member as a control message (``t: ban``, QoS 1 over the links, kept in the
peers' link sessions while they are unreachable, as retained messages travel:
cluster/_retained.py); a node that receives it applies it as its own admin API would: the ban
is added (and saved: the store's ``bans`` table or the ``bans_file``) and the connected
clients it matches are disconnected (DISCONNECT 0x98), or it is lifted.  When a link comes up
the node asks the peer for all its bans (``t: ban?``), which repairs what an expired link
session, a restart or a join missed.

Convergence is last writer wins per ``(kind, value)``: each change carries a stamp, the wall
time it was made at (a ban's ``created_at``; a lift's time); a node applies a change only when
its stamp is above the one it holds for that key (its ban's ``created_at``, or the stamp of a
lift it saw: a tombstone, kept in memory).  A stamp more than :data:`MAX_AHEAD_S` ahead of this
node's clock is refused (counted, as a retained stamp is).  Expiries are absolute wall times,
so every node drops an expired ban on its own (no message).

Not covered (documented): clocks that disagree by more than the time between two changes of
one ban can order them wrongly (a stamp is wall time, not a hybrid logical clock); tombstones
live in memory only, so a lift that a node missed while every node that saw it restarted is
lost, and that node's stored ban spreads again.

Costs: a change is one control message per peer; a link coming up costs O(bans); nothing on
the CONNECT path beyond the ban list's own probes.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from broker.ext import Ban, BanKind, canonical, enforce_ban, save_ban
from cluster._control import BadControl
from cluster._retained import MAX_AHEAD_MS

if TYPE_CHECKING:
    from broker.ext import Broker

__all__ = ["MAX_AHEAD_S", "SharedBans"]

log = logging.getLogger("siftmq.cluster")

#: a peer's ban stamp may be this far ahead of this node's wall clock (seconds): the skew the
#: cluster tolerates for retained stamps
MAX_AHEAD_S: Final = MAX_AHEAD_MS / 1000


class SharedBans:
    """The cluster's side of one node's bans: sends this node's changes, applies the peers'."""

    def __init__(
        self,
        broker: Broker,
        send: Callable[[str, dict[str, Any]], None],
        peers: Callable[[], list[str]],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.broker = broker
        self._send = send
        self._peers = peers
        self._wall = wall
        #: (kind, value) -> the stamp of the last lift seen (tombstones)
        self.lifted: dict[tuple[str, str], float] = {}
        #: changes from peers applied / ignored as older / refused as too far ahead
        self.applied = 0
        self.stale = 0
        self.refused = 0
        broker.core.bans.watchers.append(self.changed)

    @staticmethod
    def message(ban: Ban, removed: bool, stamp: float) -> dict[str, Any]:
        msg: dict[str, Any] = {"t": "ban", "k": ban.kind.value, "v": ban.value, "rm": removed, "s": stamp}
        if not removed:
            if ban.expires_at is not None:
                msg["x"] = ban.expires_at
            if ban.reason:
                msg["r"] = ban.reason
        return msg

    def changed(self, ban: Ban, removed: bool) -> None:
        """An operator changed ``ban`` here: to every peer (O(peers))."""
        if removed:
            stamp = max(self._wall(), ban.created_at + 0.001)  # after the ban it lifts
            self.lifted[(ban.kind.value, ban.value)] = stamp
        else:
            stamp = ban.created_at
            self.lifted.pop((ban.kind.value, ban.value), None)
        msg = self.message(ban, removed, stamp)
        for peer in self._peers():
            self._send(peer, msg)

    def dump(self) -> list[dict[str, Any]]:
        """Every ban and every lift this node knows, as ``ban`` messages (O(bans))."""
        out = [self.message(b, False, b.created_at) for b in self.broker.core.bans.all()]
        for (kind, value), stamp in self.lifted.items():
            out.append(self.message(Ban(BanKind(kind), value), True, stamp))
        return out

    def receive(self, msg: dict[str, Any]) -> None:
        """A peer's change: applied when its stamp is the newest for its key (see the module
        docstring); BadControl for a kind or value that is not a ban's. O(sessions) for a
        ban applied (the matching clients are disconnected), else O(1)."""
        try:
            kind = BanKind(msg["k"])
            value = canonical(kind, msg["v"])
        except ValueError as exc:
            raise BadControl(f"ban: {exc}") from None
        if value != msg["v"]:
            raise BadControl(f"ban: {msg['v'][:60]!r} is not in canonical form")
        stamp = float(msg["s"])
        expires = msg.get("x")
        if not math.isfinite(stamp) or (expires is not None and not math.isfinite(expires)):
            # json.loads takes NaN: a NaN stamp compares false both ways (never stale, never lifted)
            raise BadControl("ban: a stamp or expiry that is not a finite number")
        now = self._wall()
        if stamp > now + MAX_AHEAD_S:
            self.refused += 1
            return
        bans = self.broker.core.bans
        key = (kind.value, value)
        current = bans.get(kind, value)
        held = max(self.lifted.get(key, 0.0), current.created_at if current is not None else 0.0)
        if stamp <= held:
            self.stale += 1
            return
        self.applied += 1
        if msg["rm"]:
            self.lifted[key] = stamp
            gone = bans.remove(kind, value)
            if gone is not None:
                self._save(gone, True)
                log.warning("ban %s %r lifted by another node of the cluster", kind.value, value[:100])
            return
        self.lifted.pop(key, None)
        ban = Ban(kind, value, None if expires is None else float(expires), str(msg.get("r", "")), stamp)
        bans.add(ban)
        self._save(ban, False)
        kicked = enforce_ban(self.broker, ban, now)
        log.warning(
            "ban %s %r added by another node of the cluster; %d clients disconnected",
            kind.value,
            value[:100],
            len(kicked),
        )

    def _save(self, ban: Ban, gone: bool) -> None:
        try:
            save_ban(self.broker, ban, gone)
        except OSError as exc:  # kept in memory; said once per change
            log.error("bans file not written (the ban holds until a restart): %s", exc)
