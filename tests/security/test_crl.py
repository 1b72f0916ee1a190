"""Certificate revocation lists on TLS listeners (issue 39 item 6): a client certificate the
CRL revokes is refused at the handshake (MQTT over TLS and WebSocket over TLS), a valid one
of the same CA still connects.  CA, certificates and CRL are made in the test (openssl CLI)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
from pathlib import Path

import aiomqtt
import pytest

from broker import Broker
from broker._cli import build_parser
from broker._config import BrokerConfig, Listener
from broker.packets import Connect, encode
from tests.security.helpers import Certs, make_certs
from tests.waiting import next_message

_CA_CONFIG = """[ca]
default_ca = CA_default
[CA_default]
database = index.txt
crlnumber = crlnumber
default_md = sha256
default_crl_days = 2
certificate = ca.pem
private_key = ca.key
"""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def revoked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Certs, Path]:
    """Fresh certificates (``client`` = CN=alice, ``nocn``) and a CRL revoking ``client``."""
    d = tmp_path_factory.mktemp("crl")
    certs = make_certs(d)
    (d / "ca.cnf").write_text(_CA_CONFIG)
    (d / "index.txt").write_text("")
    (d / "crlnumber").write_text("01\n")
    _openssl("ca", "-config", "ca.cnf", "-revoke", "client.pem", cwd=d)
    _openssl("ca", "-config", "ca.cnf", "-gencrl", "-out", "crl.pem", cwd=d)
    return certs, d / "crl.pem"


def _listener(certs: Certs, crl: Path, kind: str) -> Listener:
    return Listener(
        kind,  # type: ignore[arg-type]
        "127.0.0.1",
        0,
        str(certs.server_cert),
        str(certs.server_key),
        cafile=str(certs.ca),
        crlfile=str(crl),
        require_client_cert=True,
    )


@pytest.mark.parametrize("kind", ["tcp", "ws"])
async def test_a_revoked_client_certificate_is_refused(revoked: tuple[Certs, Path], kind: str) -> None:
    certs, crl = revoked
    transport = "websockets" if kind == "ws" else "tcp"
    async with Broker(config=BrokerConfig(listeners=(_listener(certs, crl, kind),), sys_interval=0)) as b:
        good = aiomqtt.Client(
            "127.0.0.1",
            b.port,
            identifier="good",
            transport=transport,
            tls_context=certs.client_context(with_cert=True, name="nocn"),
        )
        async with good as c:  # a certificate of the same CA that the CRL does not list
            await c.subscribe("crl/ok", qos=1)
            await c.publish("crl/ok", b"1", qos=1)
            assert (await next_message(c)).payload == b"1"
        # TLS 1.3: the server checks the client certificate after the client's handshake
        # ended, so the refusal shows as an alert or a closed connection on the first read
        bad = certs.client_context(with_cert=True, name="client")
        reader, writer = await asyncio.open_connection("127.0.0.1", b.port, ssl=bad)
        first = b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n" if kind == "ws" else encode(Connect("bad"), 4)
        writer.write(first)
        answer = b"refused"
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            answer = await asyncio.wait_for(reader.read(65536), 5)
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()
        assert answer in (b"", b"refused")  # no CONNACK, no HTTP answer
        assert "bad" not in b.core.sessions


def test_crlfile_needs_cafile_and_has_a_flag(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="crlfile needs cafile"):
        Listener("tcp", "127.0.0.1", 0, "c.pem", "k.pem", crlfile="crl.pem")
    args = build_parser().parse_args(["serve", "--tls-crl", "crl.pem"])
    assert args.tls_crl == "crl.pem"
    assert shutil.which("openssl") is not None
