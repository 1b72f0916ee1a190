"""The wheel of ``pip install siftmq`` in a fresh venv: the broker alone, compiled, and the one
clear line of each missing extra (issue 28; docs/operations.md, "Installing").

``make wheel`` (a prerequisite of ``make test``) builds ``dist/siftmq-*.whl`` with the standard
front end, incrementally; the fixture installs it into a new venv made without pip (so no dev
tool is there: the dev venv's pip installs into it with ``--python``), with its declared
dependencies only, and every command below runs that venv's ``siftmq`` from a directory
outside the repository, so nothing of the checkout can be imported by mistake. A run without
the wheel (a plain ``pytest`` before ``make wheel``) skips with that reason; a wheel older
than the sources fails, as a stale compiled module does (tests/conftest.py).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from broker._build import HOT_MODULES
from tests.security.helpers import Certs, make_certs

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: seconds any one step may take (installing resolves the dependencies from the index)
T = 120.0


def _wheel() -> Path:
    wheels = sorted((ROOT / "dist").glob("siftmq-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        pytest.skip("no wheel in dist/: `make wheel` builds it (`make test` does)")
    wheel = wheels[-1]
    sources = [p for pkg in ("broker", "topics") for p in (ROOT / pkg).rglob("*.py")]
    newer = [str(p.relative_to(ROOT)) for p in sources if p.stat().st_mtime > wheel.stat().st_mtime]
    assert not newer, f"{wheel.name} is older than {newer[:3]}: run `make wheel`"
    return wheel


class Venv:
    """A venv with the broker-only wheel; runs its commands outside the repository."""

    def __init__(self, root: Path, work: Path) -> None:
        self.root = root
        self.work = work
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        self.env = env

    def bin(self, name: str) -> str:
        return str(self.root / "bin" / name)

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.bin("siftmq"), *argv],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=T,
            check=False,
        )

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.bin("python"), "-c", code],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=T,
            check=False,
        )


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    wheel = _wheel()
    root = tmp_path_factory.mktemp("wheel") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=T)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(root / "bin" / "python"),
            "install",
            "-q",
            "--no-compile",
            str(wheel),
        ],
        check=True,
        timeout=T,
    )
    work = tmp_path_factory.mktemp("work")
    return Venv(root, work)


#: what a broker-only install must not bring: the extras' modules and the dev tools
ABSENT = (
    "pyspark",
    "pyarrow",
    "pandas",
    "matplotlib",
    "kademlia",
    "prometheus_client",
    "pytest",
    "mypy",
    "pip",
)


def test_the_broker_alone_is_installed_with_its_hot_path_compiled(venv: Venv) -> None:
    r = venv.python(
        "import importlib.util as u, broker, topics, content, composite, bridge, cluster\n"
        "print(broker.__file__)\n"
        f"for m in {ABSENT!r}:\n"
        "    print(m, u.find_spec(m) is not None)\n"
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(str(venv.root)), lines[0]  # the wheel's broker, not the checkout's
    assert lines[1:] == [f"{m} False" for m in ABSENT]
    v = venv.run("version")
    assert v.returncode == 0, v.stderr
    assert v.stderr == ""  # the bridge and cluster plugins loaded (a failed one is a warning)
    assert f"hot path: {len(HOT_MODULES)} of {len(HOT_MODULES)} modules compiled with mypyc" in v.stdout
    assert "extras: spark no, cluster no, metrics no, auth no" in v.stdout
    assert venv.run("--version").stdout == v.stdout


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (("analytics", "--once"), "spark"),
        (("analytics", "report"), "spark"),
        (("serve", "--port", "0", "--bridge"), "spark"),
        (("serve", "--port", "0", "--bridge-roll-interval", "1"), "spark"),
        (("serve", "--port", "0", "--cluster-listen", "127.0.0.1:0"), "cluster"),
    ],
)
def test_a_command_without_its_extra_says_which_to_install(
    venv: Venv, argv: tuple[str, ...], extra: str
) -> None:
    r = venv.run(*argv)
    assert r.returncode == 2
    assert r.stdout == ""
    # one line, besides the log of `serve` (`bridge off: ...` before the cluster's check)
    lines = [x for x in r.stderr.splitlines() if not re.match(r"\d{4}-\d\d-\d\d .* INFO ", x)]
    assert len(lines) == 1, r.stderr
    assert f"pip install 'siftmq[{extra}]'" in lines[0]


@pytest.fixture
def served(venv: Venv, tmp_path: Path) -> Iterator[tuple[dict[str, int], Certs, list[str]]]:
    """``siftmq serve`` of the venv with its store and three listeners (TCP, TLS, WebSocket, all
    on port 0); yields ({"tcp": port, "tcp+tls": port, "ws": port}, the certificates, the log
    lines until the last listener opened)."""
    certs = make_certs(tmp_path)
    argv = [
        "serve",
        "--port",
        "0",
        "--tls-port",
        "0",
        "--ws-port",
        "0",
        "--data-dir",
        str(venv.work / "data"),
    ]
    argv += ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    proc = subprocess.Popen(
        [venv.bin("siftmq"), *argv], cwd=venv.work, env=venv.env, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    stderr = proc.stderr
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in stderr], daemon=True)
    reader.start()
    seen: list[str] = []
    ports: dict[str, int] = {}
    try:
        while len(ports) < 3:
            line = lines.get(timeout=T)
            seen.append(line)
            found = re.search(r"listening on 127\.0\.0\.1:(\d+) \((\S+)\)", line)
            if found:
                ports[found.group(2)] = int(found.group(1))
        yield ports, certs, seen
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=T) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(T)
        stderr.close()


def _receive_over_websocket(port: int, topic_filter: str) -> tuple[str, bytes]:
    """The first message a paho client (of the test's environment) subscribed over WebSocket gets."""
    got: queue.Queue[tuple[str, bytes]] = queue.Queue()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, "ws-reader", transport="websockets")
    c.ws_set_options(path="/mqtt")
    c.on_connect = lambda cl, _u, _f, _rc, _p: cl.subscribe(topic_filter, qos=1)
    c.on_message = lambda _c, _u, m: got.put((m.topic, m.payload))
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        return got.get(timeout=T)
    finally:
        c.disconnect()
        c.loop_stop()


def test_serve_without_the_spark_extra_runs_a_pub_sub_round_trip(
    venv: Venv, served: tuple[dict[str, int], Certs, list[str]]
) -> None:
    ports, certs, log = served
    text = "".join(log)
    assert "bridge off: the 'spark' extra is not installed (pip install 'siftmq[spark]')" in text
    assert f"hot path: {len(HOT_MODULES)} of {len(HOT_MODULES)} modules compiled with mypyc" in text
    # published over TLS, retained so that the subscribers started after it get it without a race
    tls = ["-h", "127.0.0.1", "-p", str(ports["tcp+tls"]), "--cafile", str(certs.ca)]
    p = venv.run("pub", *tls, "-q", "1", "-r", "-t", "sensors/a", "-m", '{"temp": 35}')
    assert p.returncode == 0, p.stderr
    # received over TCP through a content filter
    s = venv.run(*f"sub -p {ports['tcp']} -q 1 -t sensors/# -v -C 1 -W 30".split(), "--filter", "temp > 30")
    assert s.returncode == 0, s.stderr
    assert s.stdout.splitlines() == ['sensors/a {"temp": 35}']
    # and over WebSocket
    assert _receive_over_websocket(ports["ws"], "sensors/#") == ("sensors/a", b'{"temp": 35}')
