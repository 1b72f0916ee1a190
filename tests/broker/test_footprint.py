"""The light paths stay light (issue 42 item 1): what ``siftmq serve`` imports before it serves.

``siftmq serve`` runs in a subprocess under ``python -X importtime``, which prints one line per
module imported; the test waits for the broker's "listening on" line, stops it (SIGTERM) and
reads every module the process imported from start to exit. The heavy libraries must not be
among them unless their feature is used: numpy only with a content filter (the engine is made
at the first one), pyarrow / numpy / pandas only when the bridge writes its first table,
kademlia only with --cluster-listen, prometheus_client only with --metrics-listen, h11 only
with an HTTP listener, pyspark only for Spark commands, websockets only with a ws listener.
No timing: a regression test of the import graph (docs/performance.md "Footprint").
"""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import content

DEADLINE = 60.0  # generous: the suite's workers share the machine

HEAVY = ("pyarrow", "numpy", "pandas", "pyspark", "kademlia", "prometheus_client", "h11")
_SERVE = (sys.executable, "-X", "importtime", "-m", "broker._cli", "serve", "--port", "0")
_IMPORT = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)\s*$")


def _serve_imports(tmp_path: Path, *options: str) -> tuple[set[str], str]:
    """Top-level packages imported by ``siftmq serve --port 0 <options>`` until it stopped, and
    its log."""
    proc = subprocess.Popen(
        [*_SERVE, "--data-dir", str(tmp_path / "data"), *options],
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert proc.stderr is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    try:
        while True:  # until the broker listens (or exits, or the deadline)
            line = lines.get(timeout=DEADLINE)
            if line is None:
                raise AssertionError("serve exited before listening:\n" + "".join(seen[-30:]))
            seen.append(line)
            if "listening on" in line:
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE) == 0
        while (line := lines.get(timeout=DEADLINE)) is not None:
            seen.append(line)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    modules = {m.group(1).split(".")[0] for line in seen if (m := _IMPORT.match(line))}
    log = "".join(line for line in seen if not line.startswith("import time:"))
    assert "broker" in modules and "asyncio" in modules  # the hook did report the imports
    return modules, log


def test_light_serve_imports_no_heavy_library(tmp_path: Path) -> None:
    modules, _ = _serve_imports(tmp_path, "--no-bridge", "--no-persistence")
    assert not modules & {*HEAVY, "websockets"}, sorted(modules & {*HEAVY, "websockets"})


def test_default_serve_loads_the_bridge_libraries_only_to_write(tmp_path: Path) -> None:
    """With the bridge on (the spark extra is a dev dependency), nothing written: no pyarrow."""
    modules, log = _serve_imports(tmp_path)
    assert "bridge on" in log, log
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_content_engines_are_imported_at_first_use() -> None:
    """``import content`` lists every engine without importing one (numpy); a lookup imports
    it and gives the class of that name, as the dict ENGINES was."""
    code = (
        "import sys, content\n"
        "assert 'numpy' not in sys.modules, 'numpy imported with content'\n"
        "assert 'content._hema' not in sys.modules\n"
        "names = list(content.ENGINES)\n"
        "assert len(content.ENGINES) == len(names) == 11 and 'hema' in content.ENGINES\n"
        "assert 'nope' not in content.ENGINES\n"
        "assert content.ENGINES['hema'] is content.HEMA and 'content._hema' in sys.modules\n"
        "print(' '.join(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [
        "brute-force",
        "counting",
        "iccounting",
        "rabased",
        "hema",
        "rein",
        "hcem",
        "betree",
        "poset",
        "tama",
        "htree",
    ]
    assert all(content.ENGINES[name].name == name for name in content.ENGINES)
    assert dict(content.ENGINES)["tama"] is content.TAMA
