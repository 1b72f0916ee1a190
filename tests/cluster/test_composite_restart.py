"""A composite core that comes back merges nothing twice (issue 30): three real ``siftmq
serve`` processes (every node in the CSSU, alpha 3); the core (smallest ID) is stopped
(SIGSTOP), the next member takes over and merges the pairs published meanwhile; the old core is
continued (SIGCONT), is the core again, and its link sessions at the other nodes deliver it the
atoms queued while it was away, which the interim core had merged.  Before atoms had origin
ids (broker.core._atom_ids) those pairs were delivered twice (4 of 4 in every run; the nemesis
saw the same after ``kill -9`` and restart, and after a cut of the core).  A ``kill -9`` and
restart on loopback does not reproduce it: the restarted node receives its backlog before
heartbeats have given it its table, so it has no atoms to match yet (tried, and kept out of
this file for time)."""

from __future__ import annotations

import json
import queue
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from tests.cluster._processes import Node, T, eventually, kill_all, start, start_joiners, sys_value

SERVE = "cluster_refresh = 0.3\ncluster_failure_timeout = 2.0\n"
EXPRESSION = "rs/a & rs/b"


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    try:
        first = start(tmp_path / "n0", None, serve=SERVE)
        yield [first, *start_joiners([tmp_path / "n1", tmp_path / "n2"], first.cluster_port, serve=SERVE)]
    finally:
        kill_all()


def _core_of(node: Node) -> int:
    try:
        return int(sys_value(node, "$SYS/cluster/cssu/core_of"))
    except queue.Empty:  # a node starting: its $SYS not published yet
        return 0


def test_a_returning_core_does_not_deliver_the_interim_cores_events_again(nodes: list[Node]) -> None:
    by_id = {int((n.data / "cluster-node-id").read_text(), 16): n for n in nodes}
    core = by_id[min(by_id)]
    access, pub_node = (n for n in nodes if n is not core)
    events: queue.Queue[tuple[str, ...]] = queue.Queue()

    def on_message(_c: object, _u: object, m: mqtt.MQTTMessage) -> None:
        events.put(tuple(sorted(c["payload"] for c in json.loads(m.payload)["components"])))

    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, "pairs", protocol=mqtt.MQTTv311, clean_session=False)
    sub.on_message = on_message
    sub.connect("127.0.0.1", access.port)
    sub.loop_start()
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, "atoms", protocol=mqtt.MQTTv311)
    pub.connect("127.0.0.1", pub_node.port)
    pub.loop_start()
    got: list[tuple[str, ...]] = []
    k = 0

    def pair_until_event(what: str) -> None:
        """Publish pairs (a:k, b:k) until an event comes back (the current core merges)."""
        nonlocal k
        deadline = time.monotonic() + T
        while time.monotonic() < deadline:
            k += 1
            pub.publish("rs/a", f"a:{k}", qos=1).wait_for_publish(5)
            pub.publish("rs/b", f"b:{k}", qos=1).wait_for_publish(5)
            try:
                got.append(events.get(timeout=0.5))
                return
            except queue.Empty:
                pass
        raise AssertionError(f"no composite event {what}")

    try:
        sub.subscribe(f"$composite/pair/{EXPRESSION}", qos=1)
        eventually(lambda: _core_of(core) == 1, "the smallest ID matches")
        pair_until_event("before the kill")
        core.proc.send_signal(signal.SIGSTOP)
        pair_until_event("from the interim core")
        for _ in range(3):  # merged by the interim core, queued at the links for the old one
            pair_until_event("from the interim core")
        core.proc.send_signal(signal.SIGCONT)
        eventually(lambda: _core_of(core) == 1, "the old core is the core again")
        pair_until_event("from the returning core")
        # the returning core's backlog has arrived before the last pair's event (its links
        # deliver in order): collect what else came
        while True:
            try:
                got.append(events.get(timeout=1.0))
            except queue.Empty:
                break
        doubled = {p: n for p, n in Counter(got).items() if n > 1}
        assert not doubled, f"events delivered twice: {doubled}"
        assert all(len({x.partition(":")[2] for x in p}) == 1 for p in got), got
    finally:
        for c in (sub, pub):
            c.loop_stop()
            c.disconnect()
