"""Many concurrent idle connections (issue 7, item 5; the 10,000-connection run is
benchmarks/bench_connections.py, figures in docs/performance-connections.md)."""

from __future__ import annotations

import asyncio

from broker import Broker
from broker.packets import Connack, Connect, Decoder, Publish, ReasonCode, encode
from tests.rawclient import RawClient
from tests.waiting import eventually

N = 500
T = 30.0


async def _idle(port: int, i: int) -> tuple[asyncio.StreamWriter, Connack]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode(Connect(f"idle{i}", 4, keep_alive=600), 4))
    dec = Decoder(4, server=False)
    while True:
        data = await reader.read(64)
        assert data, "closed before CONNACK"
        got = dec.feed(data)
        if got:
            assert isinstance(got[0], Connack)
            return writer, got[0]


async def test_500_idle_connections_and_routing_still_works() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        conns = await asyncio.wait_for(asyncio.gather(*(_idle(b.port, i) for i in range(N))), T)
        assert all(ack.reason_code == ReasonCode.SUCCESS for _, ack in conns)
        assert b.core.sys_values(0.0)["$SYS/broker/clients/connected"] == str(N)
        sub, _ = await RawClient.connect(b.port, "sub", 5)
        await sub.subscribe("many/t")
        pub, _ = await RawClient.connect(b.port, "pub", 5)
        await pub.publish1("many/t", b"hello")
        msg = await sub.recv(T)
        assert isinstance(msg, Publish) and msg.payload == b"hello"
        for w, _ in conns:
            w.close()
        await sub.close()
        await pub.close()
        await eventually(lambda: not b.core.connections, T)
        b.core._check()
