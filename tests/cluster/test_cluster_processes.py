"""Five real ``siftmq serve`` processes joined into one cluster (issue 17 item 7): paho clients
on different nodes, nodes killed with SIGKILL while QoS 1 traffic flows, a node restarted with
its data directory, a sixth node joining under traffic.  Loopback, ports 0 (a restarted node
asks for the port it had).  Membership refreshed every 0.3 s and a silent peer removed after
2 s (defaults: 2 s and 5 s), so that the kills are noticed within the test in a few seconds
rather than tens of them; the same code paths run."""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from tests.cluster._processes import Node, Sub, T, kill_all, start_joiners
from tests.cluster._processes import eventually as _eventually
from tests.cluster._processes import publish as _publish
from tests.cluster._processes import start as _start
from tests.cluster._processes import sys_value as _sys_value
from tests.cluster._processes import wait_links as _wait_links

SERVE = "cluster_refresh = 0.3\ncluster_failure_timeout = 2.0\n"


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    started: list[Node] = []
    try:
        first = _start(tmp_path / "n0", None, serve=SERVE)
        started.append(first)
        started += start_joiners([tmp_path / f"n{i}" for i in range(1, 5)], first.cluster_port, serve=SERVE)
        yield started
    finally:
        kill_all()


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
        r3 = _start(n3.data, n0.cluster_port, cluster_port=n3.cluster_port, serve=SERVE)
        nodes[3] = r3
        assert r3.node_id == n3.node_id
        _wait_links(r3, 3)
        third = [f"c{i}".encode() for i in range(200)]
        acked3 = _publish(r3.port, "pub-c", "orders/3/paid", third)
        r3.proc.send_signal(signal.SIGKILL)
        r3.proc.wait()
        r3b = _start(n3.data, n0.cluster_port, cluster_port=n3.cluster_port, serve=SERVE)
        nodes[3] = r3b
        _eventually(lambda: far.payloads() >= acked3 and near.payloads() >= acked3, "after node 3's restart")

        # a sixth node joins while node 2 publishes: nothing acknowledged is lost
        result: dict[str, set[bytes]] = {}
        fourth = [f"d{i}".encode() for i in range(600)]
        t = threading.Thread(
            target=lambda: result.update(a=_publish(n2.port, "pub-d", "orders/4/paid", fourth))
        )
        t.start()
        n5 = _start(tmp_path / "n5", n1.cluster_port, serve=SERVE)
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
