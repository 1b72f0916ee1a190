"""End to end: Broker(hooks=[FileAuth(...)]) with real aiomqtt (paho) clients over loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest
import pytest_asyncio

from broker import Broker
from broker.auth import FileAuth
from broker.hooks import Hooks
from broker.packets import Connect, Decoder, ReasonCode, Will, encode
from tests.auth.helpers import FAST, write_passwords
from tests.waiting import next_message

V5 = aiomqtt.ProtocolVersion.V5
V311 = aiomqtt.ProtocolVersion.V311
T = 5.0

ACL = """\
topic read public/#
user alice
topic readwrite home/alice/#
topic read sensors/+/temp
user admin
topic read #
topic read $SYS/#
pattern write devices/%c/state
pattern read inbox/%u/#
"""

USERS = {"alice": "wonderland", "admin": "root-pw", "bob": "builder"}


class DisconnectWatch(Hooks):
    """Sets ``event`` when the broker has handled the end of one client's connection."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.event = asyncio.Event()

    def on_disconnect(self, client_id: str, reason: str) -> None:
        if client_id == self.client_id:
            self.event.set()


def make_auth(tmp_path: Path, allow_anonymous: bool = False) -> FileAuth:
    pw = write_passwords(tmp_path / "passwd", USERS)
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    return FileAuth(password_file=pw, acl_file=acl, allow_anonymous=allow_anonymous, params=FAST)


@pytest_asyncio.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Broker]:
    async with Broker(host="127.0.0.1", port=0, hooks=[make_auth(tmp_path)], sys_interval=0) as b:
        yield b


def client(
    b: Broker, ident: str, user: str | None, password: str | None, protocol: aiomqtt.ProtocolVersion = V5
) -> aiomqtt.Client:
    return aiomqtt.Client(
        "127.0.0.1", b.port, identifier=ident, username=user, password=password, protocol=protocol
    )


async def refused_code(
    b: Broker, user: str | None, password: str | None, protocol: aiomqtt.ProtocolVersion
) -> int:
    with pytest.raises(aiomqtt.MqttCodeError) as info:
        async with client(b, "intruder", user, password, protocol):
            pass
    return code(info.value.rc)


def code(rc: object) -> int:
    """A SUBACK/CONNACK code as an int (paho gives ints or ReasonCode objects)."""
    return rc if isinstance(rc, int) else int(getattr(rc, "value"))  # noqa: B009


def codes(granted: object) -> list[int]:
    assert isinstance(granted, list | tuple), granted
    return [code(g) for g in granted]


