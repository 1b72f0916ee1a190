"""A queue bound of its own for one session, in messages and bytes, with a drop policy (sans-IO).

The broker bounds every session's queue by ``max_queued_messages`` and drops the newest
QoS 1/2 message at the bound (``Core._queue_full``).  A session registered in
``Core.queue_bounds`` (client id -> :class:`QueueBound`; the outbound bridges register their
``$uplink/<name>`` sessions, docs/bridging-out.md "The store-and-forward bound") is bounded by
its :class:`QueueBound` instead: at most ``messages`` queued messages and, when ``max_bytes``
is not 0, at most ``max_bytes`` bytes of topics and payloads, and at the bound either the
newest message is dropped (``drop_oldest`` false: the queue keeps the oldest, as
``max_queued_messages`` does) or the oldest queued ones make room for it (``drop_oldest``
true: the queue keeps the most recent).  Every drop is counted here (``dropped``) and in the
broker's ``queue_overflow``, and logged rate-limited (the line is built only when it is
logged: ``Core.log_limit`` with a callable); a dropped queued message leaves the
store too (``journal.dropped``).

With ``pace`` (the bridges' ``queue_policy = "pace"``) nothing is dropped at the bound: the
connection whose PUBLISH is being routed (``Core.current``) is paused as flow control pauses
a publisher (``Core.block``: its socket is not read, the packets of its read not processed yet
wait), the message is queued (past the bound by what that publisher's read already held: it
gets its PUBACK, nothing acknowledged is lost), and every publisher paused so (``paced``) is
resumed (``Core.unblock``) once the queue is back at its low-water mark, 3/4 of the bound in
messages and in bytes (:meth:`QueueBound.drained`, asked by ``Core.drain``), or when the bound
is released (:meth:`release`: the session ended, the bound removed or its policy changed).
Publishers of other topics are not paused; a message with no publisher connection to pause
(the broker's own, ``$SYS``, an in-process publish), or whose publisher is itself a bounded
session (another bridge's local link: two bridges pacing each other would wait for ever), is
dropped at the bound as with ``drop_newest`` (counted).  A paused publisher that disconnects
is forgotten by ``Connection.lost`` (its ``blockers`` reset); :meth:`release` skips it, and
``paced`` drops such publishers whenever it doubles (a bound that stays full while publishers
come and go keeps O(live paused publishers), not every one it ever paused).

Only the queue path of ``Core.deliver`` asks (a message that goes straight into the in-flight
window does not): one dict lookup there when bounds exist, none when there are none; each
admission is O(1) amortised (each message is dropped at most once); ``drain`` subtracts the
bytes of what leaves the queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker._logging import bounded

if TYPE_CHECKING:
    from broker.core._connection import Connection
    from broker.core._core import Core
    from broker.core._session import Outgoing, Session

__all__ = ["QueueBound", "size_of"]


def size_of(out: Outgoing) -> int:
    """The bytes a queued message counts for: its topic and payload (O(1))."""
    msg = out.msg
    return len(msg.topic) + len(msg.payload)


@dataclass(slots=True)
class QueueBound:
    """The bound of one session's queue (see the module docstring)."""

    messages: int
    max_bytes: int = 0
    drop_oldest: bool = False
    #: bytes of the messages queued now (kept by ``admit``, ``Core.drain``, ``sync``)
    queued_bytes: int = 0
    #: messages dropped at the bound
    dropped: int = 0
    #: at the bound, pause the publisher instead of dropping (see the module docstring)
    pace: bool = False
    #: publishers paused at the bound now (resumed by :meth:`release`), and how many times one
    #: was paused
    paced: set[Connection] = field(default_factory=set)
    paces: int = 0
    #: size of ``paced`` at which the publishers lost while paused are forgotten (:meth:`_hold`)
    prune_at: int = 64

    def sync(self, s: Session | None) -> None:
        """Count the bytes of what ``s`` has queued (a restored session), O(queue)."""
        self.queued_bytes = 0 if s is None else sum(size_of(o) for o in s.queue)

    def _full(self, count: int, size: int) -> bool:
        return count >= self.messages or (self.max_bytes > 0 and self.queued_bytes + size > self.max_bytes)

    def admit(self, core: Core, s: Session, out: Outgoing) -> bool:
        """True: ``out`` may be appended to ``s.queue`` (its bytes are counted); False: it
        is dropped (counted, logged)."""
        size = size_of(out)
        queue = s.queue
        if self.drop_oldest and not (self.max_bytes > 0 and size > self.max_bytes):
            # (a message bigger than the whole bound is dropped without emptying the queue)
            while queue and self._full(len(queue), size):
                old = queue.popleft()
                self.queued_bytes -= size_of(old)
                core.journal.dropped(s, old)
                self._drop(core, s, "oldest")
            if not self._full(len(queue), size):
                self.queued_bytes += size
                return True
        elif not self._full(len(queue), size) or (self.pace and self._hold(core, s)):
            self.queued_bytes += size
            return True
        self._drop(core, s, "newest")  # bigger than the whole bound, or drop newest
        return False

    def _hold(self, core: Core, s: Session) -> bool:
        """At the bound with ``pace``: pause the publisher being routed (once); False when
        there is none to pause (the message is dropped then). O(1)."""
        pub = core.current
        if pub is None or pub.client_id in core.queue_bounds:  # no one, or a bridge's own link
            return False
        paced = self.paced
        if pub not in paced:
            if len(paced) >= self.prune_at:  # forget the publishers lost while paused: O(1) amortised
                paced = self.paced = {c for c in paced if c in core.connections}
                self.prune_at = max(64, 2 * len(paced))
            paced.add(pub)
            self.paces += 1
            core.block(pub)
            core.log_limit(
                "queue",
                s.client_id,
                lambda: (
                    f"queue at its bound ({len(s.queue)} messages, {self.queued_bytes} bytes): "
                    f"publisher {bounded(pub.client_id)} paused until it drains"
                ),  # the client's string
            )
        return True

    def drained(self, count: int) -> bool:
        """Whether a queue of ``count`` messages (and :attr:`queued_bytes`) is back at the
        low-water mark: 3/4 of the bound. O(1)."""
        return 4 * count <= 3 * self.messages and (
            self.max_bytes == 0 or 4 * self.queued_bytes <= 3 * self.max_bytes
        )

    def release(self, core: Core) -> None:
        """Resume every publisher paused at this bound (O(paced))."""
        paced, self.paced = self.paced, set()
        for pub in paced:
            if pub in core.connections and pub.blockers > 0:  # a lost one was reset already
                core.unblock(pub)

    def _drop(self, core: Core, s: Session, which: str) -> None:
        self.dropped += 1
        core.stats.queue_overflow += 1
        core.stats.dropped_queue_full += 1
        core.log_limit(  # the line is built only when it is logged (one per interval)
            "queue",
            s.client_id,
            lambda: (
                f"queue at its bound ({len(s.queue)} messages, {self.queued_bytes} bytes): {which} dropped"
            ),
        )
