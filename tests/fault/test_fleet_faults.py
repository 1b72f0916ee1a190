"""A fleet's faults, small (issue 27, item 5; the 19,000-connection runs are
benchmarks/bench_fleet.py, docs/performance-connections.md): a storm of 2,000 connections at
once, clients that never send CONNECT, clients that go silent (half-open), a storm of invalid
CONNECTs -- each answered and counted, none stalls the others. Descriptor exhaustion:
tests/fault/test_descriptors.py."""

from __future__ import annotations

import asyncio

from broker import Broker
from broker.packets import (
    Connack,
    Connect,
    Decoder,
    Publish,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    encode,
)
from tests.rawclient import RawClient
from tests.waiting import eventually

T = 30.0
STORM = 2000


async def _device(port: int, i: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """CONNECT and one SUBSCRIBE, sent at once; returns when both are acknowledged."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode(Connect(f"dev{i}", 4, keep_alive=600), 4))
    writer.write(encode(Subscribe(1, (SubscriptionRequest(f"dev/{i}/cmd", 1),)), 4))
    dec = Decoder(4, server=False)
    got: list[object] = []
    while len(got) < 2:
        data = await reader.read(64)
        assert data, f"device {i} closed"
        got.extend(dec.feed(data))
    assert isinstance(got[0], Connack) and got[0].reason_code == ReasonCode.SUCCESS, got
    assert isinstance(got[1], Suback), got
    return reader, writer


async def test_storm_of_2000_devices_all_served_and_routed() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        devices = await asyncio.wait_for(asyncio.gather(*(_device(b.port, i) for i in range(STORM))), T)
        assert b.core.sys_values(0.0)["$SYS/broker/clients/connected"] == str(STORM)
        assert b.core.stats.refused_descriptors == b.core.stats.refused_connection_rate == 0
        assert len(b.core.conn_timers) == STORM  # one keep-alive deadline each, no loop timer
        b.core._check()
        # a command reaches its device among them
        assert await b.publish("dev/1234/cmd", b"reboot", qos=1) == 1
        dec = Decoder(4, server=False)
        got = dec.feed(await asyncio.wait_for(devices[1234][0].read(256), T))
        assert isinstance(got[0], Publish) and got[0].payload == b"reboot"
        for _, w in devices:
            w.close()
        await eventually(lambda: not b.core.connections, T)
        b.core._check()
        assert len(b.core.conn_timers) == 0  # closed connections leave the wheel


async def test_connect_timeout_closes_silent_sockets_and_counts_them() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, connect_timeout=0.3) as b:
        silent = [await asyncio.open_connection("127.0.0.1", b.port) for _ in range(20)]
        live, _ = await RawClient.connect(b.port, "live", 5)  # not stalled meanwhile
        await live.subscribe("t")
        for reader, writer in silent:
            assert await asyncio.wait_for(reader.read(10), T) == b""  # closed by the broker
            writer.close()
        assert b.core.stats.connect_timeouts == 20
        assert b.core.sys_values(0.0)["$SYS/broker/connections/connect_timeouts"] == "20"
        await b.publish("t", b"still here")
        p = await live.recv(T)
        assert isinstance(p, Publish) and p.payload == b"still here"
        await live.close()


async def test_silent_client_half_open_is_disconnected_after_keep_alive() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        gone, ack = await RawClient.connect(b.port, "gone", 5, keep_alive=1)
        assert ack.reason_code == ReasonCode.SUCCESS
        other, _ = await RawClient.connect(b.port, "other", 5, keep_alive=60)
        # "gone" sends nothing more (a device that vanished): 1.5 x keep-alive later it is out
        got = await gone.closed(T)
        assert any(getattr(p, "reason_code", None) == ReasonCode.KEEP_ALIVE_TIMEOUT for p in got), got
        assert b.core.stats.keepalive_timeouts == 1
        assert "gone" not in b.core.sessions and "other" in b.core.sessions
        await other.close()


BAD_FIRST_PACKETS = [
    b"\x10\x05\x00\x04MQT",  # CONNECT cut short, then garbage
    b"\x10\x0c\x00\x04MQTX\x04\x02\x00\x3c\x00\x00",  # wrong protocol name
    b"\x30\x05\x00\x01ahi",  # PUBLISH before CONNECT
    b"\xff\xff\xff\xff\xff",  # not MQTT
    b"\x10\xff\xff\xff\xff\x7f",  # remaining length beyond the limit
]


async def test_storm_of_invalid_connects_is_counted_and_stalls_nobody() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        sub, _ = await RawClient.connect(b.port, "sub", 5)
        await sub.subscribe("ok/t")
        pub, _ = await RawClient.connect(b.port, "pub", 5)

        async def bad(i: int) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
            writer.write(BAD_FIRST_PACKETS[i % len(BAD_FIRST_PACKETS)])
            try:
                while await asyncio.wait_for(reader.read(1024), T):
                    pass
            except ConnectionResetError:
                pass
            writer.close()

        storm = asyncio.gather(*(bad(i) for i in range(300)))
        for k in range(20):  # the good clients keep working during the storm
            await pub.publish1("ok/t", str(k).encode())
            p = await sub.recv_where(lambda p: isinstance(p, Publish))
            assert isinstance(p, Publish) and p.payload == str(k).encode()
        await asyncio.wait_for(storm, T)
        await eventually(lambda: len(b.core.connections) == 2, T)
        assert b.core.stats.malformed == 300
        await sub.close()
        await pub.close()
