"""Ingress load shedding (issue 14 item 3; docs/broker.md, "Flow control").

A publisher that stays far ahead of the broker (more than ``ingress_shed_bytes`` waiting in the
kernel behind a read, for ``ingress_shed_grace`` seconds) has the QoS 0 PUBLISHes of its reads
dropped unread and counted, so QoS 0 latency stays bounded instead of queueing in socket
buffers; retained messages, QoS 1/2 and MQTT 5 PUBLISHes with properties are never shed.

The decoder part is sans-IO (no event loop). The broker part pushes a stream of QoS 0 frames
from a thread with a blocking socket, much faster than one event loop can route them, and
checks the exact accounting: every QoS 0 PUBLISH was either routed or counted as shed.
"""

from __future__ import annotations

import asyncio
import socket
import threading

from broker import Broker
from broker.core._clock import ManualClock
from broker.packets import Connect, Decoder, Properties, Publish, encode
from tests.rawclient import RawClient
from tests.waiting import eventually

QOS0 = 20_000  # QoS 0 PUBLISHes in the stream (about 0.7 MB)


def _frames(version: int = 4) -> tuple[bytes, int]:
    """CONNECT, QOS0 QoS 0 PUBLISHes with a retained one and a QoS 1 one near the end."""
    parts = [encode(Connect("shed-pub", version, clean_start=True, keep_alive=0), version)]
    body = b"x" * 16
    frame = encode(Publish("sh/t", body, 0), version)
    parts.append(frame * (QOS0 - 1))
    parts.append(encode(Publish("sh/r", b"kept", 0, retain=True), version))
    parts.append(encode(Publish("sh/q", b"acked", 1, packet_id=7), version))
    return b"".join(parts), QOS0


def test_decoder_sheds_only_plain_qos0() -> None:
    dec = Decoder(5)
    dec.shed_keep = 0  # shed every eligible frame
    alias = Publish("a/b", b"1", 0, properties=Properties(topic_alias=3))
    packets = [
        Publish("t", b"0", 0),
        Publish("t", b"r", 0, retain=True),
        Publish("t", b"1", 1, packet_id=1),
        alias,
        Publish("t", b"0", 0),
    ]
    out = dec.feed(b"".join(encode(p, 5) for p in packets))
    assert [(p.payload, p.qos, p.retain) for p in out if isinstance(p, Publish)] == [
        (b"r", 0, True),
        (b"1", 1, False),
        (b"1", 0, False),
    ]
    assert dec.shed_count == 2
    dec.shed_keep = -1
    assert dec.feed(encode(Publish("t", b"0", 0), 5)) == [Publish("t", b"0", 0)]
    assert dec.shed_count == 2


def test_decoder_keeps_the_newest_bytes_of_a_read() -> None:
    """``shed_keep`` = k: frames starting in the last k bytes of what is fed are decoded."""
    frames = [encode(Publish("t", b"%d" % i, 0), 4) for i in range(10)]
    size = len(frames[0])
    dec = Decoder(4)
    dec.feed(encode(Connect("c", 4), 4))
    dec.shed_keep = 3 * size
    out = dec.feed(b"".join(frames))
    assert [p.payload for p in out if isinstance(p, Publish)] == [b"7", b"8", b"9"]
    assert dec.shed_count == 7


def _push(port: int, data: bytes, done: threading.Event) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(data)  # blocking: as fast as the kernel takes it
        s.recv(4)  # CONNACK ...
        done.wait(30)  # ... and keep the connection until the test has looked


async def _run(b: Broker) -> tuple[int, int, list[Publish]]:
    sub, _ = await RawClient.connect(b.port, "shed-sub", 4, clean_start=True)
    await sub.subscribe("sh/q")
    data, qos0 = _frames()
    done = threading.Event()
    t = threading.Thread(target=_push, args=(b.port, data, done), daemon=True)
    t.start()
    st = b.core.stats
    try:
        # every PUBLISH of the stream was routed or shed (nothing in between)
        await eventually(lambda: st.messages_received + st.dropped_qos0_ingress == qos0 + 1, timeout=30)
        got = [await sub.recv_where(lambda p: isinstance(p, Publish))]
    finally:
        done.set()
        await asyncio.to_thread(t.join, 30)
    return st.messages_received, st.dropped_qos0_ingress, got  # type: ignore[return-value]


async def test_a_publisher_far_ahead_has_its_qos0_shed_and_counted() -> None:
    async with Broker(port=0, sys_interval=0, ingress_shed_bytes=4096, ingress_shed_grace=0) as b:
        routed, shed, got = await _run(b)
        assert shed > 0, "the stream never got ahead of the broker"
        assert routed + shed == QOS0 + 1
        assert b.core.stats.publish_dropped >= shed
        # the QoS 1 message and the retained one are never shed
        assert [(p.topic, p.payload) for p in got] == [("sh/q", b"acked")]
        assert b.core.router.retained.get("sh/r") is not None
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


async def test_a_backlog_shorter_than_the_grace_sheds_nothing() -> None:
    """The clock does not move: the backlog never lasts the grace time, so nothing is shed."""
    async with Broker(port=0, sys_interval=0, ingress_shed_bytes=4096, clock=ManualClock()) as b:
        routed, shed, got = await _run(b)
        assert (routed, shed) == (QOS0 + 1, 0)
        assert [(p.topic, p.payload) for p in got] == [("sh/q", b"acked")]
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace
