"""Helpers of the cluster tests that run real ``siftmq serve`` processes (loopback, ports 0;
a restarted node asks for the cluster port it had): start, wait for links, read ``$SYS``,
publish and subscribe with paho."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt

from tests.serving import Serve

T = 20.0


@dataclass
class Node:
    serve: Serve
    data: Path
    port: int = 0
    cluster_port: int = 0
    node_id: str = ""

    @property
    def proc(self) -> subprocess.Popen[str]:
        return self.serve.proc

    @property
    def lines(self) -> list[str]:
        """Its log so far."""
        return self.serve.lines


_ALL: list[Node] = []


def start(data: Path, join: int | None, cluster_port: int = 0, serve: str = "", broker: str = "") -> Node:
    """A ``siftmq serve`` process with its store and node ID in ``data``, joining through the
    cluster port ``join``; ``serve`` and ``broker``: more ``[serve]`` and ``[broker]`` lines of
    its TOML configuration. Returns once it listens (MQTT and cluster ports known)."""
    return _ready(_launch(data, join, cluster_port, serve, broker))


def start_joiners(datas: list[Path], join: int, serve: str = "", broker: str = "") -> list[Node]:
    """:func:`start` for several nodes joining through ``join``, launched side by side (a
    process start is about a second of interpreter start-up and imports, mostly waiting on
    the other core) and returned once each listens."""
    return [_ready(node) for node in [_launch(d, join, 0, serve, broker) for d in datas]]


def _launch(data: Path, join: int | None, cluster_port: int, serve: str, broker: str) -> Node:
    data.mkdir(parents=True, exist_ok=True)
    cfg = data.parent / f"{data.name}.toml"
    cfg.write_text(f"[broker]\nsys_interval = 0.3\n{broker}\n[serve]\n{serve}\n")
    flags = ["--data-dir", str(data), "--config", str(cfg), "--no-bridge", "--log-level", "INFO"]
    flags += ["--cluster-listen", f"127.0.0.1:{cluster_port}"]
    if join is not None:
        flags += ["--join", f"127.0.0.1:{join}"]
    node = Node(Serve(*flags, env={"SIFTMQ_CLUSTER_SECRET": "process-test-secret"}), data)
    _ALL.append(node)
    return node


def _ready(node: Node) -> Node:
    """``node`` once its log said which MQTT and cluster ports it listens on."""
    node.port = node.serve.port()
    m = node.serve.wait_for(r"cluster node ([0-9a-f]+) on 127\.0\.0\.1:(\d+)", timeout=T)
    node.node_id, node.cluster_port = m.group(1), int(m.group(2))
    return node


def kill_all() -> None:
    """Every process started by :func:`start` is killed (a stopped one is continued first)."""
    for n in _ALL:
        n.serve.close()
    _ALL.clear()


def sys_value(node: Node, topic: str) -> bytes:
    """The current value of a retained ``$SYS`` topic of ``node``."""
    got: queue.Queue[bytes] = queue.Queue()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, f"sys-{node.port}-{time.monotonic_ns()}")
    c.on_message = lambda _c, _u, m: got.put(m.payload)
    c.connect("127.0.0.1", node.port)
    c.loop_start()
    try:
        c.subscribe(topic)
        return got.get(timeout=5)
    finally:
        c.loop_stop()
        c.disconnect()


def wait_links(node: Node, count: int) -> None:
    """Until ``node`` says ``count`` of its links are up (its $SYS/cluster/links/up)."""
    got: queue.Queue[bytes] = queue.Queue()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, f"probe-{node.port}", protocol=mqtt.MQTTv5)
    c.on_message = lambda _c, _u, m: got.put(m.payload)
    c.connect("127.0.0.1", node.port)
    c.loop_start()
    try:
        deadline = time.monotonic() + T
        while time.monotonic() < deadline:
            c.subscribe("$SYS/cluster/links/up")
            try:
                if int(got.get(timeout=0.5)) == count:
                    return
            except queue.Empty:
                pass
            c.unsubscribe("$SYS/cluster/links/up")
        raise AssertionError(f"node {node.port}: {count} links never up")
    finally:
        c.loop_stop()
        c.disconnect()


def eventually(cond: Callable[[], bool], what: str, timeout: float = T) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(what)


class Sub:
    """A paho subscriber collecting payloads (persistent session, QoS 1)."""

    def __init__(self, port: int, cid: str, topic: str) -> None:
        self.got: list[bytes] = []
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, cid, protocol=mqtt.MQTTv5)
        self.c.on_message = self._on
        self.c.on_subscribe = lambda *a: self.ready.set()
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        self.c.subscribe(topic, qos=1)
        assert self.ready.wait(T)

    def _on(self, _c: object, _u: object, m: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.got.append(m.payload)

    def payloads(self) -> set[bytes]:
        with self.lock:
            return set(self.got)

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def publish(port: int, cid: str, topic: str, payloads: list[bytes]) -> set[bytes]:
    """QoS 1 publish; the payloads the broker acknowledged."""
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, cid, protocol=mqtt.MQTTv5)
    c.max_inflight_messages_set(32)
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        infos = [(p, c.publish(topic, p, qos=1)) for p in payloads]
        acked = set()
        for p, info in infos:
            info.wait_for_publish(T)
            if info.is_published():
                acked.add(p)
        return acked
    finally:
        c.loop_stop()
        c.disconnect()


def sys_values(node: Node, topic_filter: str, count: int) -> dict[str, bytes]:
    """The ``count`` retained ``$SYS`` values under ``topic_filter`` of ``node`` (one
    publication of them: they are sent together on SUBSCRIBE)."""
    got: dict[str, bytes] = {}
    full = threading.Event()

    def on_message(_c: object, _u: object, m: mqtt.MQTTMessage) -> None:
        got[m.topic] = m.payload
        if len(got) >= count:
            full.set()

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, f"sys-{node.port}-{time.monotonic_ns()}")
    c.on_message = on_message
    c.connect("127.0.0.1", node.port)
    c.loop_start()
    try:
        c.subscribe(topic_filter)
        assert full.wait(5), f"{topic_filter}: {sorted(got)}"
        return dict(got)
    finally:
        c.loop_stop()
        c.disconnect()
