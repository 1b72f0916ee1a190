"""Micro-batched content matching over MQTT (issue 8): the PUBLISHes of one read, matched with
one ``match_batch`` of a batch engine, are delivered, acknowledged and refused exactly as one
at a time would be: in order, each once, and a bad PUBLISH in the middle of a read still
answered after the acknowledgements of the ones before it."""

from __future__ import annotations

import orjson
import pytest

from broker import Broker
from broker.packets import Disconnect, Properties, Puback, Publish, ReasonCode, SubscriptionRequest, encode
from tests.rawclient import RawClient

N = 60  # PUBLISHes in one write


def _payload(i: int) -> bytes:
    return orjson.dumps({"i": i, "temp": i % 10})


@pytest.mark.parametrize("engine", ["hcem", "rabased"])
async def test_one_read_of_publishes_is_routed_as_a_batch(engine: str) -> None:
    async with Broker(port=0, sys_interval=0, content_engine=engine, content_batch_min=1) as b:
        assert b.core.router.engine.batch_native
        hot, _ = await RawClient.connect(b.port, "hot")
        await hot.subscribe(SubscriptionRequest("$filter/temp >= 5/b/t", 0))
        cold, _ = await RawClient.connect(b.port, "cold", version=4)
        await cold.subscribe(SubscriptionRequest("$filter/temp < 5/b/t", 0))
        both, _ = await RawClient.connect(b.port, "both")
        await both.subscribe(SubscriptionRequest("b/t", 0))  # QoS 0: the raw clients do not ack
        pub, _ = await RawClient.connect(b.port, "pub")
        pids = [pub.pid() for _ in range(N)]
        burst = b"".join(
            encode(Publish("b/t", _payload(i), 1, packet_id=pid), 5) for i, pid in enumerate(pids)
        )
        # a wildcard in a topic name ends the read: its DISCONNECT must follow the N PUBACKs
        pub.send_bytes(burst + encode(Publish("b/#", b"{}", 1, packet_id=pub.pid()), 5))
        answers = await pub.closed()
        assert b.core.router.batched >= 2  # matched through match_batch (one read, or a few)
        acks = [p for p in answers if isinstance(p, Puback)]
        assert [a.packet_id for a in acks] == pids and all(a.reason_code == 0 for a in acks)
        assert (
            isinstance(answers[-1], Disconnect) and answers[-1].reason_code == ReasonCode.TOPIC_NAME_INVALID
        )
        assert answers[: len(acks)] == acks  # nothing before the last PUBACK but PUBACKs

        async def received(c: RawClient, n: int) -> list[int]:
            got = []
            for _ in range(n):
                p = await c.recv()
                assert isinstance(p, Publish), p
                got.append(orjson.loads(p.payload)["i"])
            return got

        assert await received(hot, N // 2) == [i for i in range(N) if i % 10 >= 5]
        assert await received(cold, N // 2) == [i for i in range(N) if i % 10 < 5]
        assert await received(both, N) == list(range(N))
        for c in (hot, cold, both):
            assert await c.barrier() == []  # each delivered exactly once
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


async def test_selectors_in_user_property_and_qos2_in_the_run() -> None:
    """v5 ``filter`` user property; a QoS 2 PUBLISH between QoS 1 ones keeps the order."""
    async with Broker(port=0, sys_interval=0, content_engine="hcem", content_batch_min=1) as b:
        sub, _ = await RawClient.connect(b.port, "sub")
        await sub.subscribe(
            SubscriptionRequest("c/+", 0), properties=Properties(user_properties=(("filter", "temp > 2"),))
        )
        pub, _ = await RawClient.connect(b.port, "pub")
        data = b"".join(
            encode(Publish(f"c/{i % 3}", _payload(i), 2 if i == 7 else 1, packet_id=i + 1), 5)
            for i in range(20)
        )
        pub.send_bytes(data)
        got = []
        for _ in range(sum(1 for i in range(20) if i % 10 > 2)):
            p = await sub.recv()
            assert isinstance(p, Publish)
            got.append(orjson.loads(p.payload)["i"])
        assert got == [i for i in range(20) if i % 10 > 2]
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace
