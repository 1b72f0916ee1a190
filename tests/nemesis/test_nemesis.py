"""The short nemesis run of CI (issue 30): 3 ``siftmq serve`` nodes in their own network
namespaces, 3 random faults from a fixed seed, the whole history checked
(``tests/nemesis/_checker.py``).  Skipped with the reason when the machine cannot make
namespaces (root, iproute2, nftables).  The long runs: ``benchmarks/nemesis.py``, results in
docs/fault.md."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.nemesis import _net
from tests.nemesis._run import Options, run, summary

pytestmark = pytest.mark.skipif(bool(_net.why_not()), reason=str(_net.why_not()))


def test_short_nemesis_run_loses_nothing_acknowledged(tmp_path: Path) -> None:
    opts = Options(nodes=3, cycles=3, seed=30, fault_s=2.0, settle_s=1.0, rate=20.0, final_wait_s=8.0)
    res = run(tmp_path, opts)
    rep = res.report
    text = json.dumps(summary(res, opts), indent=1)
    assert not res.tracebacks, res.tracebacks[:5]
    assert rep.acked > 100, text
    assert not rep.lost, text
    assert not rep.lost_shared, text
    assert not rep.qos2_duplicates, text
    assert not rep.retained_problems, text
    # no subscriber's queue overflowed (a drop by the configured bound would hide as "lost")
    assert res.queue_overflows == 0, text
    # this run's namespaces and bridge are gone (tag: the process id, as Network chose it)
    mine = f"{_net.PREFIX}{os.getpid() % 250}"
    assert not [ns for ns in _net._run(["ip", "netns", "list"]).splitlines() if ns.startswith(mine + "n")]
    assert f" {mine}b:" not in _net._run(["ip", "-o", "link", "show", "type", "bridge"])
