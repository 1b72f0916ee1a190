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

from tests.cluster._processes import (
    Node,
    T,
    eventually,
    kill_all,
    start,
    start_joiners,
    sys_values,
    wait_links,
)


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
        self.c.on_publish = self._on_puback
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        self.sent: list[tuple[bytes, mqtt.MQTTMessageInfo]] = []
        self.pubacks: set[int] = set()
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

    def _on_puback(self, _c: object, _u: object, mid: int, _rc: object, _p: object) -> None:
        with self.lock:
            self.pubacks.add(mid)

    def acked(self) -> set[bytes]:
        """The payloads whose PUBACK came (paho's ``on_publish``).  Not ``is_published()``: a
        publish made while the client was disconnected from a stopped node returns
        MQTT_ERR_NO_CONN (paho queues it and sends it after reconnecting), and its
        ``is_published()`` then raises even once it is acknowledged.  Message ids are unique
        here: a test publishes far fewer than 65,535 messages per feeder."""
        with self.lock:
            return {p for p, info in self.sent if info.mid in self.pubacks}

    def stop(self) -> None:
        self.done.set()
        self.thread.join(T)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


@pytest.fixture
def four(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[Node]]:
    """Four nodes; the parameter is (takeover timeout, failure timeout); SIGKILL ends stopped ones."""
    takeover, failure = request.param
    serve = (
        f"cluster_refresh = 0.3\ncluster_failure_timeout = {failure}\ncluster_takeover_timeout = {takeover}\n"
    )
    try:
        # a handover stuck for seconds buffers thousands of messages: no queue limit in the way
        limit = "max_queued_messages = 100000"
        first = start(tmp_path / "n0", None, serve=serve, broker=limit)
        joiners = [tmp_path / f"n{i}" for i in (1, 2, 3)]
        nodes = [first, *start_joiners(joiners, first.cluster_port, serve=serve, broker=limit)]
        for n in nodes:
            wait_links(n, 3)
        yield nodes
    finally:
        kill_all()


def _counter(node: Node, name: str) -> int:
    return int(sys_values(node, "$SYS/cluster/sessions/+", 7)[f"$SYS/cluster/sessions/{name}"])


def _subscribe_everywhere(mover: Mover, feeders: list[Feeder]) -> None:
    """A new session (no session present) subscribes to every feeder's topic, QoS 1, and
    waits until its routes reached every feeder's node."""
    assert mover.present.get(timeout=T) is False
    mover.c.subscribe("feed/#", qos=1)
    assert mover.subscribed.wait(T)
    _subscribed_everywhere(mover, feeders)


def _subscribed_everywhere(mover: Mover, feeders: list[Feeder]) -> None:
    """Until the mover received a message of every feeder that the feeder's node has
    acknowledged (its routes reached every node)."""
    eventually(
        lambda: all(f.acked() & mover.payloads() for f in feeders),
        "the mover's subscription did not reach every node",
    )


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


@pytest.mark.parametrize(
    "four", [(0.5, 1.0), (30.0, 1.0)], indirect=True, ids=["timeout-first", "removal-first"]
)
def test_peers_stopped_and_killed_mid_handover_lose_no_acknowledged_message(
    four: list[Node], request: pytest.FixtureRequest
) -> None:
    """The client's session moves from A to B while peer X is stopped (it neither answers nor
    fences; continued later) and peer Y is stopped and then killed.  With a short takeover
    timeout A sends its tail before the silent peers leave the membership, and forwards
    their late copies; with a long one the peers' removal counts as their fences.  Every
    acknowledged message arrives at least once; B's CONNACK says "session present"."""
    a, b, x, y = four
    long_timeout = request.node.callspec.params["four"][0] > 1
    feeders = [Feeder(n.port, name) for n, name in zip(four, "abxy", strict=True)]
    first = Mover(a.port)
    second: Mover | None = None
    try:
        _subscribe_everywhere(first, feeders)
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
        eventually(lambda: not _missing(acked, first, second), "acknowledged messages never arrived")  # type: ignore[arg-type]
        assert _missing(acked, first, second) == []
        assert sum(1 for p in acked if p.startswith(b"y:")) > 0
        # the handover's counters, once both nodes published its end
        done: dict[str, dict[str, bytes]] = {}

        def counters() -> bool:
            for n, key in ((a, "moved_out"), (b, "moved_in")):
                done[key] = got = sys_values(n, "$SYS/cluster/sessions/+", 7)
                if got[f"$SYS/cluster/sessions/{key}"] != b"1":
                    return False
            return True

        eventually(counters, "the handover's end never published")
        timeouts = [
            int(done[k]["$SYS/cluster/sessions/handover_timeouts"]) for k in ("moved_out", "moved_in")
        ]
        if long_timeout:  # the silent peers' removal counted as their fences: nobody timed out
            assert timeouts == [0, 0]
        else:
            assert timeouts[0] >= 1
    finally:
        for f in feeders:
            f.close()
        if second is not None:
            second.close()


