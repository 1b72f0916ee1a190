"""The dashboard's JSON API over real HTTP, against an embedded broker with real MQTT clients
(issue 28, item 2; docs/dashboard.md): numbers match $SYS, lists, search, details, kick,
the topic browser, SSE, authentication and the admin role, ACL-hidden payloads, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest
import pytest_asyncio

from broker import Broker
from broker.auth import FileAuth
from tests.auth.helpers import FAST, write_passwords
from tests.dashboard import httpclient as http
from tests.waiting import eventually, next_message

V5 = aiomqtt.ProtocolVersion.V5
V311 = aiomqtt.ProtocolVersion.V311


@pytest_asyncio.fixture
async def b() -> AsyncIterator[Broker]:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0") as broker:
        yield broker


def mqtt(b: Broker, ident: str, protocol: aiomqtt.ProtocolVersion = V5, **kw: object) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", b.port, identifier=ident, protocol=protocol, **kw)  # type: ignore[arg-type]


def port(b: Broker) -> int:
    assert b.metrics_port is not None
    return b.metrics_port


async def csrf(p: int, headers: dict[str, str] | None = None) -> str:
    r = await http.get(p, "/api/session", headers)
    assert r.status == 200, r.body
    token: str = r.json()["csrf"]
    return token


async def test_pages_and_metrics_are_served(b: Broker) -> None:
    p = port(b)
    page = await http.get(p, "/")
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    assert b'src="/app.js"' in page.body and b"http" not in page.body.replace(b"http-equiv", b"")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    js = await http.get(p, "/app.js")
    assert js.status == 200 and b"EventSource" in js.body
    assert (await http.get(p, "/app.css")).status == 200
    metrics = await http.get(p, "/metrics")
    assert metrics.status == 200 and b"siftmq_messages_received_total" in metrics.body
    assert (await http.get(p, "/nope")).status == 404
    assert (await http.get(p, "/api/nope")).status == 404


async def test_overview_matches_sys() -> None:
    # $SYS rounds only when the test asks for one (sys_interval of an hour)
    async with Broker(host="127.0.0.1", port=0, sys_interval=3600, metrics_listen="127.0.0.1:0") as b:
        p = port(b)
        async with mqtt(b, "sys-watch") as watch, mqtt(b, "pub", V311) as pub:
            await watch.subscribe("$SYS/broker/#")
            for i in range(5):
                await pub.publish("data/x", f"{i}", qos=1)
            await eventually(lambda: b.core.stats.messages_received == 5)
            expected = b.core.sys_values(b.core.clock.monotonic())
            b.core.publish_sys(b.core.clock.monotonic())
            b.core.flush()
            seen: dict[str, str] = {}
            while len(seen) < len(expected):
                m = await next_message(watch)
                seen[str(m.topic)] = bytes(m.payload).decode()  # type: ignore[arg-type]
            ov = (await http.get(p, "/api/overview")).json()
            # the clients' PUBLISHes count; the round's own $SYS messages are the broker's
            assert ov["messages_received"] == int(seen["$SYS/broker/messages/received"]) == 5
            assert ov["messages_internal"] == int(seen["$SYS/broker/messages/internal"]) + len(seen)
            assert ov["clients_connected"] == int(seen["$SYS/broker/clients/connected"]) == 2
            assert ov["sessions"] == int(seen["$SYS/broker/clients/total"]) == 2
            assert ov["publishers_paused"] == int(seen["$SYS/broker/flow/publishers/paused"]) == 0
            assert ov["slow_consumers"] == int(seen["$SYS/broker/flow/slow_consumers/current"]) == 0
            assert ov["dropped"]["queue_full"] == int(seen["$SYS/broker/flow/dropped/queue_full"])
            assert ov["dropped"]["qos0_slow"] == int(seen["$SYS/broker/flow/dropped/qos0"])
            assert ov["memory_rss"] > 1_000_000


async def test_clients_search_detail_and_pages(b: Broker) -> None:
    p = port(b)
    async with (
        mqtt(b, "sensor-1") as s1,
        mqtt(b, "sensor-2", V311, username="carol") as s2,
        mqtt(b, "other", clean_start=False, properties=None) as _o,
    ):
        await s1.subscribe("home/+/temp")
        await s2.subscribe("$filter/temp > 20/home/#", qos=1)
        page = (await http.get(p, "/api/clients")).json()
        assert page["total"] == 3 and [c["client_id"] for c in page["clients"]] == [
            "other",
            "sensor-1",
            "sensor-2",
        ]
        found = (await http.get(p, "/api/clients?q=SENSOR&limit=1&offset=1")).json()
        assert found["total"] == 2 and [c["client_id"] for c in found["clients"]] == ["sensor-2"]
        assert found["clients"][0]["protocol"] == "3.1.1" and found["clients"][0]["username"] == "carol"
        assert (await http.get(p, "/api/clients?q=carol")).json()["total"] == 1
        d = (await http.get(p, "/api/clients/sensor-1")).json()
        assert d["protocol"] == "5.0" and d["connected"] and d["address"].startswith("127.0.0.1:")
        assert [s["filter"] for s in d["subscription_list"]] == ["home/+/temp"]
        d2 = (await http.get(p, "/api/clients/sensor-2")).json()
        assert (
            d2["subscription_list"][0]["selector"] == "temp > 20" and d2["subscription_list"][0]["qos"] == 1
        )
        assert "password" not in str(d2)
        subs = (await http.get(p, "/api/subscriptions?q=temp")).json()
        assert {(s["client_id"], s["filter"], s["selector"]) for s in subs["subscriptions"]} == {
            ("sensor-1", "home/+/temp", None),
            ("sensor-2", "home/#", "temp > 20"),
        }
        assert (await http.get(p, "/api/clients/nobody")).status == 404
        for bad in ("limit=0", "limit=501", "offset=-1", "limit=x"):
            r = await http.get(p, f"/api/clients?{bad}")
            assert r.status == 400 and "limit" in r.json()["error"]


async def test_composite_subscription_with_its_buffer(b: Broker) -> None:
    async with b.subscribe_composite("a/x & a/y", name="pair"):
        await b.publish("a/x", b"1")
        subs = (await http.get(port(b), "/api/subscriptions")).json()
        (row,) = subs["composites"]
        assert row["name"] == "pair" and row["buffered"] == 1 and sum(row["buffers"].values()) == 1


async def test_kick_disconnects_the_client(b: Broker) -> None:
    p = port(b)
    token = await csrf(p)
    async with mqtt(b, "victim") as victim:
        await eventually(lambda: "victim" in b.core.sessions)
        r = await http.post(p, "/api/kick", {"client_id": "victim"}, {"X-CSRF-Token": token})
        assert r.status == 200 and r.json() == {"kicked": "victim"}
        await eventually(
            lambda: b.core.sessions.get("victim") is None or b.core.sessions["victim"].conn is None
        )
        with pytest.raises(aiomqtt.MqttError):
            await asyncio.wait_for(victim.publish("x", "y", qos=1), 5)
    ov = (await http.get(p, "/api/overview")).json()
    assert ov["clients_connected"] == 0


async def test_kick_refuses_bad_requests(b: Broker) -> None:
    p = port(b)
    token = await csrf(p)
    ok = {"X-CSRF-Token": token}
    async with mqtt(b, "target"):
        cases = [
            (http.post(p, "/api/kick", {"client_id": "target"}), 403),  # no CSRF token
            (http.post(p, "/api/kick", {"client_id": "target"}, {"X-CSRF-Token": "0" * 64}), 403),
            (
                http.post(p, "/api/kick", {"client_id": "target"}, {**ok, "Origin": "http://evil.example"}),
                403,
            ),
            (http.post(p, "/api/kick", {"client_id": "target"}, {**ok, "Sec-Fetch-Site": "cross-site"}), 403),
            (http.post(p, "/api/kick", b'{"client_id": ', ok), 400),  # bad JSON
            (http.post(p, "/api/kick", [1, 2], ok), 400),
            (http.post(p, "/api/kick", {"client_id": 7}, ok), 400),
            (
                http.post(
                    p,
                    "/api/kick",
                    b"client_id=target",
                    {**ok, "Content-Type": "application/x-www-form-urlencoded"},
                ),
                415,
            ),
            (http.post(p, "/api/kick", {"client_id": "ghost"}, ok), 404),
            (http.get(p, "/api/kick"), 404),
            (http.raw(p, b"DELETE /api/kick HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), 405),
        ]
        for request, status in cases:
            r = await request
            assert r.status == status, (status, r.body)
            assert r.json()["error"]
        assert b.core.sessions["target"].conn is not None  # none of them kicked it
        r = await http.post(
            p,
            "/api/kick",
            {"client_id": "target"},
            {**ok, "Origin": "http://127.0.0.1", "Sec-Fetch-Site": "same-origin"},
        )
        assert r.status == 200


async def test_malformed_and_oversized_requests(b: Broker) -> None:
    p = port(b)
    big = b"POST /api/kick HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10000000\r\n\r\n"
    assert (await http.raw(p, big)).status == 413
    huge_head = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 20000 + b"\r\n\r\n"
    assert (await http.raw(p, huge_head)).status == 431
    assert (await http.raw(p, b"GARBAGE\r\n\r\n")).status == 400
    assert (await http.raw(p, b"GET / HTTP/2.0\r\n\r\n")).status == 505
    chunked = b"POST /api/kick HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    assert (await http.raw(p, chunked)).status == 501
    assert (
        await http.raw(p, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n")
    ).status == 400
    # a DNS-rebinding page names its own host: refused while no login is required
    assert (await http.get(p, "/api/overview", {"Host": "evil.example:80"})).status == 403
    # the broker still serves after all of it
    assert (await http.get(p, "/api/overview")).status == 200


async def test_keep_alive_serves_several_requests_on_one_connection(b: Broker) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port(b))
    try:
        writer.write(b"GET /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 2)
        for _ in range(2):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200")
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
    finally:
        writer.close()


async def test_topic_browser(b: Broker) -> None:
    p = port(b)
    await b.publish("home/kitchen/temp", b'{"temp": 21}', retain=True)
    await b.publish("home/hall/temp", b"\xff\x00", retain=True)
    await b.publish("home", b"root", retain=True)
    top = (await http.get(p, "/api/topics")).json()
    assert [(lv["level"], lv["children"]) for lv in top["levels"]] == [("home", True)]
    assert top["levels"][0]["retained"]["payload"]["text"] == "root"
    home = (await http.get(p, "/api/topics?prefix=home")).json()
    assert [lv["level"] for lv in home["levels"]] == ["hall", "kitchen"] and home["retained"]["size"] == 4
    kitchen = (await http.get(p, "/api/topics?prefix=home/kitchen")).json()
    assert kitchen["levels"][0]["retained"]["payload"]["text"] == '{"temp": 21}'
    hall = (await http.get(p, "/api/topics?prefix=home/hall")).json()
    assert hall["levels"][0]["retained"]["payload"]["hex"] == "ff00"
    assert (await http.get(p, "/api/topics?prefix=nothing/here")).json()["levels"] == []


async def test_server_sent_events_stream_the_overview(b: Broker) -> None:
    dash = b.dashboard
    assert dash is not None
    stream = http.events(port(b))
    try:
        name, first = await asyncio.wait_for(anext(stream), 5)
        assert name == "history" and "points" in first
        await b.publish("x/y", b"1")
        dash.sample()  # the sampler's next tick, now (it runs every second)
        async with asyncio.timeout(5):
            async for name, ov in stream:
                if name == "overview" and ov["messages_received"] == 1:
                    break
        assert b.dashboard.watchers == 1
    finally:
        await stream.aclose()
    await eventually(lambda: b.dashboard is not None and b.dashboard.watchers == 0)


async def test_cluster_section(b: Broker) -> None:
    assert (await http.get(port(b), "/api/cluster")).json() == {"clustered": False}
    b.dashboard_providers["cluster"] = lambda: {"node_id": "n1", "links": []}
    assert (await http.get(port(b), "/api/cluster")).json() == {
        "clustered": True,
        "cluster": {"node_id": "n1", "links": []},
    }


# ------------------------------------------------------------------ authentication
ACL = """\
user admin
topic read open/#
user viewer
topic read #
"""


@pytest_asyncio.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Broker]:
    pw = write_passwords(tmp_path / "passwd", {"admin": "s3cret", "viewer": "v1ew"})
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    auth = FileAuth(password_file=pw, acl_file=acl, allow_anonymous=True, params=FAST)
    async with Broker(
        host="127.0.0.1",
        port=0,
        hooks=[auth],
        sys_interval=0,
        metrics_listen="127.0.0.1:0",
        dashboard_admins=("admin",),
    ) as broker:
        yield broker


async def test_login_required_with_a_password_file(secured: Broker) -> None:
    p = port(secured)
    for path in ("/", "/api/overview", "/api/events"):
        r = await http.get(p, path)
        assert r.status == 401 and r.headers["www-authenticate"].startswith("Basic")
    assert (await http.get(p, "/api/overview", http.basic("admin", "wrong"))).status == 401
    assert (await http.get(p, "/api/overview", http.basic("nobody", "s3cret"))).status == 401
    assert (await http.get(p, "/api/overview", {"Authorization": "Basic !!!"})).status == 401
    r = await http.get(p, "/api/overview", http.basic("viewer", "v1ew"))
    assert r.status == 403 and "admin" in r.json()["error"]
    assert (await http.get(p, "/api/overview", http.basic("admin", "s3cret"))).status == 200
    assert (await http.get(p, "/", http.basic("admin", "s3cret"))).status == 200
    assert (await http.get(p, "/metrics")).status == 200  # scrapers need no login
    me = (await http.get(p, "/api/session", http.basic("admin", "s3cret"))).json()
    assert me["user"] == "admin" and me["login"] is True
    assert "s3cret" not in str(me) and "scrypt" not in str(me)


async def test_kick_needs_the_admins_token(secured: Broker) -> None:
    p = port(secured)
    admin = http.basic("admin", "s3cret")
    token = await csrf(p, admin)
    async with mqtt(secured, "kicked", username="viewer", password="v1ew"):
        await eventually(lambda: "kicked" in secured.core.sessions)
        r = await http.post(p, "/api/kick", {"client_id": "kicked"}, {"X-CSRF-Token": token})
        assert r.status == 401  # no credentials
        r = await http.post(p, "/api/kick", {"client_id": "kicked"}, {**admin, "X-CSRF-Token": token})
        assert r.status == 200
        await eventually(
            lambda: (
                secured.core.sessions.get("kicked") is None or secured.core.sessions["kicked"].conn is None
            )
        )


async def test_payloads_outside_the_admins_acl_are_hidden(secured: Broker) -> None:
    p = port(secured)
    await secured.publish("open/a", b"visible", retain=True)
    await secured.publish("secret/a", b"hidden-value", retain=True)
    admin = http.basic("admin", "s3cret")
    opened = (await http.get(p, "/api/topics?prefix=open", admin)).json()["levels"][0]["retained"]
    assert opened["payload"]["text"] == "visible"
    secret = await http.get(p, "/api/topics?prefix=secret", admin)
    row = secret.json()["levels"][0]["retained"]
    assert "payload" not in row and "ACL" in row["hidden"] and b"hidden-value" not in secret.body


async def test_a_listener_off_loopback_requires_a_login() -> None:
    # 0.0.0.0 is not loopback: without a password file nobody can log in
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, metrics_listen="0.0.0.0:0") as b:
        r = await http.get(port(b), "/api/overview")
        assert r.status == 401 and "no password file" in r.json()["error"]
        assert (await http.get(port(b), "/metrics")).status == 200


async def test_dashboard_can_be_turned_off() -> None:
    async with Broker(
        host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0", dashboard=False
    ) as b:
        assert (await http.get(port(b), "/")).status == 404
        assert (await http.get(port(b), "/metrics")).status == 200


async def test_many_clients_are_paginated(b: Broker) -> None:
    # in-process sessions stand in for 2,000 clients (the benchmark connects 10,000 real ones)
    subs = [b.subscribe(f"t/{i}") for i in range(2000)]
    async with contextlib.AsyncExitStack() as stack:
        for s in subs:
            await stack.enter_async_context(s)
        page = (await http.get(port(b), "/api/clients?limit=500&offset=1500")).json()
        assert page["total"] == 2000 and len(page["clients"]) == 500
        assert page["clients"][0]["protocol"] == "in-process"
        subs_page = (await http.get(port(b), "/api/subscriptions?limit=10")).json()
        assert subs_page["total"] == 2000 and len(subs_page["subscriptions"]) == 10


async def test_metrics_without_prometheus_client_says_which_extra(
    b: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as if prometheus-client were not installed: importing it fails (the dashboard still works)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.setitem(sys.modules, "prometheus_client.exposition", None)
    r = await http.get(port(b), "/metrics")
    assert r.status == 501 and b"needs the 'metrics' extra" in r.body
    assert b"pip install 'siftmq[metrics]'" in r.body
    assert (await http.get(port(b), "/api/overview")).status == 200


def test_serve_flags() -> None:
    from broker._cli import build_parser

    args = build_parser().parse_args(
        ["serve", "--dashboard-admin", "ann", "--dashboard-admin", "bo", "--no-dashboard"]
    )
    assert args.dashboard_admin == ["ann", "bo"] and args.dashboard is False


async def test_a_reloaded_password_file_ends_old_passwords(secured: Broker, tmp_path: Path) -> None:
    p = port(secured)
    assert (await http.get(p, "/api/overview", http.basic("admin", "s3cret"))).status == 200
    auth = next(h for h in secured.hooks if isinstance(h, FileAuth))
    write_passwords(tmp_path / "passwd", {"admin": "n3w"})
    auth.reload()
    assert (await http.get(p, "/api/overview", http.basic("admin", "s3cret"))).status == 401
    assert (await http.get(p, "/api/overview", http.basic("admin", "n3w"))).status == 200


async def test_head_of_the_event_stream_is_a_head(b: Broker) -> None:
    r = await http.raw(port(b), b"HEAD /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert r.status == 200 and r.headers["content-type"] == "text/event-stream" and r.body == b""
    assert b.dashboard is not None and b.dashboard.watchers == 0


async def test_stop_ends_open_event_streams(b: Broker) -> None:
    stream = http.events(port(b))
    try:
        name, _ = await asyncio.wait_for(anext(stream), 5)
        assert name == "history"
        await asyncio.wait_for(b.stop(), 10)  # does not wait for the browser to leave
        assert b.dashboard is None and b.metrics_port is None
        async with asyncio.timeout(5):  # the stream ends (at most the overview event before)
            rest = [name async for name, _ in stream]
        assert rest in ([], ["overview"])
    finally:
        await stream.aclose()


async def test_an_idle_dashboard_does_not_sample(b: Broker) -> None:
    dash = b.dashboard
    assert dash is not None and not dash.sampling
    assert (await http.get(port(b), "/api/clients")).status == 200
    assert (await http.get(port(b), "/metrics")).status == 200
    assert not dash.sampling  # lists and scrapes need no sampler
    assert (await http.get(port(b), "/api/overview")).status == 200
    assert dash.sampling and len(dash.history) == 1
