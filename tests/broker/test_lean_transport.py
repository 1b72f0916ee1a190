"""The lean plain-TCP transport (broker/net/_lean.py, issue 27 item 2) on asyncio and uvloop.

Each test runs an embedded broker on its own event loop, once with asyncio's default loop and
once with uvloop, and drives it with real clients over loopback: aiomqtt for the ordinary
traffic, raw sockets where the test needs a peer that stops reading or resets. What the
transport must keep from asyncio's: delivery in order, back-pressure (a backlog above the
high-water mark pauses the protocol, and it resumes once the peer reads), the lingering close
(DISCONNECT before the end of stream), abort on a reset, the peer address.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable, Coroutine
from typing import Any

import aiomqtt
import pytest
import uvloop

from broker import Broker
from broker.net._lean import LeanProtocol
from broker.net._transport import MQTTProtocol
from broker.packets import (
    Auth,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    Pingreq,
    Pingresp,
    Publish,
    ReasonCode,
    Subscribe,
    SubscriptionRequest,
    Will,
    encode,
)
from tests.waiting import eventually, next_message

LOOPS = ["asyncio", "uvloop"]


def run(loop: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    if loop == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


def protocols(b: Broker) -> list[MQTTProtocol]:
    return b._protocols()


@pytest.mark.parametrize("loop", LOOPS)
def test_roundtrip_in_order_on_a_lean_transport(loop: str) -> None:
    async def main() -> None:
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05) as b:
            async with (
                aiomqtt.Client("127.0.0.1", b.port, identifier="lean-sub") as sub,
                aiomqtt.Client("127.0.0.1", b.port, identifier="lean-pub") as pub,
            ):
                await sub.subscribe("lean/t", qos=1)
                payloads = [bytes([i % 251]) * (20_000 + i) for i in range(60)]
                for p in payloads:
                    await pub.publish("lean/t", p, qos=1)
                got = [bytes((await next_message(sub)).payload) for _ in payloads]  # type: ignore[arg-type]
                assert got == payloads
                ps = protocols(b)
                assert len(ps) == 2
                assert all(type(p) is LeanProtocol and p.transport is p for p in ps)
                await eventually(lambda: all(p.transport.get_write_buffer_size() == 0 for p in ps))  # type: ignore[union-attr]
                # the peer address is the socket's: what the client sees as its own address
                ours = {p.conn.peer for p in ps if p.conn is not None}
                assert all(isinstance(a, tuple) and a[0] == "127.0.0.1" for a in ours)
                assert b._listeners is not None
                pollers = [a.poller for o in b._listeners for a in o.acceptors if a.poller is not None]
                assert pollers and all(p._ep is not None and not p._ep.closed for p in pollers)
            await eventually(lambda: not b.core.connections and not b._protocols())
        # the listeners closed and their last connections gone: the epoll sets are closed too
        assert all(p._ep is None or p._ep.closed for p in pollers)

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_backlog_pauses_and_resumes_the_protocol(loop: str) -> None:
    """A subscriber that stops reading: the broker's writes pile up in the transport's backlog,
    above the high-water mark the protocol is paused (its QoS 1 queues in the session); once
    the subscriber reads again everything arrives in order and the backlog is released."""

    async def main() -> None:
        # a small kernel send buffer and mark, a wide window, no hung-consumer verdict: the
        # backlog builds up in the transport while the peer does not read
        opts: dict[str, Any] = {
            "socket_send_buffer": 4096,
            "write_buffer_high": 16 * 1024,
            "max_inflight": 500,
            "hung_consumer_time": 0,
            "slow_consumer_grace": 60.0,
        }
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05, **opts) as b:
            raw = socket.socket()
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            raw.setblocking(False)
            loop_ = asyncio.get_running_loop()
            await loop_.sock_connect(raw, ("127.0.0.1", b.port))
            await loop_.sock_sendall(raw, encode(Connect("lean-slow", 4, keep_alive=60), 4))
            sub = Subscribe(1, (SubscriptionRequest("lean/slow", 1),))
            await loop_.sock_sendall(raw, encode(sub, 4))
            dec = Decoder(4, server=False)
            got: list[Any] = []
            while len(got) < 2:
                got += dec.feed(await loop_.sock_recv(raw, 4096))
            (proto,) = protocols(b)
            t = proto.transport
            assert type(t) is LeanProtocol
            async with aiomqtt.Client("127.0.0.1", b.port, identifier="lean-fast") as pub:
                n = 0
                while not proto.write_paused:
                    await pub.publish("lean/slow", n.to_bytes(4, "big") * 4096, qos=1)
                    n += 1
                    assert n < 400, "the protocol was never paused"
                assert t.get_write_buffer_size() > 0
                # now read everything: every message arrives, in order, acknowledged by us
                seqs: list[int] = []
                while len(seqs) < n:
                    data = await asyncio.wait_for(loop_.sock_recv(raw, 65536), 5)
                    assert data, "closed by the broker"
                    for p in dec.feed(data):
                        assert isinstance(p, Publish)
                        seqs.append(int.from_bytes(p.payload[:4], "big"))
                        await loop_.sock_sendall(raw, b"\x40\x02" + struct.pack("!H", p.packet_id or 0))
                assert seqs == list(range(n))
                await eventually(lambda: not proto.write_paused and t.get_write_buffer_size() == 0)
                assert t.backlog is None  # released once empty
            raw.close()
            await eventually(lambda: not b.core.connections)

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_lingering_close_delivers_the_disconnect(loop: str) -> None:
    """A protocol error: CONNACK, then the v5 DISCONNECT (0x82), then the end of stream."""

    async def main() -> None:
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05) as b:
            reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
            writer.write(encode(Connect("lean-bad", 5), 5))
            writer.write(encode(Auth(), 5))  # AUTH without a method: a protocol error
            dec = Decoder(5, server=False)
            got: list[Any] = []
            while data := await asyncio.wait_for(reader.read(4096), 5):
                got += dec.feed(data)
            assert [type(p) for p in got] == [Connack, Disconnect]
            assert got[-1].reason_code == ReasonCode.PROTOCOL_ERROR
            writer.close()
            await eventually(lambda: not b.core.connections and not b._protocols())

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_reset_by_peer_detaches_the_session(loop: str) -> None:
    """The peer resets (SO_LINGER 0): the transport ends, the session is detached and the
    will is published (a connection lost, not a DISCONNECT)."""

    async def main() -> None:
        async with (
            Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05) as b,
            aiomqtt.Client("127.0.0.1", b.port, identifier="lean-watch") as watch,
        ):
            await watch.subscribe("lean/will", qos=0)
            raw = socket.create_connection(("127.0.0.1", b.port))
            c = Connect("lean-reset", 4, keep_alive=60, will=Will("lean/will", b"gone"))
            raw.sendall(encode(c, 4))
            await eventually(lambda: b.core.connected == 2)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            raw.close()  # RST
            msg = await next_message(watch)
            assert msg.payload == b"gone"
            await eventually(lambda: b.core.connected == 1 and len(b._protocols()) == 1)

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_idle_connections_hold_no_decoder(loop: str) -> None:
    """Between packets a connection holds the shared decoder of its protocol level
    (``Decoder.settle``): a packet split over two reads is still decoded whole (the connection
    has its own decoder while it is incomplete), v4 and v5 connections keep their own protocol
    level, and a second CONNECT after the connection went idle is still the protocol error it
    was (0x82, then closed) without touching the other v5 connection."""

    async def main() -> None:
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05) as b:
            streams = {}
            for v in (4, 5, 55):  # 55: a second v5 connection
                level = 5 if v == 55 else v
                reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
                writer.write(encode(Connect(f"lean-dec{v}", level, keep_alive=60), level))
                writer.write(encode(Subscribe(1, (SubscriptionRequest(f"lean/dec{v}", 1),)), level))
                dec = Decoder(level, server=False)
                got: list[Any] = []
                while len(got) < 2:
                    got += dec.feed(await asyncio.wait_for(reader.read(4096), 5))
                streams[v] = (reader, writer, dec)
            ps = protocols(b)
            assert len(ps) == 3 and all(p.decoder.shared for p in ps)
            # the v4 client publishes to the v5 one, the packet split over two reads
            _, writer4, _ = streams[4]
            data = encode(Publish("lean/dec5", b"x" * 300, 1, packet_id=7), 4)
            writer4.write(data[:100])
            await writer4.drain()
            await eventually(lambda: any(not p.decoder.shared for p in protocols(b)))
            writer4.write(data[100:])
            reader5, writer5, dec5 = streams[5]
            got = []
            while not got:
                got += dec5.feed(await asyncio.wait_for(reader5.read(4096), 5))
            assert isinstance(got[0], Publish) and got[0].payload == b"x" * 300
            await eventually(lambda: all(p.decoder.shared for p in protocols(b)))
            # a second CONNECT on the idle v5 connection: DISCONNECT 0x82, then the end of stream
            writer5.write(encode(Connect("lean-dec5", 5), 5))
            got = []
            while data := await asyncio.wait_for(reader5.read(4096), 5):
                got += dec5.feed(data)
            assert [type(p) for p in got][-1:] == [Disconnect]
            assert got[-1].reason_code == ReasonCode.PROTOCOL_ERROR
            # that error stayed with its connection: the other v5 one (same shared decoder) reads on
            reader55, writer55, dec55 = streams[55]
            writer55.write(encode(Pingreq(), 5))
            got = []
            while not got:
                got += dec55.feed(await asyncio.wait_for(reader55.read(4096), 5))
            assert isinstance(got[0], Pingresp)
            for _, w, _ in streams.values():
                w.close()
            await eventually(lambda: not b.core.connections and not b._protocols())

    run(loop, main)