SLOW_REMOVAL = (30.0, 3.0)  # A sends its tail after 22.5 s at the latest; a dead peer is removed after ~3.5 s


def _installed(b: Node) -> None:
    """Until B published that it installed the moving session's subscriptions."""
    eventually(lambda: _counter(b, "moved_in") == 1, "B never installed the session")


@pytest.mark.parametrize("four", [SLOW_REMOVAL], indirect=True)
def test_the_old_node_killed_mid_handover(four: list[Node]) -> None:
    """A answered with the session and waits for the fence of the stopped peer X when it is
    killed: B gives up on it once A leaves the membership (``handover_holder_lost``), says
    "session present" (the subscriptions came) and delivers what it held and buffered: every
    message acknowledged at B and at Y once B had installed the subscriptions arrives.  What
    A had queued dies with it."""
    a, b, x, y = four
    feeders = [Feeder(b.port, "b"), Feeder(y.port, "y")]
    first = Mover(a.port)
    second: Mover | None = None
    try:
        _subscribe_everywhere(first, feeders)
        first.close()
        x.proc.send_signal(signal.SIGSTOP)
        second = Mover(b.port)
        _installed(b)
        marks = {f.name: len(f.sent) for f in feeders}
        a.proc.send_signal(signal.SIGKILL)
        x.proc.send_signal(signal.SIGCONT)
        assert second.present.get(timeout=T) is True
        eventually(lambda: _counter(b, "handover_holder_lost") == 1, "B never gave the old node up")
        for f in feeders:
            f.stop()
        acked = _expected(feeders, marks)
        eventually(lambda: not _missing(acked, second), "acknowledged messages never arrived")  # type: ignore[arg-type]
        assert _counter(b, "handover_timeouts") == 0  # A's removal ended the wait, not the timeout
    finally:
        for f in feeders:
            f.close()
        if second is not None:
            second.close()


@pytest.mark.parametrize("four", [SLOW_REMOVAL], indirect=True)
def test_the_new_node_killed_mid_handover(four: list[Node]) -> None:
    """B installed the session and is killed while A waits for the fence of peer X (stopped,
    then continued: it never fences, B being dead): A cancels the handover once B leaves the
    membership (``handover_target_lost``) and keeps the session, with what it had set aside
    for B; the client, back at A, gets "session present" and every message acknowledged at
    A and at Y since it first left."""
    a, b, x, y = four
    feeders = [Feeder(a.port, "a"), Feeder(y.port, "y")]
    movers = [Mover(a.port)]
    try:
        assert movers[0].present.get(timeout=T) is False
        movers[0].c.subscribe("feed/#", qos=1)
        assert movers[0].subscribed.wait(T)
        _subscribed_everywhere(movers[0], feeders)
        firsts = _firsts(movers[0])
        movers[0].close()
        x.proc.send_signal(signal.SIGSTOP)
        movers.append(Mover(b.port))
        _installed(b)
        b.proc.send_signal(signal.SIGKILL)
        x.proc.send_signal(signal.SIGCONT)
        eventually(lambda: _counter(a, "handover_target_lost") == 1, "A never cancelled the handover")
        movers[1].close()
        movers.append(Mover(a.port))
        assert movers[2].present.get(timeout=T) is True
        for f in feeders:
            f.stop()
        acked = _expected(feeders, firsts)
        eventually(lambda: not _missing(acked, *movers), "acknowledged messages never arrived")
        assert _counter(a, "moved_out") == 0
    finally:
        for f in feeders:
            f.close()
        for m in movers:
            m.close()
