"""``drop_oldest`` at a byte bound (core/_qbound.py): a message bigger than the whole bound
is dropped by itself; the queued messages, which it could never make room for, stay."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

from broker.core._qbound import QueueBound


def _out(payload: bytes) -> Any:
    return SimpleNamespace(msg=SimpleNamespace(topic="t", payload=payload))


def test_drop_oldest_keeps_the_queue_when_a_message_exceeds_the_whole_byte_bound() -> None:
    dropped: list[Any] = []
    core: Any = SimpleNamespace(
        journal=SimpleNamespace(dropped=lambda s, out: dropped.append(out)),
        stats=SimpleNamespace(queue_overflow=0, dropped_queue_full=0),
        log_limit=lambda *a: None,
        log_due=lambda kind: True,
    )
    session: Any = SimpleNamespace(client_id="$uplink/x", queue=deque())
    bound = QueueBound(10, max_bytes=100, drop_oldest=True)
    for _ in range(3):
        out = _out(b"x" * 9)
        assert bound.admit(core, session, out)
        session.queue.append(out)
    assert not bound.admit(core, session, _out(b"y" * 200))
    assert len(session.queue) == 3 and dropped == []
    assert bound.queued_bytes == 30 and bound.dropped == 1
    # an ordinary message still makes room by dropping the oldest
    assert bound.admit(core, session, _out(b"z" * 79))
    assert len(session.queue) == 2 and len(dropped) == 1 and bound.dropped == 2
