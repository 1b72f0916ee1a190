"""Five real ``siftmq serve`` processes joined into one cluster (issue 17 item 7): paho clients
on different nodes, nodes killed with SIGKILL while QoS 1 traffic flows, a node restarted with
its data directory, a sixth node joining under traffic.  Loopback, ports 0 (a restarted node
asks for the port it had)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

T = 20.0


@dataclass
class Node:
    proc: subprocess.Popen[str]
    data: Path
    port: int = 0
    cluster_port: int = 0
    node_id: str = ""
    lines: queue.Queue[str] = field(default_factory=queue.Queue)


_ALL: list[Node] = []


def _start(data: Path, join: int | None, cluster_port: int = 0) -> Node:
    data.mkdir(parents=True, exist_ok=True)
    cfg = data.parent / "siftmq.toml"
    cfg.write_text("[broker]\nsys_interval = 0.3\n")
    cmd = [
        sys.executable,
        "-m",
        "broker._cli",
        "serve",
        "--port",
        "0",
        "--data-dir",
        str(data),
        "--config",
        str(cfg),
        "--no-bridge",
        "--log-level",
        "INFO",
        "--cluster-listen",
        f"127.0.0.1:{cluster_port}",
    ]
    if join is not None:
        cmd += ["--join", f"127.0.0.1:{join}"]
    env = {**os.environ, "SIFTMQ_CLUSTER_SECRET": "process-test-secret"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    node = Node(proc, data)
    _ALL.append(node)
    assert proc.stderr is not None
    stderr = proc.stderr
    threading.Thread(target=lambda: [node.lines.put(x) for x in stderr], daemon=True).start()
    deadline = time.monotonic() + T
    while not node.cluster_port:
        line = node.lines.get(timeout=max(0.1, deadline - time.monotonic()))
        if not node.port and (m := re.search(r"listening on 127\.0\.0\.1:(\d+)", line)):
            node.port = int(m.group(1))
        if m := re.search(r"cluster node ([0-9a-f]+) on 127\.0\.0\.1:(\d+)", line):
            node.node_id, node.cluster_port = m.group(1), int(m.group(2))
    return node


def _wait_links(node: Node, count: int) -> None:
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


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    started: list[Node] = []
    try:
        first = _start(tmp_path / "n0", None)
        started.append(first)
        for i in range(1, 5):
            started.append(_start(tmp_path / f"n{i}", first.cluster_port))
        yield started
    finally:
        for n in _ALL:
            if n.proc.poll() is None:
                n.proc.kill()
            n.proc.wait()
            if n.proc.stderr is not None:
                n.proc.stderr.close()
        _ALL.clear()


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


def _publish(port: int, cid: str, topic: str, payloads: list[bytes]) -> set[bytes]:
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


def _eventually(cond: object, what: str) -> None:
    deadline = time.monotonic() + T
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(what)


def _routes_reach(port: int, subs: list[Sub], topic: str) -> None:
    """Publish probes on ``topic`` at ``port`` until every subscriber got one: their
    subscriptions' routes have travelled the links (the probes stay in their payload sets)."""
    deadline = time.monotonic() + T
    k = 0
    while time.monotonic() < deadline:
        k += 1
        _publish(port, f"probe-{k}", topic, [f"probe-{k}".encode()])
        if all(any(p.startswith(b"probe-") for p in s.payloads()) for s in subs):
            return
    raise AssertionError("routes did not reach the publishing node")


