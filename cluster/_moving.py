"""What a moving session carries between nodes, and the diversion of copies meanwhile
(issue 17 item 3; the protocol is :mod:`cluster._takeover`, docs/cluster.md "Consistency model").

* **Entries** (:func:`session_entries`, :func:`decode_entry`): a QoS 1/2 message on its way to
  the client, as JSON: the PUBLISH encoded by the broker's codec (MQTT 5, so every property
  travels: user properties, content type, the expiry left ...), base64, and its delivery
  (QoS, RETAIN, subscription identifiers, filter, selector), its packet identifier and state
  when it was in flight.  :func:`install` puts them in the receiving session: in-flight
  messages keep their packet identifier and state (a QoS 2 message whose PUBREC came is
  continued with PUBREL, never sent again; one whose PUBLISH went out is sent again with
  DUP under the same identifier, which the client de-duplicates), and the client's own
  QoS 2 identifiers not yet released move too (its PUBLISH sent again with DUP is not routed
  twice).  That exact state moves only when the session is still waiting for it (its CONNACK
  held); later, each entry is delivered as a possible duplicate.
* **Possible duplicates** (:func:`deliver_dup`): a copy that the other node may have delivered
  too is sent with the DUP flag when it leaves at once (the flag is not stored: one that waits
  in the queue leaves without it).  MQTT 5 section 3.3.1.1 lets DUP mean exactly this: the
  receiver may have seen the message.
* **Diversions** (:class:`Diversions`): while a session moves, a QoS 1/2 copy forwarded by a
  peer to it is not delivered the usual way but handed to a handler chosen per peer and client
  (hold it, set it aside, forward it, drop it), which is how both nodes cut the peers' streams
  at their fences.  A copy for a shared subscription is never diverted (the group sent it to
  one node only), nor is QoS 0 (A does not queue it for an offline session, B delivers it).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.ext import PUBLISH_SENT, PUBREL_SENT, SHARE_PREFIX, Message, Outgoing, Route
from broker.packets import Decoder, Publish, encode_publish

if TYPE_CHECKING:
    from broker.ext import Core, Session

__all__ = ["Diversions", "Handler", "decode_entry", "deliver_dup", "install", "session_entries"]

#: what becomes of a diverted copy: ``handler(message, route)``
Handler = Callable[[Message, Route], None]


def _entry(o: Outgoing, pid: int | None, now: float) -> list[Any]:
    msg = o.msg
    props = msg.properties
    if msg.expires_at is not None:  # what is left of its lifetime
        props = dataclasses.replace(props, message_expiry_interval=max(0, int(msg.expires_at - now + 0.999)))
    data = encode_publish(msg.topic, msg.payload, 0, False, False, None, props, 5)
    return [
        base64.b64encode(data).decode(),
        o.qos,
        o.retain,
        list(o.sub_ids),
        o.topic_filter,
        o.selector,
        pid,
        o.state if pid is not None else PUBLISH_SENT,
    ]


def session_entries(s: Session, now: float) -> list[list[Any]]:
    """The session's in-flight messages (in send order, with packet ids) then its queue. O(n)."""
    return [_entry(o, pid, now) for pid, o in s.inflight.items()] + [_entry(o, None, now) for o in s.queue]


def outgoing_entry(msg: Message, route: Route, now: float) -> list[Any]:
    """A copy that was not queued anywhere (a forwarded one) as an entry."""
    out = Outgoing(msg, route.qos, route.retain, route.subscription_ids, route.topic_filter, route.selector)
    return _entry(out, None, now)


def decode_entry(entry: list[Any], now: float) -> tuple[Message, Route, int | None, int]:
    """(message, its delivery to the session, packet id or None, state) of an entry."""
    data, qos, retain, sub_ids, topic_filter, selector, pid, state = entry
    pkts = Decoder(5).feed(base64.b64decode(data))
    p = pkts[0]
    assert isinstance(p, Publish)
    msg = Message.create(p.topic, p.payload, int(qos), bool(retain), p.properties, None, now)
    route = Route("", int(qos), bool(retain), tuple(int(i) for i in sub_ids), str(topic_filter), selector)
    return msg, route, (None if pid is None else int(pid)), int(state)


