"""The router's index and a store's restore: ``replay_entries`` (``SubscriptionIndex.replay``)
must not leave a routing plan cached from before it (the plan would miss the restored client).
"""

from __future__ import annotations

from broker.core._router import Router
from broker.store import EntryRecord, replay_entries
from broker.values import Message, SubOptions


def test_replay_drops_the_cached_plan_of_a_restored_topic() -> None:
    router = Router()
    router.index.subscribe("c1", "a/b", SubOptions(1, topic_filter="a/b"))
    msg = Message("a/b", b"x", 1)
    for _ in range(3):  # the second miss of a topic caches its plan (admission filter)
        assert [r.client_id for r in router.route(msg)] == ["c1"]
    assert "a/b" in router._cache
    replay_entries(
        router.index,
        "c2",
        [
            EntryRecord("a/+", SubOptions(0, topic_filter="a/+")),
            EntryRecord("a/b", SubOptions(1, topic_filter="a/b")),
        ],
    )
    assert sorted((r.client_id, r.qos) for r in router.route(msg)) == [("c1", 1), ("c2", 1)]
    router._check()