def test_five_processes_survive_two_kills_a_restart_and_a_join(nodes: list[Node], tmp_path: Path) -> None:
    n0, n1, n2, n3, n4 = nodes
    for n in nodes:
        _wait_links(n, 4)
    far = Sub(n0.port, "far", "orders/#")
    near = Sub(n1.port, "near", "orders/+/paid")
    try:
        _routes_reach(n2.port, [far, near], "orders/0/paid")
        first = [f"a{i}".encode() for i in range(300)]
        acked = _publish(n2.port, "pub-a", "orders/1/paid", first)
        assert acked == set(first)
        _eventually(lambda: far.payloads() >= acked and near.payloads() >= acked, "before the kills")

        # SIGKILL two nodes that carry no client of this test: delivery goes on
        n4.proc.send_signal(signal.SIGKILL)
        n3.proc.send_signal(signal.SIGKILL)
        second = [f"b{i}".encode() for i in range(300)]
        acked2 = _publish(n2.port, "pub-b", "orders/2/paid", second)
        assert acked2 == set(second)
        _eventually(lambda: far.payloads() >= acked2 and near.payloads() >= acked2, "after the kills")

        # a publisher on node 3 (restarted, same data dir, same ID): acknowledged messages are
        # in its store for the links of nodes 0 and 1, and arrive after a kill -9 and restart
        n3.proc.wait()
        r3 = _start(n3.data, n0.cluster_port, cluster_port=n3.cluster_port)
        nodes[3] = r3
        assert r3.node_id == n3.node_id
        _wait_links(r3, 3)
        third = [f"c{i}".encode() for i in range(200)]
        acked3 = _publish(r3.port, "pub-c", "orders/3/paid", third)
        r3.proc.send_signal(signal.SIGKILL)
        r3.proc.wait()
        r3b = _start(n3.data, n0.cluster_port, cluster_port=n3.cluster_port)
        nodes[3] = r3b
        _eventually(lambda: far.payloads() >= acked3 and near.payloads() >= acked3, "after node 3's restart")

        # a sixth node joins while node 2 publishes: nothing acknowledged is lost
        result: dict[str, set[bytes]] = {}
        fourth = [f"d{i}".encode() for i in range(600)]
        t = threading.Thread(
            target=lambda: result.update(a=_publish(n2.port, "pub-d", "orders/4/paid", fourth))
        )
        t.start()
        n5 = _start(tmp_path / "n5", n1.cluster_port)
        nodes.append(n5)
        t.join(T)
        assert result["a"] == set(fourth)
        _eventually(
            lambda: far.payloads() >= result["a"] and near.payloads() >= result["a"], "during the join"
        )
        _wait_links(n5, 4)  # nodes 0, 1, 2 and the restarted 3
    finally:
        far.close()
        near.close()


def _sys_value(node: Node, topic: str) -> bytes:
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


def test_composite_delivery_continues_after_sigkill_of_its_core(nodes: list[Node]) -> None:
    """Seed 001 live: the composite subscription is kept by its CSSU (3 nearest nodes by XOR);
    SIGKILL of the core (smallest ID) -> re-election -> composite events keep coming."""
    from cluster._groups import group_code
    from cluster._placement import GROUP_NUM
    from composite import canonical

    for n in nodes:
        _wait_links(n, 4)
    expression = "(dock/a | dock/b) & truck/x"
    code = group_code(canonical(expression), GROUP_NUM)
    by_id = {int((n.data / "cluster-node-id").read_text(), 16): n for n in nodes}
    cssu = sorted(sorted(by_id, key=lambda i: i ^ code)[:3])
    core = by_id[cssu[0]]
    others = [n for n in nodes if n is not core]
    access, pub_node = others[0], others[1]
    events: queue.Queue[bytes] = queue.Queue()
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, "watch", protocol=mqtt.MQTTv311)
    sub.on_message = lambda _c, _u, m: events.put(m.payload)
    sub.connect("127.0.0.1", access.port)
    sub.loop_start()
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, "dockpub")
    pub.connect("127.0.0.1", pub_node.port)
    pub.loop_start()
    try:
        sub.subscribe(f"$composite/ship/{expression}", qos=1)
        _eventually(lambda: _sys_value(core, "$SYS/cluster/cssu/core_of") == b"1", "the core matches")

        def event_arrives(deadline: float) -> bool:
            """Publish a pair of atoms every second until a composite event arrives."""
            end = time.monotonic() + deadline
            while time.monotonic() < end:
                pub.publish("dock/b", b'{"p": 1}', qos=1).wait_for_publish(5)
                pub.publish("truck/x", b'{"t": 2}', qos=1).wait_for_publish(5)
                try:
                    events.get(timeout=1.0)
                    return True
                except queue.Empty:
                    pass
            return False

        assert event_arrives(10), "no composite event before the kill"
        core.proc.send_signal(signal.SIGKILL)
        core.proc.wait()
        assert event_arrives(40), "no composite event after the core's SIGKILL"
        alive = [n for n in nodes if n is not core]
        _eventually(
            lambda: sum(int(_sys_value(n, "$SYS/cluster/cssu/core_of")) for n in alive) == 1,
            "one new core among the survivors",
        )
    finally:
        for c in (sub, pub):
            c.loop_stop()
            c.disconnect()
