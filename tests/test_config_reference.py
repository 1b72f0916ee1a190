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
