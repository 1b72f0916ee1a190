"""The admin API (``/api/v1/``, docs/admin.md) over real HTTP against an embedded broker with
real MQTT clients (aiomqtt, and tests/rawclient.py where the exact reason code matters):
bans kick and refuse, retained deletes, users and ACL rules effective at once, subscriptions
of persistent sessions, publish, paging, the CSRF and login rules, a table of bad input
(4xx JSON, never 500) and the OpenAPI document (validated)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
import pytest_asyncio

from broker import Broker
from broker.auth import FileAuth
from broker.packets import Connack, Disconnect, ReasonCode
from tests.admin.api import call
from tests.auth.helpers import FAST, write_passwords
from tests.dashboard import httpclient as http
from tests.rawclient import RawClient
from tests.waiting import eventually, next_message

V5 = aiomqtt.ProtocolVersion.V5
V311 = aiomqtt.ProtocolVersion.V311
API = "/api/v1"


@pytest_asyncio.fixture
async def b() -> AsyncIterator[Broker]:
    async with Broker(
        host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0", store_path=":memory:"
    ) as broker:
        yield broker
        # before the broker stops: a raw client still open never answers the broker's
        # DISCONNECT, and the stop would wait its whole grace (1 s) for it
        await RawClient.close_all()


def mqtt(b: Broker, ident: str, protocol: aiomqtt.ProtocolVersion = V5, **kw: Any) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", b.port, identifier=ident, protocol=protocol, **kw)


def hport(b: Broker) -> int:
    assert b.metrics_port is not None
    return b.metrics_port


async def ok(b: Broker, method: str, path: str, body: object = None, **query: Any) -> Any:
    r = await call(hport(b), method, API + path, body, query or None)
    assert 200 <= r.status < 300, (r.status, r.body)
    return r.json()


# ---------------------------------------------------------------------------- bans
@pytest.mark.parametrize(
    ("kind", "value"),
    [("client_id", "victim"), ("username", "mallory"), ("address", "127.0.0.0/8")],
)
async def test_ban_kicks_the_connected_client_and_refuses_its_reconnect(
    b: Broker, kind: str, value: str
) -> None:
    c5, ack = await RawClient.connect(b.port, "victim", 5, username="mallory")
    c4, ack4 = await RawClient.connect(b.port, "victim4", 4, username="mallory")
    assert ack.reason_code is ack4.reason_code is ReasonCode.SUCCESS
    got = await ok(b, "POST", "/bans", {"kind": kind, "value": value, "reason": "spam"})
    assert "victim" in got["disconnected"]
    before = await c5.closed()
    # 0x8A is a CONNACK code only (MQTT 5 section 3.14.2.1): the DISCONNECT says 0x98
    assert any(
        isinstance(p, Disconnect) and p.reason_code is ReasonCode.ADMINISTRATIVE_ACTION for p in before
    ), before
    if kind != "client_id":
        await c4.closed()  # 3.1.1: closed (no DISCONNECT from a server)
    # reconnects are refused: MQTT 5 CONNACK 0x8A; 3.1.1 return code 5 (decoded as 0x87)
    _, again = await RawClient.connect(b.port, "victim", 5, username="mallory")
    assert again.reason_code is ReasonCode.BANNED
    _, again4 = await RawClient.connect(b.port, "victim", 4, username="mallory")
    assert again4.reason_code is ReasonCode.NOT_AUTHORIZED
    assert b.core.bans.refused == 2
    metrics = await http.get(hport(b), "/metrics")
    assert b'siftmq_banned_total{reason="connect"} 2.0' in metrics.body
    # others still get in unless the ban covers them (the address ban covers everyone here)
    _, other = await RawClient.connect(b.port, "bystander", 5)
    assert other.reason_code is (ReasonCode.BANNED if kind == "address" else ReasonCode.SUCCESS)
    listed = (await ok(b, "GET", "/bans"))["bans"]
    assert [(x["kind"], x["value"], x["reason"]) for x in listed] == [(kind, value, "spam")]
    await ok(b, "DELETE", "/bans", kind=kind, value=value)
    _, back = await RawClient.connect(b.port, "victim", 5, username="mallory")
    assert back.reason_code is ReasonCode.SUCCESS


async def test_ban_with_expiry_lapses(b: Broker) -> None:
    got = await ok(b, "POST", "/bans", {"kind": "client_id", "value": "brief", "expiry": 1})
    assert 0 < got["ban"]["expires_in"] <= 1
    _, refused = await RawClient.connect(b.port, "brief", 5)
    assert refused.reason_code is ReasonCode.BANNED

    async def admitted() -> bool:
        c, ack = await RawClient.connect(b.port, "brief", 5)
        await c.close()
        return ack.reason_code is ReasonCode.SUCCESS

    async with asyncio.timeout(10):
        while not await admitted():  # noqa: ASYNC110 (polls a ban's wall-clock expiry)
            await asyncio.sleep(0.1)
    assert (await ok(b, "GET", "/bans"))["bans"] == []


async def test_address_ban_normalises_and_refuses_host_bits(b: Broker) -> None:
    got = await ok(b, "POST", "/bans", {"kind": "address", "value": "10.1.2.3"})
    assert got["ban"]["value"] == "10.1.2.3/32"
    r = await call(hport(b), "POST", API + "/bans", {"kind": "address", "value": "10.1.2.3/8"})
    assert r.status == 400 and "host bits" in r.json()["error"]


async def test_bans_survive_a_restart_with_the_store(tmp_path: Path) -> None:
    db = str(tmp_path / "broker.db")
    kw: dict[str, Any] = {"sys_interval": 0, "metrics_listen": "127.0.0.1:0", "store_path": db}
    async with Broker(host="127.0.0.1", port=0, **kw) as b1:
        await ok(b1, "POST", "/bans", {"kind": "username", "value": "eve", "reason": "r"})
    async with Broker(host="127.0.0.1", port=0, **kw) as b2:
        assert [x["value"] for x in (await ok(b2, "GET", "/bans"))["bans"]] == ["eve"]
        _, ack = await RawClient.connect(b2.port, "x", 5, username="eve")
        assert ack.reason_code is ReasonCode.BANNED
        await ok(b2, "DELETE", "/bans", kind="username", value="eve")
        await RawClient.close_all()  # before the stop, as in ``b``
    async with Broker(host="127.0.0.1", port=0, **kw) as b3:
        assert (await ok(b3, "GET", "/bans"))["bans"] == []
    await RawClient.close_all()


async def test_bans_survive_a_restart_in_the_bans_file_without_a_store(tmp_path: Path) -> None:
    path = tmp_path / "bans.json"
    kw: dict[str, Any] = {"sys_interval": 0, "metrics_listen": "127.0.0.1:0", "bans_file": str(path)}
    async with Broker(host="127.0.0.1", port=0, **kw) as b1:
        await ok(b1, "POST", "/bans", {"kind": "address", "value": "198.51.100.0/24", "reason": "r"})
        await ok(b1, "POST", "/bans", {"kind": "client_id", "value": "bot"})
        await ok(b1, "DELETE", "/bans", kind="address", value="198.51.100.0/24")
    assert path.stat().st_mode & 0o777 == 0o600
    async with Broker(host="127.0.0.1", port=0, **kw) as b2:
        assert [x["value"] for x in (await ok(b2, "GET", "/bans"))["bans"]] == ["bot"]
        _, ack = await RawClient.connect(b2.port, "bot", 5)
        assert ack.reason_code is ReasonCode.BANNED
        await RawClient.close_all()  # before the stop, as in ``b``
    path.write_text("{not json")  # a damaged file: logged, the broker starts without bans
    async with Broker(host="127.0.0.1", port=0, **kw) as b3:
        assert (await ok(b3, "GET", "/bans"))["bans"] == []
    for other in ("5", "null", '{"a": 1}'):  # JSON but not a list of rows: the same (was a TypeError)
        path.write_text(other)
        async with Broker(host="127.0.0.1", port=0, **kw) as b4:
            assert (await ok(b4, "GET", "/bans"))["bans"] == []
    await RawClient.close_all()


# ---------------------------------------------------------------------------- retained
async def test_deleted_retained_message_is_not_delivered_to_a_new_subscriber(b: Broker) -> None:
    async with mqtt(b, "pub") as pub:
        await pub.publish("home/a/temp", b"20", qos=1, retain=True)
        await pub.publish("home/b/temp", b"21", qos=1, retain=True)
        await pub.publish("office/temp", b"22", qos=1, retain=True)
    await eventually(lambda: len(b.core.router.retained) == 3)
    page = await ok(b, "GET", "/retained", filter="home/+/temp")
    assert [m["topic"] for m in page["retained"]] == ["home/a/temp", "home/b/temp"]
    assert page["retained"][0]["payload"]["text"] == "20"
    one = await ok(b, "GET", "/retained/message", topic="office/temp")
    assert one["payload_base64"] == "MjI=" and one["qos"] == 1
    assert (await ok(b, "DELETE", "/retained", topic="home/a/temp"))["deleted"] == 1
    assert (await ok(b, "DELETE", "/retained", filter="office/#"))["deleted"] == 1
    async with mqtt(b, "late") as late:
        await late.subscribe("#", qos=1)
        m = await next_message(late)
        assert str(m.topic) == "home/b/temp"  # the only one left
        with pytest.raises(TimeoutError):
            await next_message(late, timeout=0.3)
    assert b.core.journal.store is not None and b.core.journal.store.counts()["retained"] == 1
    r = await call(hport(b), "GET", API + "/retained/message", query={"topic": "home/a/temp"})
    assert r.status == 404


async def test_retained_list_pages_with_a_cursor(b: Broker) -> None:
    for i in range(7):
        await b.publish(f"r/{i}", b"x", retain=True)
    first = await ok(b, "GET", "/retained", filter="r/#", limit=3)
    assert first["total"] == 7 and first["next"] == "r/2"
    second = await ok(b, "GET", "/retained", filter="r/#", limit=3, after=first["next"])
    assert [m["topic"] for m in second["retained"]] == ["r/3", "r/4", "r/5"]
    third = await ok(b, "GET", "/retained", filter="r/#", limit=3, page=3)
    assert [m["topic"] for m in third["retained"]] == ["r/6"] and third["next"] is None


# ---------------------------------------------------------------------------- clients
async def test_clients_list_search_detail_kick_and_discard(b: Broker) -> None:
    async with (
        mqtt(b, "sensor-1", username="carol") as s1,
        mqtt(b, "sensor-2", V311) as _s2,
        mqtt(b, "other", V311, clean_session=False) as _o,
    ):
        await s1.subscribe("a/#", qos=1)
        everyone = await ok(b, "GET", "/clients", limit=2)
        assert [c["client_id"] for c in everyone["clients"]] == ["other", "sensor-1"]
        rest = await ok(b, "GET", "/clients", limit=2, after=everyone["next"])
        assert [c["client_id"] for c in rest["clients"]] == ["sensor-2"] and rest["next"] is None
        assert (await ok(b, "GET", "/clients", prefix="sensor"))["total"] == 2
        assert [c["client_id"] for c in (await ok(b, "GET", "/clients", username="carol"))["clients"]] == [
            "sensor-1"
        ]
        assert (await ok(b, "GET", "/clients", address="127.0.0.0/8"))["total"] == 3
        assert (await ok(b, "GET", "/clients", address="10.0.0.0/8"))["total"] == 0
        d = await ok(b, "GET", "/clients/sensor-1")
        assert d["connected"] and d["inflight"] == 0 and d["subscription_list"][0]["filter"] == "a/#"
        await ok(b, "POST", "/clients/kick", {"client_id": "sensor-1"})
        await eventually(lambda: b.core.sessions.get("sensor-1") is None)  # a clean session ends
    # "other" is persistent (3.1.1 clean_start=False): kicking keeps it, discard ends it
    await eventually(lambda: "other" in b.core.sessions and b.core.sessions["other"].conn is None)
    r = await call(hport(b), "POST", API + "/clients/kick", {"client_id": "other"})
    assert r.status == 409
    await ok(b, "POST", "/clients/kick", {"client_id": "other", "discard": True})
    assert "other" not in b.core.sessions


async def test_kick_and_discard_a_connected_persistent_session(b: Broker) -> None:
    c, ack = await RawClient.connect(b.port, "keep", 4, clean_start=False)
    assert ack.reason_code is ReasonCode.SUCCESS
    await ok(b, "POST", "/clients/kick", {"client_id": "keep", "discard": True})
    await c.closed()
    await eventually(lambda: "keep" not in b.core.sessions)
    _, again = await RawClient.connect(b.port, "keep", 4, clean_start=False)
    assert isinstance(again, Connack) and not again.session_present


# ---------------------------------------------------------------------------- subscriptions
async def test_subscription_added_to_an_offline_persistent_session_gets_messages(b: Broker) -> None:
    async with mqtt(b, "durable", V311, clean_session=False) as d:
        await d.subscribe("first", qos=1)
    await eventually(lambda: b.core.sessions["durable"].conn is None)
    got = await ok(b, "POST", "/subscriptions", {"client_id": "durable", "filter": "news/#", "qos": 1})
    assert got == {"client_id": "durable", "filter": "news/#", "qos": 1}
    by_filter = await ok(b, "GET", "/subscriptions", filter="news/#")
    assert [s["client_id"] for s in by_filter["subscriptions"]] == ["durable"]
    await b.publish("news/today", b"hello", qos=1)
    await ok(b, "DELETE", "/subscriptions", client_id="durable", filter="first")
    await b.publish("first", b"gone", qos=1)
    listed = await ok(b, "GET", "/subscriptions", client_id="durable")
    assert [s["filter"] for s in listed["subscriptions"]] == ["news/#"]
    async with mqtt(b, "durable", V311, clean_session=False) as d:
        m = await next_message(d)
        assert str(m.topic) == "news/today" and m.payload == b"hello"
        with pytest.raises(TimeoutError):
            await next_message(d, timeout=0.3)
    r = await call(
        hport(b), "DELETE", API + "/subscriptions", query={"client_id": "durable", "filter": "nope"}
    )
    assert r.status == 404


# ---------------------------------------------------------------------------- publish
async def test_publish_as_the_broker_with_properties(b: Broker) -> None:
    async with mqtt(b, "sub") as s:
        await s.subscribe("cmd/#", qos=1)
        body = {
            "topic": "cmd/x",
            "payload": "go",
            "qos": 1,
            "retain": True,
            "properties": {"content_type": "text/plain", "user_properties": [["k", "v"]]},
        }
        assert (await ok(b, "POST", "/publish", body))["deliveries"] == 1
        m = await next_message(s)
        assert m.payload == b"go" and m.qos == 1
        assert m.properties is not None and m.properties.ContentType == "text/plain"
        assert m.properties.UserProperty == [("k", "v")]
        await ok(b, "POST", "/publish", {"topic": "cmd/y", "payload_base64": "AAE="})
        m2 = await next_message(s)
        assert m2.payload == b"\x00\x01"
    assert b.core.router.retained.get("cmd/x") is not None


# ---------------------------------------------------------------------------- users and ACL
def _auth(tmp_path: Path) -> FileAuth:
    pw = write_passwords(tmp_path / "passwd", {"admin": "adminpw", "alice": "alicepw"})
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite alice/#\ntopic read shared/#\n")
    return FileAuth(pw, acl, allow_anonymous=False, params=FAST)


@pytest_asyncio.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Broker]:
    async with Broker(
        host="127.0.0.1",
        port=0,
        sys_interval=0,
        metrics_listen="127.0.0.1:0",
        hooks=[_auth(tmp_path)],
        dashboard_admins=("admin",),
    ) as broker:
        yield broker
        await RawClient.close_all()  # before the stop, as in ``b``


ADMIN = http.basic("admin", "adminpw")


def _file(b: Broker, which: str) -> tuple[str, int]:
    """(text, permission bits) of the broker's password or ACL file."""
    path = Path(getattr(b.hooks[0], which))
    return path.read_text(), path.stat().st_mode & 0o777


