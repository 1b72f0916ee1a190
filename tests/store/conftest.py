"""Fixtures of the store tests: a store on a temporary data directory, closed after the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.store import Store


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def store(data_dir: Path) -> Iterator[Store]:
    s = Store.in_data_dir(data_dir)
    yield s
    s.close()
