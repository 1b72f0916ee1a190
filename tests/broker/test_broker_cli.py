"""``siftmq serve`` as a subprocess: port 0, a paho client through it, SIGTERM stops it cleanly."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from broker._cli import main
from tests.serving import Serve

T = 10.0


def test_help_lists_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = capsys.readouterr().out
    for flag in ("--config", "--data-dir", "--no-bridge", "--no-partial-unsubscribe", "--max-queued"):
        assert flag in help_text


def test_bad_config_is_reported(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[broker]\nno_such_option = 1\n")
    assert main(["serve", "--config", str(cfg), "--no-bridge"]) == 2


def test_unknown_serve_key_and_bad_roll_interval_are_reported(tmp_path: Path) -> None:
    cfg = tmp_path / "typo.toml"
    cfg.write_text('[serve]\ndata_dri = "x"\n')
    assert main(["serve", "--config", str(cfg), "--no-bridge"]) == 2
    assert main(["serve", "--bridge-roll-interval", "-1", "--no-bridge"]) == 2


def test_serve_subprocess(tmp_path: Path) -> None:
    cfg = tmp_path / "siftmq.toml"
    cfg.write_text('[broker]\nsys_interval = 0\nmax_inflight = 10\n\n[serve]\nlog_level = "INFO"\n')
    with Serve("--config", str(cfg), "--data-dir", str(tmp_path / "data"), "--no-bridge") as serve:
        port = serve.port()
        got: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        subscribed = threading.Event()
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, "cli-test")
        c.on_message = lambda _c, _u, m: got.put(m)
        c.on_subscribe = lambda *a: subscribed.set()
        c.connect("127.0.0.1", port)
        c.loop_start()
        c.subscribe("cli/#", qos=1)
        assert subscribed.wait(T)
        c.publish("cli/x", b"through serve", qos=1)
        m = got.get(timeout=T)
        assert (m.topic, m.payload) == ("cli/x", b"through serve")
        c.disconnect()
        c.loop_stop()
        mark = len(serve.lines)
        assert serve.stop(T) == 0
        assert any("stopped" in x for x in serve.lines[mark:])
