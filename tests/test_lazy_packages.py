"""The lazy public names of ``bridge`` and ``cluster`` (``broker.ext.lazy_names`` with ``plain``).

Both packages load their names at first use (PEP 562), and only some of them need the package's
extra: ``bridge.spark_jar`` and ``cluster.RouteTable`` work without Spark / kademlia, while
``bridge.Bridge`` and ``cluster.ClusterNode`` raise ``MissingExtra`` naming the pip line.  Each
case runs in a fresh interpreter in which the extra's module cannot be imported (its
``sys.modules`` entry is None, as Python's own import blocking does), so the installed extras
of the test machine do not decide the outcome.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("package", "blocked", "plain", "needs_extra", "extra"),
    [
        ("bridge", "pyarrow", "spark_jar", "Bridge", "spark"),
        ("cluster", "kademlia", "RouteTable", "ClusterNode", "cluster"),
    ],
)
def test_plain_names_load_without_the_extra_and_the_others_name_it(
    package: str, blocked: str, plain: str, needs_extra: str, extra: str
) -> None:
    out = _run(
        f"""
        import sys
        sys.modules[{blocked!r}] = None
        import {package} as p
        from broker.ext import MissingExtra
        value = p.{plain}
        assert p.__dict__[{plain!r}] is value  # kept: the next use is an ordinary attribute
        try:
            p.{needs_extra}
        except MissingExtra as exc:
            print(exc.extra.value, "|", exc)
        try:
            p.no_such_name
        except AttributeError as exc:
            print(exc)
        """
    )
    first, second = out.splitlines()
    assert first.startswith(f"{extra} |") and f"siftmq[{extra}]" in first
    assert second == f"module {package!r} has no attribute 'no_such_name'"
