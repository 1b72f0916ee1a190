"""Retained messages as one converging register per topic (issue 30, finding 3): stamps by a
hybrid logical clock with the node ID as tie-break, the merge, persistence, and two live
nodes with concurrent writers (real brokers, loopback, ports 0).  The same across real
partitions: tests/nemesis."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiomqtt

from cluster._retained import Hlc, Received, RetainedRegister
from tests.cluster._support import cluster, drain, node_of
from tests.waiting import eventually


def _register(me: str, data: Path | None, wall: float = 1000.0) -> tuple[RetainedRegister, dict[str, bytes]]:
    held: dict[str, bytes] = {}

    def store(topic: str, payload: bytes, _qos: int, _expiry: int | None) -> None:
        held[topic] = payload

    return RetainedRegister(me, data, store, wall=lambda: wall), held


def test_hlc_never_goes_back_and_observes_later_stamps() -> None:
    now = [5.0]
    clock = Hlc(lambda: now[0])
    a = clock.tick()
    b = clock.tick()  # the wall clock did not move
    assert b == a + 1
    clock.observe(a + 10_000)  # a peer ahead of us
    now[0] = 4.0  # our wall clock steps back
    assert clock.tick() == a + 10_001


def test_last_writer_wins_with_the_node_id_as_tie_break() -> None:
    a, held_a = _register("aa", None)
    b, held_b = _register("bb", None)
    from_a = a.local("t", b"X", 1, None)
    from_b = b.local("t", b"Y", 1, None)  # same wall clock: same hlc, "bb" > "aa"
    assert a.receive(from_b) is Received.APPLIED
    assert held_a == {"t": b"Y"}
    assert b.receive(from_a) is Received.STALE  # older: ignored, whatever the order of arrival
    assert held_b == {}
    assert (a.stale, b.stale) == (0, 1)
    # a later write at a wins everywhere; a deletion is a stamped tombstone
    later = a.local("t", b"", 1, None)
    assert b.receive(later) is Received.APPLIED
    assert held_b == {"t": b""}
    assert b.receive(from_b) is Received.STALE  # a late duplicate of an older value changes nothing


def test_stamps_survive_a_restart(tmp_path: Path) -> None:
    a, _ = _register("aa", tmp_path)
    ctl = a.local("t", b"X", 1, None)
    a.close()
    again, held = _register("aa", tmp_path, wall=970.0)  # a wall clock 30 s behind
    assert again.stamps["t"] == (ctl["h"], "aa")
    older = {**ctl, "o": "a0", "p": "WQ=="}  # same hlc, smaller node id
    assert again.receive(older) is Received.STALE
    assert held == {}
    assert again.local("u", b"Z", 1, None)["h"] > ctl["h"]  # the clock resumed past its stamps
    again.close()


async def test_concurrent_retained_writers_converge_and_a_new_subscriber_gets_one() -> None:
    async with cluster(3) as bs:
        for round_ in range(3):
            async with (
                aiomqtt.Client("127.0.0.1", bs[0].port, identifier="w0") as w0,
                aiomqtt.Client("127.0.0.1", bs[2].port, identifier="w2") as w2,
            ):
                await asyncio.gather(
                    w0.publish("cfg/x", f"a{round_}".encode(), qos=1, retain=True),
                    w2.publish("cfg/x", f"b{round_}".encode(), qos=1, retain=True),
                )

            def same() -> bool:
                values = {b.core.router.retained.get("cfg/x") for b in bs}
                return len({None if v is None else v.payload for v in values}) == 1

            await eventually(same, timeout=10)
            stamps = {node_of(b).retained.stamps["cfg/x"] for b in bs}
            assert len(stamps) == 1
            value = bs[0].core.router.retained.get("cfg/x")
            assert value is not None
            for b in bs:
                async with aiomqtt.Client("127.0.0.1", b.port, identifier=f"r{round_}") as r:
                    await r.subscribe("cfg/#", qos=1)
                    got = await drain(r, 0.4)
                    assert [(m.topic.value, m.payload, m.retain) for m in got] == [
                        ("cfg/x", value.payload, True)
                    ]


async def test_a_subscriber_gets_no_retained_copies_after_subscribing() -> None:
    """Only live publications reach an existing subscriber (with RETAIN 0: no retain as
    published), never a replay of the peers' registers."""
    async with cluster(2) as bs:
        async with aiomqtt.Client("127.0.0.1", bs[1].port, identifier="w") as w:
            await w.publish("cfg/y", b"old", qos=1, retain=True)
        await eventually(lambda: bs[0].core.router.retained.get("cfg/y") is not None, timeout=10)
        async with aiomqtt.Client("127.0.0.1", bs[0].port, identifier="s") as s:
            await s.subscribe("cfg/#", qos=1)
            first = await drain(s, 0.4)
            assert [(m.payload, m.retain) for m in first] == [(b"old", True)]
            async with aiomqtt.Client("127.0.0.1", bs[1].port, identifier="w") as w:
                await w.publish("cfg/y", b"new", qos=1, retain=True)
            got = await drain(s, 0.6)
            assert [(m.payload, m.retain) for m in got] == [(b"new", False)]
