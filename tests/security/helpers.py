"""Helpers of the security tests: a throwaway CA and certificates (openssl CLI), raw CONNECT."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

from broker.packets import Connack, Connect, Decoder, Packet, encode

T = 5.0


@dataclass(frozen=True, slots=True)
class Certs:
    """PEM files: a CA, a server certificate for 127.0.0.1/localhost, a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_context(self, with_cert: bool = False, name: str = "client") -> ssl.SSLContext:
        """TLS client context trusting the CA; ``with_cert``: present the ``name`` certificate
        (``client``: CN=alice; ``nocn``: a subject without a common name)."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if with_cert:
            d = self.ca.parent
            ctx.load_cert_chain(str(d / f"{name}.pem"), str(d / f"{name}.key"))
        return ctx


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d: Path) -> Certs:
    """A CA and two leaf certificates (P-256 keys, valid 2 days) made with the openssl CLI."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _run(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=siftmq test CA",
        cwd=d,
    )
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    (d / "nocn.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subject in (("server", "/CN=localhost"), ("client", "/CN=alice"), ("nocn", "/O=siftmq")):
        _run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
        _run(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d,
        )  # fmt: skip
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key")


async def raw_connect(
    port: int, connect: Connect, ssl_ctx: ssl.SSLContext | None = None
) -> tuple[Packet, bool]:
    """Send one CONNECT; the first packet back and whether the broker then closed the socket."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ssl_ctx)
    try:
        writer.write(encode(connect, connect.protocol_level))
        decoder = Decoder(connect.protocol_level, server=False)
        packets: list[Packet] = []
        while not packets:
            data = await asyncio.wait_for(reader.read(65536), T)
            assert data, "connection closed without CONNACK"
            packets = decoder.feed(data)
        closed = False
        if isinstance(packets[0], Connack) and packets[0].reason_code != 0:  # refused: then closed
            closed = await asyncio.wait_for(reader.read(65536), T) == b""
        return packets[0], closed
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
