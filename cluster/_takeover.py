"""Sessions that move between the nodes of a cluster (issue 17 item 3, docs/cluster.md).

When a client connects to node B, B tells every live peer (``takeover`` control message).
A node that holds a session of that client id disconnects its connection, if any, with
DISCONNECT 0x8E (session taken over) as on one broker; its will is not published (the client
lives on, at B).  With a clean start it simply ends the session.

Otherwise B holds the CONNACK (``Hooks.hold_connack``) while the session moves, as EMQX
does, so that the CONNACK says "session present" and the subscriptions and queued messages
are in place before it; every peer answers ``none`` or, the node A that holds the session,
``session``.  Moving a session without losing a QoS 1/2 message published meanwhile, and
without doubling one when every node answers in time, needs a cut in every node's stream of
messages, which the handover builds with *fences*:

1. A answers ``session`` with the subscriptions (negative entries and composite
   subscriptions included) and keeps the session, offline, queueing what still arrives.
2. B installs the subscriptions (its route table sends them to every peer) and, in the same
   step, sends a fence to A and starts buffering every delivery to the session (a temporary
   ``sink``): a message published at B before that step went to A, one after it waits at B.
3. Once a peer X acknowledged B's new subscriptions (``PeerLink.when_held``: its SUBACKs),
   B asks X for a fence; X sends one to A and one to B in one step: X routed what came before
   to A (and, once B's subscriptions were held, to B too) and what comes after to both.
4. Until X's fence, B *holds* the QoS 1/2 copies that come from X (A has them); from X's fence
   on, A sets X's copies aside (B has them).  QoS 0 is never held (A does not queue QoS 0 for
   an offline session, B delivers it), nor a copy for a shared subscription (it went to one
   node only).
5. When A has the fence of every peer B asked (and B's request for A's own), it sends the
   ``tail``: everything queued or in flight for the session, with packet identifiers and
   QoS 2 state (:mod:`cluster._moving`), and the list of peers whose fence it had.  The tail
   is A's fence in its stream to B.  B delivers the tail, drops the copies it held from the
   peers in that list (the tail contained them), delivers the others flagged DUP, then what
   it buffered, releases the CONNACK and delivers normally from then on.

Every node answering in time, each publisher's messages arrive once and in order.  When one
does not, the rule is that a side never drops a copy it cannot prove the other delivered,
and delivers it flagged DUP instead (a QoS 1 duplicate, never a loss):

* **A peer that leaves the membership** (it died, or is cut off) counts as fenced: neither
  side waits for it.  Its copies that B held are delivered flagged DUP (A cannot prove it got
  them all).
* **A peer that does not fence in time** (3/4 of ``timeout``, so that the tail normally reaches
  B within its own ``timeout``): A sends the tail anyway, and then stays
  a *forwarder*: the session lives on at A in memory (its store rows are gone), and every copy
  that still comes from a peer whose fence A did not get is sent on to B (``more``, delivered
  flagged DUP), until that fence comes (B asks again whenever its link to the peer comes
  back) or ``linger`` seconds pass.  A peer that comes back after it with copies for A still
  queued in its store is the one case left where a copy can be lost.
* **A dies before its tail** (it leaves the membership, or B's ``timeout`` passes): B delivers
  what it held and buffered (flagged DUP: A may still send a late tail, whose entries are
  then delivered as possible duplicates too); what A had queued is in A's store only.
* **B dies before the tail**: A cancels the handover and keeps the session with the copies it
  had set aside (what B buffered).
* A late ``session`` answer (after B's ``timeout``) is still installed and fenced, so A can
  finish.

Sans-IO: control messages go out through ``send``, timers through ``later`` and the links'
acknowledgement barrier through ``when_held``; the core is the broker's.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from broker.ext import PEER_PREFIX, Message, Route
from broker.hooks import SubscriptionAction
from broker.packets import NO_PROPERTIES, ReasonCode, SubscriptionRequest
from cluster._moving import (
    Diversions,
    Handler,
    deliver_dup,
    deliver_route,
    install,
    install_qos2_ids,
    outgoing_entry,
    session_entries,
)

if TYPE_CHECKING:
    from broker.ext import Core, Session

__all__ = ["Takeover"]

log = logging.getLogger("siftmq.cluster")


class Handle(Protocol):
    def cancel(self) -> None: ...


#: ``later(delay, callback)``: a timer (``loop.call_later``)
Later = Callable[[float, Callable[[], None]], Handle]
#: ``when_held(peer, callback)``: callback once the link to ``peer`` has its SUBACKs; False if down
WhenHeld = Callable[[str, Callable[[], None]], bool]
#: ``clock()``: monotonic seconds
Clock = Callable[[], float]


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
    held: list[tuple[str, Message, Route]] = field(default_factory=list)  # (origin, ...) before its fence
    buffer: list[tuple[Message, Route]] = field(default_factory=list)
    tail: bool = False
    gone: set[str] = field(default_factory=set)  # peers that left the membership meanwhile


@dataclass(slots=True)
class _Outgoing:
    """At A: a session handed over, kept until the fences are in (then the tail), and after
    the tail, while a peer did not fence, as a forwarder."""

    rid: str
    client_id: str
    session: Session
    dest: str
    peers: set[str]  # B and the peers B asked
    waiting: set[str]  # nodes whose fence has not come here (and that are still members)
    fenced: set[str] = field(default_factory=set)  # nodes whose fence came here
    ready: bool = False  # B's subscriptions are held here (B asked for this node's fence)
    timer: Handle | None = None
    aside: list[tuple[Message, Route]] = field(default_factory=list)  # B has them (before the tail)
    forwarding: bool = False  # the tail is sent; copies from unfenced peers go on to B


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
        linger: float = 60.0,
        peers: Callable[[], list[str]] = list,
    ) -> None:
        self.me = me
        self.peers = peers  # the peers this node's links reach now
        self.core = core
        self.send = send
        self.later = later
        self.when_held = when_held
        self.timeout = timeout
        self.linger = linger
        self.moved_out = 0
        self.moved_in = 0
        self.timeouts = 0
        self.holder_lost = 0  # handovers whose old node left before its tail (at B)
        self.target_lost = 0  # handovers cancelled: the new node left before the tail (at A)
        self.duplicates = 0  # copies delivered as possible duplicates (at B)
        self.forwarded = 0  # copies forwarded after the tail (at A)
        self.incoming: dict[str, _Incoming] = {}
        self.outgoing: dict[str, _Outgoing] = {}
        self.diversions = Diversions(core)
        #: fence requests not sent yet, per peer and handover: (when asked, message)
        self.asks: dict[str, dict[str, tuple[float, dict[str, Any]]]] = {}

    # ------------------------------------------------------------ B: a client connects here
    def connecting(
        self, client_id: str, clean_start: bool, release: Callable[[bool], None], peers: list[str]
    ) -> bool:
        """A client connected here: every other node must give its session up.  True if the
        CONNACK waits for the session to come (``release(present)`` is called later)."""
        for out in [o for o in self.outgoing.values() if o.client_id == client_id]:
            self._cancel_out(out, "its client came back")
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
            case "more":
                self._more(msg)

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
        targets = set(msg.get("peers") or ()) | set(() if inc is None else inc.peers)
        if inc is None:  # too late: delivered as it comes; A still needs the fences to finish
            log.info("session %s: subscriptions from %s after the takeover timeout", client_id[:40], src[:8])
        else:
            inc.asked.discard(src)
            inc.holder = src
            inc.unfenced = (targets | {src}) - inc.gone - {self.me}
            buffer = inc.buffer
            s.sink = lambda m, r: buffer.append((m, r))
            for peer in inc.unfenced:  # QoS 1/2 from a peer before its fence: A has them
                self.diversions.set(peer, client_id, self._holder(inc, peer))
        self.send(src, {"t": "fence", "rid": rid, "src": self.me})
        for peer in sorted(targets | {src}):  # src too: A learns that its peers hold ours
            self._ask(peer, {"t": "fencereq", "rid": rid, "src": self.me, "a": src})
        core.flush()

    @staticmethod
    def _holder(inc: _Incoming, peer: str) -> Handler:
        return lambda m, r: inc.held.append((peer, m, r))

    def _ask(self, peer: str, msg: dict[str, Any]) -> None:
        """Ask ``peer`` for its fence once it holds our subscriptions.  The request stays
        pending until it is sent: if the link is down, or goes down before the peer held
        them (its barrier is lost with the connection), it is asked again when the link is
        up (:meth:`link_up`), for ``linger`` seconds."""
        if peer == self.me:
            return
        now = self.core.clock.monotonic()
        for p, pending in list(self.asks.items()):  # forget those of peers that never came back
            for rid in [r for r, (at, _m) in pending.items() if now - at >= self.linger]:
                del pending[rid]
            if not pending:
                del self.asks[p]
        self.asks.setdefault(peer, {})[str(msg["rid"])] = (now, msg)
        self._try_ask(peer, msg)

    def _try_ask(self, peer: str, msg: dict[str, Any]) -> None:
        rid = str(msg["rid"])

        def fire() -> None:
            pending = self.asks.get(peer)
            if pending is None or rid not in pending:
                return  # sent already (an older barrier of the same request)
            del pending[rid]
            if not pending:
                del self.asks[peer]
            self.send(peer, msg)

        if not self.when_held(peer, fire):
            log.info("session handover %s: link to %s down, its fence asked when it is back", rid, peer[:8])

    def link_up(self, peer: str) -> None:
        """The link to ``peer`` is up: the fence requests pending for it are asked again
        (sent once it holds our subscriptions); those older than ``linger`` are forgotten."""
        pending = self.asks.get(peer)
        if not pending:
            return
        now = self.core.clock.monotonic()
        for rid, (at, msg) in list(pending.items()):
            if now - at >= self.linger:
                del pending[rid]
            else:
                self._try_ask(peer, msg)
        if not pending:
            self.asks.pop(peer, None)

    def _install(self, s: Session, msg: dict[str, Any]) -> None:
        core = self.core
        client_id = s.client_id
        router = core.router
        s.materialize()  # a lean restored session shares empty containers (Session.lean)
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
        if out is not None:  # at A
            self._fenced_here(out, src)
            return
        inc = self.incoming.get(rid)
        if inc is not None and src in inc.unfenced:  # at B: what comes from src after is ours
            inc.unfenced.discard(src)
            self.diversions.clear(src, inc.client_id)
            if inc.tail and not inc.unfenced:
                self._finish_in(inc)

    def _tail(self, msg: dict[str, Any], rid: str) -> None:
        """A's queued messages (step 5): delivered, then what waited here."""
        core = self.core
        client_id = str(msg["cid"])
        s = core.sessions.get(client_id)
        inc = self.incoming.get(rid)
        if inc is not None and inc.session is not s:
            self._finish_in(inc)  # the client left: a session it has now is a later one
            inc = None
        now = core.clock.monotonic()
        entries: list[list[Any]] = msg["messages"]
        if s is None:
            log.warning(
                "session %s: its tail came from %s with no session here: %d message(s) lost",
                client_id[:40],
                str(msg["src"])[:8],
                len(entries),
            )
            return
        if inc is None:  # late (after our timeout): all of it may have come already
            self.duplicates += install(self.core, s, entries, False, now)
            log.info(
                "session %s: late tail, %d message(s) delivered as possible duplicates",
                client_id[:40],
                len(entries),
            )
            core.flush()
            return
        inc.tail = True
        holder = inc.holder or str(msg["src"])
        proven = {str(p) for p in msg.get("fenced", ())} | {holder}
        s.sink = None
        exact = inc.release is not None  # the CONNACK still waits: the exact state moves
        install(core, s, entries, exact, now)
        if exact:
            install_qos2_ids(core, s, [int(p) for p in msg.get("qos2", ())])
        held, inc.held = inc.held, []
        for origin, m, r in held:
            if origin not in proven:
                deliver_dup(core, s, m, r, now)
                self.duplicates += 1
        log.info("session %s taken over with %d message(s)", client_id[:40], len(entries))
        self._replay(inc, now)
        inc.unfenced.discard(holder)
        self.diversions.clear(holder, client_id)
        for peer in inc.unfenced:  # their fence is still on its way here
            self.diversions.set(peer, client_id, self._drop if peer in proven else self._dup(s))
        if inc.release is not None:
            release, inc.release = inc.release, None
            release(True)
        if not inc.unfenced:
            self._finish_in(inc)
        core.flush()

    @staticmethod
    def _drop(_m: Message, _r: Route) -> None:
        """A copy the other node delivers."""

    def _dup(self, s: Session) -> Handler:
        def deliver(m: Message, r: Route) -> None:
            if self.core.sessions.get(s.client_id) is s:
                deliver_dup(self.core, s, m, r, self.core.clock.monotonic())
                self.duplicates += 1

        return deliver

    def _more(self, msg: dict[str, Any]) -> None:
        """Copies A forwarded after its tail: possible duplicates."""
        s = self.core.sessions.get(str(msg["cid"]))
        if s is None:
            log.warning(
                "session %s: %d forwarded message(s) with no session here",
                str(msg["cid"])[:40],
                len(msg["messages"]),
            )
            return
        self.duplicates += install(self.core, s, msg["messages"], False, self.core.clock.monotonic())
        self.core.flush()

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
                deliver_route(core, s, m, r, now)

    def _forget(self, h: _Incoming | _Outgoing) -> None:
        """A handover ends on this node: no longer listed, its timer off, its diversions gone."""
        (self.incoming if isinstance(h, _Incoming) else self.outgoing).pop(h.rid, None)
        if h.timer is not None:
            h.timer.cancel()
        self.diversions.clear_client(h.client_id)

    def _finish_in(self, inc: _Incoming) -> None:
        """B's handover ends (done, given up, or the client left): what was held is delivered
        flagged DUP (the old node may have it too), then what was buffered."""
        self._forget(inc)
        core = self.core
        s = inc.session
        now = core.clock.monotonic()
        held, inc.held = inc.held, []
        if s.sink is not None:
            s.sink = None
        if core.sessions.get(s.client_id) is s:
            for _origin, m, r in held:
                deliver_dup(core, s, m, r, now)
                self.duplicates += 1
        if inc.buffer:
            self._replay(inc, now)
        if inc.release is not None:
            release, inc.release = inc.release, None
            release(inc.holder is not None)
        core.flush()

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
                "session %s: handover from %s incomplete after %.1f s (%s); delivering what came, "
                "possible duplicates flagged DUP",
                inc.client_id[:40],
                (inc.holder or "")[:8],
                self.timeout,
                "no tail"
                if not inc.tail
                else "no fence from " + ", ".join(p[:8] for p in sorted(inc.unfenced)),
            )
        self._finish_in(inc)

    # ------------------------------------------------------------ membership
    def peer_gone(self, peer: str) -> None:
        """``peer`` left the membership: it counts as fenced; if it was the old node of a
        session moving here, what came is delivered; if it was the new node of a session
        moving away, the handover is cancelled and the session stays here."""
        for inc in list(self.incoming.values()):
            inc.asked.discard(peer)
            inc.gone.add(peer)
            if inc.holder is None:
                if not inc.asked:
                    self._finish_in(inc)
            elif peer == inc.holder and not inc.tail:
                self.holder_lost += 1
                log.warning(
                    "session %s: its old node %s left before its tail; delivering what came (DUP)",
                    inc.client_id[:40],
                    peer[:8],
                )
                self._finish_in(inc)
            elif peer in inc.unfenced:
                inc.unfenced.discard(peer)
                self.diversions.clear(peer, inc.client_id)
                if inc.tail and not inc.unfenced:
                    self._finish_in(inc)
        for out in list(self.outgoing.values()):
            if out.forwarding:
                continue  # a peer that left may come back with copies for A: forwarded
            if peer == out.dest:
                self.target_lost += 1
                self._cancel_out(out, f"its new node {peer[:8]} left")
            elif peer in out.waiting:
                out.waiting.discard(peer)
                self._maybe_hand_over(out)

    # ------------------------------------------------------------ A: the session is here
    def _give_up(self, client_id: str, clean: bool, dest: str, rid: str, peers: list[str]) -> None:
        core = self.core
        s = core.sessions.get(client_id)
        if s is None or s.sink is not None:
            if rid:
                self.send(dest, {"t": "none", "cid": client_id, "rid": rid, "src": self.me})
            return
        for out in [o for o in self.outgoing.values() if o.client_id == client_id]:
            self._cancel_out(out, f"it moves to {dest[:8]} instead")  # the client moved again
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
        # the peers B reached and those this node reaches: each one's stream is cut by a fence
        asked = ({str(p) for p in peers} | set(self.peers()) | {dest}) - {self.me}
        self.send(dest, self._subscriptions(s, rid, sorted(asked - {dest})))
        out = _Outgoing(rid, client_id, s, dest, asked, set(asked))
        # A gives up first (3/4 of the timeout), so that B, waiting the whole timeout from an
        # earlier start, normally has the tail before it gives up (no duplicates)
        out.timer = self.later(0.75 * self.timeout, lambda: self._expire_out(rid))
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

    def _fenced_here(self, out: _Outgoing, src: str) -> None:
        """At A, ``src``'s fence: its copies after it are B's to deliver."""
        out.waiting.discard(src)
        out.fenced.add(src)
        cid = out.client_id
        if out.forwarding:
            self.diversions.set(src, cid, self._drop)
        else:
            self.diversions.set(src, cid, lambda m, r: out.aside.append((m, r)))
        self._maybe_hand_over(out)

    def _maybe_hand_over(self, out: _Outgoing) -> None:
        if not out.ready:
            return
        if out.forwarding:
            if out.fenced >= out.peers:
                self._end_forwarding(out, "every fence came")
        elif not out.waiting:
            self._hand_over(out)

    def _expire_out(self, rid: str) -> None:
        out = self.outgoing.get(rid)
        if out is None:
            return
        if out.forwarding:
            self._end_forwarding(
                out,
                f"no fence from {', '.join(p[:8] for p in sorted(out.peers - out.fenced))} "
                f"after {self.linger:.0f} s",
            )
            return
        self.timeouts += 1
        log.warning(
            "session %s: handover to %s incomplete after %.1f s (%s); sending what is queued",
            out.client_id[:40],
            out.dest[:8],
            0.75 * self.timeout,
            "no fence from " + ", ".join(p[:8] for p in sorted(out.waiting))
            if out.waiting
            else "its subscriptions not confirmed",
        )
        self._hand_over(out)

    def _hand_over(self, out: _Outgoing) -> None:
        """The tail (A's fence in its stream to B); then the session ends here, or, when a
        peer did not fence, lives on as a forwarder."""
        if out.timer is not None:
            out.timer.cancel()
        core = self.core
        s = out.session
        cid = out.client_id
        if core.sessions.get(cid) is not s:  # ended meanwhile (expired)
            self._forget(out)
            return
        now = core.clock.monotonic()
        self.send(
            out.dest,
            {
                "t": "tail",
                "rid": out.rid,
                "cid": cid,
                "src": self.me,
                "messages": session_entries(s, now),
                "qos2": sorted(s.qos2_received),
                "fenced": sorted(out.fenced),
            },
        )
        out.aside = []
        self.moved_out += 1
        if out.ready and out.fenced >= out.peers:
            self._forget(out)
            core.end_session(s, now)
            core.flush()
            log.info("session %s moved to node %s", cid[:40], out.dest[:8])
            return
        # a forwarder: in memory only (its rows go), nothing queued, copies go on to B
        out.forwarding = True
        core.journal.ended(s)
        s.inflight.clear()
        s.queue.clear()
        s.qos2_received.clear()
        s.sink = lambda m, r: None if out.ready or r.qos == 0 else self._forward(out, m, r)
        for peer in out.peers:
            self.diversions.set(peer, cid, self._drop if peer in out.fenced else self._forwarder(out))
        out.timer = self.later(self.linger, lambda: self._expire_out(out.rid))
        core.flush()
        log.info(
            "session %s moved to node %s; forwarding what still comes from %s",
            cid[:40],
            out.dest[:8],
            ", ".join(p[:8] for p in sorted(out.peers - out.fenced)) or "here",
        )

    def _forwarder(self, out: _Outgoing) -> Handler:
        return lambda m, r: self._forward(out, m, r)

    def _forward(self, out: _Outgoing, m: Message, r: Route) -> None:
        self.forwarded += 1
        entry = outgoing_entry(m, r, self.core.clock.monotonic())
        self.send(
            out.dest, {"t": "more", "rid": out.rid, "cid": out.client_id, "src": self.me, "messages": [entry]}
        )

    def _end_forwarding(self, out: _Outgoing, why: str) -> None:
        self._forget(out)
        core = self.core
        s = out.session
        if core.sessions.get(out.client_id) is s:
            core.end_session(s, core.clock.monotonic())
            core.flush()
        log.info("session %s: forwarding to %s ended (%s)", out.client_id[:40], out.dest[:8], why)

    def _cancel_out(self, out: _Outgoing, why: str) -> None:
        """The session stays here (the new node left, or the client came back): before the
        tail, what was set aside is queued again; a forwarder becomes the session again."""
        self._forget(out)
        core = self.core
        s = out.session
        now = core.clock.monotonic()
        if core.sessions.get(out.client_id) is s:
            if out.forwarding:
                s.sink = None
                if s.conn is not None:
                    core.journal.connected(s, now)  # stored again (its rows went with the tail)
            else:
                for m, r in out.aside:
                    deliver_route(core, s, m, r, now)
        out.aside = []
        core.flush()
        log.warning("session %s: handover to %s cancelled, %s", out.client_id[:40], out.dest[:8], why)

    def _subscriptions(self, s: Session, rid: str, peers: list[str]) -> dict[str, Any]:
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
            "peers": peers,
        }

    # ------------------------------------------------------------ observability
    def sys_values(self) -> dict[str, str]:
        base = "$SYS/cluster/sessions/"
        return {
            base + "moved_in": str(self.moved_in),
            base + "moved_out": str(self.moved_out),
            base + "handover_timeouts": str(self.timeouts),
            base + "handover_holder_lost": str(self.holder_lost),
            base + "handover_target_lost": str(self.target_lost),
            base + "possible_duplicates": str(self.duplicates),
            base + "forwarded_late": str(self.forwarded),
        }
