"""Outbound bridge benchmark: siftmq's ``[[bridges]]`` vs mosquitto's own bridge, same run.

Run from the repository root (after ``make build``), under the benchmark lock:

    flock /work/bench.lock .venv/bin/python benchmarks/bench_uplink.py [--messages N] [--runs R]

One central mosquitto (persistence on, so the counting subscriber's session survives the
outage) is the remote; a paho subscriber on it (QoS 1) counts
arrivals on ``central/#``.  Two edges are measured in turn against the same central, each
bridging ``bench/#`` out at QoS 1 with the remote prefix ``central/`` over MQTT 5:

* **siftmq**: ``siftmq serve --config`` with one ``[[bridges]]`` table and persistence on
  (``--data-dir``: every message is written to SQLite before its PUBACK);
* **mosquitto**: Debian's mosquitto with a ``connection`` block (persistence off: its queue is
  in memory).

Two measures per edge:

0. **direct**: the same publisher straight to the central (no bridge): the ceiling the
   publisher and subscriber themselves allow;
1. **throughput**: one paho publisher sends N QoS 1 messages to the edge (up to 1000 in flight)
   while the bridge is up; messages/s from the first publish to the N-th arrival at the
   central subscriber;
2. **drain after an outage**: the central is down, N QoS 1 messages are published to the edge
   (all PUBACKed: queued there), the central comes back; seconds from its start to the N-th
   arrival, and whether every message arrived (the store-and-forward promise).

The ratio siftmq / mosquitto of each measure is printed (peers measured in the same run).
"""

from __future__ import annotations

import argparse
import getpass
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {port}")


class Proc:
    def __init__(self, args: list[str], port: int) -> None:
        self.args, self.port = args, port
        self.p: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.p = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def stop(self) -> None:
        if self.p is not None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
            self.p = None


def mosquitto(d: Path, name: str, port: int, extra: str = "", persist: bool = False) -> Proc:
    conf = d / f"{name}.conf"
    keep = f"persistence true\npersistence_location {d}/\n" if persist else "persistence false\n"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\n{keep}user {getpass.getuser()}\n"
        f"max_queued_messages 1000000\nmax_inflight_messages 1000\n{extra}"
    )
    return Proc([MOSQUITTO, "-c", str(conf)], port)


