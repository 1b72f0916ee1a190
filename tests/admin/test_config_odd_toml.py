"""Odd TOML in ``siftmq serve --config`` (review rev15 of the unknown-table warning):

* a table or dotted key *inside* ``[broker]`` (``[broker.dashbaord]``, ``limits.max_packet_size
  = 1000``) is an unknown option, refused like an unknown plain key (it was ignored in
  silence: only the top level's tables belong to other packages);
* an empty array of a table someone reads (``bridges = []`` before ``[broker]``) is that
  table, not a stray ``[broker]`` option: no warning telling to move it into ``[broker]``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker._cli import _load_config, load_plugins


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[broker]\nport = 0\nlimits.max_packet_size = 1000\n", "limits"),
        ("[broker]\nport = 0\n\n[broker.dashbaord]\nenabled = true\n", "dashbaord"),
        ("[broker]\nport = 0\nbridges = [{name = 'x'}]\n", "bridges"),
    ],
)
def test_a_table_inside_broker_is_an_unknown_option_not_ignored(
    tmp_path: Path, text: str, named: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"unknown option '{named}'") as err:
        _load_config(path, load_plugins())
    assert str(path) in str(err.value)


def test_a_table_inside_broker_named_like_an_option_still_counts(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[broker]\nport = 0\n\n[broker.shared_subscription_group_strategy]\nalarms = 'sticky'\n")
    cfg, _ = _load_config(path, load_plugins())
    assert "alarms=sticky" in "".join(cfg.shared_subscription_group_strategy).replace(" ", "")


def test_an_empty_array_of_a_known_table_is_not_a_stray_top_level_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.toml"
    path.write_text("bridges = []\nlisteners = []\n\n[broker]\nport = 0\n")
    with caplog.at_level(logging.WARNING):
        _load_config(path, load_plugins())
    said = [r.getMessage() for r in caplog.records if "top-level key" in r.getMessage()]
    assert said == []


def test_an_unknown_array_of_tables_at_the_top_level_is_warned_like_a_table(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a ``[broker]`` table, ``[[brokr]]`` is another package's table like ``[brokr]``:
    a warning naming it (it was refused as ``[broker]: unknown option 'brokr'``, naming a
    table the file does not have, while ``[brokr]`` was only warned about)."""
    path = tmp_path / "c.toml"
    path.write_text("port = 0\n\n[[brokr]]\nx = 1\n\n[brokr2]\nx = 1\n")
    with caplog.at_level(logging.WARNING):
        cfg, _ = _load_config(path, load_plugins())
    assert cfg.port == 0
    said = [r.getMessage() for r in caplog.records if "unknown table" in r.getMessage()]
    assert len(said) == 2 and "[brokr]" in said[0] and "[brokr2]" in said[1], said
