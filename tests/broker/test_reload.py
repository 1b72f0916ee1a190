"""Reload without restart (issue 38, item 4): ``Broker.reload()``, SIGHUP to ``siftmq serve`` and
``siftmq reload``, with real clients (aiomqtt, raw MQTT over TLS) against real brokers (embedded,
and ``siftmq serve`` as a subprocess for the SIGHUP cases)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import shutil
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest
import pytest_asyncio

from broker import Broker
from broker._cli import main
from broker._config import Listener
from broker._metrics import registry_for
from broker.auth import FileAuth
from broker.core._backoff import LoginBackoff
from broker.packets import Connack, Connect, Disconnect, Publish, ReasonCode
from tests.auth.helpers import FAST, write_passwords
from tests.rawclient import RawClient
from tests.security.helpers import make_certs
from tests.serving import Serve
from tests.waiting import eventually, next_message

V5 = aiomqtt.ProtocolVersion.V5
T = 10.0
START = 60.0  # seconds a `siftmq serve` child may take to start on a loaded machine

ACL = "user alice\ntopic readwrite home/alice/#\n"
ACL_MORE = ACL + "topic readwrite extra/#\n"


def code(rc: object) -> int:
    """A SUBACK/CONNACK code as an int (paho gives ints or ReasonCode objects)."""
    return rc if isinstance(rc, int) else int(getattr(rc, "value"))  # noqa: B009


def granted(result: object) -> list[int]:
    assert isinstance(result, list | tuple), result
    return [code(g) for g in result]


# ------------------------------------------------------------------ certificates


@dataclass(frozen=True, slots=True)
class TwoCerts:
    """One CA, two server certificates for 127.0.0.1 (different serials and keys)."""

    ca: Path
    first: tuple[Path, Path]  # (cert, key)
    second: tuple[Path, Path]

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


@pytest.fixture(scope="module")
def two_certs(tmp_path_factory: pytest.TempPathFactory) -> TwoCerts:
    d = tmp_path_factory.mktemp("reload-certs")
    certs = make_certs(d)  # CA, server (CN=localhost, SAN 127.0.0.1), clients
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for args in (
        ("req", *ec, "-keyout", "second.key", "-out", "second.csr", "-subj", "/CN=localhost"),
        ("x509", "-req", "-in", "second.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "second.pem", "-days", "2", "-extfile", "server.ext"),
    ):  # fmt: skip
        subprocess.run(["openssl", *args], cwd=d, capture_output=True, check=True)
    return TwoCerts(certs.ca, (certs.server_cert, certs.server_key), (d / "second.pem", d / "second.key"))


def der(pem: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.read_text())


def fingerprint(cert: bytes) -> str:
    return hashlib.sha256(cert).hexdigest()[:16]


async def tls_stream(
    port: int, ctx: ssl.SSLContext
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A TLS connection (handshake done) and the certificate the server presented (DER)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    cert = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    assert cert is not None
    return reader, writer, cert


async def peer_cert(port: int, ctx: ssl.SSLContext) -> bytes:
    """The certificate a NEW TLS connection to ``port`` is shown (DER)."""
    _, writer, cert = await tls_stream(port, ctx)
    writer.close()
    await writer.wait_closed()
    return cert


def install(src: tuple[Path, Path], dst: tuple[Path, Path]) -> None:
    """Replace the listener's certificate and key files (as certbot and friends do)."""
    for a, b in zip(src, dst, strict=True):
        shutil.copyfile(a, b)


# ------------------------------------------------------------------ embedded broker


def make_auth(d: Path, acl: str = ACL) -> FileAuth:
    pw = write_passwords(d / "passwd", {"alice": "one", "bob": "builder"})
    (d / "acl").write_text(acl)
    return FileAuth(password_file=pw, acl_file=d / "acl", params=FAST)


@pytest_asyncio.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Broker]:
    async with Broker(host="127.0.0.1", port=0, hooks=[make_auth(tmp_path)], sys_interval=0) as b:
        yield b


def alice(b: Broker, ident: str = "alice-1", password: str = "one") -> aiomqtt.Client:
    return aiomqtt.Client(
        "127.0.0.1", b.port, identifier=ident, username="alice", password=password, protocol=V5
    )


