"""Durability of the broker core: the journal behind which the store sits.

Every change to a *persisted* session (one whose expiry interval is above 0, with a store
configured) and every retained message is written through to the store's queue: an O(1)
append on the event loop; the store's writer thread commits in groups (docs/persistence.md;
issue 7, item 1 — no seed covers it).  The core calls the journal unconditionally at each
such change; each method is a no-op without a store or for a session that is not persisted,
so the state machine carries no ``if store is not None`` branches.

Acknowledgements that reveal stored state (PUBACK, PUBREC, PUBREL to persisted subscribers,
PUBCOMP to persisted publishers; CONNACK, SUBACK and UNSUBACK of persisted sessions) are
parked with :meth:`Journal.hold` until the store's durable signal: one shared wake-up per
group commit, in submission order, so each connection keeps its packet order (one FIFO per
connection: a packet leaves only when every packet held before it on its connection left).
A publisher's QoS 1 PUBACK whose only store writes were the deliveries of its message to
persisted sessions may leave earlier: when every one of those deliveries is acknowledged
(:class:`~broker.core._session.AckWaiter`), nothing of the message needs the store any more
(a crash before the commit loses rows that would have been deleted anyway; one after it
redelivers a message that was acknowledged, as QoS 1 allows).
:meth:`Journal.restore` rebuilds the core's state at start.

The store's records (:mod:`broker.durability`) are imported by the methods that write or
replay them, reached only with a store: a broker without one never loads the store's modules
(issue 42 item 1; one module attribute lookup per record written, beside the row's encoding).
"""

from __future__ import annotations

import concurrent.futures
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import content
from broker.core._session import AckWaiter, ConnectionState, Outgoing, Session
from broker.packets import Connack, Packet, ReasonCode
from broker.values import QUEUED, Message

if TYPE_CHECKING:
    from broker.core._connection import Connection
    from broker.core._core import Core
    from broker.durability import LoadedState, MessageRecord, SessionRecord, Store

__all__ = ["Journal"]


class Held:
    """A packet parked until the store's commit (``ready``), or its message's deliveries
    were all acknowledged; ``done`` once sent or given up."""

    __slots__ = ("conn", "done", "packet", "ready")

    def __init__(self, conn: Connection, packet: Packet | bytes) -> None:
        self.conn = conn
        self.packet = packet
        self.ready = False
        self.done = False


_Held = list[Held]


def _call_now(fn: Callable[..., object], *args: object) -> None:
    fn(*args)


