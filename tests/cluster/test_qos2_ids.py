"""The received QoS 2 ids of each peer (issue 30, finding 6): kept beyond a link's life and,
with a data directory, across a restart (real files)."""

from __future__ import annotations

from pathlib import Path

from cluster._qos2 import ReceivedQos2


def test_ids_survive_a_reopen_and_releases_and_new_sessions_apply(tmp_path: Path) -> None:
    ids = ReceivedQos2(tmp_path)
    for pid in (1, 2, 3):
        ids.add("aa", pid)
    ids.add("bb", 7)
    ids.discard("aa", 2)
    ids.add("cc", 9)
    ids.clear("cc")  # the peer's session was new: nothing it sent before counts
    ids.close()
    again = ReceivedQos2(tmp_path)  # a restart: compacted on open
    assert again.of("aa") == {1, 3}
    assert again.of("bb") == {7}
    assert again.of("cc") == set()
    assert (tmp_path / "cluster-qos2").read_text().splitlines() == ["+ aa 1", "+ aa 3", "+ bb 7"]
    again.close()


def test_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "cluster-qos2").write_text("+ aa 1\n+ aa 2\n- aa 1\n+ aa 3")
    assert ReceivedQos2(tmp_path).of("aa") == {2, 3}
    (tmp_path / "cluster-qos2").write_text("+ aa 1\n+ aa x")
    assert ReceivedQos2(tmp_path).of("aa") == {1}


def test_the_set_is_shared_with_links_and_memory_only_without_a_data_dir() -> None:
    ids = ReceivedQos2(None)
    live = ids.of("aa")
    ids.add("aa", 5)
    assert 5 in live  # a new link of the same peer reads the same set
    ids.discard("aa", 5)
    assert not live


def test_the_file_is_compacted_when_it_grows(tmp_path: Path) -> None:
    ids = ReceivedQos2(tmp_path)
    for k in range(12_000):
        ids.add("aa", k % 65535 + 1)
        ids.discard("aa", k % 65535 + 1)
    ids.add("aa", 42)
    ids.close()
    assert len((tmp_path / "cluster-qos2").read_text().splitlines()) < 3_000
    assert ReceivedQos2(tmp_path).of("aa") == {42}