async def test_acl_rule_added_applies_to_the_connected_clients_next_subscribe_and_publish(
    secured: Broker, tmp_path: Path
) -> None:
    async with alice(secured) as c, secured.subscribe("#") as everything:
        assert granted(await c.subscribe("extra/#", qos=1)) == [0x87]  # not in the ACL yet
        await c.publish("extra/a", b"refused", qos=1)
        await c.publish("home/alice/b", b"allowed", qos=1)
        m = await everything.get(T)
        assert (m.topic, m.payload) == ("home/alice/b", b"allowed")  # extra/a was not routed

        (tmp_path / "acl").write_text(ACL_MORE)
        result = await secured.reload()
        assert result.ok, result
        assert any("ACL file" in x for x in result.changed)

        # the same connection, its next SUBSCRIBE and PUBLISH
        assert granted(await c.subscribe("extra/#", qos=1)) == [1]
        await c.publish("extra/c", b"now allowed", qos=1)
        m = await everything.get(T)
        assert (m.topic, m.payload) == ("extra/c", b"now allowed")
        got = await next_message(c, T)
        assert (got.topic.value, got.payload) == ("extra/c", b"now allowed")
    assert secured.reload_counters.done == 1


async def test_acl_read_rule_removed_stops_deliveries_to_a_subscribed_client(
    secured: Broker, tmp_path: Path
) -> None:
    """The ACL is asked per delivery ("receive"): a subscription made under the old ACL gets
    nothing the new one refuses, from the first message after the reload."""
    async with alice(secured) as c:
        assert granted(await c.subscribe("home/alice/#", qos=1)) == [1]
        await secured.publish("home/alice/secret/x", b"before", qos=1)
        assert (await next_message(c, T)).payload == b"before"

        (tmp_path / "acl").write_text("user alice\ntopic readwrite home/alice/public/#\n")
        assert (await secured.reload()).ok
        denied = secured.core.stats.receive_denied
        await secured.publish("home/alice/secret/y", b"after", qos=1)
        await secured.publish("home/alice/public/z", b"still", qos=1)
        m = await next_message(c, T)
        assert (m.topic.value, m.payload) == ("home/alice/public/z", b"still")
        assert secured.core.stats.receive_denied == denied + 1


async def test_password_changed_applies_at_the_next_connect_and_connected_clients_stay(
    secured: Broker, tmp_path: Path
) -> None:
    async with alice(secured, "old-session") as old:
        assert granted(await old.subscribe("home/alice/#", qos=1)) == [1]
        write_passwords(tmp_path / "passwd", {"alice": "two", "bob": "builder"})
        assert (await secured.reload()).ok
        with pytest.raises(aiomqtt.MqttCodeError) as refused:
            async with alice(secured, "with-old-password", "one"):
                pass
        assert code(refused.value.rc) in {0x86, 0x87}
        async with alice(secured, "with-new-password", "two") as new:
            await new.publish("home/alice/door", b"open", qos=1)
        m = await next_message(old, T)  # the connection made with the old password still receives
        assert (m.topic.value, m.payload) == ("home/alice/door", b"open")


async def test_dashboard_logins_follow_a_reloaded_password_file(tmp_path: Path) -> None:
    from tests.dashboard import httpclient as http

    auth = make_auth(tmp_path)
    async with Broker(
        host="127.0.0.1",
        port=0,
        hooks=[auth],
        sys_interval=0,
        metrics_listen="127.0.0.1:0",
        dashboard_admins=("alice",),
    ) as b:
        assert b.metrics_port is not None
        assert (await http.get(b.metrics_port, "/api/overview", http.basic("alice", "one"))).status == 200
        write_passwords(tmp_path / "passwd", {"alice": "two"})
        assert (await b.reload()).ok
        assert (await http.get(b.metrics_port, "/api/overview", http.basic("alice", "one"))).status == 401
        assert (await http.get(b.metrics_port, "/api/overview", http.basic("alice", "two"))).status == 200


