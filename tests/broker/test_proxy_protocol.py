"""PROXY protocol v1/v2 on listeners (issue 39 item 6): the sans-IO parser (round trips, every
split, Hypothesis fuzz) and a real broker with raw sockets sending a header then an MQTT
CONNECT: the client's address the dashboard API reports is the header's; a missing, malformed
or late header closes the connection and is counted; a header on a plain listener is bad MQTT."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker import Broker
from broker._config import BrokerConfig, Listener
from broker.packets import Connack, Connect, Decoder, encode
from broker.protocol._proxy import (
    MAX_V1,
    SIGNATURE,
    ProxyError,
    ProxyHeader,
    ProxyParser,
    encode_v1,
    encode_v2,
)
from tests.dashboard import httpclient as http
from tests.waiting import eventually

V4 = ProxyHeader(1, ("203.0.113.7", 51234), ("10.0.0.1", 1883))
V6 = ProxyHeader(2, ("2001:db8::42", 40000), ("2001:db8::1", 1883))


# ------------------------------------------------------------ parser
@pytest.mark.parametrize(
    ("header", "wire"),
    [
        (V4, encode_v1(V4)),
        (ProxyHeader(1, V6.source, V6.destination), encode_v1(V6)),
        (ProxyHeader(2, V4.source, V4.destination), encode_v2(V4)),
        (V6, encode_v2(V6)),
        (V6, encode_v2(V6, tlvs=b"\x04\x00\x03abc")),  # a TLV is skipped
        (ProxyHeader(1), b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n"),
        (ProxyHeader(2), encode_v2(ProxyHeader(2))),  # LOCAL: the balancer's own check
    ],
)
def test_round_trip_in_every_split(header: ProxyHeader, wire: bytes) -> None:
    rest = b"\x10\x0cMQTT"  # the start of a CONNECT stays for the MQTT decoder
    data = wire + rest
    for cut in range(len(data) + 1):
        p = ProxyParser()
        got = p.feed(data[:cut])
        if got is None:
            assert p.feed(data[cut:]) == (header, rest)
        else:  # complete within the first part: what followed it in that part is returned
            assert cut >= len(wire) and got == (header, data[len(wire) : cut])


@pytest.mark.parametrize(
    "wire",
    [
        b"\x10\x0c\x00\x04MQTT",  # a plain CONNECT: no header
        b"GET /mqtt HTTP/1.1\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
        b"PROXY TCP4 1.2.3.4 ::1 1 2\r\n",  # family mismatch
        b"PROXY TCP4 1.2.3.999 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 65536\r\n",
        b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 " + b"1" * MAX_V1,  # no CRLF in 107 bytes
        SIGNATURE + b"\x31\x11\x00\x0c" + bytes(12),  # version 3
        SIGNATURE + b"\x22\x11\x00\x0c" + bytes(12),  # command 2
        SIGNATURE + b"\x21\x12\x00\x0c" + bytes(12),  # UDP
        SIGNATURE + b"\x21\x11\x00\x04" + bytes(4),  # IPv4 cut short
        SIGNATURE + b"\x21\x11\xff\xff",  # 65535 bytes announced
    ],
)
def test_malformed_headers_are_errors(wire: bytes) -> None:
    with pytest.raises(ProxyError):
        ProxyParser().feed(wire)


@given(st.binary(max_size=300), st.integers(0, 300))
def test_fuzz_never_raises_anything_but_proxy_error(data: bytes, cut: int) -> None:
    p = ProxyParser()
    with contextlib.suppress(ProxyError):
        if p.feed(data[:cut]) is None:
            p.feed(data[cut:])
    assert len(p.buffer) <= 16 + 2048


@given(
    st.ip_addresses(),
    st.ip_addresses(),
    st.integers(0, 65535),
    st.integers(0, 65535),
    st.sampled_from([1, 2]),
)
def test_round_trip_of_any_address(src: object, dst: object, sport: int, dport: int, version: int) -> None:
    a, b = str(src), str(dst)
    if (":" in a) != (":" in b):
        b = "::1" if ":" in a else "127.0.0.1"
    h = ProxyHeader(version, (str(ipaddress.ip_address(a)), sport), (str(ipaddress.ip_address(b)), dport))
    wire = encode_v1(h) if version == 1 else encode_v2(h)
    assert ProxyParser().feed(wire + b"x") == (h, b"x")


def test_proxy_protocol_is_refused_on_tls_listeners() -> None:
    with pytest.raises(ValueError, match="proxy_protocol on a TLS listener"):
        Listener("tcp", "127.0.0.1", 0, "c.pem", "k.pem", proxy_protocol=True)


# ------------------------------------------------------------ a real broker
def proxied(**options: object) -> Broker:
    listeners = (
        Listener("tcp", "127.0.0.1", 0, proxy_protocol=True),
        Listener("tcp", "127.0.0.1", 0),
        Listener("ws", "127.0.0.1", 0, proxy_protocol=True),
    )
    cfg = BrokerConfig(listeners=listeners, sys_interval=0, metrics_listen="127.0.0.1:0", **options)  # type: ignore[arg-type]
    return Broker(config=cfg)


async def connect_after(port: int, first: bytes, client_id: str) -> tuple[Connack | None, bool]:
    """Send ``first`` then a CONNECT; the CONNACK (None: closed without one) and whether the
    connection is then still open (a DISCONNECT closes it cleanly)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(first + encode(Connect(client_id), 4))
        decoder = Decoder(4, server=False)
        async with asyncio.timeout(10):
            while True:
                data = await reader.read(65536)
                if not data:
                    return None, False
                packets = decoder.feed(data)
                if packets:
                    assert isinstance(packets[0], Connack)
                    return packets[0], True
    except ConnectionResetError:
        return None, False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def reported_address(b: Broker, client_id: str) -> str:
    assert b.metrics_port is not None
    r = await http.get(b.metrics_port, f"/api/clients/{client_id}")
    assert r.status == 200, r.body
    address = r.json()["address"]
    assert isinstance(address, str)
    return address


