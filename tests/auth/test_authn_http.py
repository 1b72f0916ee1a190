"""Issue 39, item 2: ``broker.authn.HttpAuth`` against a real HTTP auth service.

The service is ``http.server`` on a thread, on 127.0.0.1 port 0 (tests/auth/authservice.py);
the broker is a real ``Broker`` on port 0 and the clients are raw MQTT clients over loopback
(tests/rawclient.py: the reason codes on the wire are the point).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from types import SimpleNamespace

import pytest

from broker import Broker, authn
from broker.authn import HttpAuth
from broker.packets import Connect, Pingreq, Pingresp, ReasonCode
from tests.auth.authservice import auth_service
from tests.rawclient import RawClient
from tests.waiting import eventually

#: a QoS 1 PUBLISH accepted (with or without subscribers)
ACCEPTED = (ReasonCode.SUCCESS, ReasonCode.NO_MATCHING_SUBSCRIBERS)

ACL = [
    {"permission": "allow", "action": "publish", "topic": "out/%u/#"},
    {"permission": "allow", "action": "subscribe", "topic": "in/%c/#"},
    {"permission": "deny", "action": "all", "topic": "out/alice/secret"},
]


async def test_allow_with_rules_the_request_body_and_the_rules_applied() -> None:
    with auth_service() as svc:
        svc.answer = (200, {"result": "allow", "is_superuser": False, "acl": ACL})
        auth = HttpAuth(svc.url, timeout=5.0)
        async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0) as b:
            c, ack = await RawClient.connect(b.port, "c1", username="alice", password=b"pw")
            try:
                assert ack.reason_code is ReasonCode.SUCCESS
                (body,) = svc.bodies
                assert body == {
                    "clientid": "c1",
                    "username": "alice",
                    "password": "pw",
                    "peerhost": "127.0.0.1",
                    "listener": f"127.0.0.1:{b.port}",
                    "listener_port": b.port,
                    "protocol": 5,
                    "cert_subject": None,
                    "cert_common_name": None,
                }
                assert b.core.sessions["c1"].authenticated
                assert (await c.publish1("out/alice/x")).reason_code in ACCEPTED
                assert (await c.publish1("out/bob/x")).reason_code is ReasonCode.NOT_AUTHORIZED
                assert (await c.publish1("out/alice/secret")).reason_code is ReasonCode.NOT_AUTHORIZED
                granted = await c.subscribe("in/c1/#", "in/c2/#", "out/alice/#")
                assert granted.reason_codes == (
                    ReasonCode.GRANTED_QOS_1,
                    ReasonCode.NOT_AUTHORIZED,
                    ReasonCode.NOT_AUTHORIZED,
                )
            finally:
                await c.close()
            # the rules lived with the connection
            await eventually(lambda: "c1" not in auth._grants)


@pytest.mark.parametrize(
    ("answer", "version", "code"),
    [
        ((200, {"result": "deny"}), 5, ReasonCode.NOT_AUTHORIZED),
        ((403, None), 5, ReasonCode.NOT_AUTHORIZED),
        ((401, {"result": "allow"}), 4, ReasonCode.NOT_AUTHORIZED),  # the status decides
        ((200, ["not", "an", "object"]), 5, ReasonCode.NOT_AUTHORIZED),
        ((204, None), 4, ReasonCode.SUCCESS),
        ((500, None), 5, ReasonCode.SERVER_UNAVAILABLE),
        ((503, None), 4, ReasonCode.SERVER_UNAVAILABLE),
    ],
)
async def test_the_status_and_the_answer_decide(
    answer: tuple[int, object], version: int, code: ReasonCode
) -> None:
    with auth_service() as svc:
        svc.answer = answer
        auth = HttpAuth(svc.url, timeout=5.0, retries=2)
        async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0) as b:
            c, ack = await RawClient.connect(b.port, "c1", version, username="u", password=b"p")
            await c.close()
            assert ack.reason_code is code
            # a 5xx is retried (bounded), anything else is asked once
            assert svc.requests == (3 if answer[0] >= 500 else 1)
            st = b.core.stats
            assert st.refused_auth_busy == int(code is ReasonCode.SERVER_UNAVAILABLE)
            assert st.auth_failures == int(code is ReasonCode.NOT_AUTHORIZED)


async def test_cache_hit_within_the_ttl_and_a_new_request_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two CONNECTs within the TTL cost the service one request; after the TTL, another.
    A deny is remembered for ``negative_ttl`` (a guesser does not reach the service).

    The cache's clock is the real one moved on by ``ahead``: a TTL no loaded machine outlasts
    between two CONNECTs, then stepped past, instead of a bet that two CONNECTs take < 0.5 s."""
    ttl = 60.0
    ahead = [0.0]
    monkeypatch.setattr(authn, "time", SimpleNamespace(monotonic=lambda: time.monotonic() + ahead[0]))
    with auth_service() as svc:
        auth = HttpAuth(svc.url, cache_ttl=ttl, negative_ttl=30.0)
        async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=0) as b:
            for _ in range(2):
                c, ack = await RawClient.connect(b.port, "c1", username="u", password=b"p")
                await c.close()
                assert ack.reason_code is ReasonCode.SUCCESS
            assert (svc.requests, auth.hits) == (1, 1)
            ahead[0] = ttl  # the TTL passes
            c, ack = await RawClient.connect(b.port, "c1", username="u", password=b"p")
            await c.close()
            assert ack.reason_code is ReasonCode.SUCCESS and svc.requests == 2
            # a different password is another key; its deny is cached
            svc.answer = (200, {"result": "deny"})
            for _ in range(3):
                c, ack = await RawClient.connect(b.port, "c1", username="u", password=b"wrong")
                await c.close()
                assert ack.reason_code is ReasonCode.NOT_AUTHORIZED
            assert svc.requests == 3


