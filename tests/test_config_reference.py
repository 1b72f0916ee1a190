"""docs/config-reference.md is what scripts/config_reference.py generates from the code (so the
reference cannot drift: a new option without its regenerated reference fails here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_committed_config_reference_matches_the_code() -> None:
    spec = importlib.util.spec_from_file_location(
        "config_reference", ROOT / "scripts" / "config_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = (ROOT / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert committed == module.generate(), (
        "docs/config-reference.md is out of date: run scripts/config_reference.py"
    )
    # every option is in it
    from broker._config import BrokerConfig

    for name in BrokerConfig.__dataclass_fields__:
        assert f"| `{name}` |" in committed
    # with what the schema accepts (broker._config.Option), for [broker] and [serve] alike
    assert "| `max_inflight` | `int` | an integer 1..65535 (messages) |" in committed
    assert "| `log_level` | one of DEBUG, INFO, WARNING, ERROR, CRITICAL |" in committed
    assert "| `cluster_listen` | HOST:PORT with a port 0..65535 |" in committed


def test_the_example_configuration_of_the_systemd_unit_is_valid() -> None:
    """packaging/siftmq.toml (installed as /etc/siftmq/siftmq.toml by docs/operations.md) loads,
    and its ``[serve]`` keys are known to ``siftmq serve``."""
    import tomllib

    from broker import _cli
    from broker._config import load_toml

    example = ROOT / "packaging" / "siftmq.toml"
    cfg = load_toml(example)
    assert cfg.metrics_listen == "127.0.0.1:9464"
    serve = tomllib.loads(example.read_text())["serve"]
    known = _cli._SERVE_KEYS.union(*(p.serve_keys for p in _cli.load_plugins()))
    assert set(serve) <= known
    unit = (ROOT / "packaging" / "siftmq.service").read_text()
    assert "--config /etc/siftmq/siftmq.toml" in unit


def test_a_list_key_names_its_repeatable_flag() -> None:
    """``dashboard_admins`` is set by ``--dashboard-admin USER`` given once per user: its row
    names that flag (it had an empty flag column: the flag's name is the key's singular)."""
    committed = (ROOT / "docs" / "config-reference.md").read_text(encoding="utf-8")
    row = next(line for line in committed.splitlines() if line.startswith("| `dashboard_admins` |"))
    assert "`--dashboard-admin` (repeatable)" in row
