"""Interoperability matrix (issue 28 item 3): clients nobody here wrote against one embedded
broker per module (TCP, TLS and WebSocket listeners, port 0), each over MQTT 3.1.1 and 5.0:

=========  ==================================================================================
feature    what the client does, and what the broker's side checks
=========  ==================================================================================
qos0..2    subscribes at QoS n and receives a message the broker publishes at QoS n (broker to
           client), publishes at QoS n (client to broker: an in-process subscriber gets it
           with QoS n)
retained   receives a retained message published before it subscribed (retain flag set);
           publishes a retained message the broker then holds
will       connects with a will and drops the connection without DISCONNECT: the will is
           published
session    subscribes with a persistent session (3.1.1 CleanSession=0, v5 session expiry)
           and disconnects; a QoS 1 message published meanwhile arrives on its reconnection
tls        qos1 over the TLS listener (the test CA)
websocket  qos1 over the WebSocket listener (``/mqtt``)
filter     a content filter: 3.1.1 ``$filter/n > 5/<topic>``, v5 the SUBSCRIBE user property
           ``filter``; of {"n": 1} then {"n": 9} only the second arrives
=========  ==================================================================================

A client without a feature, or not installed, is skipped with the reason (``make
interop-clients`` installs them: Debian's mosquitto-clients and paho.mqtt.c-examples, MQTT.js
with npm into tests/interop/node_modules; gmqtt is in the dev extra). docs/broker.md,
"Interoperability matrix", has the table.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from broker import Broker, BrokerConfig, Listener
from tests.interop._clients import CLIENTS, TIMEOUT, Client, Env, Got, Job
from tests.security.helpers import make_certs
from tests.waiting import eventually

FEATURES = ("qos0", "qos1", "qos2", "retained", "will", "session", "tls", "websocket", "filter")
_ids = itertools.count()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Broker, Env]]:
    certs = make_certs(tmp_path_factory.mktemp("interop-certs"))
    cfg = BrokerConfig(
        listeners=(
            Listener("tcp", "127.0.0.1", 0),
            Listener("tcp", "127.0.0.1", 0, str(certs.server_cert), str(certs.server_key)),
            Listener("ws", "127.0.0.1", 0),
        ),
        sys_interval=0,
    )
    async with Broker(config=cfg) as b:
        core = b.core
        try:
            yield (
                b,
                Env(
                    "127.0.0.1",
                    *b.ports,
                    certs.ca,
                    subscribed=lambda cid: core.router.index.entry_count(cid) > 0,
                    connected=lambda cid: (s := core.sessions.get(cid)) is not None and s.conn is not None,
                ),
            )
        finally:
            for client in CLIENTS:
                await client.stop()


def _cases() -> list[object]:
    out = []
    for client, version, feature in itertools.product(CLIENTS, (4, 5), FEATURES):
        marks = []
        reason = client.available() or client.why_not(feature, version)
        if reason:
            marks.append(pytest.mark.skip(reason=reason))
        out.append(
            pytest.param(client, version, feature, id=f"{client.name}-v{version}-{feature}", marks=marks)
        )
    return out


class _Sub:
    """An in-process subscriber at QoS 2: the broker's side of "client to broker"."""

    def __init__(self, b: Broker, topic: str) -> None:
        self.sub = b.subscribe(topic, qos=2)

    async def __aenter__(self) -> _Sub:
        await self.sub.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.sub.__aexit__(None, None, None)

    async def next(self) -> tuple[str, bytes, int, bool]:
        m = await asyncio.wait_for(self.sub.queue.get(), TIMEOUT)
        return (m.topic, m.payload, m.qos, m.retain)


def _payloads(got: list[Got]) -> list[str]:
    return [g.payload for g in got]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(("client", "version", "feature"), _cases())
async def test_interop(env: tuple[Broker, Env], client: Client, version: int, feature: str) -> None:
    b, e = env
    n = next(_ids)
    base = f"interop/{n}"
    cid = f"interop-{n}-{version}"
    if feature.startswith("qos") or feature in {"tls", "websocket"}:
        qos = int(feature[3]) if feature.startswith("qos") else 1
        endpoint = {"tls": "tls", "websocket": "ws"}.get(feature, "tcp")
        async with _Sub(b, f"{base}/out") as out:
            job = Job(
                endpoint,
                version,
                cid,
                subscribe=(f"{base}/in", qos),
                expect=1,
                publish=((f"{base}/out", "from-client", qos, False),),
            )
            run = client.start(job, e)
            await run.wait_ready()
            await b.publish(f"{base}/in", b"from-broker", qos)
            got = await run.result()
            assert _payloads(got) == ["from-broker"]
            assert got[0].qos in (None, qos) and got[0].topic in (None, f"{base}/in")
            assert await out.next() == (f"{base}/out", b"from-client", qos, False)
    elif feature == "retained":
        await b.publish(f"{base}/ret", b"kept", 1, retain=True)
        job = Job(
            "tcp",
            version,
            cid,
            subscribe=(f"{base}/ret", 1),
            expect=1,
            publish=((f"{base}/ret2", "held", 1, True),),
        )
        got = await client.start(job, e).result()
        assert _payloads(got) == ["kept"] and got[0].retain in (None, True)
        retained = b.core.router.retained
        await eventually(lambda: retained.get(f"{base}/ret2") is not None, TIMEOUT)
        held = retained.get(f"{base}/ret2")
        assert held is not None and held.payload == b"held"
    elif feature == "will":
        async with _Sub(b, f"{base}/will") as wills:
            job = Job("tcp", version, cid, will=(f"{base}/will", "gone"), abort=True)
            await client.start(job, e).result()
            assert await wills.next() == (f"{base}/will", b"gone", 1, False)
    elif feature == "session":
        first = Job("tcp", version, cid, clean=False, expiry=300, subscribe=(f"{base}/s", 1))
        await client.start(first, e).result()
        await eventually(lambda: (s := b.core.sessions.get(cid)) is not None and s.conn is None, TIMEOUT)
        await b.publish(f"{base}/s", b"while-away", 1)
        again = Job("tcp", version, cid, clean=False, expiry=300, subscribe=(f"{base}/s", 1), expect=1)
        got = await client.start(again, e).result()
        assert _payloads(got) == ["while-away"]
    elif feature == "filter":
        selector = "n > 5"
        topic = f"{base}/f"
        job = Job(
            "tcp",
            version,
            cid,
            subscribe=(topic if version == 5 else f"$filter/{selector}/{topic}", 1),
            selector=selector if version == 5 else None,
            expect=1,
        )
        run = client.start(job, e)
        await run.wait_ready()
        await b.publish(topic, b'{"n": 1}', 1)
        await b.publish(topic, b'{"n": 9}', 1)
        got = await run.result()
        assert _payloads(got) == ['{"n": 9}']
    b.core._check()
