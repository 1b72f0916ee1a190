"""Issue 37, items 3 and 4: the ACL trusts only authenticated user names; password checks run
off the event loop, bounded, with a per-address back-off of failed logins.

Real brokers (``Broker`` on port 0, one ``siftmq serve``) and real MQTT over loopback with raw
clients (``tests/rawclient.py``): the order and the codes of the packets on the wire are the
point (aiomqtt/paho clients cover the same hook in tests/auth/test_auth_e2e.py).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from broker import Broker
from broker._config import Listener
from broker._passwd import PasswordFile, Scrypt
from broker.auth import FileAuth
from broker.hooks import AuthUnavailable, AuthVerdict, Hooks
from broker.packets import (
    Connack,
    Connect,
    Pingreq,
    Pingresp,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
)
from tests.auth.helpers import FAST, write_passwords
from tests.rawclient import RawClient
from tests.serving import Serve
from tests.waiting import eventually

#: about 0.9 s of scrypt per check on the build machine (p multiplies the time, not the
#: 16 MiB of memory): a check is pending for far longer than a few PINGREQ round trips
SLOW = Scrypt(log2_n=14, r=8, p=8)

ACL = """\
topic read public/#
user admin
topic readwrite secret/#
pattern readwrite inbox/%u/#
"""


def slow_passwords(path: Path, users: dict[str, str]) -> Path:
    pf = PasswordFile(SLOW)
    for name, password in users.items():
        pf.set(name, password)
    pf.save(path)
    return path


def bad_connect(client_id: str, version: int = 5) -> Connect:
    return Connect(client_id, version, username="alice", password=b"wrong")


async def connack(c: RawClient) -> Connack:
    ack = await c.recv(timeout=30.0)
    assert isinstance(ack, Connack), ack
    return ack


class Trusting(Hooks):
    """An authenticate hook that verifies one user itself (as an auth service would)."""

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> bool | None:
        if username == "admin":
            return password == b"s3cret"
        return None


# ------------------------------------------------------------ item 1: who is a user


async def test_acl_without_password_file_gives_a_claimed_name_no_rights(tmp_path: Path) -> None:
    """Fails on the old broker: a client claiming ``admin`` without a password got CONNACK 0
    and ``secret/#``.  Now it is anonymous to the ACL: the anonymous rule applies, the user
    section and the ``%u`` pattern do not, and nothing retained under secret/ reaches it."""
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    auth = FileAuth(acl_file=acl, allow_anonymous=True)  # as siftmq serve --acl-file builds it
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0) as b:
        await b.publish("secret/plans", b"classified", retain=True)
        await b.publish("public/news", b"hello", retain=True)
        c, ack = await RawClient.connect(b.port, "claims-admin", username="admin")
        try:
            assert ack.reason_code is ReasonCode.SUCCESS  # accepted, as an anonymous client
            refused = await c.subscribe("secret/#", "inbox/admin/#")
            assert refused.reason_codes == (ReasonCode.NOT_AUTHORIZED, ReasonCode.NOT_AUTHORIZED)
            granted = await c.subscribe("public/#")
            assert granted.reason_codes == (ReasonCode.GRANTED_QOS_1,)
            got = await c.barrier()  # the retained public/news, and nothing from secret/
            assert [p.topic for p in got] == ["public/news"]  # type: ignore[attr-defined]
            s = b.core.sessions["claims-admin"]
            assert (s.username, s.authenticated) == ("admin", False)
        finally:
            await c.close()


async def test_a_name_another_hook_verified_gets_its_acl_rights(tmp_path: Path) -> None:
    """The same ACL with a hook that checks the password: the verified ``admin`` gets its
    section and its ``%u`` pattern; the wrong password is refused."""
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    hooks = [Trusting(), FileAuth(acl_file=acl, allow_anonymous=True)]
    async with Broker(host="127.0.0.1", port=0, hooks=hooks, sys_interval=0) as b:
        c, ack = await RawClient.connect(b.port, "admin-1", username="admin", password=b"s3cret")
        try:
            assert ack.reason_code is ReasonCode.SUCCESS
            granted = await c.subscribe("secret/#", "inbox/admin/#")
            assert granted.reason_codes == (ReasonCode.GRANTED_QOS_1, ReasonCode.GRANTED_QOS_1)
            assert b.core.sessions["admin-1"].authenticated
        finally:
            await c.close()
        bad, ack = await RawClient.connect(b.port, "admin-2", username="admin", password=b"guess")
        await bad.close()
        assert ack.reason_code is ReasonCode.NOT_AUTHORIZED


async def test_acl_without_password_file_says_so_in_one_line_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    caplog.set_level(logging.INFO, logger="broker")
    auth = FileAuth(acl_file=acl, allow_anonymous=True)
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0) as b:
        for i in range(3):
            c, ack = await RawClient.connect(b.port, f"c{i}", username="admin")
            await c.close()
            assert ack.reason_code is ReasonCode.SUCCESS
    lines = [r for r in caplog.records if "without a password file" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].levelno == logging.WARNING
    assert "treats every client as anonymous" in lines[0].getMessage()
    # with a password file there is nothing to say
    caplog.clear()
    pw = write_passwords(tmp_path / "pw", {"admin": "x"})
    quiet = FileAuth(password_file=pw, acl_file=acl, params=FAST)
    async with Broker(host="127.0.0.1", port=0, hooks=[quiet], sys_interval=0):
        pass
    assert not [r for r in caplog.records if "without a password file" in r.getMessage()]
    # nor when every listener takes the user name from a verified client certificate; a
    # plain listener beside one is named as the exception
    cert = {"certfile": "c.pem", "keyfile": "c.key", "cafile": "ca.pem", "require_client_cert": True}
    identity = Listener("tcp", "127.0.0.1", 0, use_identity_as_username=True, **cert)  # type: ignore[arg-type]
    Broker(listeners=(identity,), hooks=[FileAuth(acl_file=acl)])
    assert not [r for r in caplog.records if "without a password file" in r.getMessage()]
    Broker(listeners=(identity, Listener("tcp", "127.0.0.1", 0)), hooks=[FileAuth(acl_file=acl)])
    (line,) = [r.getMessage() for r in caplog.records if "without a password file" in r.getMessage()]
    assert "unless it comes from a client certificate" in line


# ------------------------------------------------------------ item 2: checks off the loop


async def test_pingreqs_are_answered_while_wrong_password_checks_are_pending(tmp_path: Path) -> None:
    """Fails on the old broker (scrypt on the event loop: the first refusal goes out before
    the PINGREQs behind it are answered).  Four wrong-password CONNECTs whose checks take about
    a second each are pending; another client's PINGREQs are answered meanwhile, and only then
    are the four refused."""
    auth = FileAuth(password_file=slow_passwords(tmp_path / "pw", {"alice": "right"}), allow_anonymous=True)
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=0) as b:
        pinger, ack = await RawClient.connect(b.port, "pinger")
        assert ack.reason_code is ReasonCode.SUCCESS
        storm = [await RawClient.open(b.port) for _ in range(4)]
        try:
            for i, c in enumerate(storm):
                c.send(bad_connect(f"guess-{i}"))
            answers = [asyncio.create_task(connack(c)) for c in storm]
            pongs = 0
            for _ in range(5):
                pinger.send(Pingreq())
                assert isinstance(await pinger.recv(timeout=30.0), Pingresp)
                pongs += 1
            answered = [t for t in answers if t.done()]
            assert pongs == 5 and not answered, "a wrong-password CONNECT was refused before the PINGREQs"
            assert b.core.stats.auth_pending == 4  # all four still being checked
            for t in answers:
                assert (await t).reason_code is ReasonCode.NOT_AUTHORIZED
            assert b.core.stats.auth_failures == 4
            await eventually(lambda: b.core.stats.auth_pending == 0)
        finally:
            for c in [pinger, *storm]:
                await c.close()
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


async def test_packets_sent_behind_a_pending_connect_are_handled_after_it_in_order(tmp_path: Path) -> None:
    """A client may send SUBSCRIBE and PINGREQ right behind its CONNECT: they wait for the
    verdict and are answered after the CONNACK, in order."""
    auth = FileAuth(password_file=slow_passwords(tmp_path / "pw", {"alice": "right"}))
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0) as b:
        c = await RawClient.open(b.port)
        try:
            c.send(Connect("eager", 5, username="alice", password=b"right"))
            c.send(Subscribe(1, (SubscriptionRequest("a/b", 1),)))
            c.send(Pingreq())
            await eventually(lambda: b.core.stats.auth_pending == 1, timeout=10.0)
            first = await c.recv(timeout=30.0)
            assert isinstance(first, Connack) and first.reason_code is ReasonCode.SUCCESS
            second = await c.recv()
            assert isinstance(second, Suback) and second.reason_codes == (ReasonCode.GRANTED_QOS_1,)
            assert isinstance(await c.recv(), Pingresp)
            assert b.core.sessions["eager"].authenticated
        finally:
            await c.close()


async def test_a_correct_password_is_accepted_and_a_re_login_costs_no_check(tmp_path: Path) -> None:
    auth = FileAuth(password_file=write_passwords(tmp_path / "pw", {"alice": "right"}), params=FAST)
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0) as b:
        for attempt in range(3):
            c, ack = await RawClient.connect(b.port, "alice-1", username="alice", password=b"right")
            await c.close()
            assert ack.reason_code is ReasonCode.SUCCESS, attempt
            assert auth.pool.checks == 1  # the first login hashed; the others: one HMAC each
            await eventually(lambda: "alice-1" not in b.core.sessions)  # clean session: ended
        c, ack = await RawClient.connect(b.port, "alice-2", username="alice", password=b"other")
        await c.close()
        assert ack.reason_code is ReasonCode.NOT_AUTHORIZED  # the memo lets no other password in
        assert auth.pool.checks == 2


@pytest.mark.parametrize("version", [5, 4])
async def test_checks_beyond_the_bound_are_refused_server_unavailable(tmp_path: Path, version: int) -> None:
    """One thread, two checks pending at most: of four wrong-password CONNECTs at once, two
    are refused at once with 0x88 (3.1.1: return code 3), unchecked and not counted as failed
    logins; the other two are checked and refused as not authorized."""
    auth = FileAuth(
        password_file=slow_passwords(tmp_path / "pw", {"alice": "right"}), workers=1, max_pending=2
    )
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=0) as b:
        storm = [await RawClient.open(b.port, version) for _ in range(4)]
        try:
            for i, c in enumerate(storm[:2]):
                c.send(bad_connect(f"first-{i}", version))
            await eventually(lambda: b.core.stats.auth_pending == 2, timeout=10.0)
            for i, c in enumerate(storm[2:]):
                c.send(bad_connect(f"late-{i}", version))
            late = [await connack(c) for c in storm[2:]]
            assert [a.reason_code for a in late] == [ReasonCode.SERVER_UNAVAILABLE] * 2
            assert b.core.stats.refused_auth_busy == 2
            assert b.core.stats.auth_pending == 2  # the first two are still being checked
            first = [await connack(c) for c in storm[:2]]
            assert [a.reason_code for a in first] == [ReasonCode.NOT_AUTHORIZED] * 2
            assert b.core.stats.auth_failures == 2
            assert auth.pool.checks == 2
            sys = b.core.sys_values(0.0)
            assert sys["$SYS/broker/connections/refused/auth_busy"] == "2"
        finally:
            for c in storm:
                await c.close()
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


async def test_the_connect_timeout_applies_while_the_check_runs(tmp_path: Path) -> None:
    auth = FileAuth(password_file=slow_passwords(tmp_path / "pw", {"alice": "right"}), workers=1)
    async with Broker(
        host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, connect_timeout=0.2, tick_interval=0.05
    ) as b:
        c = await RawClient.open(b.port)
        try:
            c.send(Connect("slow", 5, username="alice", password=b"right"))
            got = await c.closed(timeout=30.0)
            assert got == []  # closed without a CONNACK
            assert b.core.stats.connect_timeouts == 1
            await eventually(lambda: b.core.stats.auth_pending == 0, timeout=30.0)
            assert "slow" not in b.core.sessions  # the late verdict attached nothing
        finally:
            await c.close()
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


# ------------------------------------------------------------ item 3: back-off per address


async def test_failed_logins_back_off_the_address_without_checking(tmp_path: Path) -> None:
    """After three failed logins from 127.0.0.1 its next CONNECT with credentials -- even the
    right password -- is refused at once: no check runs (the pool's count stands still), the
    refusal is counted in $SYS and /metrics; an anonymous CONNECT is still accepted."""
    auth = FileAuth(
        password_file=write_passwords(tmp_path / "pw", {"alice": "right"}), params=FAST, allow_anonymous=True
    )
    async with Broker(
        host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=3, auth_backoff=600.0,
        auth_backoff_max=600.0,
    ) as b:  # fmt: skip
        for i in range(3):
            c, ack = await RawClient.connect(b.port, f"guess-{i}", username="alice", password=b"wrong")
            await c.close()
            assert ack.reason_code is ReasonCode.NOT_AUTHORIZED
        assert (b.core.stats.auth_failures, auth.pool.checks) == (3, 3)
        c, ack = await RawClient.connect(b.port, "alice-1", username="alice", password=b"right")
        await c.close()
        assert ack.reason_code is ReasonCode.NOT_AUTHORIZED
        assert ack.properties.reason_string == "too many failed logins from this address"
        assert b.core.stats.refused_auth_backoff == 1
        assert auth.pool.checks == 3  # no scrypt for it
        assert b.core.stats.auth_failures == 3  # and not a failure of its own
        c, ack = await RawClient.connect(b.port, "anon")
        await c.close()
        assert ack.reason_code is ReasonCode.SUCCESS
        assert b.core.sys_values(0.0)["$SYS/broker/connections/refused/auth_backoff"] == "1"
        from prometheus_client import generate_latest

        from broker._metrics import registry_for

        text = generate_latest(registry_for(b.core)).decode()
        assert "siftmq_refused_auth_backoff_total 1.0" in text
        assert "siftmq_auth_failures_total 3.0" in text
        assert "siftmq_auth_pending 0.0" in text


async def test_the_back_off_ends_and_the_right_password_gets_in(tmp_path: Path) -> None:
    auth = FileAuth(password_file=write_passwords(tmp_path / "pw", {"alice": "right"}), params=FAST)
    async with Broker(
        host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=2, auth_backoff=1.0
    ) as b:
        for i in range(2):
            c, ack = await RawClient.connect(b.port, f"guess-{i}", username="alice", password=b"wrong")
            await c.close()
            assert ack.reason_code is ReasonCode.NOT_AUTHORIZED
        assert b.core.login_backoff.blocked("127.0.0.1", b.core.clock.monotonic()) > 0
        await eventually(lambda: not b.core.login_backoff.blocked("127.0.0.1", b.core.clock.monotonic()), 10)
        c, ack = await RawClient.connect(b.port, "alice-1", username="alice", password=b"right")
        await c.close()
        assert ack.reason_code is ReasonCode.SUCCESS


async def test_the_store_keeps_only_authenticated_user_names(tmp_path: Path) -> None:
    """A persisted session of a verified ``admin`` keeps its name (and its rights: a message
    for ``inbox/admin/...`` is queued for it after a restart); one that merely claimed a name
    (``bob``, whom no hook verifies) comes back without one."""
    from broker.packets import Properties

    acl = tmp_path / "acl"
    acl.write_text(ACL)
    keep = Properties(session_expiry_interval=3600)
    config = {"host": "127.0.0.1", "port": 0, "sys_interval": 0, "store_path": str(tmp_path / "b.db")}
    hooks = [Trusting(), FileAuth(acl_file=acl, allow_anonymous=True)]
    async with Broker(hooks=hooks, **config) as b:  # type: ignore[arg-type]
        for cid, user, password, ok in (
            ("admin-p", "admin", b"s3cret", ReasonCode.GRANTED_QOS_1),
            ("claims-p", "bob", None, ReasonCode.NOT_AUTHORIZED),  # %u does not apply
        ):
            c, ack = await RawClient.connect(
                b.port, cid, username=user, password=password, clean_start=False, properties=keep
            )
            assert ack.reason_code is ReasonCode.SUCCESS
            assert (await c.subscribe(f"inbox/{user}/#")).reason_codes == (ok,)
            await c.close()
        await eventually(lambda: all(s.conn is None for s in b.core.sessions.values()))
    hooks = [Trusting(), FileAuth(acl_file=acl, allow_anonymous=True)]
    async with Broker(hooks=hooks, **config) as b:  # type: ignore[arg-type]
        verified, claimed = b.core.sessions["admin-p"], b.core.sessions["claims-p"]
        assert (verified.username, verified.authenticated) == ("admin", True)
        assert (claimed.username, claimed.authenticated) == (None, False)
        await b.publish("inbox/admin/1", b"for admin", qos=1)
        assert [o.msg.payload for o in verified.queue] == [b"for admin"]


class ServiceLike(Hooks):
    """An async authenticate hook, as an HTTP auth service's would be (issue 39's seam):
    answers after yielding to the loop; None for names it does not know."""

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> AuthVerdict:
        if username is None:
            return None
        return self._ask(username, password)

    async def _ask(self, username: str, password: bytes | None) -> bool | None:
        await asyncio.sleep(0)
        match username:
            case "svc":
                return password == b"token"
            case "down":
                raise AuthUnavailable("service unreachable")
            case "broken":
                raise RuntimeError("bug in the hook")
        return None


class Fallback(Hooks):
    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> bool | None:
        return True if username == "local" else None


@pytest.mark.parametrize(
    ("user", "password", "code", "authenticated"),
    [
        ("svc", b"token", ReasonCode.SUCCESS, True),
        ("svc", b"nope", ReasonCode.NOT_AUTHORIZED, None),
        ("local", None, ReasonCode.SUCCESS, True),  # the async hook said None: the next decides
        ("stranger", None, ReasonCode.SUCCESS, False),  # nobody verified it: accepted, unauthenticated
        ("down", b"x", ReasonCode.SERVER_UNAVAILABLE, None),
        ("broken", b"x", ReasonCode.NOT_AUTHORIZED, None),
    ],
)
async def test_an_async_hook_decides_passes_or_fails(
    user: str, password: bytes | None, code: ReasonCode, authenticated: bool | None
) -> None:
    async with Broker(host="127.0.0.1", port=0, hooks=[ServiceLike(), Fallback()], sys_interval=0) as b:
        c, ack = await RawClient.connect(b.port, "c1", username=user, password=password)
        try:
            assert ack.reason_code is code
            if authenticated is not None:
                assert b.core.sessions["c1"].authenticated is authenticated
            st = b.core.stats
            assert (st.auth_failures, st.refused_auth_busy, st.hook_errors) == (
                int(user == "svc" and code is ReasonCode.NOT_AUTHORIZED),
                int(user == "down"),
                int(user == "broken"),
            )
            assert st.auth_pending == 0
        finally:
            await c.close()


async def test_siftmq_serve_with_only_an_acl_file(tmp_path: Path) -> None:
    """The command line end to end: ``siftmq serve --acl-file`` without a password file logs
    the one line at start, and a client claiming ``admin`` gets no ``secret/#``."""
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    with Serve("--no-bridge", "--no-persistence", "--acl-file", str(acl)) as serve:
        port = await asyncio.to_thread(serve.port)
        c, ack = await RawClient.connect(port, "claims-admin", username="admin")
        try:
            assert ack.reason_code is ReasonCode.SUCCESS
            assert (await c.subscribe("secret/#")).reason_codes == (ReasonCode.NOT_AUTHORIZED,)
        finally:
            await c.close()
        assert await asyncio.to_thread(serve.stop) == 0
    lines = serve.lines
    said = [x for x in lines if "without a password file" in x]
    assert len(said) == 1, lines
    assert "treats every client as anonymous" in said[0]


async def test_stopping_the_broker_while_a_check_runs(tmp_path: Path) -> None:
    """A graceful stop does not wait for a pending password check: the held connection is
    closed without a CONNACK and the check's late outcome is dropped."""
    auth = FileAuth(password_file=slow_passwords(tmp_path / "pw", {"alice": "right"}), workers=1)
    b = Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0)
    await b.start()
    c = await RawClient.open(b.port)
    try:
        c.send(Connect("held", 5, username="alice", password=b"right"))
        await eventually(lambda: b.core.stats.auth_pending == 1, timeout=10.0)
        await asyncio.wait_for(b.stop(), 10.0)
        assert await c.closed(timeout=10.0) == []
        assert b.core.stats.auth_pending == 0
        assert "held" not in b.core.sessions
    finally:
        await c.close()
