"""The received QoS 2 ids of each peer (issue 30, finding 6): kept beyond a link's life and,
in the broker's store (real SQLite files), across a restart."""

from __future__ import annotations

from pathlib import Path

from broker import Broker
from broker.store import Store
from cluster._qos2 import IN_PREFIX, ReceivedQos2


def test_ids_are_stored_released_and_cleared_in_the_brokers_store(tmp_path: Path) -> None:
    path = tmp_path / "broker.db"
    store = Store(path)
    ids = ReceivedQos2()
    ids.attach(store, {})
    for pid in (1, 2, 3):
        ids.received("aa", pid)
    ids.received("bb", 7)
    ids.discard("aa", 2)  # PUBREL
    ids.received("cc", 9)
    ids.clear("cc")  # the peer's session was new: nothing it sent before counts
    store.sync().result(10)
    store.close()
    again = Store(path)  # a restart
    try:
        state = again.load()
        assert state.qos2_in == {IN_PREFIX + "aa": {1, 3}, IN_PREFIX + "bb": {7}}
        restored = ReceivedQos2()
        restored.attach(again, state.qos2_in)
        assert restored.of("aa") == {1, 3}
        assert restored.of("bb") == {7}
        assert restored.of("cc") == set()
    finally:
        again.close()


async def test_a_restarted_broker_hands_the_ids_without_a_session_back(tmp_path: Path) -> None:
    path = tmp_path / "broker.db"
    store = Store(path)
    ReceivedQos2().attach(store, {})
    store.qos2_received(IN_PREFIX + "aa", 5)
    store.sync().result(10)
    store.close()
    async with Broker("127.0.0.1", 0, store_path=str(path)) as b:
        assert b.restored_qos2_in == {IN_PREFIX + "aa": {5}}


def test_the_set_is_shared_with_links_and_memory_only_without_a_store() -> None:
    ids = ReceivedQos2()
    live = ids.of("aa")
    ids.received("aa", 5)
    assert 5 in live  # a new link of the same peer reads the same set
    ids.discard("aa", 5)
    assert not live


def test_a_release_gives_the_durable_signal_its_pubcomp_waits_for(tmp_path: Path) -> None:
    """The link answers a peer's PUBREL once the release is committed: a PUBCOMP before it,
    then a crash, and the restored (stale) id would swallow the peer's next message that
    reuses the packet id."""
    store = Store(tmp_path / "broker.db")
    try:
        ids = ReceivedQos2()
        ids.attach(store, {})
        ids.received("aa", 4)
        durable = ids.discard("aa", 4)
        assert durable is not None
        durable.result(10)
        assert store.load().qos2_in == {}
        assert ids.discard("aa", 4) is None  # released already: nothing to wait for
    finally:
        store.close()
