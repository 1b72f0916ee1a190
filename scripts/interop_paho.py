"""Run the Eclipse Paho interoperability suites against ``siftmq serve`` (by hand, not in CI).

Usage (``SUITE`` is the ``interoperability`` folder of a checkout of
https://github.com/eclipse/paho.mqtt.testing, kept outside this repository)::

    .venv/bin/python scripts/interop_paho.py SUITE

The script starts ``siftmq serve`` on a free loopback port with the two options the suites
expect (a refused filter ``test/nosubscribe`` and a server keep-alive of 60 s), runs
``client_test.py`` (MQTT 3.1.1) and ``client_test5.py`` (MQTT 5.0) unmodified, prints their
unittest summaries and exits non-zero if either fails.  ``client_test.py`` forwards its own
``-p`` option to unittest, so it is driven by importing it and setting its module globals
(the values its ``__main__`` block would set).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """\
[broker]
server_keep_alive = 60
refused_filters = ["test/nosubscribe"]
sys_interval = 0
"""

RUN_311 = """\
import logging, sys, unittest
sys.path.insert(0, {suite!r})
import client_test as ct
ct.topics = ("TopicA", "TopicA/B", "Topic/C", "TopicA/C", "/TopicA")
ct.wildtopics = ("TopicA/+", "+/C", "#", "/#", "/+", "+/+", "TopicA/#")
ct.nosubscribe_topics = ("test/nosubscribe",)
ct.host = "127.0.0.1"
ct.port = {port}
logging.getLogger().setLevel(logging.ERROR)
unittest.main(module=ct, argv=["client_test"])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_listening(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"siftmq serve did not listen on {port} within {timeout} s")


def _summary(output: str) -> str:
    ran = re.findall(r"^Ran \d+ tests? in [\d.]+s$", output, re.M)
    verdict = re.findall(r"^(OK.*|FAILED.*)$", output, re.M)
    return f"{ran[-1] if ran else 'no tests ran'}; {verdict[-1] if verdict else 'no verdict'}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("suite", type=Path, help="paho.mqtt.testing/interoperability folder")
    args = ap.parse_args()
    suite = args.suite.resolve()
    if not (suite / "client_test5.py").exists():
        ap.error(f"{suite} has no client_test5.py")
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp, "paho.toml")
        cfg.write_text(CONFIG)
        siftmq = Path(sys.executable).with_name("siftmq")
        cmd = [str(siftmq), "serve", "--port", str(port), "--no-bridge", "--config", str(cfg)]
        with open(Path(tmp, "broker.log"), "w") as log:
            broker = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
        try:
            _wait_listening(port)
            env = dict(os.environ, PYTHONPATH=str(suite))

            def run(args: list[str]) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    args, cwd=suite, env=env, capture_output=True, text=True, timeout=600, check=False
                )

            v311 = run([sys.executable, "-c", RUN_311.format(suite=str(suite), port=port)])
            v5 = run([sys.executable, "client_test5.py", "-p", str(port)])
        finally:
            broker.terminate()
            broker.wait(timeout=10)
    print(f"MQTT 3.1.1 client_test.py:  {_summary(v311.stderr + v311.stdout)}")
    print(f"MQTT 5.0   client_test5.py: {_summary(v5.stderr + v5.stdout)}")
    failed = v311.returncode != 0 or v5.returncode != 0
    if failed:
        sys.stderr.write(v311.stderr[-4000:] + v5.stderr[-4000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