@pytest.mark.parametrize(
    ("which", "text", "line"),
    [
        ("acl", "user alice\ntopic readwrite home/alice/#\nfrobnicate everything\n", 3),
        ("passwd", None, 2),
    ],
)
async def test_a_file_that_does_not_parse_keeps_the_old_settings_and_logs_one_error_line(
    secured: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture, which: str, text: str | None, line: int
) -> None:
    path = tmp_path / which
    if text is None:  # a password file whose second line is broken, the first one changed
        write_passwords(path, {"alice": "two"})
        path.write_text(path.read_text() + "bob has no colon\n")
        (tmp_path / "acl").write_text(ACL_MORE)  # a good ACL: not taken either (all or nothing)
    else:
        path.write_text(text)
    async with alice(secured) as c:
        assert granted(await c.subscribe("home/alice/#", qos=1)) == [1]
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="broker"):
            result = await secured.reload()
        assert not result.ok
        assert result.error is not None and result.error.startswith(f"{path}:{line}: "), result.error
        errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.getMessage() for r in errors] == [f"reload: {result.error} (old settings kept)"]
        assert [(getattr(r, "event", None), getattr(r, "reason", None)) for r in errors] == [
            ("reload.failed", result.error)  # the JSON log format's keys (broker._logging)
        ]
        assert not [
            r for r in caplog.records if r.getMessage().startswith("reload:") and r.levelno < logging.ERROR
        ]

        # old settings: alice's old password, the old ACL (extra/# still refused)
        async with alice(secured, "again", "one") as again:
            assert granted(await again.subscribe("extra/#")) == [0x87]
        # the connection is still up and served
        await secured.publish("home/alice/x", b"still here", qos=1)
        assert (await next_message(c, T)).payload == b"still here"

    counters = secured.reload_counters
    assert (counters.done, counters.failed) == (0, 1)
    sys_values = secured.core.sys_values(secured.core.clock.monotonic())
    assert sys_values["$SYS/broker/reloads/failed"] == "1"
    assert sys_values["$SYS/broker/reloads/done"] == "0"
    from prometheus_client import generate_latest

    metrics = generate_latest(registry_for(secured.core)).decode()
    assert 'siftmq_reloads_total{reason="failed"} 1.0' in metrics
    assert 'siftmq_reloads_total{reason="done"} 0.0' in metrics


async def test_live_limits_apply_to_new_connections_and_restart_fields_are_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        old, ack = await RawClient.connect(b.port, "old")
        assert ack.properties.maximum_packet_size is None  # the default: no limit announced
        with caplog.at_level(logging.INFO, logger="broker"):
            result = await b.reload(
                b.config.replace(max_packet_size=2000, max_connections=2, max_topic_levels=9)
            )
        assert result.ok, result
        assert result.restart == ("max_topic_levels",)
        assert any(x.startswith("max_packet_size=2000") for x in result.changed)
        records = [r for r in caplog.records if r.getMessage().startswith("reload:")]
        lines = [r.getMessage() for r in records]
        assert len(lines) == 1 and "need a restart: max_topic_levels" in lines[0], lines
        assert getattr(records[0], "event", None) == "reload.done"
        assert b.config.max_topic_levels == 201  # not applied
        assert b.core.config.max_packet_size == 2000

        new, ack = await RawClient.connect(b.port, "new")
        assert ack.properties.maximum_packet_size == 2000  # a new connection gets the new limit
        big = b"x" * 3000
        await old.subscribe("big/#")
        old.send(Publish("big/old", big, qos=0))  # the old connection keeps its limit
        m = await old.recv_where(lambda p: isinstance(p, Publish))
        assert isinstance(m, Publish) and m.payload == big
        new.send(Publish("big/new", big, qos=0))  # the new one refuses a packet beyond it
        tail = await new.closed()
        assert any(isinstance(p, Disconnect) and p.reason_code == ReasonCode.PACKET_TOO_LARGE for p in tail)

        # max_connections applies at once: with "old" open, a second is admitted, a third refused
        limits = b._listeners[0].acceptors[0].limits if b._listeners else None
        assert limits is not None and limits.max_connections == 2
        await eventually(lambda: limits.open == 1, T)  # "new" has been closed
        _, ack = await RawClient.connect(b.port, "second")
        assert ack.reason_code == ReasonCode.SUCCESS
        _, ack = await RawClient.connect(b.port, "third")
        assert ack.reason_code == ReasonCode.QUOTA_EXCEEDED
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


async def test_login_back_off_limits_change_live(secured: Broker) -> None:
    """``auth_failures`` lowered to 1 by a reload: the next failed login from this address
    backs it off, so even the right password is refused at once for ``auth_backoff``."""
    assert (await secured.reload(secured.config.replace(auth_failures=1, auth_backoff=60.0))).ok
    with pytest.raises(aiomqtt.MqttCodeError):
        async with alice(secured, "guess", "wrong"):
            pass
    with pytest.raises(aiomqtt.MqttCodeError):
        async with alice(secured, "right-but-blocked", "one"):
            pass
    assert secured.core.stats.refused_auth_backoff == 1


