"""The light paths stay light (issue 42 item 1): what ``siftmq serve`` imports before it serves.

``siftmq serve`` runs in a subprocess under ``python -X importtime``, which prints one line per
module imported; the test waits for the broker's "listening on" line, stops it (SIGTERM) and
reads every module the process imported from start to exit. The heavy libraries must not be
among them unless their feature is used: numpy only with a content filter (the engine is made
at the first one), pyarrow / numpy / pandas only when the bridge writes its first table,
kademlia only with --cluster-listen,
the uplink's MQTT client (paho) only with [[bridges]], prometheus_client only with --metrics-listen, h11 only
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
import time
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho

import content

DEADLINE = 60.0  # generous: the suite's workers share the machine

HEAVY = ("pyarrow", "numpy", "pandas", "pyspark", "kademlia", "prometheus_client", "h11")
_SERVE = (sys.executable, "-X", "importtime", "-m", "broker._cli", "serve", "--port", "0")
_IMPORT = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)\s*$")


def _serve_imports(
    tmp_path: Path, *options: str, during: Callable[[int, int], None] | None = None
) -> tuple[set[str], str]:
    """Top-level packages imported by ``siftmq serve --port 0 <options>`` until it stopped, and
    its log.  ``during(port, pid)`` runs once it listens, before it is stopped."""
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
        if during is not None:
            m = re.search(r"listening on [\d.]+:(\d+)", "".join(seen))
            assert m is not None, seen[-5:]
            during(int(m.group(1)), proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE) == 0
        while (line := lines.get(timeout=DEADLINE)) is not None:
            seen.append(line)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    full = {m.group(1) for line in seen if (m := _IMPORT.match(line))}
    modules = {name.split(".")[0] for name in full} | {name for name in full if name.startswith("uplink.")}
    log = "".join(line for line in seen if not line.startswith("import time:"))
    assert "broker" in modules and "asyncio" in modules  # the hook did report the imports
    return modules, log


def test_light_serve_imports_no_heavy_library(tmp_path: Path) -> None:
    modules, _ = _serve_imports(tmp_path, "--no-bridge", "--no-persistence")
    assert not modules & {*HEAVY, "websockets"}, sorted(modules & {*HEAVY, "websockets"})
    # the uplink plugin is loaded, its bridges (an MQTT client, 2.4 MB) only with [[bridges]]
    assert "uplink" in modules
    assert not modules & {"uplink._bridge", "uplink._hook", "paho"}, sorted(modules)


def test_default_serve_loads_the_bridge_libraries_only_to_write(tmp_path: Path) -> None:
    """With the bridge on (the spark extra is a dev dependency), nothing written: no pyarrow."""
    modules, log = _serve_imports(tmp_path)
    assert "bridge on" in log, log
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def _deliver_and_wait_for_the_landing(tmp_path: Path) -> Callable[[int, int], None]:
    """A subscriber and a publisher (paho), one QoS 1 message, then wait until the bridge's
    deliveries file is committed."""

    def run(port: int, pid: int) -> None:
        got = threading.Event()
        sub = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="fp-sub")
        sub.on_message = lambda *_: got.set()
        sub.connect("127.0.0.1", port)
        sub.loop_start()
        try:
            sub.subscribe("fp/t", qos=1)[0]
            pub = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="fp-pub")
            pub.connect("127.0.0.1", port)
            pub.loop_start()
            deadline = time.monotonic() + DEADLINE
            try:
                while not got.is_set():  # until the subscription is in place and delivered to
                    assert time.monotonic() < deadline, "no delivery"
                    pub.publish("fp/t", b"x", qos=1).wait_for_publish(DEADLINE)
                    got.wait(0.2)
            finally:
                pub.loop_stop()
                pub.disconnect()
        finally:
            sub.loop_stop()
            sub.disconnect()
        deliveries = tmp_path / "data" / "landing" / "deliveries"
        while not list(deliveries.glob("*.parquet")):  # the bridge's first commit
            assert time.monotonic() < deadline, "the bridge wrote nothing"
            time.sleep(0.05)

    return run


def test_default_serve_keeps_the_bridge_libraries_out_of_the_broker_after_writing(tmp_path: Path) -> None:
    """The defaults write through the bridge's writer process (bridge/_writerproc.py): after its
    first file, the broker's own process has still imported no numpy, pyarrow or pandas."""
    modules, log = _serve_imports(tmp_path, during=_deliver_and_wait_for_the_landing(tmp_path))
    assert "writer process" in log, log
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_thread_writer_loads_the_bridge_libraries_in_the_broker(tmp_path: Path) -> None:
    """The control: ``--bridge-writer thread`` loads them in the broker at the first write
    (the test above would see them if the writer process did not keep them out)."""
    modules, _ = _serve_imports(
        tmp_path, "--bridge-writer", "thread", during=_deliver_and_wait_for_the_landing(tmp_path)
    )
    assert {"numpy", "pyarrow"} <= modules


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
