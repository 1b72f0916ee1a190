"""``siftmq passwd`` then ``siftmq serve`` (subprocesses) with paho clients: passwords, anonymous
clients, TLS and WebSocket listeners from the command line."""

from __future__ import annotations

import queue
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTProtocolVersion

from tests.security.helpers import Certs, T
from tests.serving import CLI, Serve

LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+) \((\S+)\)")


@contextmanager
def serve(*flags: str) -> Iterator[dict[str, int]]:
    """Run ``siftmq serve --port 0 ...`` (on uvloop, which the light broker runs on only with
    ``--uvloop``: its own TLS is tested here, the other tests run asyncio's); yields {"tcp":
    port, "tcp+tls": port, "ws": port, ...}."""
    listeners = 1 + sum(f.endswith("-port") for f in flags)
    with Serve("--no-bridge", "--no-persistence", "--uvloop", *flags) as s:
        ports: dict[str, int] = {}

        def listening(line: str) -> bool:
            if found := LISTENING.search(line):
                ports[found.group(2)] = int(found.group(1))
            return len(ports) == listeners

        s.wait_line(listening, timeout=T, what=f"{listeners} listeners")
        yield ports
        assert s.stop(T) == 0


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], check=False, capture_output=True, text=True)


def try_connect(port: int, version: int = 5, transport: str = "tcp", tls: Any = None, **login: str) -> int:
    """CONNECT with paho; the CONNACK reason code (0 = accepted), after a pub/sub round trip."""
    proto = MQTTProtocolVersion.MQTTv5 if version == 5 else MQTTProtocolVersion.MQTTv311
    c = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, f"cli-{port}-{version}", protocol=proto, transport=transport
    )  # type: ignore[arg-type]
    if tls is not None:
        c.tls_set_context(tls)
    if login:
        c.username_pw_set(login["username"], login.get("password"))
    acks: queue.Queue[int] = queue.Queue()
    got: queue.Queue[bytes] = queue.Queue()
    c.on_connect = lambda _c, _u, _f, rc, _p: acks.put(rc.value)
    c.on_message = lambda _c, _u, m: got.put(m.payload)
    c.on_subscribe = lambda _c, _u, _m, _rc, _p: c.publish("cli/x", b"ok", qos=1)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        rc = acks.get(timeout=T)
        if rc == 0:
            c.subscribe("cli/x", qos=1)
            assert got.get(timeout=T) == b"ok"
        return rc
    finally:
        c.disconnect()
        c.loop_stop()


def test_passwd_then_serve_with_passwords(tmp_path: Path, certs: Certs) -> None:
    pw = tmp_path / "passwd.txt"
    r = run("passwd", "-c", "-b", str(pw), "alice", "wonderland")
    assert r.returncode == 0, r.stderr
    assert pw.read_text().startswith("alice:$scrypt$")
    r = run("passwd", "-b", str(pw), "bob")
    assert r.returncode == 2 and "-b needs a PASSWORD" in r.stderr

    tls_flags = ("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key))
    with serve(
        "--password-file", str(pw), "--no-allow-anonymous", "--tls-port", "0", "--ws-port", "0", *tls_flags
    ) as ports:
        assert set(ports) == {"tcp", "tcp+tls", "ws"}
        for version in (4, 5):
            assert try_connect(ports["tcp"], version, username="alice", password="wonderland") == 0
            assert try_connect(ports["tcp"], version, username="alice", password="wrong") == 135
            assert try_connect(ports["tcp"], version) == 135  # anonymous, even on loopback
        ctx = certs.client_context()
        assert try_connect(ports["tcp+tls"], 5, tls=ctx, username="alice", password="wonderland") == 0
        assert (
            try_connect(ports["ws"], 4, transport="websockets", username="alice", password="wonderland") == 0
        )
        assert try_connect(ports["ws"], 5, transport="websockets") == 135


def test_anonymous_default_is_loopback_only(tmp_path: Path) -> None:
    pw = tmp_path / "passwd.txt"
    r = run("passwd", "-c", "-b", str(pw), "alice", "pw")
    assert r.returncode == 0, r.stderr
    with serve("--password-file", str(pw)) as ports:
        assert try_connect(ports["tcp"], 5) == 0  # loopback listener: anonymous allowed
        assert try_connect(ports["tcp"], 4, username="alice", password="nope") == 135
    r = run("serve", "--tls-port", "0", "--no-bridge")
    assert r.returncode == 2 and "--tls-cert" in r.stderr
