"""Sessions that move between the nodes of a cluster (issue 17 item 3, docs/cluster.md).

When a client connects to node B, B tells every live peer (``takeover`` control message).
A node that holds a session of that client id disconnects its connection, if any, with
DISCONNECT 0x8E (session taken over) as on one broker; its will is not published (the client
lives on, at B).  With a clean start it simply ends the session.

Otherwise B holds the CONNACK (``Hooks.hold_connack``) while the session moves, as EMQX
does, so that the CONNACK says "session present" and the subscriptions and queued messages
are in place before it; every peer answers ``none`` or, the node A that holds the session,
``session``.  Moving a session without losing or duplicating a QoS 1/2 message published
meanwhile needs a cut in every node's stream of messages (no message may fall between A
giving up the session and B's subscriptions reaching a publisher's node, and none may be
delivered by both), which the handover builds with *fences*:

1. A answers ``session`` with the subscriptions (negative entries and composite
   subscriptions included) and keeps the session, offline, queueing what still arrives.
2. B installs the subscriptions (its route table sends them to every peer) and, in the same
   step, sends a fence to A and starts buffering every delivery to the session (a temporary
   ``sink``): a message published at B before that step went to A, one after it waits at B.
3. Once a peer X acknowledged B's new subscriptions (``PeerLink.when_held``: its SUBACKs),
   B asks X for a fence; X sends one to A and one to B in one step: X routed what came before
   to A only (B had no session there yet, or drops it, step 4) and what comes after to B.
4. Until X's fence, B drops the QoS 1/2 deliveries to the session that come from X (A has
   them); from X's fence on, A drops them (B has them).  QoS 0 is never dropped at B (A does
   not queue QoS 0 for an offline session).
5. When A has the fence of every peer B asked (and B's request for its own fence), it sends
   the ``tail``, everything queued or in flight for the session, and ends it: the tail is A's
   fence in its stream to B.  B delivers the tail, then what it buffered, releases the
   CONNACK and delivers normally from then on.

A message in a node's stream to A before that node's fence is delivered through A's tail;
one after it directly by B; so nothing is lost or doubled, and each publisher's order is kept
(B's buffer follows the tail).  Each side gives up after ``timeout`` seconds (the CONNACK then
says what B knows: "session present" if A's subscriptions came) and delivers what it has, as
the cluster did before the fences: that is where a message can still be missed or doubled (a
peer that does not answer: a link down, a node dying mid-handover).  A QoS 0 message that
overtakes a fence (sent at once while the QoS 1 fence waits behind a full in-flight window)
can be dropped; a QoS 2 message in flight at A is delivered again by B (packet identifier
state does not move).

Sans-IO: control messages go out through ``send``, timers through ``later`` and the links'
acknowledgement barrier through ``when_held``; the core is the broker's.
"""

from __future__ import annotations

import base64
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from broker.core._message import PEER_PREFIX, SHARE_PREFIX, Message, Route
from broker.hooks import SubscriptionAction
from broker.packets import NO_PROPERTIES, ReasonCode, SubscriptionRequest

if TYPE_CHECKING:
    from broker.core._core import Core
    from broker.core._session import Session

__all__ = ["Takeover"]

log = logging.getLogger("siftmq.cluster")


class Handle(Protocol):
    def cancel(self) -> None: ...


#: ``later(delay, callback)``: a timer (``loop.call_later``)
Later = Callable[[float, Callable[[], None]], Handle]
#: ``when_held(peer, callback)``: callback once the link to ``peer`` has its SUBACKs; False if down
WhenHeld = Callable[[str, Callable[[], None]], bool]


@dataclass(slots=True)
class _Incoming:
    """At B: a session being fetched for a client that connected here."""

    rid: str
    client_id: str
    session: Session
    peers: list[str]
    asked: set[str]  # peers that have not answered yet
    release: Callable[[bool], None] | None
    timer: Handle | None = None
    holder: str | None = None
    unfenced: set[str] = field(default_factory=set)  # peers whose fence has not come here
    buffer: list[tuple[Message, Route]] = field(default_factory=list)
    tail: bool = False


@dataclass(slots=True)
class _Outgoing:
    """At A: a session handed over, kept until the fences are in."""

    rid: str
    client_id: str
    session: Session
    dest: str
    waiting: set[str]  # nodes whose fence has not come here
    ready: bool = False  # B's subscriptions are held here (B asked for this node's fence)
    timer: Handle | None = None


