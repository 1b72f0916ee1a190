"""Issue 39, item 1: a new-style hook (``authenticate_request``) receives the whole
:class:`~broker.hooks.AuthRequest` -- peer address, listener, protocol version, the TLS client
certificate -- while an old-style ``authenticate`` hook beside it keeps its three arguments.
Real brokers on port 0 (a TLS listener with a throwaway CA, tests/security/helpers.py) and
real clients (aiomqtt over TLS, raw MQTT 3.1.1)."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiomqtt
import pytest

from broker import Broker
from broker._config import BrokerConfig, Listener
from broker.hooks import AuthRequest, AuthVerdict, Hooks
from broker.packets import ReasonCode
from tests.rawclient import RawClient
from tests.security.helpers import Certs, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


class Recorder(Hooks):
    """New style: keeps each request; allows only a client certificate's CN=alice, or a
    plain-TCP client named ``plain``."""

    def __init__(self) -> None:
        self.requests: list[AuthRequest] = []

    def authenticate_request(self, request: AuthRequest) -> AuthVerdict:
        self.requests.append(request)
        if request.certificate_subject is not None:
            return request.certificate_subject == "CN=alice"
        return request.username == "plain" or None


class OldStyle(Hooks):
    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, bytes | None]] = []

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> bool | None:
        self.calls.append((client_id, username, password))
        return username == "old"


async def test_new_style_hook_gets_address_listener_protocol_and_certificate(certs: Certs) -> None:
    tls = Listener(
        "tcp", "127.0.0.1", 0, str(certs.server_cert), str(certs.server_key),
        cafile=str(certs.ca), require_client_cert=True,
    )  # fmt: skip
    plain = Listener("tcp", "127.0.0.1", 0)
    new, old = Recorder(), OldStyle()
    cfg = BrokerConfig(listeners=(tls, plain), sys_interval=0)
    async with Broker(config=cfg, hooks=[new, old]) as b:
        tls_port, plain_port = b.ports
        ctx = certs.client_context(with_cert=True)
        async with aiomqtt.Client(
            "127.0.0.1", tls_port, identifier="tls-1", protocol=aiomqtt.ProtocolVersion.V5,
            tls_context=ctx, username="claims-bob", password="pw",
        ):  # fmt: skip
            pass
        (r,) = new.requests
        assert (r.client_id, r.username, r.password) == ("tls-1", "claims-bob", b"pw")
        assert r.address == "127.0.0.1" and isinstance(r.peer, tuple)
        assert (r.listener, r.listener_port, r.protocol_version) == (f"127.0.0.1:{tls_port}", tls_port, 5)
        assert r.certificate_subject == "CN=alice" and not r.identity
        assert r.certificate is not None and r.certificate["subject"] == ((("commonName", "alice"),),)
        assert r.certificate_der is not None
        assert ssl.DER_cert_to_PEM_cert(r.certificate_der).strip() == certs.client_cert.read_text().strip()
        assert old.calls == []  # the new-style hook decided
        # plain TCP, MQTT 3.1.1: no certificate; the old-style hook decides what the new one
        # has no opinion on, with its three arguments
        c, ack = await RawClient.connect(plain_port, "old-1", 4, username="old", password=b"x")
        await c.close()
        assert ack.reason_code is ReasonCode.SUCCESS
        r = new.requests[-1]
        assert (r.listener_port, r.protocol_version, r.certificate, r.certificate_subject) == (
            plain_port, 4, None, None,
        )  # fmt: skip
        assert old.calls == [("old-1", "old", b"x")]
        c, ack = await RawClient.connect(plain_port, "p-1", 5, username="plain")
        await c.close()
        assert ack.reason_code is ReasonCode.SUCCESS and len(old.calls) == 1
        assert b.core.sessions["p-1"].authenticated


def test_auth_request_is_frozen(tmp_path: Path) -> None:
    r = AuthRequest("c", None, None, None, None, "", None, 5)
    with pytest.raises(AttributeError):
        r.username = "x"  # type: ignore[misc]


async def test_http_auth_sends_the_certificate_subject(certs: Certs) -> None:
    """HttpAuth's body carries what the TLS listener verified: the subject and its CN."""
    from broker.authn import HttpAuth
    from tests.auth.authservice import auth_service

    tls = Listener(
        "tcp", "127.0.0.1", 0, str(certs.server_cert), str(certs.server_key),
        cafile=str(certs.ca), require_client_cert=True,
    )  # fmt: skip
    with auth_service() as svc:
        cfg = BrokerConfig(listeners=(tls,), sys_interval=0)
        async with Broker(config=cfg, hooks=[HttpAuth(svc.url)]) as b:
            port = b.port
            ctx = certs.client_context(with_cert=True)
            async with aiomqtt.Client(
                "127.0.0.1", b.port, identifier="tls-2", protocol=aiomqtt.ProtocolVersion.V311,
                tls_context=ctx, username="alice", password="pw",
            ):  # fmt: skip
                pass
        (body,) = svc.bodies
        assert (body["cert_subject"], body["cert_common_name"]) == ("CN=alice", "alice")
        assert (body["listener_port"], body["protocol"], body["clientid"]) == (port, 4, "tls-2")
