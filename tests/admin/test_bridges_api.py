"""Each outbound bridge's state in the admin API (``/api/v1/bridges``), the dashboard's data
endpoint (``/api/bridges``) and ``siftmq ctl bridges`` (issue 40, item 4; docs/admin.md).

Real brokers throughout: an edge broker runs two bridges (``Uplink``), one to a second
embedded broker (``central``: connected, messages cross, a content filter keeps one back) and
one to a loopback port that refuses connections (``nowhere``: its QoS 1 messages queue in its
local session up to its own bound, its last error says why). The API is called over real
HTTP; ``siftmq ctl`` runs as a process against a real ``siftmq serve`` whose ``[[bridges]]``
table points at a broker of the test.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
import pytest_asyncio

from broker import Broker
from broker.auth import FileAuth
from tests.admin.api import call
from tests.auth.helpers import FAST, write_passwords
from tests.dashboard import httpclient as http
from tests.serving import Serve
from tests.uplink._remote import MOSQUITTO, Mosquitto
from tests.waiting import eventually, next_message
from uplink import BridgeConfig, Direction, TopicRule, Uplink

API = "/api/v1"
T = 30.0


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A loopback port that is bound but not listening: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def _bridges(central: int, nowhere: int) -> Uplink:
    fast = {"backoff_min": 0.05, "backoff_max": 0.2}
    return Uplink(
        [
            BridgeConfig(
                name="central",
                urls=(f"mqtt://127.0.0.1:{central}",),
                topics=(TopicRule("sensors/#", Direction.OUT, 1, filter="temp > 30"),),
                **fast,  # type: ignore[arg-type]
            ),
            BridgeConfig(
                name="nowhere",
                urls=(f"mqtt://user:secret@127.0.0.1:{nowhere}", f"mqtt://127.0.0.1:{nowhere}"),
                topics=(TopicRule("far/#", Direction.OUT, 1),),
                protocol="3.1.1",
                max_queued_messages=3,
                max_queued_bytes=100_000,
                **fast,  # type: ignore[arg-type]
            ),
        ]
    )


@pytest_asyncio.fixture
async def edge(refusing_port: int) -> AsyncIterator[tuple[Broker, Broker, Uplink]]:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        uplink = _bridges(central.port, refusing_port)
        async with Broker(
            host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0", hooks=[uplink]
        ) as b:
            await asyncio.wait_for(uplink.bridges["central"].wait_connected(), 10)
            yield b, central, uplink


async def get(b: Broker, path: str) -> Any:
    assert b.metrics_port is not None
    r = await call(b.metrics_port, "GET", API + path)
    assert r.status == 200, (r.status, r.body)
    assert r.headers["content-type"] == "application/json"
    return r.json()


async def _publish(port: int, *messages: tuple[str, bytes]) -> None:
    async with aiomqtt.Client("127.0.0.1", port, identifier="pub") as c:
        for topic, payload in messages:
            await c.publish(topic, payload, qos=1)


async def test_the_admin_api_shows_each_bridges_state(edge: tuple[Broker, Broker, Uplink]) -> None:
    b, central, uplink = edge
    before = time.time()
    async with aiomqtt.Client("127.0.0.1", central.port, identifier="far-end") as sub:
        await sub.subscribe("sensors/#", qos=1)
        await _publish(
            b.port,
            ("sensors/a", b'{"temp": 35}'),
            ("sensors/b", b'{"temp": 20}'),  # kept back by the rule's content filter
            ("sensors/c", b'{"temp": 40}'),
            *((f"far/{i}", b"x" * 10) for i in range(5)),  # 5 for a bound of 3: 2 dropped
        )
        got = [bytes((await next_message(sub, 10)).payload) for _ in range(2)]  # type: ignore[arg-type]
        assert sorted(got) == [b'{"temp": 35}', b'{"temp": 40}']
    await eventually(lambda: uplink.bridges["central"].state.sent == 2, 10)
    await eventually(lambda: uplink.bridges["nowhere"].state.failures.get("unreachable", 0) >= 2, 10)

    listed = (await get(b, "/bridges"))["bridges"]
    assert [x["name"] for x in listed] == ["central", "nowhere"]
    c, n = listed
    assert c["connected"] is True and c["protocol"] == "5"
    assert c["remote"] == c["remotes"][0] == f"mqtt://127.0.0.1:{central.port}"
    assert (c["sent"], c["received"], c["reconnects"]) == (2, 0, 0)
    assert c["dropped"] == {"filtered": 1, "queue_bound": 0, "too_large": 0, "no_rule": 0, "refused": 0}
    assert c["dropped_total"] == 1
    assert c["queued"] == {"messages": 0, "bytes": None}  # no bound of its own: bytes not counted
    assert c["last_error"] is None and c["connects"] == 1 and c["failures"] == {}
    assert before - 60 <= c["connected_since"] <= time.time()

    assert n["connected"] is False and n["protocol"] == "3.1.1" and n["connected_since"] is None
    assert n["queued"]["messages"] == 3 and n["queued"]["bytes"] > 3 * 10
    assert n["dropped"]["queue_bound"] == 2 and n["sent"] == 0
    assert n["failures"]["unreachable"] >= 2 and n["connects"] >= 2
    assert "Connection refused" in n["last_error"]["text"]
    assert before - 60 <= n["last_error"]["at"] <= time.time()
    assert "secret" not in json.dumps(n)  # no password of a URL
    assert n["remotes"][0] == n["remotes"][1] == f"mqtt://127.0.0.1:{n['remotes'][0].rsplit(':', 1)[1]}"

    one = await get(b, "/bridges/central")
    assert one["name"] == "central" and one["sent"] == 2
    assert b.metrics_port is not None
    r = await call(b.metrics_port, "GET", API + "/bridges/nope")
    assert r.status == 404 and r.json()["error"] == "no bridge 'nope'"
    assert r.json()["detail"] == {"bridges": ["central", "nowhere"]}
    # the same numbers the dashboard's data endpoint shows
    dash = (await http.get(b.metrics_port, "/api/bridges")).json()["bridges"]
    assert [(x["name"], x["sent"], x["dropped"]) for x in dash] == [
        (x["name"], x["sent"], x["dropped"]) for x in listed
    ]


async def test_reconnect_drops_and_reconnects_without_losing_a_message(
    edge: tuple[Broker, Broker, Uplink],
) -> None:
    b, central, uplink = edge
    p = b.metrics_port
    assert p is not None
    bridge = uplink.bridges["central"]
    r = await call(p, "POST", API + "/bridges/central/reconnect", csrf=False)
    assert r.status == 403 and "CSRF" in r.json()["error"]  # state-changing: the CSRF rule
    assert (await call(p, "POST", API + "/bridges/nope/reconnect")).status == 404
    async with aiomqtt.Client("127.0.0.1", central.port, identifier="far-end") as sub:
        await sub.subscribe("sensors/#", qos=1)
        r = await call(p, "POST", API + "/bridges/central/reconnect")
        assert r.status == 200 and r.json() == {"reconnecting": "central"}
        await _publish(b.port, ("sensors/x", b'{"temp": 99}'))  # while it reconnects: queued, then sent
        assert bytes((await next_message(sub, 10)).payload) == b'{"temp": 99}'  # type: ignore[arg-type]
    await eventually(lambda: bridge.state.connected, 10)
    got = await get(b, "/bridges/central")
    assert got["connected"] is True and got["reconnects"] == 1 and got["connects"] >= 2
    # two at once (two admins clicking): one restart, never two bridge tasks fighting over
    # the remote session
    assert await asyncio.gather(uplink.reconnect_bridge("central"), uplink.reconnect_bridge("central")) == [
        True,
        True,
    ]
    await eventually(lambda: bridge.state.connected, 10)
    running = [t for t in asyncio.all_tasks() if t.get_name() == "uplink-central" and not t.done()]
    assert running == [bridge._task]


async def test_a_broker_without_bridges_lists_none() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0") as b:
        assert (await get(b, "/bridges")) == {"bridges": []}
        assert b.metrics_port is not None
        r = await call(b.metrics_port, "GET", API + "/bridges/x")
        assert r.status == 404 and r.json()["detail"] == {"bridges": []}
        assert (await http.get(b.metrics_port, "/api/bridges")).json() == {"bridges": []}
        doc = await get(b, "/openapi.json")
        assert {"/api/v1/bridges", "/api/v1/bridges/{name}", "/api/v1/bridges/{name}/reconnect"} <= set(
            doc["paths"]
        )
        assert doc["paths"]["/api/v1/bridges/{name}/reconnect"]["post"]["parameters"][0]["name"] == "name"


@pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (make installs it)")
@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_the_state_through_an_outage_of_a_mosquitto_remote(tmp_path: Path, protocol: str) -> None:
    """Debian mosquitto as the remote: sent while up; killed: down, the loss and its error in
    the API, messages queue; back: connected again (one reconnect), the queue drains."""
    remote = Mosquitto(tmp_path)
    remote.start()
    cfg = BridgeConfig(
        name="cloud",
        urls=(f"mqtt://127.0.0.1:{remote.port}",),
        topics=(TopicRule("site/#", Direction.OUT, 1),),
        protocol=protocol,
        backoff_min=0.05,
        backoff_max=0.2,
    )
    uplink = Uplink([cfg])
    try:
        async with Broker(
            host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0", hooks=[uplink]
        ) as b:
            bridge = uplink.bridges["cloud"]
            await asyncio.wait_for(bridge.wait_connected(), 10)
            await _publish(b.port, *((f"site/{i % 3}", b"up") for i in range(10)))
            await eventually(lambda: bridge.state.sent == 10, 10)
            up = await get(b, "/bridges/cloud")
            shown = (up["connected"], up["protocol"], up["sent"], up["queued"]["messages"])
            assert shown == (True, protocol, 10, 0)

            await asyncio.to_thread(remote.stop)
            await eventually(lambda: not bridge.state.connected, 10)
            await _publish(b.port, *((f"site/{i % 3}", b"down") for i in range(6)))
            await eventually(lambda: bridge.state.failures.get("unreachable", 0) >= 1, 10)
            down = await get(b, "/bridges/cloud")
            assert down["connected"] is False and down["connected_since"] is None
            assert down["failures"]["lost"] == 1 and down["queued"]["messages"] == 6
            assert down["last_error"]["text"] and down["last_error"]["at"] >= up["connected_since"]

            await asyncio.to_thread(remote.start)
            await eventually(lambda: bridge.state.connected and bridge.state.sent == 16, 15)
            back = await get(b, "/bridges/cloud")
            assert (back["connected"], back["reconnects"], back["sent"]) == (True, 1, 16)
            assert back["connected_since"] > down["last_error"]["at"] - 1
            await eventually(lambda: uplink.bridge_status()[0].queued_messages == 0, 10)
    finally:
        remote.stop()


async def test_bridges_need_the_same_login_and_role_as_the_other_endpoints(
    tmp_path: Path, refusing_port: int
) -> None:
    pw = write_passwords(tmp_path / "passwd", {"admin": "adminpw", "alice": "alicepw"})
    uplink = _bridges(refusing_port, refusing_port)
    async with Broker(
        host="127.0.0.1",
        port=0,
        sys_interval=0,
        metrics_listen="127.0.0.1:0",
        hooks=[FileAuth(pw, None, params=FAST), uplink],
        dashboard_admins=("admin",),
    ) as b:
        p = b.metrics_port
        assert p is not None
        for path in ("/bridges", "/bridges/central"):
            assert (await call(p, "GET", API + path)).status == 401
            assert (await call(p, "GET", API + path, headers=http.basic("alice", "alicepw"))).status == 403
            assert (await call(p, "GET", API + path, headers=http.basic("admin", "adminpw"))).status == 200
        assert (await http.get(p, "/api/bridges")).status == 401
        alice = http.basic("alice", "alicepw")
        r = await call(p, "POST", API + "/bridges/central/reconnect", headers=alice, csrf=False)
        assert r.status == 403 and "not a dashboard admin" in r.json()["error"]
        r = await call(p, "POST", API + "/bridges/central/reconnect", headers=http.basic("admin", "adminpw"))
        assert r.status == 200


# ---------------------------------------------------------------------------- siftmq ctl
def _ctl_run(http_port: int, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker._cli", "ctl", "--url", f"http://127.0.0.1:{http_port}", *argv],
        capture_output=True,
        text=True,
        timeout=T,
        check=False,
    )


def _ctl(http_port: int, *argv: str) -> Any:
    out = _ctl_run(http_port, *argv)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def test_ctl_bridges_against_siftmq_serve(tmp_path: Path) -> None:
    """``siftmq serve --config`` with a ``[[bridges]]`` table to a broker of the test; ``siftmq
    ctl bridges list|show|reconnect`` as processes. The bridges table is not warned about (a
    plugin's table), the misspelt ``[brige]`` is."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        conf = tmp_path / "edge.toml"
        conf.write_text(
            "[broker]\nsys_interval = 0\nmetrics_listen = '127.0.0.1:0'\n\n[brige]\nname = 'x'\n\n"
            f"[[bridges]]\nname = 'up'\nurl = 'mqtt://127.0.0.1:{central.port}'\nbackoff_min = 0.05\n"
            "backoff_max = 0.2\ntopics = [{pattern = 'a/#', direction = 'out', qos = 1}]\n"
        )
        serve = Serve(
            "--config", str(conf), "--no-persistence", "--data-dir", str(tmp_path / "d"), "--no-bridge"
        )
        try:
            await asyncio.to_thread(serve.port)
            line = await asyncio.to_thread(serve.wait_for, r"metrics on http://127\.0\.0\.1:(\d+)/metrics")
            hp = int(line[1])
            await serve.line(r"bridge up: connected to")
            listed = await asyncio.to_thread(_ctl, hp, "bridges", "list")
            assert [x["name"] for x in listed["bridges"]] == ["up"]
            assert listed["bridges"][0]["connected"] is True
            shown = await asyncio.to_thread(_ctl, hp, "bridges", "show", "up")
            assert shown["remote"] == f"mqtt://127.0.0.1:{central.port}" and shown["protocol"] == "5"
            assert await asyncio.to_thread(_ctl, hp, "bridges", "reconnect", "up") == {"reconnecting": "up"}
            async with asyncio.timeout(T):
                while True:
                    again = await asyncio.to_thread(_ctl, hp, "bridges", "show", "up")
                    if again["connected"] and again["reconnects"] == 1:
                        break
                    await asyncio.sleep(0.05)
            missing = await asyncio.to_thread(_ctl_run, hp, "bridges", "show", "nope")
            assert missing.returncode == 1 and "HTTP 404" in missing.stderr and "no bridge" in missing.stderr
            assert await asyncio.to_thread(serve.stop) == 0
        finally:
            serve.close()
        tables = [line for line in serve.lines if "unknown table" in line]
        assert len(tables) == 1 and "[brige]" in tables[0], tables