async def sok(b: Broker, method: str, path: str, body: object = None, **query: Any) -> Any:
    r = await call(hport(b), method, API + path, body, query or None, ADMIN)
    assert 200 <= r.status < 300, (r.status, r.body)
    return r.json()


async def test_login_admin_role_and_csrf(secured: Broker) -> None:
    p = hport(secured)
    assert (await call(p, "GET", API + "/clients")).status == 401
    bad = await call(p, "GET", API + "/clients", headers=http.basic("admin", "wrong"))
    assert bad.status == 401 and "error" in bad.json()
    alice = await call(p, "GET", API + "/clients", headers=http.basic("alice", "alicepw"))
    assert alice.status == 403 and "dashboard_admins" in alice.json()["error"]
    assert (await call(p, "GET", API + "/clients", headers=ADMIN)).status == 200
    # state-changing calls: the X-CSRF-Token, a JSON content type, same origin
    no_token = await call(p, "POST", API + "/publish", {"topic": "t"}, headers=ADMIN, csrf=False)
    assert no_token.status == 403 and "X-CSRF-Token" in no_token.json()["error"]
    form = await call(
        p, "POST", API + "/publish", b"topic=t", headers={**ADMIN, "Content-Type": "text/plain"}
    )
    assert form.status == 415
    cross = await call(
        p,
        "DELETE",
        API + "/bans",
        query={"kind": "username", "value": "x"},
        headers={
            **ADMIN,
            "Origin": "http://evil.example",
        },
    )
    assert cross.status == 403