def deliver_route(core: Core, s: Session, msg: Message, route: Route, now: float) -> None:
    """``Core.deliver`` of ``msg`` to ``s`` as ``route`` says (QoS, RETAIN, ids, filter)."""
    core.deliver(
        s, msg, route.qos, route.retain, route.subscription_ids, route.topic_filter, route.selector, now
    )


def deliver_dup(core: Core, s: Session, msg: Message, route: Route, now: float) -> None:
    """Deliver ``msg`` to ``s`` as a possible duplicate (``Core.deliver_duplicate``: with DUP
    if it is sent at once, the usual way otherwise)."""
    core.deliver_duplicate(s, msg, route, now)


def install(core: Core, s: Session, entries: list[list[Any]], exact: bool, now: float) -> int:
    """Deliver a moved session's ``entries`` to ``s``.  ``exact``: the session still waits
    for its state (CONNACK held), so in-flight ones keep their packet id and state (resent as
    a reconnecting client's would be: PUBLISH with DUP, or PUBREL; ``Core.resume_inflight``)
    and queued ones are delivered as usual; otherwise every entry is a possible duplicate (one
    whose PUBREC came is not sent again: the client has it).  Returns the number of possible
    duplicates. O(n)."""
    dups = 0
    for entry in entries:
        msg, route, pid, state = decode_entry(entry, now)
        if exact and pid is None:  # queued: delivered as usual
            core.deliver(
                s,
                msg,
                route.qos,
                route.retain,
                route.subscription_ids,
                route.topic_filter,
                route.selector,
                now,
            )
        elif exact and pid is not None and core.resume_inflight(s, pid, msg, route, state, now):
            continue  # in flight here as it was there
        elif state != PUBREL_SENT:  # the client may have it: DUP (one whose PUBREC came has it)
            core.deliver_duplicate(s, msg, route, now)
            dups += 1
    return dups


def install_qos2_ids(core: Core, s: Session, ids: list[int]) -> None:
    """The client's QoS 2 packet ids that the old node received and not yet released."""
    for pid in ids:
        core.keep_qos2_id(s, int(pid))


class Diversions:
    """Per origin peer and client id, the handler of the QoS 1/2 copies that peer forwards to
    that client while its session moves (:meth:`routes_from` is called only while
    :attr:`by_peer` is not empty)."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.by_peer: dict[str, dict[str, Handler]] = {}
        #: client id -> the plain filters of its shared subscriptions, while it is diverted
        self.shared: dict[str, frozenset[str]] = {}

    def set(self, peer: str, client_id: str, handler: Handler) -> None:
        if client_id not in self.shared:
            self.shared[client_id] = frozenset(
                e.options.topic_filter
                for e in self.core.router.index.entries(client_id)
                if e.options is not None and e.topic_filter.startswith(SHARE_PREFIX)
            )
        self.by_peer.setdefault(peer, {})[client_id] = handler

    def clear(self, peer: str, client_id: str) -> None:
        got = self.by_peer.get(peer)
        if got is not None:
            got.pop(client_id, None)
            if not got:
                del self.by_peer[peer]
        if client_id in self.shared and not any(client_id in h for h in self.by_peer.values()):
            del self.shared[client_id]

    def clear_client(self, client_id: str) -> None:
        for peer in list(self.by_peer):
            self.clear(peer, client_id)

    def routes_from(self, peer: str, msg: Message, routes: list[Route]) -> list[Route]:
        """``routes`` of a message forwarded by ``peer`` without the diverted ones (each
        given to its handler). O(routes)."""
        handlers = self.by_peer.get(peer)
        if not handlers:
            return routes
        shared = self.shared
        kept: list[Route] = []
        for r in routes:
            h = handlers.get(r.client_id) if r.qos else None
            if h is None or r.topic_filter in shared.get(r.client_id, ()):
                kept.append(r)
            else:
                h(msg, r)
        return kept

    def _check(self) -> None:
        assert all(self.by_peer.values())
        diverted = {c for h in self.by_peer.values() for c in h}
        assert set(self.shared) == diverted