async def hold(port: int, first: bytes, client_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that stays open after its CONNACK (the dashboard shows it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(first + encode(Connect(client_id, keep_alive=0), 4))
    decoder = Decoder(4, server=False)
    async with asyncio.timeout(10):
        while not (packets := decoder.feed(await reader.read(65536))):
            pass
    assert isinstance(packets[0], Connack) and packets[0].reason_code == 0
    return reader, writer


async def test_v1_and_v2_addresses_are_the_connections_address() -> None:
    async with proxied() as b:
        proxy_port = b.ports[0]
        held = [
            await hold(proxy_port, encode_v1(V4), "v1"),
            await hold(proxy_port, encode_v2(V6), "v2"),
            await hold(proxy_port, encode_v2(ProxyHeader(2)), "local"),  # LOCAL: the socket's own
        ]
        try:
            assert await reported_address(b, "v1") == "203.0.113.7:51234"
            assert await reported_address(b, "v2") == "[2001:db8::42]:40000"
            assert (await reported_address(b, "local")).startswith("127.0.0.1:")
            assert b.core.sessions["v2"].conn is not None
            assert b.core.sessions["v2"].conn.peer == ("2001:db8::42", 40000)
        finally:
            for _, w in held:
                w.close()
        assert b.core.stats.refused_proxy_header == 0


async def test_websocket_listener_reads_the_header_before_the_upgrade() -> None:
    async with proxied() as b:
        ws_port = b.ports[2]
        reader, writer = await asyncio.open_connection("127.0.0.1", ws_port)
        try:
            writer.write(
                encode_v1(V4)
                + b"GET /mqtt HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                b"Sec-WebSocket-Protocol: mqtt\r\n\r\n"
            )
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 101")
            connect = encode(Connect("wsclient", keep_alive=0), 4)
            writer.write(bytes((0x82, 0x80 | len(connect))) + bytes(4) + connect)  # masked, key 0
            await eventually(lambda: "wsclient" in b.core.sessions, timeout=10)
            assert await reported_address(b, "wsclient") == "203.0.113.7:51234"
        finally:
            writer.close()


async def test_missing_or_malformed_header_closes_and_is_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="broker")
    async with proxied() as b:
        proxy_port = b.ports[0]
        assert await connect_after(proxy_port, b"", "plain") == (None, False)  # no header: refused
        assert await connect_after(proxy_port, b"PROXY TCP4 1.2.3.4 nope 1 2\r\n", "bad") == (None, False)
        assert await connect_after(proxy_port, SIGNATURE + b"\x21\x12\x00\x00", "udp") == (None, False)
        assert b.core.stats.refused_proxy_header == 3
        sys_values = b.core.sys_values(b.core.clock.monotonic())
        assert sys_values["$SYS/broker/connections/refused/proxy_header"] == "3"
        assert not {"plain", "bad", "udp"} & set(b.core.sessions)
        lines = [r.getMessage() for r in caplog.records if "proxy_header" in r.getMessage()]
        assert len(lines) == 1, lines  # rate-limited: one line for the three
        assert "no PROXY protocol header" in lines[0]
        # the listener still serves well-formed connections, counted once each in the limits
        connack, _ = await connect_after(proxy_port, encode_v1(V4), "good")
        assert connack is not None and connack.reason_code == 0


async def test_a_late_header_is_closed_by_its_timeout() -> None:
    async with proxied(proxy_header_timeout=0.2) as b:
        reader, writer = await asyncio.open_connection("127.0.0.1", b.ports[0])
        try:
            writer.write(b"PROXY TCP4 1.2.3.4")  # and nothing more
            assert await asyncio.wait_for(reader.read(100), 10) == b""  # closed by the broker
        except ConnectionResetError:
            pass
        finally:
            writer.close()
        assert b.core.stats.refused_proxy_header == 1


async def test_a_header_on_a_plain_listener_is_bad_mqtt() -> None:
    async with proxied() as b:
        plain_port = b.ports[1]
        malformed = b.core.stats.malformed
        # v2 starts with 0x0D: packet type 0, reserved (a v1 "PROXY" reads as an incomplete
        # PUBREC before CONNECT, closed as bad MQTT too once complete or by connect_timeout)
        assert await connect_after(plain_port, encode_v2(V6), "spoof") == (None, False)
        assert "spoof" not in b.core.sessions
        assert b.core.stats.malformed == malformed + 1
        assert b.core.stats.refused_proxy_header == 0


async def test_an_address_ban_applies_to_the_proxied_address() -> None:
    """The header's address is THE peer: a ban of the client's real network refuses it, while
    the balancer's own address (127.0.0.1, the socket's peer) stays free."""
    from broker.core._bans import Ban, BanKind

    async with proxied() as b:
        b.core.bans.add(Ban(BanKind.ADDRESS, "203.0.113.0/24"))
        connack, _ = await connect_after(b.ports[0], encode_v1(V4), "banned")
        assert connack is not None and connack.reason_code == 0x87  # 3.1.1: 5 (0x8A as 5)
        connack, _ = await connect_after(b.ports[0], encode_v2(V6), "free")
        assert connack is not None and connack.reason_code == 0