def test_login_back_off_retune_keeps_running_back_offs_and_cuts_counts() -> None:
    b = LoginBackoff(failures=5, window=60.0, base=10.0, cap=100.0)
    for t in range(5):
        b.failed("a", float(t))  # the fifth starts a back-off of 10 s (until t=14)
    for t in range(3):
        b.failed("b", float(t))  # three failures counted
    b.retune(2, 60.0, 1.0, 100.0)
    b._check()
    assert b.blocked("a", 5.0) == pytest.approx(9.0)  # the running back-off runs to its end
    assert b.failed("b", 5.0) == 1.0  # one more failure now reaches the lowered count
    with pytest.raises(ValueError):
        b.retune(2, 60.0, 10.0, 1.0)


async def test_a_live_limit_of_the_wrong_type_fails_the_reload_and_applies_nothing() -> None:
    """A string where a number belongs, taken live, would break every new connection. The
    configuration's schema refuses it when the config is built (a TOML file too); a config
    forced around the schema is still refused by the reload."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        with pytest.raises(ValueError, match=r'max_inflight = "7": expected an integer 1..65535'):
            b.config.replace(max_packet_size=2000, max_inflight="7")
        bad = b.config.replace(max_packet_size=2000)
        object.__setattr__(bad, "max_inflight", "7")  # around BrokerConfig's check
        result = await b.reload(bad)
        assert not result.ok and result.error == "max_inflight: expected int, found '7'"
        assert (b.core.config.max_packet_size, b.core.config.max_inflight) == (268_435_455, 20)
        _, ack = await RawClient.connect(b.port, "after")  # new connections are served as before
        assert ack.reason_code == ReasonCode.SUCCESS and ack.properties.maximum_packet_size is None
        assert (b.reload_counters.done, b.reload_counters.failed) == (0, 1)
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


@pytest.mark.parametrize("kind", ["tcp", "ws"])
async def test_tls_reload_new_handshakes_see_the_new_certificate_old_connections_keep_theirs(
    two_certs: TwoCerts, tmp_path: Path, kind: str
) -> None:
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    install(two_certs.first, (cert, key))
    listener = Listener(kind, "127.0.0.1", 0, str(cert), str(key))  # type: ignore[arg-type]
    ctx = two_certs.client_context()
    async with Broker(listeners=(Listener("tcp", "127.0.0.1", 0), listener), sys_interval=0) as b:
        port = b.ports[1]
        assert await peer_cert(port, ctx) == der(two_certs.first[0])
        reader, writer, before = await tls_stream(port, ctx)  # handshake done, nothing sent yet

        install(two_certs.second, (cert, key))
        result = await b.reload()
        assert result.ok and "TLS files of 1 listener(s)" in result.changed, result

        got = await peer_cert(port, ctx)
        assert fingerprint(got) == fingerprint(der(two_certs.second[0]))  # a new client: new cert
        assert before == der(two_certs.first[0])
        if kind == "tcp":  # the connection made before the reload is served (with its old cert)
            old = RawClient(reader, writer, 5)
            old.send(Connect("before-reload", protocol_level=5))
            assert isinstance(await old.recv(), Connack)
            await old.subscribe("t/#")
            await b.publish("t/x", b"over the old TLS session")
            m = await old.recv_where(lambda p: isinstance(p, Publish))
            assert isinstance(m, Publish) and m.payload == b"over the old TLS session"
            assert writer.get_extra_info("ssl_object").getpeercert(binary_form=True) == before
        else:
            writer.close()
            await writer.wait_closed()


async def test_tls_reload_with_a_broken_key_keeps_the_old_certificate(
    two_certs: TwoCerts, tmp_path: Path
) -> None:
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    install(two_certs.first, (cert, key))
    listener = Listener("tcp", "127.0.0.1", 0, str(cert), str(key))
    ctx = two_certs.client_context()
    async with Broker(listeners=(listener,), sys_interval=0) as b:
        shutil.copyfile(two_certs.second[0], cert)
        key.write_text("-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n")
        result = await b.reload()
        assert not result.ok and result.error is not None and str(key) in result.error
        assert await peer_cert(b.port, ctx) == der(two_certs.first[0])  # still the old pair
        assert b.reload_counters.failed == 1


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> bytes:
    """A TLS handshake in memory (two SSLObjects over BIOs); the server's certificate (DER)."""
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    done = [False, False]
    for _ in range(10):
        for i, (obj, out, peer_in) in enumerate(((cli, c_out, s_in), (srv, s_out, c_in))):
            try:
                obj.do_handshake()
                done[i] = True
            except ssl.SSLWantReadError:
                pass
            peer_in.write(out.read())
        if all(done):
            break
    cert = cli.getpeercert(binary_form=True)
    assert cert is not None
    return cert