async def test_user_added_connects_at_once_and_removed_is_kicked(secured: Broker) -> None:
    b = secured
    assert (await sok(b, "POST", "/users", {"username": "bob", "password": "bobpw"}))["created"]
    async with mqtt(b, "bob-1", username="bob", password="bobpw") as bob:
        await bob.publish("x", b"1")
        assert [u["username"] for u in (await sok(b, "GET", "/users"))["users"]] == ["admin", "alice", "bob"]
        await sok(b, "POST", "/users", {"username": "bob", "password": "newpw"})  # change password
        with pytest.raises(aiomqtt.MqttCodeError):
            async with mqtt(b, "bob-2", username="bob", password="bobpw"):
                pass
        async with mqtt(b, "bob-3", username="bob", password="newpw"):
            pass
        got = await sok(b, "DELETE", "/users", username="bob")
        assert got["disconnected"] == ["bob-1"]
        await eventually(lambda: "bob-1" not in b.core.sessions)
    with pytest.raises(aiomqtt.MqttCodeError):
        async with mqtt(b, "bob-4", username="bob", password="newpw"):
            pass
    text, mode = _file(b, "password_file")
    assert "bob:" not in text and "alice:" in text
    assert mode == 0o600


async def test_acl_rule_added_and_removed_takes_effect_at_once(secured: Broker) -> None:
    b = secured
    async with mqtt(b, "alice-1", username="alice", password="alicepw") as alice:
        # no rule for news/#: the subscription is refused
        granted = await alice.subscribe("news/#", qos=1)
        assert granted[0].value == 0x87  # type: ignore[union-attr]
        await sok(b, "POST", "/acl", {"user": "alice", "access": "read", "filter": "news/#"})
        rules = (await sok(b, "GET", "/acl"))["rules"]
        assert {"user": "alice", "access": "read", "filter": "news/#", "pattern": False} in rules
        granted = await alice.subscribe("news/#", qos=1)
        assert granted[0].value == 1  # type: ignore[union-attr]
        await b.publish("news/a", b"1", qos=1)
        assert (await next_message(alice)).payload == b"1"
        # removed: the next message is not delivered (receive is checked per message)
        await sok(b, "DELETE", "/acl", user="alice", access="read", filter="news/#")
        await b.publish("news/b", b"2", qos=1)
        await alice.publish("alice/ping", b"p", qos=1)  # still allowed: a barrier
        await eventually(lambda: b.core.stats.receive_denied >= 1)
        with pytest.raises(TimeoutError):
            await next_message(alice, timeout=0.3)
    r = await call(
        hport(b), "DELETE", API + "/acl", query={"user": "alice", "filter": "news/#"}, headers=ADMIN
    )
    assert r.status == 404
    # anonymous and pattern rules land in the right place of the file
    await sok(b, "POST", "/acl", {"access": "read", "filter": "public/#"})
    await sok(b, "POST", "/acl", {"pattern": True, "access": "readwrite", "filter": "clients/%c/#"})
    lines = _file(b, "acl_file")[0].splitlines()
    assert lines[0] == "topic read public/#" and lines[-1] == "pattern readwrite clients/%c/#"
    await sok(b, "DELETE", "/acl", access="read", filter="public/#")
    assert "topic read public/#" not in _file(b, "acl_file")[0]
    assert _file(b, "acl_file")[1] == 0o600