async def test_a_hanging_service_refuses_within_the_timeout_and_the_loop_keeps_serving() -> None:
    """Fail-closed: the service accepts the request and never answers; the CONNECT is refused
    0x88 once the timeout passed (not before: N PINGREQ round trips of another client complete
    while it hangs), and not much later: well before the 4 x 3 s that a timeout per attempt
    (retries=3) would take."""
    timeout = 3.0
    with auth_service() as svc:
        svc.hang = threading.Event()
        auth = HttpAuth(svc.url, timeout=timeout, retries=3)
        async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0) as b:
            # an anonymous pinger: the service decides it too, so let it in before the hang
            svc.hang.set()
            pinger, ack = await RawClient.connect(b.port, "pinger")
            assert ack.reason_code is ReasonCode.SUCCESS
            svc.hang = threading.Event()
            waiting = await RawClient.open(b.port)
            try:
                t0 = time.monotonic()
                waiting.send(Connect("c1", 5, username="u", password=b"p"))
                answer = asyncio.create_task(waiting.recv(timeout=30.0))
                answered: list[float] = []  # when it came, not when the pings let us look
                answer.add_done_callback(lambda _: answered.append(time.monotonic()))
                await eventually(lambda: svc.requests == 2, timeout=10.0)
                pongs = 0
                for _ in range(20):
                    pinger.send(Pingreq())
                    assert isinstance(await pinger.recv(timeout=5.0), Pingresp)
                    pongs += 1
                assert pongs == 20 and not answer.done(), "the CONNECT was answered while the service hung"
                ack = await answer
                elapsed = answered[0] - t0
                assert ack.reason_code is ReasonCode.SERVER_UNAVAILABLE  # type: ignore[attr-defined]
                assert timeout * 0.9 <= elapsed < timeout + 4.0, elapsed
                assert b.core.stats.refused_auth_busy == 1 and auth.unavailable == 1
            finally:
                svc.hang.set()
                await waiting.close()
                await pinger.close()


async def test_a_service_that_is_down_refuses_server_unavailable() -> None:
    """Connection refused (a port nobody listens on): 0x88 (3.1.1: return code 3), retried
    within the bound, not cached, not a failed login."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    auth = HttpAuth(f"http://127.0.0.1:{port}/auth", timeout=2.0, retries=2)
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0) as b:
        for version in (5, 4):
            t0 = time.monotonic()
            c, ack = await RawClient.connect(b.port, "c1", version, username="u", password=b"p")
            await c.close()
            assert ack.reason_code is ReasonCode.SERVER_UNAVAILABLE
            assert time.monotonic() - t0 < 2.0 + 2.0
        assert auth.requests == 6 and auth.hits == 0
        assert b.core.stats.auth_failures == 0 and b.core.stats.refused_auth_busy == 2


async def test_superuser_may_do_anything() -> None:
    with auth_service() as svc:
        svc.answer = (200, {"result": "allow", "is_superuser": True, "acl": []})
        async with Broker(host="127.0.0.1", port=0, hooks=[HttpAuth(svc.url)], sys_interval=0) as b:
            c, ack = await RawClient.connect(b.port, "root", username="root", password=b"pw")
            try:
                assert ack.reason_code is ReasonCode.SUCCESS
                assert (await c.publish1("any/thing")).reason_code in ACCEPTED
                assert (await c.subscribe("#")).reason_codes == (ReasonCode.GRANTED_QOS_1,)
            finally:
                await c.close()


async def test_rules_follow_the_connection_through_a_takeover() -> None:
    """A client id taken over by a connection with other rules gets the new rules (the old
    connection's disconnect comes after and must not drop them); one let in by another hook
    gets none of the service's."""
    from broker.hooks import Hooks

    class Local(Hooks):
        def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> bool | None:
            return True if username == "local" else None

    with auth_service() as svc:
        auth = HttpAuth(svc.url, cache_ttl=0, negative_ttl=0)
        async with Broker(host="127.0.0.1", port=0, hooks=[Local(), auth], sys_interval=0) as b:
            svc.answer = (200, {"result": "allow", "acl": [{"action": "publish", "topic": "a/#"}]})
            first, ack = await RawClient.connect(b.port, "dev", username="u1", password=b"p")
            assert ack.reason_code is ReasonCode.SUCCESS
            svc.answer = (200, {"result": "allow", "acl": [{"action": "publish", "topic": "b/#"}]})
            second, ack = await RawClient.connect(b.port, "dev", username="u2", password=b"p")
            try:
                assert ack.reason_code is ReasonCode.SUCCESS
                await first.closed()  # taken over
                assert (await second.publish1("b/x")).reason_code in ACCEPTED
                assert (await second.publish1("a/x")).reason_code is ReasonCode.NOT_AUTHORIZED
            finally:
                await second.close()
            await eventually(lambda: "dev" not in auth._grants)  # gone with its connection
            third, ack = await RawClient.connect(b.port, "dev", username="local")
            try:
                assert ack.reason_code is ReasonCode.SUCCESS
                assert (await third.publish1("a/x")).reason_code in ACCEPTED  # no rules of ours
            finally:
                await third.close()
