"""Live fuzzing of an embedded broker over real sockets (issue 7, item 5; docs/fault.md).

Many raw sockets at once send random bytes, valid packets from the codec's encoder mutated by a
seeded mutator (bit flips, inserted/deleted/overwritten bytes, duplicated slices), truncated
packets, or vanish mid-packet / half-close, while a well-behaved aiomqtt (paho) client keeps a
QoS 1 ping-pong with itself going. Afterwards: the good client got every message in order,
a new connection works, ``Core._check()`` holds and no fuzzer connection is left in
``core.connections``.

``SIFTMQ_FUZZ_CASES`` (default 1500) sets the number of cases; ``SIFTMQ_FUZZ_SEED`` the seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random

import aiomqtt
import pytest

from broker import Broker
from broker.core._core import LIMIT_LOG_INTERVAL
from broker.packets import (
    Auth,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Properties,
    Puback,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Subscribe,
    SubscriptionRequest,
    Unsubscribe,
    Will,
    encode,
)
from tests.rawclient import RawClient
from tests.waiting import eventually

CASES = int(os.environ.get("SIFTMQ_FUZZ_CASES", "1500"))
SEED = int(os.environ.get("SIFTMQ_FUZZ_SEED", "7"))
WORKERS = 12
T = 10.0
PROPS = Properties(
    user_properties=(("k", "v"),),
    message_expiry_interval=30,
    content_type="application/json",
    response_topic="r/t",
    correlation_data=b"cd",
)


def _corpus(version: int) -> list[Packet]:
    """Valid packets of every kind (properties only in MQTT 5)."""
    v5 = version == 5
    props = PROPS if v5 else Properties()
    return [
        Publish("fz/a", b'{"n": 1, "kind": "x"}', 0, properties=props),
        Publish("fz/b/c", b"\x00\xff" * 10, 1, packet_id=3, properties=props),
        Publish("fz/q2", b"q2", 2, packet_id=4, retain=True),
        Subscribe(
            5,
            (
                SubscriptionRequest("fz/#", 1),
                SubscriptionRequest("$filter/n > 0/fz/+", 0),
                SubscriptionRequest("$share/g/fz/x", 2),
            ),
        ),
        Unsubscribe(6, ("fz/#", "a/+/b")),
        Puback(3),
        Pubrec(4),
        Pubrel(4),
        Pingreq(),
        *([Auth(ReasonCode.CONTINUE_AUTHENTICATION, Properties(authentication_method="m"))] if v5 else []),
        Disconnect(),
    ]


def _connect(version: int, rng: random.Random) -> bytes:
    will = Will("fz/will", b"bye", rng.randrange(3), rng.random() < 0.5) if rng.random() < 0.5 else None
    props = (
        Properties(session_expiry_interval=rng.choice((0, 5)), receive_maximum=4)
        if version == 5
        else Properties()
    )
    return encode(
        Connect(f"fz-{rng.randrange(1 << 30)}", version, rng.random() < 0.8, 30, will, properties=props),
        version,
    )


def _mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        if not b:
            break
        i = rng.randrange(len(b))
        match rng.randrange(6):
            case 0:
                b[i] ^= 1 << rng.randrange(8)
            case 1:
                b[i] = rng.choice((0x00, 0x7F, 0x80, 0xFF))
            case 2:
                b.insert(i, rng.randrange(256))
            case 3:
                del b[i]
            case 4:
                j = rng.randrange(i, len(b) + 1)
                b[i:i] = b[i:j]
            case _:
                b[i] = rng.randrange(256)
    return bytes(b)


def _case(rng: random.Random) -> tuple[bytes, bool]:
    """The bytes of one case and whether the client half-closes after them."""
    version = rng.choice((4, 5))
    kind = rng.randrange(6)
    connect = _connect(version, rng)
    packets = [encode(p, version) for p in rng.sample(_corpus(version), 3)]
    match kind:
        case 0:  # random bytes, maybe behind a valid CONNECT
            junk = rng.randbytes(rng.randrange(1, 64))
            data = connect + junk if rng.random() < 0.5 else junk
        case 1:  # mutated CONNECT
            data = _mutate(connect, rng) + b"".join(packets)
        case 2:  # valid CONNECT, then mutated packets
            data = connect + b"".join(_mutate(p, rng) for p in packets)
        case 3:  # truncated: vanish mid-packet
            stream = connect + b"".join(packets)
            data = stream[: rng.randrange(1, len(stream))]
        case 4:  # valid session that ends abruptly (no DISCONNECT)
            data = connect + b"".join(packets[:2])
        case _:  # the remaining length claims more than is sent
            data = connect + bytes((0x30, 0xFF, 0xFF, 0x7F)) + rng.randbytes(rng.randrange(8))
    return data, rng.random() < 0.3


async def _run_case(port: int, data: bytes, half_close: bool, rng: random.Random) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        cut = rng.randrange(len(data) + 1)
        writer.write(data[:cut])
        await writer.drain()
        writer.write(data[cut:])
        if half_close:
            writer.write_eof()
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.02):
                while await reader.read(65536):
                    pass
    except (ConnectionError, OSError):
        pass
    finally:
        writer.transport.abort()


async def _fuzzer(port: int, seed: int, n: int) -> None:
    rng = random.Random(seed)
    for _ in range(n):
        data, half_close = _case(rng)
        await _run_case(port, data, half_close, rng)


async def _ping_pong(port: int, stop: asyncio.Event) -> tuple[int, list[bytes]]:
    sent = 0
    got: list[bytes] = []
    async with aiomqtt.Client(
        "127.0.0.1", port, identifier="good-client", protocol=aiomqtt.ProtocolVersion.V5
    ) as c:
        await c.subscribe("good/pp", qos=1)
        it = c.messages.__aiter__()
        while not stop.is_set() or sent < 20:
            payload = str(sent).encode()
            await c.publish("good/pp", payload, qos=1)
            sent += 1
            m = await asyncio.wait_for(it.__anext__(), T)
            assert isinstance(m.payload, bytes)
            got.append(m.payload)
    return sent, got


async def test_live_fuzz_keeps_broker_and_good_client_alive(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="broker")
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05) as b:
        stop = asyncio.Event()
        pp = asyncio.create_task(_ping_pong(b.port, stop))
        per = -(-CASES // WORKERS)
        await asyncio.wait_for(
            asyncio.gather(*(_fuzzer(b.port, SEED * 1000 + w, per) for w in range(WORKERS))), 120
        )
        stop.set()
        sent, got = await asyncio.wait_for(pp, 60)
        assert got == [str(i).encode() for i in range(sent)]
        # the broker still accepts and serves a new client
        ok, ack = await RawClient.connect(b.port, "after-fuzz", 5)
        assert ack.reason_code == ReasonCode.SUCCESS
        assert await ok.barrier() == []
        await ok.close()
        # every fuzzer connection is gone (closed by the broker or by the client abort)
        await eventually(lambda: not b.core.connections, T)
        b.core._check()
        assert b.core.stats.connections_total >= per * WORKERS  # every case reached the broker
    # malformed input is logged at most once per LIMIT_LOG_INTERVAL: no log flood
    malformed_logged = [r for r in caplog.records if "further malformed refusals" in r.getMessage()]
    assert 1 <= len(malformed_logged) <= 1 + int(120 / LIMIT_LOG_INTERVAL)
