"""The QoS 2 packet identifiers this node received from each peer and not yet released
(issue 30, finding 6): exactly once across a link must outlive the link object and the
process.

A link receives a peer's QoS 2 PUBLISH, injects it, and answers PUBREC once the local store
made it durable; the id stays "received" until the peer's PUBREL.  A PUBLISH resent under a
received id is the same message (MQTT 4.3.3): it is answered PUBREC and not injected again.
The set used to live in the :class:`~cluster._link.PeerLink` object, which the node throws
away when the peer leaves the membership (a partition longer than the failure timeout): the
peer's resend after the heal was then injected twice.  It also died with the process (the
documented hole of docs/cluster.md).

Here the sets are kept per peer for the node's life and, with persistence on, in the broker's
own store, under the client id ``$cluster-in/<peer>`` (the store's ``qos2_in`` table, which
keeps ids without a session row: ``Broker.restored_qos2_in`` hands them back at start).  The
id's row is written in the same store transaction as the injected message's copies for the
local subscribers (``ClusterNode._inject`` adds it before asking for the durable signal), so
a ``kill -9`` leaves either both (the resend is recognised) or neither (the resend is the
first copy): no window.  Without persistence, nothing the node holds survives a restart
anyway, and the sets are in memory only.
"""

from __future__ import annotations

import concurrent.futures
from typing import Protocol

__all__ = ["IN_PREFIX", "ReceivedQos2"]

#: the client id under which a peer's received QoS 2 ids are stored
IN_PREFIX = "$cluster-in/"


class _Store(Protocol):
    def qos2_received(self, client_id: str, packet_id: int) -> None: ...
    def qos2_released(self, client_id: str, packet_id: int) -> None: ...
    def sync(self) -> concurrent.futures.Future[None]: ...


class ReceivedQos2:
    """Per-peer sets of received QoS 2 ids, stored in the broker's store once attached."""

    def __init__(self) -> None:
        self._ids: dict[str, set[int]] = {}
        self.store: _Store | None = None

    def attach(self, store: _Store | None, restored: dict[str, set[int]]) -> None:
        """Use ``store`` from now on; ``restored``: the ids it held at start (by client id)."""
        self.store = store
        for cid, ids in restored.items():
            if cid.startswith(IN_PREFIX):
                self.of(cid[len(IN_PREFIX) :]).update(ids)

    def of(self, peer: str) -> set[int]:
        """The live set of ``peer`` (read it; change it only through this object)."""
        return self._ids.setdefault(peer, set())

    def received(self, peer: str, pid: int) -> None:
        """``peer``'s QoS 2 PUBLISH ``pid`` was injected: remembered, and stored in the same
        transaction as the injection's copies (call it before asking the store to sync)."""
        self.of(peer).add(pid)
        if self.store is not None:
            self.store.qos2_received(IN_PREFIX + peer, pid)

    def discard(self, peer: str, pid: int) -> concurrent.futures.Future[None] | None:
        """``peer`` released ``pid`` (PUBREL): the store's signal that the release is durable
        (the PUBCOMP waits for it, as the broker's own does: a stale id restored after a crash
        would swallow the peer's next message under that id), or None if nothing was written."""
        ids = self.of(peer)
        if pid in ids:
            ids.discard(pid)
            if self.store is not None:
                self.store.qos2_released(IN_PREFIX + peer, pid)
                return self.store.sync()
        return None

    def clear(self, peer: str) -> None:
        """``peer``'s session for us was new: nothing it sent before counts."""
        ids = self.of(peer)
        if self.store is not None:
            for pid in ids:
                self.store.qos2_released(IN_PREFIX + peer, pid)
        ids.clear()