@pytest.mark.parametrize(
    ("method", "path", "body", "query"),
    [
        ("POST", "/users", {"username": "a:b", "password": "p"}, None),
        ("POST", "/users", {"username": "", "password": "p"}, None),
        ("POST", "/users", {"username": "x"}, None),
        ("POST", "/users", {"username": "x", "password": 5}, None),
        ("POST", "/acl", {"user": "alice", "filter": "a/#/b"}, None),
        ("POST", "/acl", {"user": "alice", "filter": "a", "access": "all"}, None),
        ("POST", "/acl", {"user": " alice", "filter": "a"}, None),
        ("POST", "/acl", {"filter": "a\nuser x"}, None),
        # a pattern rule is every user's: a user with it was dropped silently (and echoed back)
        ("POST", "/acl", {"user": "alice", "pattern": True, "filter": "a/%c"}, None),
        ("DELETE", "/acl", None, {"filter": "a", "pattern": "maybe"}),
    ],
)
async def test_bad_users_and_acl_input_is_400_and_changes_nothing(
    secured: Broker, method: str, path: str, body: object, query: dict[str, str] | None
) -> None:
    before = _file(secured, "password_file")[0], _file(secured, "acl_file")[0]
    r = await call(hport(secured), method, API + path, body, query, ADMIN)
    assert r.status == 400, (r.status, r.body)
    assert isinstance(r.json()["error"], str)
    assert (_file(secured, "password_file")[0], _file(secured, "acl_file")[0]) == before