async def raw_connack(b: Broker, user: str | None, password: bytes | None) -> bytes:
    """The 3.1.1 CONNACK bytes on the wire (paho reports 3.1.1 return codes as v5 reason codes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    try:
        writer.write(encode(Connect("raw", 4, username=user, password=password), 4))
        return await asyncio.wait_for(reader.readexactly(4), T)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_bad_credentials_get_3_1_1_return_codes_on_the_wire(secured: Broker) -> None:
    assert (await raw_connack(secured, "alice", b"wrong"))[3] in {4, 5}
    assert (await raw_connack(secured, None, None))[3] in {4, 5}
    assert await raw_connack(secured, "alice", b"wonderland") == bytes([0x20, 2, 0, 0])


@pytest.mark.parametrize("protocol", [V311, V5])
async def test_bad_credentials_are_refused(secured: Broker, protocol: aiomqtt.ProtocolVersion) -> None:
    codes = {0x86, 0x87}  # paho maps 3.1.1 return codes 4/5 to these
    assert await refused_code(secured, "alice", "wrong", protocol) in codes
    assert await refused_code(secured, "mallory", "wonderland", protocol) in codes
    assert await refused_code(secured, "alice", None, protocol) in codes
    assert await refused_code(secured, None, None, protocol) in codes  # anonymous not allowed
    async with client(secured, "a1", "alice", "wonderland", protocol) as c:
        await c.subscribe("home/alice/x")  # the good password gets in


async def test_anonymous_allowed_when_configured(tmp_path: Path) -> None:
    async with (
        Broker(
            host="127.0.0.1", port=0, hooks=[make_auth(tmp_path, allow_anonymous=True)], sys_interval=0
        ) as b,
        client(b, "anon", None, None) as c,
    ):
        await c.subscribe("public/#")
        await b.publish("public/news", b"hi")
        m = await next_message(c)
        assert (m.topic.value, m.payload) == ("public/news", b"hi")
        # anonymous clients get only the rules before the first 'user' line
        granted = await c.subscribe("home/alice/#")
        assert codes(granted) == [0x87]
        assert await refused_code(b, "alice", "nope", V5) in {
            0x86,
            0x87,
        }  # a user name still needs its password


@pytest.mark.parametrize("protocol", [V311, V5])
async def test_publish_outside_the_acl_is_not_delivered(
    secured: Broker, protocol: aiomqtt.ProtocolVersion
) -> None:
    async with (
        client(secured, "watcher", "admin", "root-pw", protocol) as watcher,
        client(secured, "a1", "alice", "wonderland", protocol) as alice,
    ):
        await watcher.subscribe("#", qos=1)
        await alice.publish("sensors/kitchen/temp", b"forged", qos=1)  # read-only for alice
        await alice.publish("home/bob/door", b"forged", qos=0)
        await alice.publish("home/alice/door", b"open", qos=1)  # allowed: the marker
        m = await next_message(watcher)
        assert (m.topic.value, m.payload) == ("home/alice/door", b"open")


@pytest.mark.parametrize(("protocol", "refused"), [(V311, 0x80), (V5, 0x87)])
async def test_subscribe_outside_the_acl_is_refused_in_suback(
    secured: Broker, protocol: aiomqtt.ProtocolVersion, refused: int
) -> None:
    async with client(secured, "a1", "alice", "wonderland", protocol) as alice:
        for f, ok in [
            ("home/alice/#", True),
            ("sensors/+/temp", True),
            ("sensors/#", False),  # wider than the read rule
            ("#", False),
            ("$share/g/home/alice/+", True),
            ("$share/g/home/#", False),
            ("$filter/t > 20/sensors/+/temp", True),
            ("$filter/t > 20/sensors/#", False),
            ("inbox/alice/#", True),  # pattern %u
            ("inbox/bob/#", False),
        ]:
            granted = await alice.subscribe(f, qos=1)
            assert codes(granted) == ([1] if ok else [refused]), f


async def test_content_filter_user_property_is_checked_on_the_topic_filter(secured: Broker) -> None:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.SUBSCRIBE)  # type: ignore[no-untyped-call]
    props.UserProperty = [("filter", "t > 20")]
    async with client(secured, "a1", "alice", "wonderland") as alice:
        granted = await alice.subscribe("sensors/#", qos=1, properties=props)
        assert codes(granted) == [0x87]
        granted = await alice.subscribe("sensors/+/temp", qos=1, properties=props)
        assert codes(granted) == [1]
        await secured.publish("sensors/hall/temp", b'{"t": 25}')
        m = await next_message(alice)
        assert m.topic.value == "sensors/hall/temp"


async def test_client_id_pattern(secured: Broker) -> None:
    async with (
        client(secured, "w", "admin", "root-pw") as watcher,
        client(secured, "dev-1", "bob", "builder") as bob,
    ):
        await watcher.subscribe("devices/#", qos=1)
        await bob.publish("devices/dev-2/state", b"spoofed", qos=1)  # another client's topic
        await bob.publish("devices/dev-1/state", b"up", qos=1)  # %c pattern
        m = await next_message(watcher)
        assert (m.topic.value, m.payload) == ("devices/dev-1/state", b"up")


async def test_retained_messages_follow_the_read_rules(secured: Broker) -> None:
    await secured.publish("home/bob/lamp", b"off", retain=True)
    await secured.publish("home/alice/lamp", b"on", retain=True)
    async with client(secured, "a1", "alice", "wonderland") as alice:
        granted = await alice.subscribe("home/#")  # refused: it would show bob's retained lamp
        assert codes(granted) == [0x87]
        await alice.subscribe("home/alice/#")
        m = await next_message(alice)
        assert (m.topic.value, m.payload, m.retain) == ("home/alice/lamp", b"on", True)


async def test_will_outside_the_acl_is_not_published(tmp_path: Path) -> None:
    gone = DisconnectWatch("a1")
    async with (
        Broker(host="127.0.0.1", port=0, hooks=[make_auth(tmp_path), gone], sys_interval=0) as secured,
        client(secured, "watcher", "admin", "root-pw") as watcher,
    ):
        await watcher.subscribe("#")
        reader, writer = await asyncio.open_connection("127.0.0.1", secured.port)
        will = Will("sensors/kitchen/temp", b"forged will")  # alice may not write there
        writer.write(encode(Connect("a1", 4, username="alice", password=b"wonderland", will=will), 4))
        packets = Decoder(4, server=False).feed(await asyncio.wait_for(reader.read(65536), T))
        # refused at CONNECT (0x87 Not authorized; 3.1.1 return code 5 on the wire): no will
        assert packets and packets[0].reason_code == ReasonCode.NOT_AUTHORIZED  # type: ignore[union-attr]
        assert await asyncio.wait_for(reader.read(65536), T) == b""  # the broker closed
        writer.close()
        await writer.wait_closed()
        assert not gone.event.is_set()  # never connected
        await secured.publish("public/marker", b"")
        m = await next_message(watcher)
        assert m.topic.value == "public/marker", f"will published to {m.topic.value}"


async def test_reloaded_acl_applies_to_existing_subscriptions(tmp_path: Path) -> None:
    auth = make_auth(tmp_path)
    async with (
        Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0) as b,
        client(b, "a1", "alice", "wonderland") as alice,
    ):
        await alice.subscribe("home/alice/#")
        (tmp_path / "acl").write_text(ACL.replace("topic readwrite home/alice/#", "topic write home/alice/#"))
        auth.reload()
        assert not auth.authorize("a1", "alice", "receive", "home/alice/x")
        await b.publish("home/alice/x", b"after revocation")
        await alice.subscribe("inbox/alice/#")
        await b.publish("inbox/alice/marker", b"")
        m = await next_message(alice)
        assert m.topic.value == "inbox/alice/marker", f"revoked topic delivered: {m.topic.value}"
        assert b.core.stats.receive_denied == 1
        assert b.core.sys_values(0.0)["$SYS/broker/messages/receive_denied"] == "1"


class _NoSecrets(Hooks):
    """A policy hook (not an ACL file): everything allowed except receiving ``secret/...``."""

    def authorize(self, client_id: str, username: str | None, action: str, topic: str) -> bool | None:
        return not (action == "receive" and topic.startswith("secret/"))


async def test_receive_is_checked_for_retained_and_live_deliveries() -> None:
    async with Broker(host="127.0.0.1", port=0, hooks=[_NoSecrets()], sys_interval=0) as b:
        await b.publish("secret/x", b"retained secret", retain=True)
        await b.publish("open/x", b"retained open", retain=True)
        async with client(b, "c1", None, None) as c:
            await c.subscribe("+/x")
            m = await next_message(c)
            assert (m.topic.value, m.payload) == ("open/x", b"retained open")
            await b.publish("secret/x", b"live secret")
            await b.publish("open/x", b"live open")
            m = await next_message(c)
            assert (m.topic.value, m.payload) == ("open/x", b"live open")
        assert b.core.stats.receive_denied == 2
