"""Sessions that move between the nodes of a cluster (issue 17 item 3, docs/cluster.md).

When a client connects to node B, B tells every peer (``takeover`` control message).  A node A
that holds a session of that client id ends it there: a connected client gets DISCONNECT 0x8E
(session taken over) as on one broker, its will is not published (the client lives on, at B),
and unless the new connection asked for a clean start A sends B the session's state: its
subscriptions (positive entries with their options, then the negative entries of partial
unsubscribes) and its QoS 1/2 messages queued or in flight.  B adds them to the client's
session there and delivers the messages.

What it does not do: B's CONNACK has already said "no session present" (B learns of A's state
after it answered), so a client that relies on the flag resubscribes, harmlessly; messages
published in the moment between A ending the session and B holding its subscriptions at the
peers are not delivered to it; a QoS 2 message in flight at A is delivered again by B (the
packet identifier state does not move).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.core._message import PEER_PREFIX, Message
from broker.hooks import SubscriptionAction
from broker.packets import NO_PROPERTIES, ReasonCode, SubscriptionRequest

if TYPE_CHECKING:
    from broker.core._core import Core
    from broker.core._session import Session

__all__ = ["Takeover"]

log = logging.getLogger("siftmq.cluster")


class Takeover:
    """Moves sessions between nodes (see the module docstring)."""

    def __init__(self, me: str, core: Core, send: Callable[[str, dict[str, Any]], None]) -> None:
        self.me = me
        self.core = core
        self.send = send
        self.moved_out = 0
        self.moved_in = 0

    def connected(self, client_id: str, peers: list[str]) -> None:
        """A client connected here: any other node holding its session must give it up."""
        if client_id.startswith((PEER_PREFIX, "$local/")):
            return
        s = self.core.sessions.get(client_id)
        conn = None if s is None else s.conn
        clean = True if conn is None else bool(conn.clean_start)
        for peer in peers:
            self.send(peer, {"t": "takeover", "cid": client_id, "clean": clean, "src": self.me})

    def receive(self, msg: dict[str, Any]) -> None:
        match msg.get("t"):
            case "takeover":
                self._give_up(str(msg["cid"]), bool(msg["clean"]), str(msg["src"]))
            case "session":
                self._take(msg)

    def _give_up(self, client_id: str, clean: bool, dest: str) -> None:
        core = self.core
        s = core.sessions.get(client_id)
        if s is None or s.sink is not None:
            return
        now = core.clock.monotonic()
        s.will = None  # the client lives on at the other node
        s.will_due = None
        core.pending_wills.discard(s)
        if s.conn is not None:
            s.conn.taken_over(now)
        state = None if clean else self._export(s)
        core.end_session(s, now)
        core.flush()
        self.moved_out += 1
        log.info("session %s moved to node %s", client_id[:40], dest[:8])
        if state is not None:
            self.send(dest, state)

    def _export(self, s: Session) -> dict[str, Any]:
        subs: list[list[Any]] = []
        negatives: list[str] = []
        for e in self.core.router.index.entries(s.client_id):
            o = e.options
            if not e.positive or o is None:
                negatives.append(e.topic_filter)
                continue
            subs.append(
                [
                    e.topic_filter,
                    o.qos,
                    o.no_local,
                    o.retain_as_published,
                    o.retain_handling,
                    o.subscription_id,
                    o.selector,
                ]
            )
        queued = [*s.inflight.values(), *s.queue]
        messages = [
            [
                o.msg.topic,
                base64.b64encode(o.msg.payload).decode(),
                o.qos,
                o.retain,
                list(o.sub_ids),
                o.topic_filter,
            ]
            for o in queued
        ]
        return {
            "t": "session",
            "cid": s.client_id,
            "subs": subs,
            "negatives": negatives,
            "messages": messages,
        }

    def _take(self, msg: dict[str, Any]) -> None:
        core = self.core
        client_id = str(msg["cid"])
        s = core.sessions.get(client_id)
        if s is None:
            return  # the client left again
        router = core.router
        for full, qos, no_local, rap, rh, sub_id, selector in msg["subs"]:
            req = SubscriptionRequest(full, int(qos), bool(no_local), bool(rap), int(rh))
            got = router.subscribe(client_id, s.selectors, req, selector, sub_id)
            if got.code < ReasonCode.UNSPECIFIED_ERROR:
                core.subscription_changed(
                    client_id, SubscriptionAction.SUBSCRIBE, got.full_filter, got.selector, int(got.code)
                )
        for full in msg["negatives"]:
            router.unsubscribe(client_id, s.selectors, full)
        core.journal.entries(s)
        now = core.clock.monotonic()
        for topic, payload, qos, retain, sub_ids, topic_filter in msg["messages"]:
            m = Message.create(
                topic, base64.b64decode(payload), int(qos), bool(retain), NO_PROPERTIES, None, now
            )
            core.deliver(s, m, int(qos), bool(retain), tuple(sub_ids), str(topic_filter), None, now)
        core.flush()
        self.moved_in += 1
        log.info(
            "session %s taken over: %d subscriptions, %d messages",
            client_id[:40],
            len(msg["subs"]),
            len(msg["messages"]),
        )
