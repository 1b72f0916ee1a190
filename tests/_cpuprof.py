"""Where the suite's CPU goes: a pytest plugin that records, per test, its wall time, the CPU
of the process that ran it (an xdist worker: user + system) and of the child processes it
waited for (``siftmq serve``, cluster nodes, CLIs, mosquitto: ``os.times()``' children
fields), one JSON line per test appended to the file named by ``$SIFTMQ_CPUPROF``; and a
report of that file by test file (docs/development.md, "Suite time (session 15)")::

    SIFTMQ_CPUPROF=/tmp/cpu.jsonl .venv/bin/python -m pytest -n 4 --dist loadfile -p tests._cpuprof
    .venv/bin/python -m tests._cpuprof /tmp/cpu.jsonl 20

A test is measured from its set-up to its teardown (``pytest_runtest_protocol``), so a module
fixture's cost lands on the test that set it up or tore it down, and the file's sum holds it
all. Not counted: processes nobody waits for (Spark's JVMs, a daemon's children), which a
cgroup's ``cpuacct.usage`` around the whole run does count. Cost: two ``os.times()`` calls
and one line written per test; the plugin does nothing unless loaded with ``-p``.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from collections.abc import Generator

import pytest

__all__ = ["pytest_runtest_logreport", "pytest_runtest_protocol", "report"]

_phases: dict[str, float] = {}  # the running test's set-up, call and teardown wall times


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _phases[report.when] = report.duration


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    del nextitem
    _phases.clear()
    t0, w0 = os.times(), time.monotonic()
    yield
    t1, w1 = os.times(), time.monotonic()
    record = {
        "id": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "-"),
        "start": w0,
        "wall": w1 - w0,
        "self": (t1.user - t0.user) + (t1.system - t0.system),
        "children": (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system),
        **{when: round(d, 4) for when, d in _phases.items()},  # "setup", "call", "teardown"
    }
    path = os.environ.get("SIFTMQ_CPUPROF")
    if path:
        with open(path, "a", encoding="utf-8") as f:  # one write per line: workers append alike
            f.write(json.dumps(record) + "\n")


def report(path: str, top: int = 20) -> str:
    """The CPU by test file (its tests' own + their waited-for children's), largest first:
    O(tests)."""
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if "wall" not in r:  # not a test's line
                continue
            row = files[r["id"].split("::", 1)[0]]
            row[0] += r["self"]
            row[1] += r["children"]
            row[2] += r["wall"]
            row[3] += 1
    own = sum(r[0] for r in files.values())
    children = sum(r[1] for r in files.values())
    out = [
        f"{sum(int(r[3]) for r in files.values())} tests: {own:.1f} s of CPU in the workers, "
        f"{children:.1f} s in their children, {own + children:.1f} s in all",
        f"{'file':62} {'CPU s':>7} {'own':>6} {'child':>6} {'wall s':>7} tests",
    ]
    ranked = sorted(files.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
    for name, (o, c, w, n) in ranked[:top]:
        out.append(f"{name:62} {o + c:7.1f} {o:6.1f} {c:6.1f} {w:7.1f} {int(n)}")
    return "\n".join(out)


if __name__ == "__main__":
    print(report(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20))