async def test_users_and_acl_without_files_are_409(b: Broker) -> None:
    r = await call(hport(b), "POST", API + "/users", {"username": "u", "password": "p"})
    assert r.status == 409 and "password file" in r.json()["error"]
    assert (await call(hport(b), "GET", API + "/acl")).status == 409


# ---------------------------------------------------------------------------- bad input
BAD: list[tuple[str, str, object, dict[str, str] | None, int]] = [
    ("GET", "/clients", None, {"limit": "x"}, 400),
    ("GET", "/clients", None, {"limit": "0"}, 400),
    ("GET", "/clients", None, {"limit": "501"}, 400),
    ("GET", "/clients", None, {"bogus": "1"}, 400),
    ("GET", "/clients", None, {"address": "not-an-ip"}, 400),
    ("GET", "/clients/nobody", None, None, 404),
    ("POST", "/clients/kick", {"client_id": 5}, None, 400),
    ("POST", "/clients/kick", {"client_id": "nobody"}, None, 404),
    ("POST", "/clients/kick", {"client_id": "x", "extra": 1}, None, 400),
    ("POST", "/clients/kick", b"{not json", None, 400),
    ("POST", "/clients/kick", [1, 2], None, 400),
    ("POST", "/clients/kick", None, None, 400),
    ("GET", "/subscriptions", None, None, 400),
    ("GET", "/subscriptions", None, {"client_id": "nobody"}, 404),
    ("POST", "/subscriptions", {"client_id": "nobody", "filter": "a"}, None, 404),
    ("POST", "/subscriptions", {"client_id": "c", "filter": "a/#/b"}, None, 400),
    ("POST", "/subscriptions", {"client_id": "c", "filter": "a", "qos": 3}, None, 400),
    ("DELETE", "/subscriptions", None, {"client_id": "c"}, 400),
    ("GET", "/retained", None, {"filter": "a/#/b"}, 400),
    ("GET", "/retained", None, {"filter": "a+"}, 400),
    ("GET", "/retained/message", None, {"topic": "a/+"}, 400),
    ("GET", "/retained/message", None, None, 400),
    ("DELETE", "/retained", None, None, 400),
    ("DELETE", "/retained", None, {"topic": "a", "filter": "a"}, 400),
    ("DELETE", "/retained", None, {"topic": "none/here"}, 404),
    ("POST", "/publish", {"topic": "a/#"}, None, 400),
    ("POST", "/publish", {"topic": ""}, None, 400),
    ("POST", "/publish", {"topic": "a", "qos": "1"}, None, 400),
    ("POST", "/publish", {"topic": "a", "retain": "yes"}, None, 400),
    ("POST", "/publish", {"topic": "a", "payload_base64": "!!"}, None, 400),
    ("POST", "/publish", {"topic": "a", "payload": "x", "payload_base64": "eA=="}, None, 400),
    ("POST", "/publish", {"topic": "a", "properties": {"user_properties": [["k"]]}}, None, 400),
    ("POST", "/publish", {"topic": "a", "properties": {"nope": 1}}, None, 400),
    ("POST", "/publish", {"topic": "a", "properties": {"user_properties": [["k", "v", "w"]]}}, None, 400),
    ("POST", "/publish", {"topic": "a", "properties": {"response_topic": ""}}, None, 400),
    ("POST", "/publish", {"topic": "a", "properties": {"message_expiry_interval": -1}}, None, 400),
    ("POST", "/publish", {"topic": "a", "properties": {"user_properties": [["k", "a\x00b"]]}}, None, 400),
    ("POST", "/publish", {"topic": "a", "properties": {"content_type": "\x00"}}, None, 400),
    ("POST", "/subscriptions", {"client_id": "c", "filter": "$composite/x"}, None, 400),
    ("POST", "/publish", {"payload": "x"}, None, 400),
    ("POST", "/bans", {"kind": "ip", "value": "x"}, None, 400),
    ("POST", "/bans", {"kind": "address", "value": "999.1.1.1"}, None, 400),
    ("POST", "/bans", {"kind": "client_id", "value": ""}, None, 400),
    ("POST", "/bans", {"kind": "client_id", "value": "x", "expiry": 0}, None, 400),
    ("POST", "/bans", {"kind": "client_id", "value": "x", "expiry": True}, None, 400),
    ("DELETE", "/bans", None, {"kind": "client_id", "value": "never-banned"}, 404),
    ("DELETE", "/bans", None, {"kind": "client_id"}, 400),
    ("GET", "/nothing", None, None, 404),
    ("PUT", "/bans", None, None, 405),
    ("DELETE", "/clients", None, None, 405),
]


