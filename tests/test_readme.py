"""README.md's quick start works as pasted (issue 38 item 8): its fenced blocks are extracted
and run.  The shell blocks run with bash in a fresh directory holding a ``.venv`` link to this
environment (the README's commands say ``.venv/bin/siftmq``); the broker's ports are its only
change: ``siftmq serve`` binds port 0 for MQTT and metrics and the clients' and curl's ports
are set to the ones it logs (the user's are 1883 and 9464).  The embedding example runs as
it is (it binds port 0).  The Spark snippet is run by tests/bridge/test_bridge_worker_python.py.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
VENV = Path(sys.executable).parent.parent


def blocks(language: str = "") -> list[str]:
    """The README's fenced blocks of ``language`` ("" = no language given), in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", README.read_text(), re.S | re.M)


def test_the_first_two_commands_are_make_run_and_make_test() -> None:
    assert blocks()[:2] == ["make run\n", "make test\n"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_shell_quick_start_as_pasted(tmp_path: Path) -> None:
    serve_block, clients_block = next(
        (b, blocks()[i + 1]) for i, b in enumerate(blocks()) if "siftmq serve" in b
    )
    assert serve_block == ".venv/bin/siftmq serve --metrics-listen 127.0.0.1:9464\n"
    (tmp_path / ".venv").symlink_to(VENV)
    serve = await asyncio.create_subprocess_exec(  # one simple command: no shell in between
        *shlex.split(serve_block.replace("127.0.0.1:9464", "127.0.0.1:0 --port 0")),
        cwd=tmp_path,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert serve.stderr is not None
    try:
        log = ""
        mqtt = metrics = None
        async with asyncio.timeout(60):
            while mqtt is None or metrics is None:
                line = (await serve.stderr.readline()).decode()
                assert line, f"siftmq serve ended: {log}"
                log += line
                if m := re.search(r"listening on 127\.0\.0\.1:(\d+) \(tcp\)", line):
                    mqtt = m[1]
                if m := re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line):
                    metrics = m[1]
        script = re.sub(r"(siftmq (?:pub|sub)) ", rf"\1 -p {mqtt} ", clients_block)
        script = script.replace("127.0.0.1:9464", f"127.0.0.1:{metrics}")
        assert script.count(f"-p {mqtt}") == 2 and metrics in script
        proc = await asyncio.create_subprocess_exec(
            "bash", "-e", "-o", "pipefail", "-c", script, cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        lines = out.decode().splitlines()
        assert lines[0] == 'sensors/a {"temp": 35}', out
        received = [
            float(line.split()[-1]) for line in lines[1:] if line.startswith("siftmq_messages_received")
        ]
        assert received and received[0] >= 1, out
    finally:
        serve.terminate()
        await asyncio.wait_for(serve.wait(), 30)


async def test_embedding_example_as_pasted(tmp_path: Path) -> None:
    example = blocks("python")[0]
    assert "from broker import Broker" in example and "Broker(port=0)" in example
    assert len([line for line in example.splitlines() if line.strip()]) <= 12
    (tmp_path / "example.py").write_text(example)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "example.py",
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert (proc.returncode, out.decode()) == (0, 'sensors/a {"temp": 35}\n'), err.decode()
