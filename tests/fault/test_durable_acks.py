"""CONNACK, SUBACK and UNSUBACK of persisted sessions come after the commit they reveal.

``kill -9`` the broker as soon as a SUBACK (or UNSUBACK) is read, restart it on the same
database, and the session must be there with the subscription (or without it): what the
client was told exists survives.  ``SIFTMQ_ACK_KILL_CYCLES`` sets the cycles (CI: 5).  And the
CONNACK of a resumed persisted session is the first packet even when messages were queued for
it (MQTT-3.2.0-1), though the connection's output waits for a commit.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from broker import Broker
from broker.packets import (
    Connack,
    Connect,
    Decoder,
    Packet,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    encode,
)
from tests.fault.test_crash_loop import EXPIRY, TIMEOUT, _start
from tests.rawclient import RawClient

CYCLES = int(os.environ.get("SIFTMQ_ACK_KILL_CYCLES", "5"))


async def _packets_until(reader: asyncio.StreamReader, dec: Decoder, kind: type) -> list[Packet]:
    got: list[Packet] = []
    while not any(isinstance(p, kind) for p in got):
        data = await asyncio.wait_for(reader.read(65536), TIMEOUT)
        assert data, "broker closed the connection"
        got += dec.feed(data)
    return got


async def _connect(
    port: int, cid: str, clean: bool
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Connack]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode(Connect(cid, 5, clean_start=clean, properties=EXPIRY), 5))
    dec = Decoder(5, server=False)
    first = (await _packets_until(reader, dec, Connack))[0]
    assert isinstance(first, Connack) and int(first.reason_code) == 0, first
    return reader, writer, first


async def _kill(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGKILL)
    await proc.wait()


async def test_kill_9_right_after_suback_and_unsuback_keeps_what_they_acknowledged(tmp_path: Path) -> None:
    db = tmp_path / "broker.db"
    for i in range(CYCLES):
        proc, port = await _start(db)
        try:
            cid, topic = f"k{i}", f"kill/{i}"
            reader, writer, _ = await _connect(port, cid, clean=True)  # a brand-new session
            # one write: SUBSCRIBE the new topic and UNSUBSCRIBE the previous cycle's, so the
            # kill comes right after the acknowledgements of both
            writer.write(
                encode(Subscribe(1, (SubscriptionRequest(topic, 1),)), 5)
                + encode(Subscribe(2, (SubscriptionRequest("kill/gone", 1),)), 5)
                + encode(Unsubscribe(3, ("kill/gone",)), 5)
            )
            got = await _packets_until(reader, Decoder(5, server=False), Unsuback)
            assert [type(p) for p in got] == [Suback, Suback, Unsuback]
        finally:
            await _kill(proc)
        writer.close()
        proc, port = await _start(db)
        try:
            reader, writer, ack = await _connect(port, cid, clean=False)
            assert ack.session_present, f"cycle {i}: the session acknowledged before the kill is gone"
            pub, _ = await RawClient.connect(port, f"p{i}")
            await pub.publish1(topic, b"here")
            await pub.publish1("kill/gone", b"not for you")
            try:
                delivered = await _packets_until(reader, Decoder(5, server=False), Publish)
            except TimeoutError:
                raise AssertionError(
                    f"cycle {i}: the subscription acknowledged before the kill is gone"
                ) from None
            assert [(p.topic, p.payload) for p in delivered if isinstance(p, Publish)] == [(topic, b"here")]
            msg = next(p for p in delivered if isinstance(p, Publish))
            writer.write(encode(Puback(msg.packet_id or 0), 5))
            await pub.close()
            writer.close()
        finally:
            await _kill(proc)


async def test_connack_is_first_on_a_resumed_session_with_queued_messages(tmp_path: Path) -> None:
    async with Broker(port=0, sys_interval=0, store_path=str(tmp_path / "b.db")) as b:
        sub, ack = await RawClient.connect(b.port, "s", clean_start=True, properties=EXPIRY)
        assert not ack.session_present
        await sub.subscribe(SubscriptionRequest("q/t", 1))
        await sub.close()
        pub, _ = await RawClient.connect(b.port, "p")
        for n in range(5):
            await pub.publish1("q/t", str(n).encode())
        c = await RawClient.open(b.port)
        c.send(Connect("s", 5, clean_start=False, properties=EXPIRY))
        first = await c.recv()
        assert isinstance(first, Connack) and first.session_present, first
        msgs = [await c.recv() for _ in range(5)]
        assert [p.payload for p in msgs if isinstance(p, Publish)] == [b"0", b"1", b"2", b"3", b"4"]
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace
