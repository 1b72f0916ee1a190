"""Issue 39: authorization through an HTTP service (``broker.authn.HttpAuthz``, EMQX's HTTP
authorizer), against a real HTTP server in the test.

The service is an asyncio HTTP/1.1 server on 127.0.0.1 port 0 in the test's loop: it allows a
topic or filter under ``ok/`` and denies the rest, records every request's JSON body, and can
hold its answers until the test releases them (a slow service, with no timing bet).  The
broker is a real ``Broker`` on port 0 and the clients are raw MQTT clients (the reason codes
on the wire are the point).  What is checked: SUBSCRIBE asks the service at SUBSCRIBE time;
a PUBLISH waits for the first decision on its topic and is decided from the cache after it
(no second request); a held client's packets keep their order and another client is served
meanwhile; a service that is down refuses (fail-closed).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

from broker import Broker
from broker.authn import HttpAuthz
from broker.packets import Pingreq, Pingresp, Puback, Publish, ReasonCode
from tests.auth.authservice import keep_alive
from tests.rawclient import RawClient
from tests.waiting import eventually

ACCEPTED = (ReasonCode.SUCCESS, ReasonCode.NO_MATCHING_SUBSCRIBERS)


class Service:
    """Allows ``ok/...`` (and ``ok/#``), denies the rest; ``release`` cleared: answers wait."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.release = asyncio.Event()
        self.release.set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await keep_alive(reader, writer, self._answer)

    async def _answer(self, request: bytes) -> bytes:
        body = json.loads(request)
        self.bodies.append(body)
        await self.release.wait()
        result = "allow" if body["topic"].startswith("ok/") else "deny"
        return json.dumps({"result": result}).encode()


async def serve(svc: Service) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(svc.handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/authz"


async def test_subscribe_and_publish_are_decided_by_the_service_then_from_its_cache() -> None:
    svc = Service()
    server, url = await serve(svc)
    authz = HttpAuthz(url, timeout=10.0)
    try:
        async with Broker(host="127.0.0.1", port=0, hooks=[authz], sys_interval=0) as b:
            c, ack = await RawClient.connect(b.port, "c1", username="alice", password=b"pw")
            try:
                assert ack.reason_code is ReasonCode.SUCCESS
                granted = await c.subscribe("ok/#", "secret/#")
                assert granted.reason_codes == (ReasonCode.GRANTED_QOS_1, ReasonCode.NOT_AUTHORIZED)
                assert svc.bodies == [
                    {"clientid": "c1", "username": None, "action": "subscribe", "topic": t,
                     "qos": 1, "retain": False}
                    for t in ("ok/#", "secret/#")
                ]  # fmt: skip
                # a PUBLISH waits for its topic's first decision, then is delivered
                assert (await c.publish1("ok/x", b"1", retain=True)).reason_code is ReasonCode.SUCCESS
                got = await c.recv_where(lambda p: isinstance(p, Publish))
                assert isinstance(got, Publish) and got.topic == "ok/x" and got.payload == b"1"
                assert (await c.publish1("secret/x")).reason_code is ReasonCode.NOT_AUTHORIZED
                assert svc.bodies[2:] == [
                    {"clientid": "c1", "username": None, "action": "publish", "topic": "ok/x",
                     "qos": 1, "retain": True},
                    {"clientid": "c1", "username": None, "action": "publish", "topic": "secret/x",
                     "qos": 1, "retain": False},
                ]  # fmt: skip
                # the same again: from the cache (allow and deny), no request
                asked = len(svc.bodies)
                for _ in range(3):
                    assert (await c.publish1("ok/x", b"2", retain=True)).reason_code is ReasonCode.SUCCESS
                    assert (await c.publish1("secret/x")).reason_code is ReasonCode.NOT_AUTHORIZED
                assert len(svc.bodies) == asked and authz.hits == 6
                # another QoS or retain flag is another question
                c.send(Publish("ok/x", b"3", 0))
                await eventually(lambda: len(svc.bodies) == asked + 1)
                assert svc.bodies[-1]["qos"] == 0 and svc.bodies[-1]["retain"] is False
            finally:
                await c.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_held_client_keeps_its_order_and_the_others_are_served() -> None:
    """The service holds its answers: the client's PUBLISHes wait (nothing more read from it),
    another client's PINGREQs are answered meanwhile; once the service answers, the client's
    packets are processed in the order sent."""
    svc = Service()
    server, url = await serve(svc)
    authz = HttpAuthz(url, timeout=30.0)
    try:
        async with Broker(host="127.0.0.1", port=0, hooks=[authz], sys_interval=0) as b:
            pinger, _ = await RawClient.connect(b.port, "pinger")
            c, _ = await RawClient.connect(b.port, "c1")
            try:
                svc.release.clear()
                c.send(Publish("ok/a", b"a", 1, packet_id=1))
                c.send(Publish("secret/b", b"b", 1, packet_id=2))
                c.send(Publish("ok/c", b"c", 1, packet_id=3))
                await eventually(lambda: len(svc.bodies) == 1)  # the first one waits
                for _ in range(20):
                    pinger.send(Pingreq())
                    assert isinstance(await pinger.recv(timeout=5.0), Pingresp)
                assert len(svc.bodies) == 1  # the client is held: nothing after it was asked
                svc.release.set()
                acks = [await c.recv_where(lambda p: isinstance(p, Puback)) for _ in range(3)]
                assert [(a.packet_id, a.reason_code) for a in acks if isinstance(a, Puback)] == [
                    (1, ReasonCode.NO_MATCHING_SUBSCRIBERS),
                    (2, ReasonCode.NOT_AUTHORIZED),
                    (3, ReasonCode.NO_MATCHING_SUBSCRIBERS),
                ]
                assert [x["topic"] for x in svc.bodies] == ["ok/a", "secret/b", "ok/c"]
            finally:
                svc.release.set()
                await c.close()
                await pinger.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_service_that_is_down_refuses() -> None:
    """Fail-closed: nobody listens at the URL: SUBSCRIBE and PUBLISH are refused 0x87 (within
    the timeout), the refusals are not cached (each asks again), counted as unavailable."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    authz = HttpAuthz(f"http://127.0.0.1:{port}/authz", timeout=2.0, retries=1)
    async with Broker(host="127.0.0.1", port=0, hooks=[authz], sys_interval=0) as b:
        c, _ = await RawClient.connect(b.port, "c1")
        try:
            t0 = time.monotonic()
            assert (await c.subscribe("ok/#")).reason_codes == (ReasonCode.NOT_AUTHORIZED,)
            assert (await c.publish1("ok/x")).reason_code is ReasonCode.NOT_AUTHORIZED
            assert (await c.publish1("ok/x")).reason_code is ReasonCode.NOT_AUTHORIZED
            assert time.monotonic() - t0 < 3 * (2.0 + 2.0)
            assert authz.unavailable == 3 and authz.requests == 6 and authz.hits == 0
        finally:
            await c.close()


def test_siftmq_serve_builds_it_from_the_serve_keys() -> None:
    from broker.authn import HttpAuth, hooks_from_serve_options

    hooks = hooks_from_serve_options(
        {"auth_http_url": "http://127.0.0.1:1/auth", "auth_http_authz_url": "http://127.0.0.1:1/authz",
         "auth_http_timeout": 2.0}
    )  # fmt: skip
    assert [type(h) for h in hooks] == [HttpAuth, HttpAuthz]  # the service after the identity's rules
    assert isinstance(hooks[1], HttpAuthz) and hooks[1].url.endswith("/authz") and hooks[1].timeout == 2.0