def test_why_new_contexts_an_in_place_load_cert_chain_with_a_bad_key_breaks_the_live_one(
    two_certs: TwoCerts, tmp_path: Path
) -> None:
    """The reason the reload builds new contexts (docs/operations.md, "Reload"): on the context
    in use, ``load_cert_chain`` with a broken key fails after it took the new certificate, and
    every later handshake fails; a failed new context leaves the old one whole."""
    live = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    live.load_cert_chain(*map(str, two_certs.first))
    assert _handshake(live, two_certs.client_context()) == der(two_certs.first[0])
    bad_key = tmp_path / "bad.key"
    bad_key.write_text("-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ssl.SSLError):
        live.load_cert_chain(str(two_certs.second[0]), str(bad_key))
    with pytest.raises(ssl.SSLError):
        _handshake(live, two_certs.client_context())


# ------------------------------------------------------------------ siftmq serve, SIGHUP


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """``siftmq serve`` with a password file, an ACL file, a TLS listener and a config file."""
    (tmp_path / "siftmq.toml").write_text("[broker]\nsys_interval = 0\n")
    write_passwords(tmp_path / "passwd", {"alice": "one"})
    (tmp_path / "acl").write_text(ACL)
    with Serve(
        "--no-bridge", "--config", str(tmp_path / "siftmq.toml"), "--data-dir", str(tmp_path / "data"),
        "--password-file", str(tmp_path / "passwd"), "--acl-file", str(tmp_path / "acl"),
        "--tls-port", "0", "--tls-cert", str(tmp_path / "server.pem"),
        "--tls-key", str(tmp_path / "server.key"),
    ) as s:  # fmt: skip
        yield s


@pytest.fixture
def serve_certs(two_certs: TwoCerts, tmp_path: Path) -> Iterator[TwoCerts]:
    install(two_certs.first, (tmp_path / "server.pem", tmp_path / "server.key"))
    yield two_certs


async def sighup(data: Path) -> None:
    """``siftmq reload --data-dir DATA`` (the pid file ``siftmq serve`` wrote there)."""
    await eventually((data / "siftmq.pid").exists, START)
    assert await asyncio.to_thread(main, ["reload", "--data-dir", str(data)]) == 0


async def test_sighup_reloads_passwords_acl_and_limits_of_siftmq_serve(
    serve_certs: TwoCerts, serve: Serve, tmp_path: Path
) -> None:
    port = int((await serve.line(r"listening on 127\.0\.0\.1:(\d+) \(tcp\)", timeout=START))[1])
    data = tmp_path / "data"

    def client(ident: str, password: str) -> aiomqtt.Client:
        return aiomqtt.Client(
            "127.0.0.1", port, identifier=ident, username="alice", password=password, protocol=V5
        )

    async with client("connected", "one") as c:
        assert granted(await c.subscribe("home/alice/#", qos=1)) == [1]
        assert granted(await c.subscribe("extra/#", qos=1)) == [0x87]

        write_passwords(tmp_path / "passwd", {"alice": "two"})
        (tmp_path / "acl").write_text(ACL_MORE)
        (tmp_path / "siftmq.toml").write_text(
            "[broker]\nsys_interval = 0\nmax_inflight = 7\nmax_topic_levels = 9\n"
        )
        mark = len(serve.lines)
        await sighup(data)
        assert (data / "siftmq.pid").stat().st_mode & 0o777 == 0o600  # private, as the data dir's files
        done = await serve.line(r"INFO +broker: reload: (.*)", mark)
        assert "password file" in done[1] and "ACL file" in done[1] and "max_inflight=7" in done[1]
        assert "need a restart: max_topic_levels" in done[1]

        with pytest.raises(aiomqtt.MqttCodeError) as refused:  # the old password, a new CONNECT
            async with client("old-password", "one"):
                pass
        assert code(refused.value.rc) in {0x86, 0x87}
        async with client("new-password", "two") as new:
            await new.publish("home/alice/door", b"open", qos=1)
        m = await next_message(c, T)  # connected before the reload, still receiving
        assert (m.topic.value, m.payload) == ("home/alice/door", b"open")
        assert granted(await c.subscribe("extra/#", qos=1)) == [1]  # the added rule, same connection

        # a broken ACL: one error line with file:line, old settings kept, connection up
        (tmp_path / "acl").write_text("user alice\ntopic readwrite home/alice/#\nbogus line\n")
        mark = len(serve.lines)
        await sighup(data)
        await serve.line(rf"ERROR +broker: reload: {re.escape(str(tmp_path / 'acl'))}:3: ", mark)
        await c.publish("extra/after", b"still allowed", qos=1)
        m = await next_message(c, T)
        assert (m.topic.value, m.payload) == ("extra/after", b"still allowed")
        complaints = [x for x in serve.lines[mark:] if re.search(r" (ERROR|WARNING) ", x)]
        assert len(complaints) == 1, complaints

        # a configuration file that is not TOML: file:line too, nothing applied (not the new
        # ACL either, which would refuse extra/#)
        (tmp_path / "acl").write_text(ACL)
        (tmp_path / "siftmq.toml").write_text("[broker]\nsys_interval = 0\nmax_inflight 8\n")
        mark = len(serve.lines)
        await sighup(data)
        toml = re.escape(str(tmp_path / "siftmq.toml"))
        await serve.line(rf"ERROR +broker: reload: {toml}:3: Expected '=' after a key", mark)
        assert granted(await c.subscribe("extra/#", qos=1)) == [1]
    assert serve.proc.poll() is None
    assert await asyncio.to_thread(serve.stop) == 0
    assert not (data / "siftmq.pid").exists()  # removed at a clean stop


async def test_sighup_replaces_the_tls_certificate_of_siftmq_serve(
    serve_certs: TwoCerts, serve: Serve, tmp_path: Path
) -> None:
    port = int((await serve.line(r"listening on 127\.0\.0\.1:(\d+) \(tcp\+tls\)", timeout=START))[1])
    ctx = serve_certs.client_context()
    async with aiomqtt.Client(
        "127.0.0.1", port, identifier="tls-old", username="alice", password="one", tls_context=ctx
    ) as old:
        assert await peer_cert(port, ctx) == der(serve_certs.first[0])
        assert granted(await old.subscribe("home/alice/#", qos=1)) == [1]

        install(serve_certs.second, (tmp_path / "server.pem", tmp_path / "server.key"))
        mark = len(serve.lines)
        await sighup(tmp_path / "data")
        await serve.line(r"reload: .*TLS files of 1 listener", mark)

        assert await peer_cert(port, ctx) == der(serve_certs.second[0])  # new handshakes
        async with aiomqtt.Client(
            "127.0.0.1", port, identifier="tls-new", username="alice", password="one", tls_context=ctx
        ) as new:
            await new.publish("home/alice/tls", b"from the new certificate's side", qos=1)
        m = await next_message(old, T)  # the old TLS connection is still served
        assert m.payload == b"from the new certificate's side"


def test_siftmq_reload_without_a_running_broker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reload", "--data-dir", str(tmp_path)]) == 2
    assert "siftmq.pid" in capsys.readouterr().err
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    (tmp_path / "siftmq.pid").write_text(gone.stdout)
    assert main(["reload", "--data-dir", str(tmp_path)]) == 1  # a stale pid file
    assert "stale" in capsys.readouterr().err


@pytest.mark.parametrize("pid", ["0", "-1", "x"])
def test_siftmq_reload_refuses_a_pid_that_is_not_one_process(
    pid: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # 0 and -1 would send SIGHUP to the process group / every process of the user
    with pytest.raises(SystemExit) as exited:
        main(["reload", "--pid", pid])
    assert exited.value.code == 2
    assert "siftmq reload: --pid: invalid process id value" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process start times from /proc")
def test_siftmq_reload_does_not_signal_a_process_newer_than_the_pid_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pid_file = tmp_path / "siftmq.pid"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pid_file.write_text(f"{other.pid}\n")
        os.utime(pid_file, (1, 1))  # written long ago: the pid now names a newer process
        assert main(["reload", "--pid-file", str(pid_file)]) == 1
        assert "stale pid file" in capsys.readouterr().err
        # not sent SIGHUP, which would end it (a signal lands at once, but poll() right after
        # the send could still see the process: a second for it to go, which it must not)
        with pytest.raises(subprocess.TimeoutExpired):
            other.wait(timeout=1.0)
    finally:
        other.kill()
        other.wait()