@pytest.mark.parametrize(("method", "path", "body", "query", "status"), BAD)
async def test_bad_input_is_a_4xx_json_error(
    b: Broker, method: str, path: str, body: object, query: dict[str, str] | None, status: int
) -> None:
    async with mqtt(b, "c"):
        r = await call(hport(b), method, API + path, body, query)
    assert r.status == status, (r.status, r.body)
    assert r.headers["content-type"] == "application/json"
    err = r.json()
    assert isinstance(err["error"], str) and err["error"]


async def test_publish_errors_name_the_property(b: Broker) -> None:
    # a bad response_topic was reported as "topic: ..."; a format indicator of 1 over a payload
    # that is not UTF-8 was published (a subscriber may drop it as malformed, 0x99)
    r = await call(
        hport(b), "POST", API + "/publish", {"topic": "a", "properties": {"response_topic": "r/#"}}
    )
    assert r.status == 400 and r.json()["error"].startswith("properties.response_topic: "), r.body
    bad = {"topic": "a", "payload_base64": "/w==", "properties": {"payload_format_indicator": 1}}
    r = await call(hport(b), "POST", API + "/publish", bad)
    assert r.status == 400 and "UTF-8" in r.json()["error"], r.body
    good = {"topic": "a", "payload": "é", "properties": {"payload_format_indicator": 1}}
    assert (await call(hport(b), "POST", API + "/publish", good)).status == 200


