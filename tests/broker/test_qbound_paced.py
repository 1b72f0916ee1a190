"""A queue bound with ``pace`` (core/_qbound.py) forgets the publishers lost while paused: a
bound that stays full while publishers connect, get paused and disconnect keeps a set of the
live paused publishers, not of every one it ever paused."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from broker.core._qbound import QueueBound


class _Conn:
    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.blockers = 0


def test_paced_publishers_lost_while_paused_are_forgotten() -> None:
    core: Any = SimpleNamespace(
        current=None, queue_bounds={}, connections=set(), block=lambda c: None, log_limit=lambda *a: None
    )
    bound = QueueBound(1, pace=True)
    session: Any = SimpleNamespace(client_id="$uplink/x", queue=[])
    for i in range(1000):
        pub = _Conn(f"p{i}")
        core.connections.add(pub)
        core.current = pub
        assert bound._hold(core, session)
        core.connections.discard(pub)  # it disconnects while paused (Connection.lost)
    assert bound.paces == 1000
    assert len(bound.paced) <= 64
    live: Any = _Conn("live")
    core.connections.add(live)
    core.current = live
    assert bound._hold(core, session)
    assert live in bound.paced
