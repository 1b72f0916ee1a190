"""A session moving between nodes while peers fail (issue 17 item 3, cluster/_takeover.py):
real ``siftmq serve`` processes, QoS 1 publishers on every node, a persistent subscriber that
moves from node A to node B while other nodes are stopped (SIGSTOP) or killed (SIGKILL) in the
middle of the handover, or while A itself is killed.  Every message a publisher had
acknowledged reaches the client at least once (on A before it left, or on B), unless it was
queued for the client only at a node that died.  Loopback, ports 0, paho clients; membership
refreshed every 0.3 s and a silent peer removed after 1 s (``cluster_refresh``,
``cluster_failure_timeout``) so that the failures are noticed within the test."""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.cluster._processes import Node, T, eventually, kill_all, start, wait_links

FAST = "cluster_refresh = 0.3\ncluster_failure_timeout = 1.0\n"


class Mover:
    """A paho MQTT 5 client with a persistent session (expiry 300 s): its CONNACK's session
    present flag and the (payload, DUP) of every message, in order."""

    def __init__(self, port: int) -> None:
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, "mover", protocol=mqtt.MQTTv5)
        self.present: queue.Queue[bool] = queue.Queue()
        self.lock = threading.Lock()
        self.got: list[tuple[bytes, bool]] = []
        self.subscribed = threading.Event()
        self.c.on_connect = lambda _c, _u, flags, _rc, _p: self.present.put(flags.session_present)
        self.c.on_message = self._on
        self.c.on_subscribe = lambda *_a: self.subscribed.set()
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 300
        self.c.connect_async("127.0.0.1", port, clean_start=False, properties=props)
        self.c.loop_start()

    def _on(self, _c: object, _u: object, m: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.got.append((m.payload, bool(m.dup)))

    def payloads(self) -> set[bytes]:
        with self.lock:
            return {p for p, _ in self.got}

    def received(self) -> list[tuple[bytes, bool]]:
        with self.lock:
            return list(self.got)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


class Feeder:
    """A QoS 1 publisher on ``topic`` at ``port``, one message every 5 ms (up to 20 in flight)
    until :meth:`stop`; :meth:`acked` is what its node acknowledged."""

    def __init__(self, port: int, name: str) -> None:
        self.name = name
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, f"feed-{name}", protocol=mqtt.MQTTv5)
        self.c.max_inflight_messages_set(20)
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        self.sent: list[tuple[bytes, mqtt.MQTTMessageInfo]] = []
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        k = 0
        while not self.done.is_set():
            payload = f"{self.name}:{k}".encode()
            info = self.c.publish(f"feed/{self.name}", payload, qos=1)
            with self.lock:
                self.sent.append((payload, info))
            k += 1
            time.sleep(0.005)  # pacing of the load, not a wait for a condition

    def acked(self) -> set[bytes]:
        with self.lock:
            return {p for p, info in self.sent if info.is_published()}

    def stop(self) -> None:
        self.done.set()
        self.thread.join(T)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


@pytest.fixture
def four(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[Node]]:
    """Four nodes; the takeover timeout is the test's parameter (SIGKILL ends stopped ones)."""
    serve = FAST + f"cluster_takeover_timeout = {getattr(request, 'param', 2.0)}\n"
    try:
        first = start(tmp_path / "n0", None, serve=serve)
        nodes = [first] + [start(tmp_path / f"n{i}", first.cluster_port, serve=serve) for i in (1, 2, 3)]
        for n in nodes:
            wait_links(n, 3)
        yield nodes
    finally:
        kill_all()


def _subscribed_everywhere(mover: Mover, feeders: list[Feeder]) -> None:
    """Until the mover has messages of every feeder (its routes reached every node)."""
    eventually(
        lambda: all(any(p.startswith(f"{f.name}:".encode()) for p in mover.payloads()) for f in feeders),
        "the mover's subscription did not reach every node",
    )


def _dump(nodes: list[Node]) -> None:
    for i, n in enumerate(nodes):
        while not n.lines.empty():
            print(i, n.lines.get_nowait().rstrip())


def _firsts(mover: Mover) -> dict[str, int]:
    """Per feeder, the first message number the mover received: the ones before it were
    published before its subscription reached the feeder's node."""
    firsts: dict[str, int] = {}
    for p in mover.payloads():
        name, k = p.decode().split(":")
        firsts[name] = min(firsts.get(name, int(k)), int(k))
    return firsts


def _expected(feeders: list[Feeder], firsts: dict[str, int]) -> set[bytes]:
    """What the feeders' nodes acknowledged once the mover's subscription had reached them."""
    return {p for f in feeders for p in f.acked() if int(p.decode().split(":")[1]) >= firsts[f.name]}


def _missing(acked: set[bytes], *movers: Mover) -> list[bytes]:
    got = set().union(*(m.payloads() for m in movers))
    return sorted(acked - got)


@pytest.mark.parametrize("four", [0.5, 5.0], indirect=True, ids=["timeout-first", "removal-first"])
def test_peers_stopped_and_killed_mid_handover_lose_no_acknowledged_message(four: list[Node]) -> None:
    """The client's session moves from A to B while peer X is stopped (it neither answers nor
    fences; continued later) and peer Y is stopped and then killed.  With a short takeover
    timeout A sends its tail before the silent peers leave the membership, and forwards
    their late copies; with a long one the peers' removal counts as their fences.  Every
    acknowledged message arrives at least once; B's CONNACK says "session present"."""
    a, b, x, y = four
    feeders = [Feeder(n.port, name) for n, name in zip(four, "abxy", strict=True)]
    first = Mover(a.port)
    second: Mover | None = None
    try:
        assert first.present.get(timeout=T) is False
        first.c.subscribe("feed/#", qos=1)
        assert first.subscribed.wait(T)
        _subscribed_everywhere(first, feeders)
        firsts = _firsts(first)
        first.close()  # offline at A: what comes is queued there
        x.proc.send_signal(signal.SIGSTOP)
        y.proc.send_signal(signal.SIGSTOP)
        second = Mover(b.port)
        assert second.present.get(timeout=T) is True
        y.proc.send_signal(signal.SIGKILL)
        _subscribed_everywhere(second, feeders[:2])  # A's and B's traffic reaches B
        x.proc.send_signal(signal.SIGCONT)
        resumed = len(feeders[2].acked())
        eventually(lambda: len(feeders[2].acked()) > resumed + 20, "node X acknowledges again")
        for f in feeders:
            f.stop()
        acked = _expected(feeders, firsts)
        try:
            eventually(lambda: not _missing(acked, first, second), "acknowledged messages never arrived")  # type: ignore[arg-type]
        finally:
            _dump(four)
            miss = _missing(acked, first, second)
            print("missing", len(miss), miss[:40])
            print("acked", {f.name: len(f.acked()) for f in feeders}, "sent", {f.name: len(f.sent) for f in feeders})
            print("first", len(first.received()), "second", len(second.received()))
            print("second order", [p for p, _ in second.received()][:400])
        assert _missing(acked, first, second) == []
        assert sum(1 for p in acked if p.startswith(b"y:")) > 0
    finally:
        for f in feeders:
            f.close()
        if second is not None:
            second.close()