async def test_oversized_body_is_413(b: Broker) -> None:
    r = await call(hport(b), "POST", API + "/publish", {"topic": "a", "payload": "x" * 70000})
    assert r.status == 413


async def test_a_banned_name_is_refused_before_its_password_is_checked(secured: Broker) -> None:
    await sok(secured, "POST", "/bans", {"kind": "username", "value": "alice"})
    _, ack = await RawClient.connect(secured.port, "a", 5, username="alice", password=b"wrong")
    assert ack.reason_code is ReasonCode.BANNED


# ---------------------------------------------------------------------------- OpenAPI
async def test_openapi_document_validates_and_lists_every_route(b: Broker) -> None:
    from openapi_spec_validator import validate

    from broker._admin_routes import ROUTES

    doc = await ok(b, "GET", "/openapi.json")
    validate(doc)
    assert doc["openapi"].startswith("3.1")
    declared = {(ep.method.lower(), ep.path) for ep in ROUTES}
    documented = {(m, path) for path, ops in doc["paths"].items() for m in ops}
    assert declared == documented
    for ep in ROUTES:
        assert hasattr(b.dashboard.admin, "h_" + ep.handler)  # type: ignore[union-attr]


async def test_the_api_is_open_on_loopback_without_a_password_file(b: Broker) -> None:
    session = await ok(b, "GET", "/session")
    assert session["user"] is None and len(session["csrf"]) == 64
    # a DNS name as Host is refused (no DNS rebinding), as for the dashboard
    r = await call(hport(b), "GET", API + "/clients", headers={"Host": "evil.example"})
    assert r.status == 403