class Counter:
    """A persistent QoS 1 subscriber on the central that counts arrivals."""

    def __init__(self, port: int) -> None:
        self.n = 0
        self.seen: set[bytes] = set()
        self.done = threading.Event()
        self.target = 0
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id="bench-counter", clean_session=False)
        self.c.reconnect_delay_set(1, 1)
        self.c.on_connect = lambda c, *_: c.subscribe("central/#", 1)
        self.c.on_message = self._on
        self.port = port

    def _on(self, _c: object, _u: object, m: paho.MQTTMessage) -> None:
        self.seen.add(bytes(m.payload))
        self.n += 1
        if self.target and len(self.seen) >= self.target:
            self.done.set()

    def expect(self, n: int) -> None:
        self.seen.clear()
        self.n = 0
        self.target = n
        self.done.clear()

    def start(self) -> None:
        self.c.connect("127.0.0.1", self.port, 30)
        self.c.loop_start()

    def stop(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def publish(port: int, n: int, tag: str, prefix: str = "bench/") -> None:
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-pub-{tag}")
    c.max_inflight_messages_set(1000)
    c.max_queued_messages_set(0)
    c.connect("127.0.0.1", port, 60)
    c.loop_start()
    payload = b"x" * 64
    infos = [c.publish(f"{prefix}{i % 10}", f"{tag}-{i}-".encode() + payload, qos=1) for i in range(n)]
    for info in infos:
        info.wait_for_publish(120)
    c.disconnect()
    c.loop_stop()


def siftmq_edge(d: Path, port: int, central: int) -> Proc:
    cfg = d / "edge.toml"
    cfg.write_text(
        "[broker]\nmax_queued_messages = 1000000\nsys_interval = 0\n\n"
        f'[[bridges]]\nname = "central"\nurl = "mqtt://127.0.0.1:{central}"\nbackoff_min = 0.2\n'
        "backoff_max = 1.0\nmax_inflight = 1000\n\n"
        '[[bridges.topics]]\npattern = "bench/#"\nremote_prefix = "central/"\n'
    )
    data = d / "siftmq-data"
    shutil.rmtree(data, ignore_errors=True)
    args = [sys.executable, "-m", "broker._cli", "serve", "--port", str(port), "--data-dir", str(data)]
    return Proc([*args, "--config", str(cfg), "--no-bridge", "--log-level", "WARNING"], port)


def mosquitto_edge(d: Path, port: int, central: int) -> Proc:
    return mosquitto(
        d,
        "edge",
        port,
        f'connection central\naddress 127.0.0.1:{central}\ntopic bench/# out 1 "" central/\n'
        "bridge_protocol_version mqttv50\ncleansession false\nrestart_timeout 1\n"
        "bridge_max_packet_size 0\n",
    )


def measure(name: str, edge: Proc, central: Proc, counter: Counter, n: int) -> tuple[float, float, bool]:
    edge.start()
    time.sleep(1.5)  # the bridge connects (not measured)
    counter.expect(n)
    t0 = time.perf_counter()
    publish(edge.port, n, f"{name}-t")
    ok = counter.done.wait(300)
    rate = n / (time.perf_counter() - t0) if ok else 0.0
    # drain after an outage
    central.stop()
    time.sleep(0.5)
    counter.expect(n)
    publish(edge.port, n, f"{name}-d")
    t1 = time.perf_counter()
    central.start()
    complete = counter.done.wait(300)
    drain = time.perf_counter() - t1
    edge.stop()
    return rate, drain, complete


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        cport = free_port()
        # persistence on at the central: the counter's session (and what reaches it while it
        # reconnects) survives the outage, however fast an edge comes back
        central = mosquitto(d, "central", cport, persist=True)
        central.start()
        counter = Counter(cport)
        counter.start()
        time.sleep(0.5)
        results: dict[str, list[tuple[float, float, bool]]] = {"siftmq": [], "mosquitto": []}
        direct: list[float] = []
        try:
            for _ in range(a.runs):
                counter.expect(a.messages)  # the ceiling: the same publisher straight to the central
                t0 = time.perf_counter()
                publish(cport, a.messages, "direct", "central/")
                assert counter.done.wait(300)
                direct.append(a.messages / (time.perf_counter() - t0))
                for name in ("siftmq", "mosquitto"):
                    eport = free_port()
                    edge = (
                        siftmq_edge(d, eport, cport) if name == "siftmq" else mosquitto_edge(d, eport, cport)
                    )
                    results[name].append(measure(name, edge, central, counter, a.messages))
                    print(name, results[name][-1], flush=True)
        finally:
            counter.stop()
            central.stop()
    print(f"messages per measure: {a.messages}, runs: {a.runs} (median)")
    print(f"direct     throughput {statistics.median(direct):9.0f} msg/s   (publisher -> central, no bridge)")
    med: dict[str, tuple[float, float]] = {}
    for name, rs in results.items():
        rate = statistics.median(r[0] for r in rs)
        drain = statistics.median(r[1] for r in rs)
        med[name] = (rate, drain)
        print(f"{name:10s} throughput {rate:9.0f} msg/s   drain after outage {drain:6.2f} s   "
              f"complete {all(r[2] for r in rs)}")  # fmt: skip
    s, m = med["siftmq"], med["mosquitto"]
    print(f"ratio siftmq/mosquitto: throughput {s[0] / m[0]:.2f}x, drain time {s[1] / m[1]:.2f}x")


if __name__ == "__main__":
    main()
