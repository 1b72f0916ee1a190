"""Fixtures of the outbound bridge tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.uplink._remote import refusing_port

__all__ = ["dead_port"]


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A loopback port where nothing listens for the whole test (``refusing_port``: a bound,
    non-listening socket kept open, so no other socket can take the port meanwhile)."""
    with refusing_port() as port:
        yield port
