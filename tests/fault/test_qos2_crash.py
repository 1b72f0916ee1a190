"""Exactly once for QoS 2 survives a ``kill -9`` between routing and the store's commit, and a
graceful stop sends the PUBCOMP it owes (issue 30).

A persisted publisher's QoS 2 message used to reach the subscribers (and the cluster's links)
before the store committed its packet id: a crash in between, then the publisher's resend
(same packet id, DUP), delivered it a second time.  Now its deliveries leave only once the id
is durable with them.  The broker runs with ``store_commit_delay = 0.5`` so that the window is
wide: the kill comes as soon as a QoS 0 marker published right behind the message reached an
observer (the broker has routed the message by then).  If the machine stalls past the window,
the message is committed and delivered, and the test still checks exactly once (the
subscriber's redelivery then carries the DUP flag and the packet id it already has).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

from broker.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    SubscriptionRequest,
)
from tests.fault._broker_process import TIMEOUT, start_broker
from tests.rawclient import RawClient

EXPIRY = Properties(session_expiry_interval=3600)


async def _start(db: Path) -> tuple[asyncio.subprocess.Process, int]:
    return await start_broker(db, store_commit_delay=0.5)


class _Receiver:
    """A QoS 2 receiver as MQTT 4.3.3 has it (state kept across connections): a PUBLISH
    counts unless it is a DUP of a packet id received and not yet released."""

    def __init__(self) -> None:
        self.unreleased: set[int] = set()
        self.delivered: list[bytes] = []

    def handle(self, c: RawClient | None, packets: list[Packet]) -> None:
        for p in packets:
            if isinstance(p, Publish) and p.qos == 2 and p.packet_id is not None:
                if not (p.dup and p.packet_id in self.unreleased):
                    self.delivered.append(p.payload)
                self.unreleased.add(p.packet_id)
                if c is not None:
                    c.send(Pubrec(p.packet_id))
            elif isinstance(p, Publish) and p.qos == 1 and c is not None:
                c.send(Puback(p.packet_id or 0))
            elif isinstance(p, Pubrel):
                self.unreleased.discard(p.packet_id)
                if c is not None:
                    c.send(Pubcomp(p.packet_id))


async def test_kill_9_before_the_commit_of_a_qos2_message_delivers_it_once(tmp_path: Path) -> None:
    db = tmp_path / "broker.db"
    recv = _Receiver()
    proc, port = await _start(db)
    try:
        sub, _ = await RawClient.connect(port, "s", clean_start=True, properties=EXPIRY)
        await sub.subscribe(SubscriptionRequest("x/q2", 2))
        obs, _ = await RawClient.connect(port, "o")
        await obs.subscribe(SubscriptionRequest("x/mark", 0))
        pub, _ = await RawClient.connect(port, "p", clean_start=True, properties=EXPIRY)
        pub.send(Publish("x/q2", b"once", 2, packet_id=7))
        pub.send(Publish("x/mark", b"routed", 0))
        mark = await obs.recv_where(lambda p: isinstance(p, Publish))
        assert isinstance(mark, Publish) and mark.payload == b"routed"
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    recv.handle(None, await sub.closed())  # whatever left the broker before the kill
    for c in (pub, obs):
        await c.close()

    await _restart_and_count(db, recv, EXPIRY)


async def _restart_and_count(db: Path, recv: _Receiver, sub_props: Properties) -> None:
    """Restart on ``db``; the publisher resends packet id 7 (it never had its PUBCOMP); the
    subscriber takes everything up to a later message: "once" must have come exactly once."""
    proc, port = await _start(db)
    try:
        pub, ack = await RawClient.connect(port, "p", clean_start=False, properties=EXPIRY)
        assert ack.session_present
        pub.send(Publish("x/q2", b"once", 2, dup=True, packet_id=7))  # the publisher's resend
        rec = await pub.recv_where(lambda p: isinstance(p, Pubrec))
        assert isinstance(rec, Pubrec) and rec.packet_id == 7
        pub.send(Pubrel(7))
        await pub.recv_where(lambda p: isinstance(p, Pubcomp))
        sub = await RawClient.open(port)
        sub.send(Connect("s", 5, clean_start=False, properties=sub_props))
        first = await sub.recv()
        assert isinstance(first, Connack) and first.session_present, first
        # a later message to the same subscriber: what was routed to it before comes first
        pub.send(Publish("x/q2", b"after", 1, packet_id=8))
        while True:
            p = await sub.recv(TIMEOUT)
            recv.handle(sub, [p])
            if isinstance(p, Publish) and p.payload == b"after":
                break
        assert recv.delivered.count(b"once") == 1, recv.delivered
        for c in (pub, sub):
            await c.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        await proc.wait()


async def test_a_queued_qos2_copy_drained_before_the_commit_waits_for_it(tmp_path: Path) -> None:
    """The subscriber's window (receive maximum 1) is full, so the QoS 2 copy is queued; the
    subscriber's PUBACK drains it inside the commit delay: it waits for the commit all the
    same (it used to leave at once), then the kill, and exactly once after the restart."""
    db = tmp_path / "broker.db"
    recv = _Receiver()
    one = Properties(session_expiry_interval=3600, receive_maximum=1)
    proc, port = await _start(db)
    try:
        sub, _ = await RawClient.connect(port, "s", clean_start=True, properties=one)
        await sub.subscribe(SubscriptionRequest("x/#", 2))
        pub, _ = await RawClient.connect(port, "p", clean_start=True, properties=EXPIRY)
        await pub.publish1("x/first", b"fills the window")
        full = await sub.recv_where(lambda p: isinstance(p, Publish))
        assert isinstance(full, Publish) and full.qos == 1
        pub.send(Publish("x/q2", b"once", 2, packet_id=7))
        pub.send(Pingreq())
        await pub.recv_where(lambda p: isinstance(p, Pingresp))
        # the broker has queued the copy (packets are handled in order); the PUBACK drains it
        sub.send(Puback(full.packet_id or 0))
        sub.send(Pingreq())
        before = []
        while not isinstance(p := await sub.recv(), Pingresp):
            before.append(p)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    recv.handle(None, [*before, *await sub.closed()])
    await pub.close()
    await _restart_and_count(db, recv, one)


async def test_a_graceful_stop_sends_the_pubcomp_it_owes_before_it_closes(tmp_path: Path) -> None:
    """SIGTERM while the PUBCOMP of a released QoS 2 id waits for the store's commit.  The stop
    used to close the connection first (the PUBCOMP dropped) and then the store, whose close
    committed the release: the restarted broker no longer knew the id, and the publisher,
    which must resend its PUBREL, was left without an answer; paho-mqtt 2.2 resent the PUBLISH
    instead (after failed reconnects), which was then routed again as a new message: the
    nemesis's QoS 2 duplicates after a ``leave`` (docs/fault.md).  Now what the commit holds
    back leaves before the DISCONNECT."""
    db = tmp_path / "broker.db"
    proc, port = await _start(db)
    try:
        # a persisted subscriber that never acknowledges: a delivery to it is a young row, so
        # the store's writer waits its commit delay (0.5 s) before the commit
        slow, _ = await RawClient.connect(port, "s", clean_start=True, properties=EXPIRY)
        await slow.subscribe(SubscriptionRequest("x/q1", 1))
        obs, _ = await RawClient.connect(port, "o")
        await obs.subscribe(SubscriptionRequest("x/mark", 0))
        pub, _ = await RawClient.connect(port, "p", clean_start=True, properties=EXPIRY)
        pub.send(Publish("x/q2", b"once", 2, packet_id=7))
        rec = await pub.recv_where(lambda p: isinstance(p, Pubrec))
        assert isinstance(rec, Pubrec) and rec.packet_id == 7
        pub.send(Publish("x/q1", b"young", 1, packet_id=8))
        pub.send(Pubrel(7))  # released; its PUBCOMP waits for the commit with the young row
        pub.send(Publish("x/mark", b"read", 0))
        mark = await obs.recv_where(lambda p: isinstance(p, Publish))
        assert isinstance(mark, Publish) and mark.payload == b"read"  # the PUBREL was handled
        proc.send_signal(signal.SIGTERM)
        got = await pub.closed()
        assert await asyncio.wait_for(proc.wait(), TIMEOUT) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        await proc.wait()
    names = [f"{type(p).__name__}({getattr(p, 'packet_id', '')})" for p in got]
    assert "Pubcomp(7)" in names, names
    last = got[-1]
    assert isinstance(last, Disconnect) and names.index("Pubcomp(7)") < len(names) - 1, names
    comp = got[names.index("Pubcomp(7)")]
    assert isinstance(comp, Pubcomp) and comp.reason_code == 0, comp
    for c in (slow, obs):
        await c.close()
