"""Suite-wide settings.  Hypothesis: no per-example deadline (machines are noisy; timing is
measured by benchmarks, never by tests); CI derandomizes so a run is reproducible."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci" if os.environ.get("CI") else "default")


def pytest_configure(config: object) -> None:
    """Refuse to test stale compiled modules: a mypyc extension shadows its edited source."""
    from broker._build import stale_modules

    stale = stale_modules()
    if stale:
        import pytest

        pytest.exit(f"compiled modules older than their source: {', '.join(stale)}; run `make build`", 2)
