"""``siftmq version`` / ``siftmq --version``: the compiled hot-path modules and the installed
extras (docs/operations.md, "Installing"); ``siftmq`` without a command is a usage error."""

from __future__ import annotations

import pytest

from broker._build import HOT_MODULES, compiled_modules
from broker._cli import main
from broker._extras import Extra, MissingExtra, available, require


def test_version_reports_compiled_modules_and_extras(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("siftmq ")
    assert f"hot path: {len(compiled_modules())} of {len(HOT_MODULES)} modules compiled with mypyc" in out
    # the dev install has every extra (the broker-only install: tests/packaging/)
    assert "extras: spark yes, cluster yes, metrics yes" in out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == out


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "a command is required" in capsys.readouterr().err


def test_require_passes_for_an_installed_extra() -> None:
    for extra in Extra:
        assert available(extra)
        require(extra, "test")
    err = MissingExtra(Extra.CLUSTER, "--cluster-listen", "kademlia")
    assert isinstance(err, ImportError)
    assert str(err) == (
        "--cluster-listen needs the 'cluster' extra (kademlia is not installed): "
        "pip install 'siftmq[cluster]'"
    )
