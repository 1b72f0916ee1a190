"""A queue bound with ``pace`` (core/_qbound.py) forgets the publishers lost while paused: a
bound that stays full while publishers connect, get paused and disconnect keeps a set of the
live paused publishers, not of every one it ever paused.

A real core (``Core(BrokerConfig(...))``, sans-IO): an offline persistent session with a bound
of one message, and 1,000 real publisher connections, each paused by its QoS 1 PUBLISH to the
full queue (``Core.current``, ``Core.block``) and then lost (``Connection.lost``)."""

from __future__ import annotations

from broker._config import BrokerConfig
from broker.core._core import Core
from broker.core._qbound import QueueBound
from broker.packets import Properties, Publish
from tests.broker.test_broker_session_machine import connect, sub


def test_paced_publishers_lost_while_paused_are_forgotten() -> None:
    core = Core(BrokerConfig(sys_interval=0))
    w, _ = connect(core, "sink", clean_start=False, properties=Properties(session_expiry_interval=600))
    sub(w, "t")
    w.drop()
    bound = core.queue_bounds["sink"] = QueueBound(1, pace=True)
    first, _ = connect(core, "p-first")
    first.feed(Publish("t", b"fills the bound", 1, packet_id=1))
    assert bound.paces == 0 and len(core.sessions["sink"].queue) == 1
    first.drop()
    for i in range(1000):
        pub, _ = connect(core, f"p{i}")
        pub.feed(Publish("t", b"x", 1, packet_id=1))  # at the bound: its publisher is paused
        assert pub.conn.blockers == 1 and pub.conn in bound.paced
        pub.drop()  # it disconnects while paused (Connection.lost)
    assert bound.paces == 1000
    assert len(bound.paced) <= 64
    live, _ = connect(core, "live")
    live.feed(Publish("t", b"x", 1, packet_id=1))
    assert live.conn in bound.paced and live.conn.blockers == 1
    assert bound.paces == 1001
