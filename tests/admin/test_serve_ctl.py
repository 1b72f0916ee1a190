"""``siftmq serve --no-persistence --metrics-listen`` and ``siftmq ctl`` as real processes: a
ban added by ctl lands in ``<data-dir>/bans.json`` (mode 0600) and is in force again after a
restart; a client refused by it gets CONNACK 0x8A (paho, MQTT 5)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from tests.serving import Serve

T = 30.0


def _serve(data: Path) -> tuple[Serve, int, int]:
    """A ``siftmq serve`` process; (it, MQTT port, HTTP port) read from its log."""
    s = Serve(
        *("--sys-interval", "0", "--no-persistence", "--metrics-listen", "127.0.0.1:0"),
        *("--data-dir", str(data), "--no-bridge"),
    )
    return s, s.port(), int(s.wait_for(r"metrics on http://127\.0\.0\.1:(\d+)/metrics")[1])


def _stop(s: Serve) -> None:
    try:
        assert s.stop() == 0
    finally:
        s.close()


def _ctl(http_port: int, *argv: str) -> object:
    out = subprocess.run(
        [sys.executable, "-m", "broker._cli", "ctl", "--url", f"http://127.0.0.1:{http_port}", *argv],
        capture_output=True,
        text=True,
        timeout=T,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _connack(port: int, client_id: str) -> int:
    """The CONNACK reason code a paho MQTT 5 client gets."""
    got: list[int] = []
    done = threading.Event()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)

    def on_connect(client: mqtt.Client, userdata: object, flags: object, rc: object, props: object) -> None:
        got.append(int(rc.value))  # type: ignore[attr-defined]
        done.set()

    c.on_connect = on_connect
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        assert done.wait(T)
    finally:
        c.disconnect()
        c.loop_stop()
    return got[0]


def test_ban_by_ctl_persists_in_the_data_dir_without_a_store(tmp_path: Path) -> None:
    data = tmp_path / "data"
    serve, port, http = _serve(data)
    try:
        assert _connack(port, "spammer") == 0
        _ctl(http, "bans", "add", "--client-id", "spammer", "--reason", "tests")
        assert _connack(port, "spammer") == 0x8A
    finally:
        _stop(serve)
    saved = data / "bans.json"
    assert json.loads(saved.read_text())[0][:2] == ["client_id", "spammer"]
    assert saved.stat().st_mode & 0o777 == 0o600
    assert not (data / "broker.db").exists()
    serve, port, http = _serve(data)
    try:
        assert _connack(port, "spammer") == 0x8A
        assert _connack(port, "neighbour") == 0
        _ctl(http, "bans", "remove", "--client-id", "spammer")
        assert _connack(port, "spammer") == 0
    finally:
        _stop(serve)
