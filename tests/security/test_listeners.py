"""TLS and WebSocket listeners with real clients (aiomqtt = paho-mqtt, websockets)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import aiomqtt
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from broker import Broker
from broker._config import BrokerConfig, Listener, load_toml
from broker.auth import FileAuth
from broker.hooks import Hooks
from broker.packets import (
    Connack,
    Connect,
    Decoder,
    Disconnect,
    Publish,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Will,
    encode,
)
from tests.security.helpers import Certs, T, raw_connect

V5 = aiomqtt.ProtocolVersion.V5
V311 = aiomqtt.ProtocolVersion.V311


def tls(certs: Certs, kind: str = "tcp", **kw: object) -> Listener:
    return Listener(kind, "127.0.0.1", 0, str(certs.server_cert), str(certs.server_key), **kw)  # type: ignore[arg-type]


async def roundtrip(client: aiomqtt.Client, topic: str, payload: bytes) -> bytes:
    await client.subscribe(topic, qos=1)
    await client.publish(topic, payload, qos=1)
    async with asyncio.timeout(T):
        async for m in client.messages:
            assert isinstance(m.payload, bytes)
            return m.payload
    raise AssertionError("no message")


@pytest.mark.parametrize("version", [V311, V5])
async def test_tls_and_websocket_listeners_share_one_broker(
    certs: Certs, version: aiomqtt.ProtocolVersion
) -> None:
    listeners = (
        Listener("tcp", "127.0.0.1", 0),
        tls(certs),
        Listener("ws", "127.0.0.1", 0),
        tls(certs, "ws", ws_path="/mqtt"),
    )
    async with Broker(config=BrokerConfig(listeners=listeners, sys_interval=0)) as b:
        plain, mqtts, ws, wss = b.ports
        assert b.port == plain and len(set(b.ports)) == 4
        ctx = certs.client_context()
        clients = [
            aiomqtt.Client("127.0.0.1", plain, protocol=version, identifier="plain"),
            aiomqtt.Client("127.0.0.1", mqtts, protocol=version, identifier="mqtts", tls_context=ctx),
            aiomqtt.Client("127.0.0.1", ws, protocol=version, identifier="ws", transport="websockets"),
            aiomqtt.Client(
                "127.0.0.1", wss, protocol=version, identifier="wss", transport="websockets", tls_context=ctx
            ),
        ]
        async with clients[0] as c0, clients[1] as c1, clients[2] as c2, clients[3] as c3:
            for i, c in enumerate((c0, c1, c2, c3)):
                assert await roundtrip(c, f"t/{i}", b"x" * (i * 1000)) == b"x" * (i * 1000)
            # across transports: the plain client hears what the WebSocket+TLS client publishes
            await c0.subscribe("cross/#", qos=1)
            await c3.publish("cross/wss", b"hello", qos=1)
            async with asyncio.timeout(T):
                async for m in c0.messages:
                    if m.topic.value == "cross/wss":
                        assert m.payload == b"hello"
                        break


async def test_client_certificate_required(certs: Certs) -> None:
    listener = tls(certs, cafile=str(certs.ca), require_client_cert=True)
    async with Broker(config=BrokerConfig(listeners=(listener,), sys_interval=0)) as b:
        # TLS 1.3: the server checks the client certificate after the client's handshake ended,
        # so the refusal shows as an alert or a closed connection instead of a CONNACK
        with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
            await raw_connect(b.port, Connect("no-cert"), certs.client_context())
        client = aiomqtt.Client("127.0.0.1", b.port, tls_context=certs.client_context(with_cert=True))
        async with client as c:
            assert await roundtrip(c, "cert/ok", b"1") == b"1"
            # the refused handshake left nothing in the broker's set of open connections
            assert len(b._open) == 1 and all(p.transport is not None for p in b._open)


async def test_websocket_is_a_byte_stream() -> None:
    """A packet split over frames (and over a fragmented message); several packets in one frame."""
    cfg = BrokerConfig(listeners=(Listener("ws", "127.0.0.1", 0),), sys_interval=0)
    async with Broker(config=cfg) as b:
        url = f"ws://127.0.0.1:{b.port}/mqtt"
        async with ws_connect(url, subprotocols=["mqtt"]) as ws:  # type: ignore[list-item]
            assert ws.subprotocol == "mqtt"
            wire = encode(Connect("raw-ws", protocol_level=5), 5)
            await ws.send(wire[:3])
            await ws.send(wire[3:])
            dec = Decoder(5, server=False)
            (ack,) = dec.feed(await asyncio.wait_for(ws.recv(), T))  # type: ignore[arg-type]
            assert isinstance(ack, Connack) and ack.reason_code == 0
            sub = encode(Subscribe(1, (SubscriptionRequest("a/b", 0),)), 5)
            pub = encode(Publish("a/b", b"payload", 0), 5)
            await ws.send([sub + pub[:4], pub[4:]])  # one fragmented message: two frames
            got: list[object] = []
            while len(got) < 2:
                got += dec.feed(await asyncio.wait_for(ws.recv(), T))  # type: ignore[arg-type]
            assert isinstance(got[0], Suback) and isinstance(got[1], Publish)
            assert got[1].payload == b"payload"


async def test_websocket_wrong_path_and_text_frames() -> None:
    cfg = BrokerConfig(listeners=(Listener("ws", "127.0.0.1", 0, ws_path="/broker"),), sys_interval=0)
    async with Broker(config=cfg) as b:
        with pytest.raises(InvalidStatus) as info:
            async with ws_connect(f"ws://127.0.0.1:{b.port}/mqtt", subprotocols=["mqtt"]):  # type: ignore[list-item]
                pass
        assert info.value.response.status_code == 404
        async with ws_connect(f"ws://127.0.0.1:{b.port}/broker", subprotocols=["mqtt"]) as ws:  # type: ignore[list-item]
            await ws.send("not binary")
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), T)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1003


async def test_stop_closes_every_listener(certs: Certs) -> None:
    cfg = BrokerConfig(listeners=(Listener("tcp", "127.0.0.1", 0), tls(certs, "ws")), sys_interval=0)
    b = Broker(config=cfg)
    await b.start()
    ports = b.ports
    await b.stop()
    for port in ports:
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
    with pytest.raises(RuntimeError):
        _ = b.port


def test_listener_records(tmp_path: Path) -> None:
    assert Listener(host="127.0.0.1").anonymous and Listener(host="::1").anonymous
    assert Listener(host="localhost").anonymous and Listener(host="127.3.4.5").anonymous
    assert not Listener(host="0.0.0.0").anonymous and not Listener(host="").anonymous
    assert Listener(host="0.0.0.0", allow_anonymous=True).anonymous
    assert not Listener(host="127.0.0.1", allow_anonymous=False).anonymous
    assert Listener("ws", "h", 80).url == "ws://h:80/mqtt"
    assert BrokerConfig(host="h", port=5).effective_listeners() == (Listener("tcp", "h", 5),)
    for bad in (
        {"kind": "udp"},
        {"certfile": "c.pem"},
        {"cafile": "ca.pem"},
        {"certfile": "c", "keyfile": "k", "require_client_cert": True},
        {"ws_path": "mqtt"},
    ):
        with pytest.raises(ValueError):
            Listener(**bad)  # type: ignore[arg-type]
    toml = tmp_path / "b.toml"
    toml.write_text(
        "[broker]\nmax_connections = 10\n\n[[listeners]]\nport = 1883\n\n"
        '[[listeners]]\nkind = "ws"\nhost = "0.0.0.0"\nport = 8080\nws-path = "/m"\nallow_anonymous = true\n'
    )
    cfg = load_toml(toml)
    assert cfg.max_connections == 10
    assert cfg.listeners == (
        Listener(port=1883),
        Listener("ws", "0.0.0.0", 8080, ws_path="/m", allow_anonymous=True),
    )
    toml.write_text('[[listeners]]\nkind = "tcp"\nbogus = 1\n')
    with pytest.raises(ValueError, match="listener 1: unknown option 'bogus'"):
        load_toml(toml)


async def test_websocket_close_ping_will_and_shutdown() -> None:
    """Ping answered; a client that closes its WebSocket without DISCONNECT leaves its will;
    stopping the broker sends MQTT 5 DISCONNECT 0x8B and a WebSocket close to the others."""
    cfg = BrokerConfig(listeners=(Listener("ws", "127.0.0.1", 0),), sys_interval=0)
    b = Broker(config=cfg)
    await b.start()
    url = f"ws://127.0.0.1:{b.port}/mqtt"
    try:
        async with b.subscribe("will/#") as wills:
            leaver = await ws_connect(url, subprotocols=["mqtt"])  # type: ignore[list-item]
            await leaver.send(
                encode(Connect("leaver", protocol_level=5, will=Will("will/leaver", b"gone")), 5)
            )
            (ack,) = Decoder(5, server=False).feed(await asyncio.wait_for(leaver.recv(), T))  # type: ignore[arg-type]
            assert isinstance(ack, Connack) and ack.reason_code == 0
            await asyncio.wait_for(await leaver.ping(), T)
            await leaver.close()
            msg = await wills.get(T)
            assert (msg.topic, msg.payload) == ("will/leaver", b"gone")
        stayer = await ws_connect(url, subprotocols=["mqtt"])  # type: ignore[list-item]
        dec = Decoder(5, server=False)
        await stayer.send(encode(Connect("stayer", protocol_level=5), 5))
        (ack,) = dec.feed(await asyncio.wait_for(stayer.recv(), T))  # type: ignore[arg-type]
        assert isinstance(ack, Connack) and ack.reason_code == 0
    finally:
        await b.stop()
    (bye,) = dec.feed(await asyncio.wait_for(stayer.recv(), T))  # type: ignore[arg-type]
    assert isinstance(bye, Disconnect) and bye.reason_code == ReasonCode.SERVER_SHUTTING_DOWN
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(stayer.recv(), T)
    assert stayer.close_code == 1000


async def test_certificate_common_name_is_the_user_name(certs: Certs, tmp_path: Path) -> None:
    """use_identity_as_username: CN=alice is the user name (a claimed one is overridden), so
    the ACL of alice applies to a client that gives no password."""
    acl = tmp_path / "acl.conf"
    acl.write_text("user alice\ntopic readwrite home/alice/#\n")
    listener = tls(certs, cafile=str(certs.ca), require_client_cert=True, use_identity_as_username=True)
    seen: list[str | None] = []

    class Names(Hooks):
        def on_connect(self, client_id: str, username: str | None, protocol_level: int) -> None:
            seen.append(username)

    cfg = BrokerConfig(listeners=(listener,), sys_interval=0)
    async with Broker(config=cfg, hooks=[FileAuth(acl_file=acl), Names()]) as b:
        ctx = certs.client_context(with_cert=True)
        async with aiomqtt.Client("127.0.0.1", b.port, protocol=V5, tls_context=ctx, username="bob") as c:
            assert await roundtrip(c, "home/alice/lamp", b"on") == b"on"
            (granted,) = await c.subscribe("home/bob/#", qos=1)  # type: ignore[misc]
            assert getattr(granted, "value", granted) == ReasonCode.NOT_AUTHORIZED
        # a certificate without a common name gives no identity: refused, whatever user
        # name the client claims (counted with the anonymous refusals)
        nocn = certs.client_context(with_cert=True, name="nocn")
        ack, closed = await raw_connect(b.port, Connect("nocn", protocol_level=5, username="alice"), nocn)
        assert isinstance(ack, Connack) and ack.reason_code == ReasonCode.NOT_AUTHORIZED and closed
        assert b.core.stats.refused_anonymous == 1
    assert seen == ["alice"]
    with pytest.raises(ValueError, match="needs require_client_cert"):
        tls(certs, cafile=str(certs.ca), use_identity_as_username=True)
