"""Outbound bridges in real ``siftmq serve`` processes (issue 40, items 2 and 5).

* The bridge's queue survives ``kill -9`` of the local broker: N QoS 1 messages are
  published (and PUBACKed) while the remote mosquitto is down, the broker is killed with
  SIGKILL and started again on the same ``--data-dir``, mosquitto comes back, and all N
  reach the remote subscriber in order.
* A ``[[bridges]]`` table that does not parse stops ``siftmq serve`` at load time with exit
  status 2 and a message naming the value (``bridges[0].topics[1].pattern``).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.serving import CLI, Serve
from tests.uplink._remote import MOSQUITTO, Collector, Mosquitto
from tests.uplink.test_uplink_mosquitto import in_order

pytestmark = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (make installs it)")

LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+) \(tcp\)")


def _serve(cfg: Path, data: Path, until: str = "") -> tuple[Serve, int]:
    """Start ``siftmq serve`` (its log also in ``serve.log``); return once it listens and then
    logged a line holding ``until``."""
    flags = ("--data-dir", str(data), "--config", str(cfg), "--no-bridge", "--log-level", "INFO")
    edge = Serve(*flags, log=data.parent / "serve.log")
    try:
        port = edge.port()
        edge.wait_line(lambda line: until in line, edge.wait_line(LISTENING.search), what=repr(until))
    except BaseException:
        edge.close()
        raise
    return edge, port


def _publish(port: int, n: int) -> None:
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id="edge-pub")
    c.connect("127.0.0.1", port)
    c.loop_start()
    infos = [c.publish(f"sensors/{i % 3}", str(i).encode(), qos=1) for i in range(n)]
    for info in infos:
        info.wait_for_publish(30)  # PUBACKed: in the broker's store
        assert info.is_published()
    c.disconnect()
    c.loop_stop()


def _wait(condition: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_queue_survives_kill_9_of_the_local_broker(tmp_path: Path) -> None:
    remote = Mosquitto(tmp_path)
    remote.start()
    collector = Collector(remote.port, "central/#", v5=False)
    collector.start()  # its persistent session at mosquitto outlives the outage
    remote.stop()
    cfg = tmp_path / "edge.toml"
    cfg.write_text(
        "[broker]\nmax_queued_messages = 100000\nsys_interval = 0\n\n"
        f'[[bridges]]\nname = "central"\nurl = "mqtt://127.0.0.1:{remote.port}"\n'
        "backoff_min = 0.05\nbackoff_max = 0.5\n\n"
        '[[bridges.topics]]\npattern = "sensors/#"\ndirection = "out"\nremote_prefix = "central/"\n'
    )
    data = tmp_path / "data"
    n = 300
    # the bridge's first attempt comes after its local session exists (made at the first start)
    edge, port = _serve(cfg, data, until="bridge central: mqtt://")
    try:
        _publish(port, n)
        edge.close()  # SIGKILL
        edge, port = _serve(cfg, data)
        remote.start()
        _wait(lambda: len({p for _, p, _ in collector.messages()}) == n, 60)
        got = collector.messages()
        for k in range(3):
            assert in_order(got, f"central/sensors/{k}") == list(range(k, n, 3))
    finally:
        edge.close()
        collector.stop()
        remote.stop()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            '[[bridges]]\nname = "c"\nurl = "mqtt://127.0.0.1:1"\n[[bridges.topics]]\npattern = "a/#"\n'
            '[[bridges.topics]]\npattern = "a/#/b"\n',
            "bridges[0].topics[1].pattern: 'a/#/b'",
        ),
        (
            '[[bridges]]\nname = "c"\nurl = "smtp://x"\n[[bridges.topics]]\npattern = "a/#"\n',
            "bridges[0].url: 'smtp://x': the scheme must be",
        ),
        (
            '[[bridges]]\nname = "c"\nurl = "mqtt://h:1"\n[[bridges.topics]]\npattern = "a"\n'
            'direction = "up"\n',
            'bridges[0].topics[0].direction: "out", "in" or "both" expected',
        ),
        (
            '[[bridges]]\nname = "c"\nurl = "mqtt://h:1"\n[[bridges.topics]]\npattern = "a"\n'
            'filter = "temp >"\n',
            "bridges[0].topics[0].filter: 'temp >'",
        ),
    ],
)
def test_a_bad_bridge_table_stops_serve_with_status_2(tmp_path: Path, table: str, message: str) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(table)
    cmd = [*CLI, "serve", "--port", "0", "--data-dir", str(tmp_path / "d")]
    cmd += ["--config", str(cfg), "--no-bridge"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert f"siftmq serve: {cfg}: {message}" in done.stderr


def test_kill_9_of_the_local_broker_in_the_middle_of_a_stream(tmp_path: Path) -> None:
    """The remote is up and the bridge forwarding when the edge is SIGKILLed: every message
    the publisher had a PUBACK for arrives after the edge's restart, in order per topic."""
    remote = Mosquitto(tmp_path)
    remote.start()
    collector = Collector(remote.port, "central/#", v5=False)
    collector.start()
    cfg = tmp_path / "edge.toml"
    cfg.write_text(
        "[broker]\nmax_queued_messages = 100000\nsys_interval = 0\n\n"
        f'[[bridges]]\nname = "central"\nurl = "mqtt://127.0.0.1:{remote.port}"\n'
        "backoff_min = 0.05\nbackoff_max = 0.5\n\n"
        '[[bridges.topics]]\npattern = "sensors/#"\nremote_prefix = "central/"\n'
    )
    data = tmp_path / "data"
    edge, port = _serve(cfg, data, until="bridge central: connected")
    pub = paho.Client(CallbackAPIVersion.VERSION2, client_id="edge-pub")
    acked: list[int] = []
    pub.on_publish = lambda _c, _u, mid, _rc, _p: acked.append(mid)
    try:
        pub.connect("127.0.0.1", port)
        pub.loop_start()
        mids = {pub.publish(f"sensors/{i % 3}", str(i).encode(), qos=1).mid: i for i in range(2000)}
        _wait(lambda: len(collector.messages()) >= 100, 30)
        edge.close()  # SIGKILL, mid-stream: some acknowledged, some not
        pub.loop_stop()
        sent = sorted(mids[m] for m in list(acked))
        assert sent, "no PUBACK before the kill"
        edge, port = _serve(cfg, data)
        want = set(sent)
        _wait(lambda: want <= {int(p) for _, p, _ in collector.messages()}, 60)
        got = collector.messages()
        for k in range(3):
            seq = in_order(got, f"central/sensors/{k}")
            assert seq == sorted(seq)
            assert {s for s in sent if s % 3 == k} <= set(seq)
    finally:
        edge.close()
        collector.stop()
        remote.stop()
