"""The broker's files on disk are private whatever the umask (issue 37, item 6;
docs/security.md, "Files on disk").

Real ``siftmq serve`` / ``siftmq backup`` processes started with a permissive umask (0o000:
without explicit modes every file would be 0666 and every directory 0777), with the store, a
one-node cluster, the bridge and a backup, after traffic; the mode of every file and
directory under the data directory is checked while the broker runs (``-wal``/``-shm``
exist then) and after it stopped.  Files an older version left readable by others are
tightened at start; operator files are checked: a cluster secret file readable by others is
refused (exit 2), a password file so gets a warning.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import subprocess
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from bridge import Bridge
from broker import Broker
from broker.store import Store
from tests.serving import CLI, Serve

T = 20.0


#: run a command with umask 0 (every permission a process asks for, it gets)
UMASK0 = ("sh", "-c", 'umask 000 && exec "$@"', "umask0")


def _modes(root: Path) -> dict[str, int]:
    """Relative path -> permission bits of ``root`` and everything under it."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for d, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            p = Path(d) / name
            out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


def _not_private(root: Path) -> dict[str, str]:
    """Entries under ``root`` whose mode is not 0700 (directories) / 0600 (files)."""
    bad = {}
    for rel, mode in _modes(root).items():
        want = 0o700 if (root / rel).is_dir() else 0o600
        if mode != want:
            bad[rel] = f"{mode:04o}"
    return bad


def _client(port: int, cid: str, clean: bool) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, cid, protocol=mqtt.MQTTv311, clean_session=clean)
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def test_serve_state_and_backup_are_private_whatever_the_umask(tmp_path: Path) -> None:
    data = tmp_path / "data" / "nested"  # the broker creates both levels
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(b"a-private-cluster-secret")
    secret.chmod(0o600)
    with Serve(
        "--log-level",
        "INFO",
        "--data-dir",
        str(data),
        "--bridge",
        "--bridge-roll-interval",
        "0.1",
        "--cluster-listen",
        "127.0.0.1:0",
        "--cluster-secret-file",
        str(secret),
        prefix=UMASK0,
    ) as node:
        port = node.port()
        node.wait_for(r"cluster node [0-9a-f]+ on 127\.0\.0\.1:\d+")
        sub = _client(port, "keeper", clean=False)  # a persisted session: its messages are stored
        got = sub.subscribe("t/#", qos=1)
        assert got[0] == mqtt.MQTT_ERR_SUCCESS
        sub.disconnect()
        sub.loop_stop()
        pub = _client(port, "writer", clean=True)
        infos = [pub.publish(f"t/{i}", b"secret payload %d" % i, qos=1, retain=i == 0) for i in range(20)]
        for info in infos:
            info.wait_for_publish(T)
            assert info.is_published()
        pub.disconnect()
        pub.loop_stop()
        deadline = time.monotonic() + T  # the bridge has landed the publications
        while not list((data / "landing").glob("*/part-*.parquet")):
            assert time.monotonic() < deadline, "the bridge landed nothing"
            time.sleep(0.05)

        backup = tmp_path / "backup.db"
        r = subprocess.run(
            [*UMASK0, *CLI, "backup", "--data-dir", str(data), str(backup)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE(backup.stat().st_mode) == 0o600

        running = _modes(data)
        for name in ("broker.db", "broker.db-wal", "broker.db-shm", "cluster-node-id", "cluster-retained"):
            assert name in running, sorted(running)
        assert _not_private(data) == {}, "while running"
        assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700  # the parent it created too
        assert node.stop() == 0
    assert _not_private(data) == {}, "after a graceful stop"
    assert any(p.endswith(".parquet") for p in _modes(data))


def test_files_left_readable_by_an_older_version_are_tightened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    with Store(data / "broker.db"):
        pass
    landing = data / "landing"
    Bridge(landing).close()
    old = landing / "deliveries" / "part-0000000000000001-old00000-00000001.parquet"
    old.write_bytes(b"")
    for p in (data, landing, landing / "deliveries", data / "broker.db", old):  # as 0.x left them
        p.chmod(0o755 if p.is_dir() else 0o644)
    caplog.set_level(logging.WARNING)

    async def run() -> None:
        db = str(data / "broker.db")
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=db, hooks=[Bridge(landing)]):
            pass

    asyncio.run(run())
    assert _not_private(data) == {}
    assert "now private to this user" in caplog.text


def test_a_cluster_secret_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(b"a-shared-cluster-secret")
    secret.chmod(0o644)
    r = subprocess.run(
        [
            *CLI,
            "serve",
            "--port",
            "0",
            "--no-bridge",
            "--data-dir",
            str(tmp_path / "data"),
            "--cluster-listen",
            "127.0.0.1:0",
            "--cluster-secret-file",
            str(secret),
        ],
        capture_output=True,
        text=True,
        timeout=T,
        check=False,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("siftmq serve: --cluster-secret-file: ")
    assert "accessible by group or others (mode 0644" in lines[0]


def test_a_password_file_readable_by_others_is_warned_about(tmp_path: Path) -> None:
    """... and ``siftmq serve`` tightens the data directory and the files directly in it that
    an older version left readable (its subdirectories are their writers': Spark's output)."""
    data = tmp_path / "data"
    (data / "analytics").mkdir(parents=True)
    (data / "cluster-node-id").write_text("ab" * 20 + "\n")
    (data / "analytics" / "part-0.json").write_text("{}")
    for p in (data, data / "cluster-node-id"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    pw = tmp_path / "passwd.txt"
    r = subprocess.run([*CLI, "passwd", "-c", "-b", str(pw), "alice", "pw"], capture_output=True, check=False)
    assert r.returncode == 0
    pw.chmod(0o644)
    acl = tmp_path / "acl.txt"
    acl.write_text("user alice\ntopic readwrite #\n")
    acl.chmod(0o600)
    files = ("--password-file", str(pw), "--acl-file", str(acl))
    with Serve(
        "--log-level",
        "INFO",
        "--no-bridge",
        "--no-persistence",
        "--data-dir",
        str(data),
        *files,
        prefix=UMASK0,
    ) as node:
        node.port()
        assert node.stop() == 0
    warned = [line for line in node.lines if "accessible by group or others" in line]
    assert len(warned) == 1, node.lines
    assert "password file" in warned[0] and "mode 0644" in warned[0]
    modes = _modes(data)
    assert (modes["."], modes["cluster-node-id"]) == (0o700, 0o600)
    assert modes["analytics/part-0.json"] == 0o666 & ~_umask()  # not the broker's: left alone
    assert sum("now private to this user" in line for line in node.lines) == 1


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