class Journal:
    """The core's write-through to the store (a no-op without one)."""

    def __init__(self, core: Core) -> None:
        self.core = core
        #: set by ``Broker.start`` when a store is configured
        self.store: Store | None = None
        #: thread-safe scheduler of the event loop (``loop.call_soon_threadsafe``)
        self.call_threadsafe: Callable[..., object] = _call_now
        self.failed = False
        self._held: tuple[concurrent.futures.Future[None], _Held] | None = None
        self._queues: dict[Connection, deque[Held]] = {}  # per connection, in send order
        #: while a QoS 1 publication is routed (``track``/``tracked``): its waiter, made by
        #: its first delivery to a persisted session (none for the common clean-session case)
        self._tracking = False
        self._waiter: AckWaiter | None = None
        #: ``Core.attach`` resumed a session whose stored row needs no commit before CONNACK
        self.resumed_as_stored = False

    @property
    def holding(self) -> bool:
        """Some packets wait for the store's commit (or their deliveries' acknowledgements)."""
        return bool(self._queues)

    @property
    def submitted(self) -> int:
        """Writes submitted so far (compare before/after to know whether a step wrote)."""
        return 0 if self.store is None else self.store.submitted

    # ------------------------------------------------------------ session rows
    def _record(self, s: Session, now: float, wall: float) -> SessionRecord:
        from broker.durability import SessionRecord  # with a store only (issue 42 item 1)

        due = None if s.will_due is None else wall + (s.will_due - now)
        disconnected = None if s.conn is not None else wall
        user = s.verified_username  # the store keeps verified names only
        return SessionRecord(
            s.client_id, s.version, s.expiry_interval, disconnected, user, s.next_pid, s.will, due
        )

    def connected(self, s: Session, now: float) -> bool:
        """CONNECT accepted: write the session row (everything, if it becomes persisted now).

        A session is persisted while its expiry interval is > 0 (MQTT 3.1.1: CleanSession=0);
        resuming one with expiry 0 deletes its rows (it ends with this connection anyway).
        Returns whether the CONNACK must wait for the commit: not when a persisted session
        resumes with the expiry interval it had, no pending will that this CONNECT cancels
        (``resumed_as_stored``, set by ``Core.attach``) and no new will, since
        everything the CONNACK tells (the session exists, with its subscriptions and
        messages) is durable already; the row only notes the connection (a crash before its
        commit counts the expiry from the previous disconnection, a few milliseconds
        earlier).  This is what lets a restart storm resume sessions without one commit
        wait per client (issue 27, item 4).
        """
        as_stored = self.resumed_as_stored
        self.resumed_as_stored = False
        store = self.store
        if store is None or s.sink is not None:
            return False
        cid = s.client_id
        if s.expiry_interval == 0:
            if s.persisted:
                s.persisted = False
                store.delete_session(cid)
                self.core.composite.persistence(cid, False)  # no longer journalled
            return False
        wall = self.core.clock.wall()
        store.put_session(self._record(s, now, wall))
        if s.persisted:
            return s.will is not None or not as_stored
        s.persisted = True  # a session kept in memory only until now (a takeover changed it)
        self.entries(s)
        for pid, out in s.inflight.items():
            self.outgoing(s, out, out.state, pid, now, wall)
        for out in s.queue:
            self.outgoing(s, out, QUEUED, None, now, wall)
        for pid in s.qos2_received:
            store.qos2_received(cid, pid)
        self.core.composite.persistence(cid, True)  # journalled from now on
        return True

    def detached(self, s: Session, now: float) -> None:
        """The session's connection ended: its row records when (and its pending will)."""
        if s.persisted and self.store is not None:
            self.store.put_session(self._record(s, now, self.core.clock.wall()))

    def ended(self, s: Session) -> None:
        """The session ended: its rows are deleted."""
        if s.persisted:
            s.persisted = False
            if self.store is not None:
                self.store.delete_session(s.client_id)

    def will_cleared(self, s: Session) -> None:
        if s.persisted and self.store is not None:
            self.store.set_will(s.client_id, None)

    def entries(self, s: Session) -> None:
        """The client's entry list changed (SUBSCRIBE / UNSUBSCRIBE): rewrite it."""
        if s.persisted and self.store is not None:
            from broker.durability import EntryRecord

            entries = self.core.router.index.entries(s.client_id)
            self.store.put_entries(s.client_id, [EntryRecord(e.topic_filter, e.options) for e in entries])

    def retain(self, msg: Message, now: float) -> None:
        """A retained message (or, empty, its deletion): kept in the router's retained tree and
        written to the store (``$SYS`` topics are not stored).  The one way retained storage is
        reached (``Core.publish``, the admin API, a cluster's retained register). O(levels)."""
        self.core.router.store_retained(msg)
        if self.store is not None and not msg.topic.startswith("$SYS/"):
            from broker.durability import message_record

            self.store.set_retained(message_record(msg, now))

    # ------------------------------------------------------------ outgoing QoS 1/2 messages
    def outgoing(  # noqa: PLR0917
        self,
        s: Session,
        out: Outgoing,
        state: int,
        pid: int | None,
        now: float,
        wall: float | None = None,
    ) -> None:
        """A message queued for (``state`` :data:`~broker.values.QUEUED`, ``pid`` None) or
        sent to the persisted session ``s`` (caller checks ``s.persisted``, which implies a
        store).  ``state`` is stored as it is: one encoding (:mod:`broker.values._flow`)."""
        store = self.store
        assert store is not None
        if self._tracking:
            w = self._waiter
            if w is None:
                w = self._waiter = AckWaiter()
            out.waiter = w
            w.remaining += 1
            w.writes += 1
        out.seq = seq = store.next_seq()
        store.add_delivery(s.client_id, seq, state, pid, out, now, wall)

    def sent(self, s: Session, out: Outgoing, pid: int) -> None:
        """A queued message left the queue with packet id ``pid``."""
        if s.persisted and self.store is not None:
            self.store.mark_sent(s.client_id, out.seq, pid)

    def dropped(self, s: Session, out: Outgoing) -> None:
        """A queued message expired before it was sent."""
        if s.persisted and self.store is not None:
            self.store.drop_outgoing(s.client_id, out.seq)

    def track(self) -> None:
        """A QoS 1 publication is about to be routed: note its deliveries to persisted sessions."""
        self._tracking = True
        self._waiter = None

    def tracked(self) -> AckWaiter | None:
        """End :meth:`track`: the publication's waiter, if it had persisted deliveries."""
        self._tracking = False
        w = self._waiter
        self._waiter = None
        return w

    def completed(self, s: Session, pid: int, out: Outgoing | None = None) -> None:
        """The outgoing flow of ``pid`` ended (PUBACK, PUBCOMP, a refusing PUBREC, discarded);
        ``out``: its message, when acknowledged by the client."""
        if s.persisted and self.store is not None:
            self.store.complete(s.client_id, pid)
        if out is not None:
            w = out.waiter
            if w is not None:
                out.waiter = None
                w.remaining -= 1
                entry = w.entry
                if w.remaining == 0 and entry is not None and not entry.done:
                    entry.ready = True
                    self._send_ready(entry.conn)

    def pubrec(self, s: Session, pid: int) -> bool:
        """PUBREC received for ``pid``; True if that was written (PUBREL must wait for it)."""
        if s.persisted and self.store is not None:
            self.store.mark_pubrec(s.client_id, pid)
            return True
        return False

    # ------------------------------------------------------------ incoming QoS 2 ids
    def qos2_received(self, s: Session, pid: int) -> None:
        """The id of an incoming QoS 2 message is stored (its deferred deliveries wait for the
        commit that holds it: :meth:`hold_writes`)."""
        if s.persisted and self.store is not None:
            self.store.qos2_received(s.client_id, pid)

    def qos2_released(self, s: Session, pid: int) -> bool:
        """PUBREL: the id is forgotten; True if written (PUBCOMP waits: a stale id would
        swallow a later message that reuses the packet id after a crash)."""
        if s.persisted and self.store is not None:
            self.store.qos2_released(s.client_id, pid)
            return True
        return False

    # ------------------------------------------------------------ back-pressure
    def bound(self, conn: Connection) -> None:
        """``conn`` just made the store write: when the writer is more than
        ``Store.max_backlog`` operations behind, stop reading ``conn`` until the next commit
        (flow control's pause, issue 15: the store's queue stays bounded). O(1)."""
        store = self.store
        if store is None or conn.store_wait or store.backlog <= store.max_backlog:
            return
        core = self.core
        conn.store_wait = True
        core.block(conn)
        core.stats.store_waits += 1
        call = self.call_threadsafe
        caught_up = self._caught_up
        store.sync().add_done_callback(lambda _f: call(caught_up, conn))

    def _caught_up(self, conn: Connection) -> None:
        conn.store_wait = False
        if conn.state is ConnectionState.CLOSED:
            return  # Connection.lost forgot its pause
        if self.core.unblock(conn):
            self.core.flush()

    # ------------------------------------------------------------ held deliveries
    def hold_writes(self, deferred: list[tuple[Connection, bytes]]) -> None:
        """The deliveries ``Core.take_deferred`` returned, sent once what was submitted to the
        store so far (the packet id and the copies) is durable, each in its connection's
        order (a later delivery to the connection waits behind them: :meth:`hold_write`)."""
        for conn, data in deferred:
            self.hold_write(conn, data)

    def hold_write(self, conn: Connection, data: bytes) -> None:
        """One encoded delivery, held until the commit. O(1)."""
        conn.held_writes += 1
        self.hold(conn, data)

    # ------------------------------------------------------------ acknowledgements
    def hold(self, conn: Connection, packet: Packet | bytes, waiter: AckWaiter | None = None) -> None:
        """Send ``packet`` on ``conn`` once everything written to the store so far is durable
        (or, with ``waiter``, once its message's persisted deliveries are all acknowledged),
        and after every packet held before it on ``conn``.

        All packets held between two commits share the store's durable signal and one
        thread-safe wake-up.  O(1).
        """
        store = self.store
        assert store is not None
        fut = store.sync()
        entry = Held(conn, packet)
        conn.held += 1
        q = self._queues.get(conn)
        if q is None:
            q = self._queues[conn] = deque()
        q.append(entry)
        if waiter is not None:
            waiter.entry = entry
        batch = self._held
        if batch is not None and batch[0] is fut:
            batch[1].append(entry)
            return
        held: _Held = [entry]
        self._held = (fut, held)
        call = self.call_threadsafe
        release = self._release
        fut.add_done_callback(lambda f: call(release, f, held))

    def _send_ready(self, conn: Connection) -> None:
        """Send ``conn``'s held packets from the head of its FIFO while they are ready."""
        q = self._queues.get(conn)
        if q is None:
            return
        while q and q[0].ready:
            entry = q.popleft()
            entry.done = True
            conn.held -= 1
            packet = entry.packet
            if isinstance(packet, bytes):  # a held delivery
                conn.held_writes -= 1
                if conn.state is not ConnectionState.CLOSED and not conn.close_requested:
                    conn._out().append(packet)
                    self.core.dirty.add(conn)
                continue
            if conn.state is ConnectionState.CLOSED:
                continue
            if conn.gated and isinstance(packet, Connack):
                conn.open_gate(packet)
            else:
                conn.send(packet)
        if not q:
            del self._queues[conn]

    def _fail(self, conn: Connection) -> None:
        """A commit failed: ``conn``'s held packets will never be sent; refuse or disconnect."""
        q = self._queues.pop(conn, None)
        if q is None:
            return
        gated_connack = False
        for entry in q:
            if not entry.done:
                entry.done = True
                conn.held -= 1
                if isinstance(entry.packet, bytes):
                    conn.held_writes -= 1
                gated_connack = gated_connack or (conn.gated and isinstance(entry.packet, Connack))
        if conn.state is ConnectionState.CLOSED:
            return
        if gated_connack:
            conn.open_gate(None)
        else:
            conn.disconnect(ReasonCode.UNSPECIFIED_ERROR, "persistent store failed: not acknowledged")

    def _release(self, fut: concurrent.futures.Future[None], held: _Held) -> None:
        """The durable signal fired: send the held packets (or, if the commit failed, refuse)."""
        batch = self._held
        if batch is not None and batch[1] is held:
            self._held = None
        exc = fut.exception()
        self.failed = exc is not None  # the store logs the cause and the recovery, once each
        conns: dict[Connection, None] = {}
        for entry in held:
            if not entry.done:
                entry.ready = True
                conns[entry.conn] = None
        for conn in conns:
            if exc is None:
                self._send_ready(conn)
            else:
                self._fail(conn)
        self.core.flush()

    # ------------------------------------------------------------ start
    def restore(self, st: LoadedState, now: float, wall: float) -> None:
        """Rebuild the state ``Store.load`` found (broker start, before accepting clients).

        Retained messages, persisted sessions with their entry lists (content filters
        compiled again), queued and in-flight messages (resent with DUP when the client
        resumes), QoS 2 ids awaiting PUBREL, and wills: a delayed will keeps its due time; a
        session that was connected when the process died gets its will as ``detach`` would
        have given it; sessions that expired while the broker was down publish theirs now.
        """
        store = self.store
        assert store is not None
        core = self.core
        router = core.router
        for rec in st.retained.values():
            router.store_retained(rec.to_message(now, wall))
        # one Message per stored message, however many sessions it was queued for (the file
        # holds a copy per delivery; live routing shares one object, and so does the restore)
        messages: dict[MessageRecord, Message] = {}
        for cid, r in st.sessions.items():
            self._restore_session(cid, r, st, messages, now, wall)
        for cid in sorted(st.crashed):
            c = core.sessions.get(cid)
            if c is None or c.will is None or c.will_due is not None:
                continue
            delay = c.will.properties.will_delay_interval or 0
            if delay == 0:
                core.publish_will(c, now)
            else:
                c.will_due = now + min(delay, c.expiry_interval)
                core.pending_wills.add(c)
                store.set_will(cid, c.will, wall + (c.will_due - now))
        for r in st.expired:
            if r.will is not None:
                gone = Session(r.client_id)
                gone.will = r.will
                core.publish_will(gone, now)

    def _restore_session(  # noqa: PLR0917
        self,
        cid: str,
        r: SessionRecord,
        st: LoadedState,
        messages: dict[MessageRecord, Message],
        now: float,
        wall: float,
    ) -> None:
        """One stored session back in the core: lean (shared empty containers) unless it has
        content filters, messages or QoS 2 ids (``Session.materialize``)."""
        from broker.durability import replay_entries

        core = self.core
        router = core.router
        qos2_in = st.qos2_in
        s = Session(cid, r.expiry_interval, True)  # lean: shared empty containers
        s.persisted = True
        s.version = r.protocol_level
        s.next_pid, s.username, s.will = r.next_pid, r.username, r.will
        s.authenticated = r.username is not None  # stored only when it was authenticated
        exp = r.expires_at()
        if exp is not None:
            s.expires_at = now + (exp - wall)
            core.expiring.add(s)
        if r.will_due is not None and r.will is not None:
            s.will_due = now + (r.will_due - wall)
            core.pending_wills.add(s)
        core.sessions[cid] = s
        entries = st.entries.get(cid, [])
        for e in entries:
            opts = e.options
            if opts is not None and opts.selector is not None:
                router.add_selector(opts.selector, content.compile(opts.selector))
                s.materialize()
                s.selectors[e.topic_filter] = opts.selector
        replay_entries(router.index, cid, entries)
        outgoing = st.outgoing.get(cid)
        if outgoing or cid in qos2_in:
            s.materialize()
        for o in outgoing or ():
            msg = messages.get(o.message)
            if msg is None:
                msg = messages[o.message] = o.message.to_message(now, wall)
            out = Outgoing(msg, o.qos, o.retain, o.sub_ids, o.topic_filter, o.selector)
            out.seq = o.seq
            if o.packet_id is None:
                s.queue.append(out)
            else:
                out.state = int(o.state)  # the store's value is the core's (broker.values._flow)
                s.inflight[o.packet_id] = out
        if cid in qos2_in:
            s.qos2_received = set(qos2_in[cid])
