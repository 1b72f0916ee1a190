"""``drop_oldest`` at a byte bound (core/_qbound.py): a message bigger than the whole bound
is dropped by itself; the queued messages, which it could never make room for, stay.

A real core (``Core(BrokerConfig(...))``, sans-IO) with a real offline persistent session whose
queue has the bound, fed by ``Core.publish``."""

from __future__ import annotations

from broker._config import BrokerConfig
from broker.core._core import Core
from broker.core._qbound import QueueBound
from broker.packets import NO_PROPERTIES, Properties
from broker.values import Message
from tests.broker.test_broker_session_machine import connect, sub


def _publish(core: Core, payload: bytes) -> None:
    core.publish(Message.create("t", payload, 1, False, NO_PROPERTIES, None, 0.0), 0.0)
    core.flush()


def test_drop_oldest_keeps_the_queue_when_a_message_exceeds_the_whole_byte_bound() -> None:
    core = Core(BrokerConfig(sys_interval=0))
    w, _ = connect(core, "sink", clean_start=False, properties=Properties(session_expiry_interval=600))
    sub(w, "t")
    w.drop()  # offline: every message is queued
    session = core.sessions["sink"]
    bound = core.queue_bounds["sink"] = QueueBound(10, max_bytes=100, drop_oldest=True)
    for _ in range(3):
        _publish(core, b"x" * 9)  # 10 bytes each with the topic
    assert len(session.queue) == 3 and bound.queued_bytes == 30
    _publish(core, b"y" * 200)  # bigger than the whole bound: dropped alone
    assert [o.msg.payload for o in session.queue] == [b"x" * 9] * 3
    assert bound.queued_bytes == 30 and bound.dropped == 1
    assert core.stats.dropped_queue_full == 1
    # an ordinary message still makes room by dropping the oldest
    _publish(core, b"z" * 79)  # 80 bytes: one of the 10-byte messages goes
    assert [o.msg.payload for o in session.queue] == [b"x" * 9, b"x" * 9, b"z" * 79]
    assert bound.queued_bytes == 100 and bound.dropped == 2
