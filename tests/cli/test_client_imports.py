"""What a ``siftmq pub`` / ``siftmq sub`` process imports (docs/development.md, "Suite time
(session 17)"): the command-line clients run one process a message in users' scripts (and
~120 times in this suite), and a process that imported the whole command line (the plugins'
entry points, ``broker._config`` and the protocol core behind it, ``broker.net`` through
``reload``, asyncio) took 0.16-0.20 s of CPU before it sent anything.  ``broker._cli.main``
builds the clients' parser alone when ``pub``/``sub`` is the first word
(``broker._cli.client_parser``); these tests run the real entry point as a process against a
broker on port 0, check that the message went through, and read the process's ``sys.modules``
at exit.  Every other command keeps the full parser (``siftmq --help`` lists them all, and
``siftmq --debug pub`` takes the full parser's way to the same client)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from broker import Broker

#: python -c: ``siftmq ARGV`` (the script's entry point), writing its ``sys.modules`` at exit
#: to the file named by its first argument
_DUMP = (
    "import atexit, sys\n"
    "out = sys.argv.pop(1)\n"
    "atexit.register(lambda: open(out, 'w').write('\\n'.join(sys.modules)))\n"
    "from broker._cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)

#: loaded by neither client: what only ``serve`` and the other commands need
NEVER = frozenset(
    {
        "asyncio",
        "broker._config",
        "broker._reload",
        "broker.net",
        "broker._ctl_cli",
        "broker._passwd_cli",
        "broker._backup_cli",
        "importlib.metadata",
        "bridge",
        "cluster",
        "uplink",
    }
)


async def _siftmq(tmp_path: Path, name: str, *argv: str) -> tuple[int, str, str, set[str]]:
    """``siftmq ARGV`` as a process: (status, stdout, stderr, the modules it imported)."""
    modules = tmp_path / f"{name}.modules"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _DUMP,
        str(modules),
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30.0)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode(), set(modules.read_text().split("\n"))


async def test_pub_and_sub_import_only_the_clients(tmp_path: Path) -> None:
    """A retained message published by ``pub`` and read by ``sub`` through a content filter:
    both work, and neither process imported the serve side (on main: all of ``NEVER``)."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        at = ("-h", "127.0.0.1", "-p", str(b.port))
        code, _, err, pub = await _siftmq(tmp_path, "pub", "pub", *at, "-t", "imp/a", "-m", '{"t": 35}', "-r")
        assert code == 0, err
        code, out, err, sub = await _siftmq(
            tmp_path, "sub", "sub", *at, "-t", "imp/#", "--filter", "t > 30", "-v", "-C", "1", "-W", "20"
        )
        assert (code, out) == (0, 'imp/a {"t": 35}\n'), err
    assert "paho.mqtt.client" in pub and "broker._client_cli" in pub  # the dump is the client's
    assert not pub & NEVER, sorted(pub & NEVER)
    assert not sub & NEVER, sorted(sub & NEVER)
    # pub checks a topic name: the topic library, not the protocol core
    assert "topics" in pub and "broker.core" not in pub, sorted(m for m in pub if m.startswith("broker"))
    # sub checks its filter the broker's way ($filter/, $composite/ split by broker.core)
    assert "content" in sub


async def test_the_other_ways_keep_the_full_parser(tmp_path: Path) -> None:
    """``siftmq --debug pub`` (an option before the command) takes the full parser to the same
    client, and ``siftmq --help`` still lists every command, the plugins' too."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        at = ("-h", "127.0.0.1", "-p", str(b.port))
        code, _, err, modules = await _siftmq(
            tmp_path, "debug", "--debug", "pub", *at, "-t", "imp/d", "-m", "x", "-r"
        )
        assert code == 0, err
        code, out, err, _ = await _siftmq(tmp_path, "read", "sub", *at, "-t", "imp/d", "-C", "1", "-W", "20")
        assert (code, out) == (0, "x\n"), err
    assert "broker._reload" in modules  # the full parser: every command registered
    code, out, err, _ = await _siftmq(tmp_path, "help", "--help")
    assert code == 0, err
    for command in ("serve", "pub", "sub", "passwd", "ctl", "backup", "reload", "version", "analytics"):
        assert command in out, (command, out)
