"""``siftmq serve`` nodes in the nemesis's namespaces, the clients beside them, and the
history they write (issue 30).

Every node runs ``siftmq serve`` (``python -m broker._cli``) in its own namespace with a data
directory (persistence on: a ``kill -9`` keeps what was acknowledged), MQTT and cluster ports 0
on its namespace address (a restarted node asks for the ports it had, and joins through every
other node).  Clients are paho MQTT 5 clients started in a node's namespace
(:func:`tests.nemesis._net.in_namespace`), with persistent sessions (clean start false,
expiry 300 s) and automatic reconnection, so a restarted node gets its clients back; their
class, :class:`PahoClient`, fixes paho-mqtt 2.2's QoS 2 resend after failed reconnects
(a PUBLISH sent again after its PUBREL), which the broker cannot tell from a new message.

The :class:`History` is a list of events with monotonic times, written by the clients'
callbacks and by the nemesis: ``sub`` (a SUBACK: client, node, filter), ``pub`` (a PUBLISH
handed to the client), ``ack`` (its PUBACK / PUBCOMP with a success code), ``recv`` (a
delivery to a subscriber), ``retained`` (a fresh subscriber's read of the retained topic at a
node), ``fault`` and ``heal``.  Payloads are ``<publisher>:<sequence>``.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.nemesis._net import Network, in_namespace

SECRET = "nemesis-test-secret"


class History:
    """Events ``(time, kind, fields)`` in the order they happened (thread-safe)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self.t0 = time.monotonic()

    def add(self, kind: str, **fields: Any) -> None:
        with self._lock:
            self.events.append((time.monotonic() - self.t0, kind, fields))

    def of(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        with self._lock:
            return [(t, f) for t, k, f in self.events if k == kind]


@dataclass
class Node:
    index: int
    data: Path
    proc: subprocess.Popen[str] | None = None
    port: int = 0
    cluster_port: int = 0
    node_id: str = ""
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    log: list[str] = field(default_factory=list)


_OVERFLOWS = re.compile(r"counters: .* (\d+) queue overflows")


class Cluster:
    """``n`` nodes in a :class:`Network` (``serve``: more ``[serve]`` TOML lines)."""

    def __init__(
        self, net: Network, root: Path, serve: str = "", broker: str = "", stock_paho: bool = False
    ) -> None:
        self.net = net
        self.root = root
        self.stock_paho = stock_paho  # clients without PahoClient's fix (paho's QoS 2 resend bug)
        self.serve = serve
        self.broker = broker
        self.nodes: list[Node] = []
        self._procs: list[subprocess.Popen[str]] = []

    def start_all(self, n: int) -> None:
        """The first node, then the others at once (they join through it)."""
        for i in range(n):
            self.nodes.append(Node(i, self.root / f"n{i}"))
        self.start(0)
        for i in range(1, n):
            self.launch(i)
        for i in range(1, n):
            self.ready(i)

    def start(self, i: int) -> None:
        self.launch(i)
        self.ready(i)

    def launch(self, i: int) -> None:
        node = self.nodes[i]
        node.data.mkdir(parents=True, exist_ok=True)
        cfg = self.root / f"n{i}.toml"
        cfg.write_text(f"[broker]\nsys_interval = 0.5\n{self.broker}\n[serve]\n{self.serve}\n")
        addr = self.net.addresses[i]
        cmd = [
            sys.executable,
            "-m",
            "broker._cli",
            "serve",
            "--host",
            addr,
            "--port",
            str(node.port),
            "--data-dir",
            str(node.data),
            "--config",
            str(cfg),
            "--no-bridge",
            "--log-level",
            "INFO",
            "--cluster-listen",
            f"{addr}:{node.cluster_port}",
        ]
        join = [
            f"{self.net.addresses[o.index]}:{o.cluster_port}"
            for o in self.nodes
            if o.cluster_port and o is not node
        ]
        if join:
            cmd += ["--join", ",".join(join)]
        env = {**os.environ, "SIFTMQ_CLUSTER_SECRET": SECRET, "PYTHONPATH": os.getcwd()}
        proc = self.net.popen(i, cmd, stderr=subprocess.PIPE, env=env)
        node.proc = proc
        self._procs.append(proc)
        node.lines = lines = queue.Queue()
        assert proc.stderr is not None
        stderr = proc.stderr

        def pump() -> None:
            for line in stderr:
                node.log.append(line)
                lines.put(line)

        threading.Thread(target=pump, daemon=True).start()

    def ready(self, i: int) -> None:
        """Until node ``i`` logged its MQTT and cluster ports."""
        node = self.nodes[i]
        addr = self.net.addresses[i]
        lines = node.lines
        deadline = time.monotonic() + 20
        ready = got_port = False
        while not ready:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                tail = "".join(node.log[-15:])
                raise AssertionError(
                    f"node {i} did not start (exit {node.proc and node.proc.poll()}):\n{tail}"
                ) from None
            # the MQTT listener is the first one logged (the cluster listener follows)
            if not got_port and (m := re.search(rf"listening on {re.escape(addr)}:(\d+)", line)):
                node.port, got_port = int(m.group(1)), True
            if m := re.search(rf"cluster node ([0-9a-f]+) on {re.escape(addr)}:(\d+)", line):
                node.node_id, node.cluster_port = m.group(1), int(m.group(2))
                ready = True

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Signal node ``i`` and wait for its end (SIGTERM: 15 s, then SIGKILL)."""
        proc = self.nodes[i].proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                self.nodes[i].log.append(f"nemesis: no exit 15 s after signal {sig}: SIGKILL\n")
                proc.kill()
                proc.wait(15)

    def signal(self, i: int, sig: int) -> None:
        proc = self.nodes[i].proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)

    def alive(self, i: int) -> bool:
        proc = self.nodes[i].proc
        return proc is not None and proc.poll() is None

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(20)
            if proc.stderr is not None:
                proc.stderr.close()
        self.save_logs()

    def tracebacks(self) -> list[str]:
        """Each traceback a node logged, with the 30 lines after it."""
        return [
            f"n{n.index}: " + "".join(n.log[k : k + 30])
            for n in self.nodes
            for k, line in enumerate(n.log)
            if "Traceback" in line
        ]

    def queue_overflows(self) -> int:
        """QoS 1/2 messages the nodes dropped at a full session queue (``max_queued_messages``:
        a bound the configuration sets, logged and counted, not a loss the checker excuses):
        the last ``counters`` figure of each run of each node, summed over the restarts."""
        total = 0
        for n in self.nodes:
            last = 0
            for line in n.log:
                if "hot path:" in line:  # a (re)start: its counters begin at 0
                    total += last
                    last = 0
                elif (m := _OVERFLOWS.search(line)) is not None:
                    last = int(m.group(1))
            total += last
        return total

    def save_logs(self) -> None:
        for n in self.nodes:
            (self.root / f"n{n.index}.log").write_text("".join(n.log))


# ---------------------------------------------------------------- clients
class PahoClient(mqtt.Client):
    """paho-mqtt's client with its QoS 2 resend after failed reconnects fixed (paho-mqtt 2.2.0).

    ``Client.reconnect`` resets the state of every unacknowledged outgoing message *before* it
    opens the socket, so every attempt that fails (the node is down: connection refused) resets
    them again.  The first reset turns a QoS 2 message whose PUBREL was sent
    (``wait_for_pubcomp``) into ``resend_pubrel``, as MQTT has it; the second turns
    ``resend_pubrel`` into ``publish``, and the PUBLISH goes out again after its PUBREL, which
    MQTT forbids (5.0 and 3.1.1, section 4.3.3: the sender "MUST NOT re-send the PUBLISH once
    it has sent the corresponding PUBREL packet").  A broker that released the packet id at the
    PUBREL can only take it for a new message and route it again: every QoS 2 duplicate of the
    nemesis's runs after a ``kill`` or ``leave`` was one (issue 30, docs/fault.md).  Here such a
    message stays ``resend_pubrel`` across the resets; ``tests/nemesis/test_paho_resend.py``
    shows paho's own behaviour beside it, and says so (a skip) once paho fixes it: this class can
    go then.
    """

    def _messages_reconnect_reset_out(self) -> None:
        with self._out_message_mutex:
            owed = [
                m
                for m in self._out_messages.values()
                if m.qos == 2 and m.state in (mqtt.mqtt_ms_wait_for_pubcomp, mqtt.mqtt_ms_resend_pubrel)
            ]
        super()._messages_reconnect_reset_out()
        if self._check_clean_session():
            return  # a new session: every message is sent again from its PUBLISH (paho's rule)
        with self._out_message_mutex:
            for m in owed:
                m.state = mqtt.mqtt_ms_resend_pubrel


def _client(cid: str, stock: bool = False) -> mqtt.Client:
    """A client of the nemesis (``stock``: paho's own, without :class:`PahoClient`'s fix)."""
    cls = mqtt.Client if stock else PahoClient
    c = cls(mqtt.CallbackAPIVersion.VERSION2, cid, protocol=mqtt.MQTTv5)
    c.reconnect_delay_set(0.1, 1.0)
    c.username_pw_set("nemesis")  # not anonymous: the listener is not on loopback
    return c


def _connect(c: mqtt.Client, host: str, port: int, persistent: bool = True) -> None:
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300 if persistent else 0
    c.connect(host, port, keepalive=20, clean_start=not persistent, properties=props)


class Subscriber:
    """A persistent subscriber of ``topic_filter`` at node ``node`` (QoS 2)."""

    def __init__(self, cluster: Cluster, node: int, cid: str, topic_filter: str, history: History) -> None:
        self.cid, self.node, self.filter, self.h = cid, node, topic_filter, history
        self.subscribed = threading.Event()
        n = cluster.nodes[node]
        addr = cluster.net.addresses[node]
        self.c = c = _client(cid, cluster.stock_paho)
        c.on_message = self._on_message
        c.on_subscribe = self._on_subscribe
        c.on_connect = self._on_connect

        def go() -> None:
            _connect(c, addr, n.port)
            c.loop_start()

        in_namespace(cluster.net.namespaces[node], go)
        if not self.subscribed.wait(20):
            raise AssertionError(f"{cid}: no SUBACK")

    def _on_connect(self, c: mqtt.Client, _u: object, _f: object, rc: Any, _p: object = None) -> None:
        if not rc.is_failure and not self.subscribed.is_set():
            c.subscribe(self.filter, qos=2)

    def _on_subscribe(self, _c: object, _u: object, _mid: int, codes: Any, _p: object = None) -> None:
        if all(not rc.is_failure for rc in codes) and not self.subscribed.is_set():
            self.h.add("sub", client=self.cid, node=self.node, filter=self.filter)
            self.subscribed.set()

    def _on_message(self, _c: object, _u: object, m: mqtt.MQTTMessage) -> None:
        self.h.add(
            "recv",
            client=self.cid,
            node=self.node,
            filter=self.filter,
            topic=m.topic,
            payload=m.payload.decode(errors="replace"),
            qos=m.qos,
            dup=bool(m.dup),
            retain=bool(m.retain),
        )

    def close(self) -> None:
        _close(self.c)


def _close(c: mqtt.Client) -> None:
    """Disconnect and stop the loop thread, waiting 2 s at most (a client of a node that is
    stopped or gone must not hang the run's cleanup; the thread is a daemon)."""
    c.disconnect()
    t = threading.Thread(target=c.loop_stop, daemon=True)
    t.start()
    t.join(2)


class Publisher:
    """Publishes ``<cid>:<seq>`` to ``topic`` (``jep/<cid>``) at ``rate`` per second (QoS ``qos``) from a
    thread in node ``node``'s namespace until :meth:`stop`."""

    def __init__(
        self,
        cluster: Cluster,
        node: int,
        cid: str,
        qos: int,
        rate: float,
        history: History,
        topic: str | None = None,
    ) -> None:
        self.cid, self.node, self.qos, self.rate, self.h = cid, node, qos, rate, history
        self.topic = topic or f"jep/{cid}"
        self.seq = 0
        self._mids: dict[int, int] = {}
        self._early: dict[int, bool] = {}  # mid -> success, acknowledged before it was noted
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.connected = threading.Event()
        n = cluster.nodes[node]
        addr = cluster.net.addresses[node]
        self.c = c = _client(cid, cluster.stock_paho)
        c.max_inflight_messages_set(100)
        c.on_publish = self._on_publish
        c.on_connect = lambda *_a: self.connected.set()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=cid)

        def go() -> None:
            _connect(c, addr, n.port)
            c.loop_start()
            self._thread.start()

        in_namespace(cluster.net.namespaces[node], go)

    def _loop(self) -> None:
        if not self.connected.wait(20):
            return
        period = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.seq += 1
            payload = f"{self.cid}:{self.seq}"
            self.h.add(
                "pub",
                client=self.cid,
                node=self.node,
                seq=self.seq,
                qos=self.qos,
                payload=payload,
                topic=self.topic,
            )
            # not under self._lock: paho calls on_publish holding its own lock (lock order)
            info = self.c.publish(self.topic, payload, qos=self.qos)
            with self._lock:
                early = self._early.pop(info.mid, None)
                if early is None:
                    self._mids[info.mid] = self.seq
            if early:
                self.h.add("ack", client=self.cid, node=self.node, seq=self.seq, payload=payload)
            next_at += period
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _on_publish(self, _c: object, _u: object, mid: int, rc: Any, _p: object = None) -> None:
        with self._lock:
            seq = self._mids.pop(mid, None)
            if seq is None:  # acknowledged before publish() returned
                self._early[mid] = not rc.is_failure
        if seq is not None and not rc.is_failure:
            self.h.add("ack", client=self.cid, node=self.node, seq=seq, payload=f"{self.cid}:{seq}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def close(self) -> None:
        self.stop()
        _close(self.c)


def publish_retained(cluster: Cluster, node: int, topic: str, value: str, history: History) -> bool:
    """One retained QoS 1 publication at ``node``; whether it was acknowledged."""
    n = cluster.nodes[node]
    c = _client(f"ret-{node}-{time.monotonic_ns()}")
    done = threading.Event()
    c.on_publish = lambda *_a: done.set()

    def go() -> None:
        _connect(c, cluster.net.addresses[node], n.port, persistent=False)
        c.loop_start()

    try:
        in_namespace(cluster.net.namespaces[node], go)
        history.add("retain_pub", node=node, topic=topic, value=value)
        c.publish(topic, value, qos=1, retain=True)
        ok = done.wait(5)
        if ok:
            history.add("retain_ack", node=node, topic=topic, value=value)
        return ok
    except OSError:
        return False
    finally:
        _close(c)


def first_retained(cluster: Cluster, node: int, topic: str, wait: float = 0.5) -> str | None:
    """The retained value a fresh subscriber of ``topic`` at ``node`` receives first (None: none
    within ``wait`` seconds of connecting, or the node cannot be reached)."""
    n = cluster.nodes[node]
    got: list[str] = []
    arrived = threading.Event()

    def on_message(_c: object, _u: object, m: mqtt.MQTTMessage) -> None:
        if m.retain:
            got.append(m.payload.decode())
            arrived.set()

    c = _client(f"conv-{node}-{time.monotonic_ns()}")
    c.on_message = on_message
    c.on_connect = lambda cl, *_a: cl.subscribe(topic, qos=1)

    def go() -> None:
        _connect(c, cluster.net.addresses[node], n.port, persistent=False)
        c.loop_start()

    try:
        in_namespace(cluster.net.namespaces[node], go)
        arrived.wait(wait)
        return got[0] if got else None
    except OSError:  # a node not listening yet (restarting)
        return None
    finally:
        _close(c)


def read_retained(cluster: Cluster, node: int, topic: str, history: History, wait: float = 1.0) -> list[str]:
    """What a fresh subscriber of ``topic`` at ``node`` receives as retained messages within
    ``wait`` seconds of its SUBACK (recorded as a ``retained`` event)."""
    n = cluster.nodes[node]
    got: list[str] = []
    subacked = threading.Event()
    c = _client(f"read-{node}-{time.monotonic_ns()}")
    c.on_message = lambda _c, _u, m: got.append(m.payload.decode()) if m.retain else None
    c.on_subscribe = lambda *_a: subacked.set()

    def go() -> None:
        _connect(c, cluster.net.addresses[node], n.port, persistent=False)
        c.loop_start()

    try:
        in_namespace(cluster.net.namespaces[node], go)
        c.subscribe(topic, qos=1)
        subacked.wait(5)
        time.sleep(wait)  # a window to count retained copies in, not a wait for a condition
        history.add("retained", node=node, topic=topic, values=list(got))
        return list(got)
    finally:
        _close(c)
