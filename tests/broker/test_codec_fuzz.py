"""Fuzz the decoder: random and mutated byte strings in random chunkings must either decode
or raise MalformedPacket, never anything else; what decodes re-encodes to an equal packet."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.packets import Connect, Decoder, MalformedPacket, Packet, encode
from tests.broker.codec_strategies import client_packets, connects, server_packets


def feed_chunked(d: Decoder, data: bytes, cuts: list[int]) -> tuple[list[Packet], MalformedPacket | None]:
    got: list[Packet] = []
    prev = 0
    try:
        for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
            got += d.feed(data[prev:cut])
            d._check()
            prev = max(prev, cut)
    except MalformedPacket as exc:
        assert isinstance(exc.reason_code, int)
        assert str(exc)
        return got, exc
    return got, None


def reencode_stable(pkts: list[Packet], version: int | None, server: bool) -> None:
    """decode(encode(p)) == p for whatever the fuzzed stream produced."""
    if not pkts:
        return
    v = version
    if isinstance(pkts[0], Connect):
        v = pkts[0].protocol_level
    assert v is not None
    wire = b"".join(encode(p, v) for p in pkts)
    d = Decoder(version, server=server)
    assert d.feed(wire) == pkts


chunks = st.lists(st.integers(0, 10_000), max_size=6)
mode = st.sampled_from([(None, True), (4, True), (5, True), (4, False), (5, False)])


@settings(max_examples=300)
@given(data=st.binary(max_size=200), cuts=chunks, m=mode)
def test_random_bytes(data: bytes, cuts: list[int], m: tuple[int | None, bool]) -> None:
    version, server = m
    pkts, _ = feed_chunked(Decoder(version, server=server, max_packet_size=1000), data, cuts)
    reencode_stable(pkts, version, server)


@st.composite
def mutated_stream(draw: st.DrawFn) -> tuple[bytes, int | None, bool]:
    v = draw(st.sampled_from([3, 4, 5]))
    server = draw(st.booleans())
    if server:
        wire = encode(draw(connects(v)), v) + b"".join(
            encode(p, v) for p in draw(st.lists(server_packets(v), max_size=3))
        )
        version = None
    else:
        v = max(v, 4)
        wire = b"".join(encode(p, v) for p in draw(st.lists(client_packets(v), min_size=1, max_size=3)))
        version = v
    buf = bytearray(wire)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        i = draw(st.integers(0, max(len(buf) - 1, 0)))
        match op:
            case "flip" if buf:
                buf[i] ^= 1 << draw(st.integers(0, 7))
            case "set" if buf:
                buf[i] = draw(st.integers(0, 255))
            case "insert":
                buf[i:i] = draw(st.binary(min_size=1, max_size=4))
            case "delete" if buf:
                del buf[i : i + draw(st.integers(1, 4))]
            case "truncate":
                del buf[i:]
    return bytes(buf), version, server


@settings(max_examples=150)
@given(s=mutated_stream(), cuts=chunks)
def test_mutated_streams(s: tuple[bytes, int | None, bool], cuts: list[int]) -> None:
    data, version, server = s
    pkts, _ = feed_chunked(Decoder(version, server=server), data, cuts)
    reencode_stable(pkts, version, server)