class Takeover:
    """Moves sessions between nodes (see the module docstring)."""

    def __init__(  # noqa: PLR0917
        self,
        me: str,
        core: Core,
        send: Callable[[str, dict[str, Any]], None],
        later: Later,
        when_held: WhenHeld,
        timeout: float = 2.0,
    ) -> None:
        self.me = me
        self.core = core
        self.send = send
        self.later = later
        self.when_held = when_held
        self.timeout = timeout
        self.moved_out = 0
        self.moved_in = 0
        self.timeouts = 0
        self.incoming: dict[str, _Incoming] = {}
        self.outgoing: dict[str, _Outgoing] = {}
        #: origin peer -> client ids whose QoS 1/2 deliveries coming from that peer are dropped
        self.exclude: dict[str, set[str]] = {}
        #: client id -> the plain filters of its shared subscriptions, while it is excluded
        #: somewhere (a copy for a shared group went to one node only: never dropped)
        self.shared: dict[str, frozenset[str]] = {}

    # ------------------------------------------------------------ B: a client connects here
    def connecting(
        self, client_id: str, clean_start: bool, release: Callable[[bool], None], peers: list[str]
    ) -> bool:
        """A client connected here: every other node must give its session up.  True if the
        CONNACK waits for the session to come (``release(present)`` is called later)."""
        if client_id.startswith((PEER_PREFIX, "$local/")) or not peers:
            return False
        if clean_start:
            for peer in peers:
                self.send(peer, {"t": "takeover", "cid": client_id, "clean": True, "src": self.me})
            return False
        s = self.core.sessions.get(client_id)
        assert s is not None
        rid = secrets.token_hex(8)
        inc = _Incoming(rid, client_id, s, sorted(peers), set(peers), release)
        inc.timer = self.later(self.timeout, lambda: self._expire_in(rid))
        self.incoming[rid] = inc
        msg = {
            "t": "takeover",
            "cid": client_id,
            "clean": False,
            "src": self.me,
            "rid": rid,
            "peers": inc.peers,
        }
        for peer in inc.peers:
            self.send(peer, msg)
        return True

    def receive(self, msg: dict[str, Any]) -> None:
        rid = str(msg.get("rid", ""))
        src = str(msg["src"])
        match msg.get("t"):
            case "takeover":
                self._give_up(str(msg["cid"]), bool(msg["clean"]), src, rid, msg.get("peers") or [])
            case "none":
                inc = self.incoming.get(rid)
                if inc is not None:
                    inc.asked.discard(src)
                    if not inc.asked and inc.holder is None:
                        self._finish_in(inc)
            case "session":
                self._session(msg, src, rid)
            case "fencereq":
                self._fence_request(rid, src, str(msg["a"]))
            case "fence":
                self._fence(rid, src)
            case "tail":
                self._tail(msg, rid)

    def _session(self, msg: dict[str, Any], src: str, rid: str) -> None:
        """A's subscriptions: installed; fences asked for (step 2 and 3)."""
        core = self.core
        client_id = str(msg["cid"])
        inc = self.incoming.get(rid)
        s = core.sessions.get(client_id)
        if inc is not None and inc.session is not s:
            self._finish_in(inc)  # the client left again
            inc = None
        if s is None:
            return
        self._install(s, msg)
        self.moved_in += 1
        if inc is None:  # too late: we stopped waiting; A sends the tail after its timeout
            log.info("session %s: subscriptions from %s after the takeover timeout", client_id[:40], src[:8])
            core.flush()
            return
        inc.asked.discard(src)
        inc.holder = src
        inc.unfenced = set(inc.peers)
        buffer = inc.buffer
        s.sink = lambda m, r: buffer.append((m, r))
        for peer in inc.peers:  # QoS 1/2 from a peer before its fence: A has them
            self._exclude(peer, client_id)
        self.send(src, {"t": "fence", "rid": rid, "src": self.me})
        for peer in inc.peers:
            if not self.when_held(
                peer, self._asker(peer, {"t": "fencereq", "rid": rid, "src": self.me, "a": src})
            ):
                log.info("session %s: link to %s down, no fence from it", client_id[:40], peer[:8])
        core.flush()

    def _asker(self, peer: str, msg: dict[str, Any]) -> Callable[[], None]:
        return lambda: self.send(peer, msg)

    def _install(self, s: Session, msg: dict[str, Any]) -> None:
        core = self.core
        client_id = s.client_id
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
        for name, expression, qos, sub_ids in msg.get("composites", ()):
            req = SubscriptionRequest(f"$composite/{name}/{expression}", int(qos), False, False, 0)
            sub_id = int(sub_ids[0]) if sub_ids else None
            core.composite.subscribe_request(client_id, req, NO_PROPERTIES, sub_id, None)

    def _fence(self, rid: str, src: str) -> None:
        out = self.outgoing.get(rid)
        if out is not None:  # at A: from now on, what comes from src is B's to deliver
            out.waiting.discard(src)
            self._exclude(src, out.client_id)
            self._maybe_hand_over(out)
            return
        inc = self.incoming.get(rid)
        if inc is not None:  # at B: from now on, what comes from src is ours to deliver
            inc.unfenced.discard(src)
            self._unexclude(src, inc.client_id)
            if inc.tail and not inc.unfenced:
                self._finish_in(inc)

    def _tail(self, msg: dict[str, Any], rid: str) -> None:
        """A's queued messages (step 5): delivered, then what waited here."""
        core = self.core
        client_id = str(msg["cid"])
        s = core.sessions.get(client_id)
        inc = self.incoming.get(rid)
        if inc is not None:
            inc.tail = True
            src = inc.holder or ""
            inc.unfenced.discard(src)
            self._unexclude(src, client_id)
        if s is None or (inc is not None and inc.session is not s):
            if inc is not None:
                self._finish_in(inc)
            return
        s.sink = None
        now = core.clock.monotonic()
        for topic, payload, qos, retain, sub_ids, topic_filter in msg["messages"]:
            m = Message.create(
                topic, base64.b64decode(payload), int(qos), bool(retain), NO_PROPERTIES, None, now
            )
            core.deliver(s, m, int(qos), bool(retain), tuple(sub_ids), str(topic_filter), None, now)
        log.info("session %s taken over with %d message(s)", client_id[:40], len(msg["messages"]))
        if inc is None:
            core.flush()
            return
        self._replay(inc, now)
        if inc.release is not None:
            release, inc.release = inc.release, None
            release(True)
        if not inc.unfenced:
            self._finish_in(inc)
        core.flush()

    def _replay(self, inc: _Incoming, now: float) -> None:
        """Deliver what the temporary sink buffered (the session's own sink is removed)."""
        core = self.core
        s = inc.session
        if s.sink is not None:
            s.sink = None
        buffered, inc.buffer = inc.buffer, []
        if core.sessions.get(s.client_id) is not s:
            return  # the session ended meanwhile
        check = core.may_receive if core.obs.authorize else None
        for m, r in buffered:
            if check is None or check(s, m.topic):
                core.deliver(s, m, r.qos, r.retain, r.subscription_ids, r.topic_filter, r.selector, now)

    def _finish_in(self, inc: _Incoming) -> None:
        """B's handover ends (done, given up, or the client left): no drops, no buffer."""
        self.incoming.pop(inc.rid, None)
        if inc.timer is not None:
            inc.timer.cancel()
        for peer in inc.peers:
            self._unexclude(peer, inc.client_id)
        if inc.buffer or inc.session.sink is not None:
            self._replay(inc, self.core.clock.monotonic())
        if inc.release is not None:
            release, inc.release = inc.release, None
            release(inc.holder is not None)
        self.core.flush()

    def _expire_in(self, rid: str) -> None:
        inc = self.incoming.get(rid)
        if inc is None:
            return
        self.timeouts += 1
        if inc.holder is None and inc.asked:
            log.warning(
                "session %s: no answer from %s within %.1f s; CONNACK without the session",
                inc.client_id[:40],
                ", ".join(p[:8] for p in sorted(inc.asked)),
                self.timeout,
            )
        elif not inc.tail or inc.unfenced:
            log.warning(
                "session %s: handover from %s incomplete after %.1f s (%s); delivering what came",
                inc.client_id[:40],
                (inc.holder or "")[:8],
                self.timeout,
                "no tail"
                if not inc.tail
                else "no fence from " + ", ".join(p[:8] for p in sorted(inc.unfenced)),
            )
        self._finish_in(inc)

    def _exclude(self, peer: str, client_id: str) -> None:
        if client_id not in self.shared:
            self.shared[client_id] = frozenset(
                e.options.topic_filter
                for e in self.core.router.index.entries(client_id)
                if e.options is not None and e.topic_filter.startswith(SHARE_PREFIX)
            )
        self.exclude.setdefault(peer, set()).add(client_id)

    def _unexclude(self, peer: str, client_id: str) -> None:
        ids = self.exclude.get(peer)
        if ids is not None:
            ids.discard(client_id)
            if not ids:
                del self.exclude[peer]
        if client_id in self.shared and not any(client_id in ids for ids in self.exclude.values()):
            del self.shared[client_id]

    # ------------------------------------------------------------ A: the session is here
    def _give_up(self, client_id: str, clean: bool, dest: str, rid: str, peers: list[str]) -> None:
        core = self.core
        s = core.sessions.get(client_id)
        if s is None or s.sink is not None:
            if rid:
                self.send(dest, {"t": "none", "cid": client_id, "rid": rid, "src": self.me})
            return
        now = core.clock.monotonic()
        s.will = None  # the client lives on at the other node
        s.will_due = None
        core.pending_wills.discard(s)
        if s.conn is not None:
            s.conn.taken_over(now)
        if clean or not rid or s.expiry_interval == 0:  # a clean session is never reused
            core.end_session(s, now)
            core.flush()
            self.moved_out += 1
            log.info("session %s ended: its client connected to node %s", client_id[:40], dest[:8])
            if rid:
                self.send(dest, {"t": "none", "cid": client_id, "rid": rid, "src": self.me})
            return
        self.send(dest, self._subscriptions(s, rid))
        waiting = {str(p) for p in peers} - {self.me}
        waiting.add(dest)
        out = _Outgoing(rid, client_id, s, dest, waiting)
        out.timer = self.later(self.timeout, lambda: self._expire_out(rid))
        self.outgoing[rid] = out
        core.flush()

    def _fence_request(self, rid: str, src: str, holder: str) -> None:
        out = self.outgoing.get(rid)
        if holder == self.me:
            if out is not None:  # B's subscriptions are held here
                out.ready = True
                self._maybe_hand_over(out)
            return
        # one step: what this node routed before goes to A, what it routes after to B
        fence = {"t": "fence", "rid": rid, "src": self.me}
        self.send(holder, fence)
        self.send(src, fence)

    def _maybe_hand_over(self, out: _Outgoing) -> None:
        if out.ready and not out.waiting:
            self._hand_over(out)

    def _expire_out(self, rid: str) -> None:
        out = self.outgoing.get(rid)
        if out is not None:
            self.timeouts += 1
            log.warning(
                "session %s: handover to %s incomplete after %.1f s (%s); sending what is queued",
                out.client_id[:40],
                out.dest[:8],
                self.timeout,
                "no fence from " + ", ".join(p[:8] for p in sorted(out.waiting))
                if out.waiting
                else "its subscriptions not confirmed",
            )
            self._hand_over(out)

    def _hand_over(self, out: _Outgoing) -> None:
        """The tail (A's fence in its stream to B), then the session ends here."""
        self.outgoing.pop(out.rid, None)
        if out.timer is not None:
            out.timer.cancel()
        core = self.core
        s = out.session
        for peer in list(self.exclude):
            self._unexclude(peer, out.client_id)
        if core.sessions.get(out.client_id) is not s:
            return  # ended meanwhile (expired, or taken over by a connection here)
        self.send(
            out.dest,
            {
                "t": "tail",
                "rid": out.rid,
                "cid": out.client_id,
                "src": self.me,
                "messages": self._messages(s),
            },
        )
        core.end_session(s, core.clock.monotonic())
        core.flush()
        self.moved_out += 1
        log.info("session %s moved to node %s", out.client_id[:40], out.dest[:8])

    def _subscriptions(self, s: Session, rid: str) -> dict[str, Any]:
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
        comp = self.core.composite  # delegated to their CSSU (the cluster's composites)
        delegated = comp.delegated
        composites = [
            [name, *delegated[(s.client_id, name)], list(ids)]
            for name, ids in sorted(comp.clients.get(s.client_id, {}).items())
            if (s.client_id, name) in delegated
        ]
        return {
            "t": "session",
            "cid": s.client_id,
            "rid": rid,
            "src": self.me,
            "subs": subs,
            "negatives": negatives,
            "composites": composites,
        }

    @staticmethod
    def _messages(s: Session) -> list[list[Any]]:
        return [
            [
                o.msg.topic,
                base64.b64encode(o.msg.payload).decode(),
                o.qos,
                o.retain,
                list(o.sub_ids),
                o.topic_filter,
            ]
            for o in [*s.inflight.values(), *s.queue]
        ]

    # ------------------------------------------------------------ injection
    def routes_from(self, peer: str, routes: list[Route]) -> list[Route]:
        """``routes`` of a message that came from ``peer``, without the QoS 1/2 deliveries
        that the other side of a handover delivers (called only while :attr:`exclude` is
        not empty). O(routes)."""
        ids = self.exclude.get(peer)
        if not ids:
            return routes
        shared = self.shared
        return [
            r
            for r in routes
            if r.qos == 0 or r.client_id not in ids or r.topic_filter in shared.get(r.client_id, ())
        ]
