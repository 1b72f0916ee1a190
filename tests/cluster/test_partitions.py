"""Findings 1, 2 and 4 of issue 30 on real ``siftmq serve`` processes (loopback, ports 0): a
node that stops answering (SIGSTOP: its link sessions stay connected and stop reading, as
across a partition) must neither make its peers drop acknowledged messages for it, nor pace
their publishers beyond the failure timeout, nor keep a shared group's messages while another
member is reachable.  The same under real partitions: tests/nemesis."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.cluster._processes import (
    Node,
    T,
    eventually,
    kill_all,
    publish,
    start,
    start_joiners,
    sys_value,
    wait_links,
)

SERVE = "cluster_refresh = 0.3\ncluster_failure_timeout = 1.0\n"


class _Sub:
    """A persistent QoS 1 subscriber (session expiry 300 s) collecting payloads."""

    def __init__(self, port: int, cid: str, topic: str) -> None:
        self.got: list[bytes] = []
        self.lock = threading.Lock()
        ready = threading.Event()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, cid, protocol=mqtt.MQTTv5)
        self.c.on_message = lambda _c, _u, m: self._add(m.payload)
        self.c.on_subscribe = lambda *_a: ready.set()
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 300
        self.c.connect("127.0.0.1", port, clean_start=False, properties=props)
        self.c.loop_start()
        self.c.subscribe(topic, qos=1)
        assert ready.wait(T)

    def _add(self, payload: bytes) -> None:
        with self.lock:
            self.got.append(payload)

    def payloads(self) -> set[bytes]:
        with self.lock:
            return set(self.got)

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


@pytest.fixture
def stopped() -> Iterator[list[Node]]:
    """Nodes a test stops with SIGSTOP are continued before they are killed."""
    paused: list[Node] = []
    try:
        yield paused
    finally:
        for n in paused:
            if n.proc.poll() is None:
                n.proc.send_signal(signal.SIGCONT)
        kill_all()


def _routes(port: int, sub: _Sub, topic: str) -> None:
    k = 0

    def probe() -> bool:
        nonlocal k
        k += 1
        publish(port, f"probe-{k}", topic, [b"probe"])
        return b"probe" in sub.payloads()

    eventually(probe, "the subscription never reached the publishing node")


def test_unreachable_peer_neither_loses_acknowledged_nor_stalls_publishers(
    tmp_path: Path, stopped: list[Node]
) -> None:
    """Node B stops reading (SIGSTOP) while A's publisher sends 300 QoS 1 messages for B's
    subscriber: A acknowledges them all (B's link paces A's publisher for the failure timeout
    at most, then counts as slow), queues them beyond ``max_queued_messages`` (30 here) for
    B's link session, and B's subscriber gets them all once B continues."""
    a = start(tmp_path / "a", None, serve=SERVE, broker="max_queued_messages = 30")
    b = start(tmp_path / "b", a.cluster_port, serve=SERVE)
    wait_links(a, 1)
    wait_links(b, 1)
    sub = _Sub(b.port, "far", "jep/#")
    try:
        _routes(a.port, sub, "jep/probe")
        b.proc.send_signal(signal.SIGSTOP)
        stopped.append(b)
        payloads = [f"m{i}".encode() for i in range(300)]
        acked = publish(a.port, "pub", "jep/x", payloads)
        assert acked == set(payloads)
        # the publisher was released by the pace limit (not by the end of B's session)
        eventually(
            lambda: any("$cluster/" in line and "slow consumer" in line for line in list(a.lines)),
            "A never released its publisher from B's link",
        )
        b.proc.send_signal(signal.SIGCONT)
        eventually(lambda: sub.payloads() >= acked, "acknowledged messages lost for B's subscriber")
        assert sys_value(a, "$SYS/broker/messages/queue_overflow/cluster_links") == b"0"
    finally:
        sub.close()


def test_shared_group_fails_over_to_a_reachable_member(tmp_path: Path, stopped: list[Node]) -> None:
    """``$share/g/jep/#`` with members on nodes 0 and 2, publisher on node 1: once node 2
    stops answering and node 1 has seen it leave, every message goes to node 0's member
    (before the fix, the round robin kept giving node 2 every other message)."""
    n0 = start(tmp_path / "n0", None, serve=SERVE)
    n1, n2 = start_joiners([tmp_path / "n1", tmp_path / "n2"], n0.cluster_port, serve=SERVE)
    for n in (n0, n1, n2):
        wait_links(n, 2)
    m0 = _Sub(n0.port, "m0", "$share/g/jep/#")
    m2 = _Sub(n2.port, "m2", "$share/g/jep/#")
    try:

        def both_reached() -> bool:
            publish(n1.port, "probe", "jep/probe", [b"probe"] * 4)
            return b"probe" in m0.payloads() and b"probe" in m2.payloads()

        eventually(both_reached, "the group's routes never reached node 1")
        n2.proc.send_signal(signal.SIGSTOP)
        stopped.append(n2)
        eventually(lambda: sys_value(n1, "$SYS/cluster/members") == b"2", "node 1 never saw node 2 leave")
        payloads = [f"s{i}".encode() for i in range(40)]
        acked = publish(n1.port, "pub", "jep/s", payloads)
        assert acked == set(payloads)
        eventually(lambda: m0.payloads() >= acked, "messages waited for the unreachable member")
    finally:
        m0.close()
        m2.close()


def test_a_node_leaving_gracefully_under_traffic_loses_nothing_acknowledged(
    tmp_path: Path, stopped: list[Node]
) -> None:
    """B is stopped with SIGTERM while A's publisher sends QoS 1 messages for B's persistent
    subscriber, then restarted with its data directory: every message A acknowledged reaches
    the subscriber (before the fix B's links went on acknowledging after its store closed)."""
    a = start(tmp_path / "a", None, serve=SERVE)
    b = start(tmp_path / "b", a.cluster_port, serve=SERVE)
    wait_links(a, 1)
    wait_links(b, 1)
    sub = _Sub(b.port, "far", "jep/#")
    result: dict[str, set[bytes]] = {}
    try:
        _routes(a.port, sub, "jep/probe")
        payloads = [f"m{i}".encode() for i in range(600)]
        t = threading.Thread(target=lambda: result.update(acked=publish(a.port, "pub", "jep/x", payloads)))
        t.start()
        eventually(lambda: len(sub.payloads()) > 50, "no traffic before the stop")
        b.proc.terminate()
        b.proc.wait(T)
        t.join(T)
        before = sub.payloads()
        sub.close()
        b2 = start(b.data, a.cluster_port, cluster_port=b.cluster_port, serve=SERVE)
        sub = _Sub(b2.port, "far", "jep/#")
        acked = result["acked"]
        assert acked == set(payloads)
        eventually(lambda: before | sub.payloads() >= acked, "acknowledged messages lost in B's stop")
    finally:
        sub.close()