# ---------------------------------------------------------------------------- never a 500
ODD: list[object] = [
    "",
    "#",
    "+/+",
    "a/#/b",
    "\x00",
    "$SYS/x",
    "x" * 5000,
    0,
    -1,
    2**70,
    1.5,
    True,
    None,
    [],
    {},
]


async def test_no_endpoint_answers_500_to_odd_values(b: Broker) -> None:
    """Every declared query parameter and body field of every route gets each odd value (the
    other required fields a plausible one): the answer is never a 500."""
    from broker._admin_routes import ROUTES

    plausible = {"client_id": "c", "filter": "a/#", "topic": "a", "kind": "client_id", "value": "v"}
    plausible |= {"username": "u", "password": "p", "user": "u", "access": "read", "qos": 1}
    statuses: set[int] = set()
    async with mqtt(b, "c", V311, clean_session=False):
        await b.publish("a", b"x", retain=True)
        for ep in ROUTES:
            if ep.handler == "openapi":
                continue
            names = [p.name for p in ep.params if p.where == "query"]
            fields = list(ep.body["properties"]) if ep.body is not None else []
            for name in names + fields:
                for odd in ODD:
                    if name in names:
                        query = {n: plausible.get(n, "1") for n in names if n != name}
                        query[name] = odd if isinstance(odd, str) else json.dumps(odd)
                        body: object = None
                    else:
                        query = {}
                        required = ep.body["required"] if ep.body is not None else []
                        body = {n: plausible.get(n, "x") for n in required if n != name}
                        body[name] = odd  # type: ignore[index]
                    path = ep.path.replace("{client_id}", "c")
                    r = await call(hport(b), ep.method, path, body if ep.body is not None else None, query)
                    assert r.status < 500, (ep.method, path, name, odd, r.status, r.body)
                    statuses.add(r.status)
    assert {200, 400} <= statuses


async def test_an_out_of_range_number_names_its_bound(b: Broker) -> None:
    r = await call(hport(b), "GET", API + "/clients", None, {"page": "0"})
    assert (r.status, r.json()["error"]) == (400, "page: must be at least 1")  # no upper bound
    r = await call(hport(b), "GET", API + "/clients", None, {"limit": "0"})
    assert (r.status, r.json()["error"]) == (400, "limit: must be between 1 and 500")
