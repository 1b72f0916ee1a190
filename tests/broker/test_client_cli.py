"""``siftmq pub`` / ``siftmq sub`` against a broker on port 0 (issue 19, item 2), run as the
user runs them: subprocesses of the installed ``siftmq`` script; none prints a Python warning."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from broker import Broker
from tests.waiting import eventually

SIFTMQ = str(Path(sys.executable).parent / "siftmq")


async def _run(*args: str, timeout: float = 20.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        SIFTMQ, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    # every warning a user sees is one we meant: no Python warning (issue 31 item 6)
    assert not re.search(r"\w+Warning: ", err.decode()), err.decode()
    return proc.returncode, out.decode(), err.decode()


async def _sub_then_pub(b: Broker, sub_args: list[str], pubs: list[list[str]]) -> tuple[int, str, str]:
    port = str(b.port)
    sub = asyncio.create_task(_run("sub", "-h", "127.0.0.1", "-p", port, "-i", "cli-sub", *sub_args))
    index = b.core.router.index
    await eventually(lambda: index.entry_count("cli-sub") >= 1, 10.0)
    for args in pubs:
        code, _, err = await _run("pub", "-h", "127.0.0.1", "-p", port, *args)
        assert code == 0, err
    return await sub


async def test_sub_prints_topic_and_payload_and_exits_after_count() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        code, out, err = await _sub_then_pub(
            b,
            ["-t", "cli/#", "-C", "2", "-v", "-q", "1"],
            [["-t", "cli/a", "-m", "hello", "-q", "1"], ["-t", "cli/b", "-m", "two words", "-V", "mqttv311"]],
        )
        assert code == 0, err
        assert out.splitlines() == ["cli/a hello", "cli/b two words"]


async def test_retained_and_content_filter() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        at = ("-h", "127.0.0.1", "-p", str(b.port))
        code, _, err = await _run("pub", *at, "-t", "r/t", "-m", "kept", "-r")
        assert code == 0, err
        code, out, err = await _run("sub", *at, "-t", "r/#", "-C", "1")
        assert (code, out) == (0, "kept\n"), err
        for version in ("mqttv5", "mqttv311"):
            code, out, err = await _sub_then_pub(
                b,
                ["-t", "f/t", "-C", "1", "--filter", "temp > 30", "-V", version],
                [["-t", "f/t", "-m", '{"temp": 20}'], ["-t", "f/t", "-m", '{"temp": 35}']],
            )
            assert (code, out) == (0, '{"temp": 35}\n'), err
            await eventually(lambda: b.core.router.index.entry_count("cli-sub") == 0, 10.0)


async def test_refused_connection_and_bad_arguments_exit_non_zero() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        port = b.port
    code, _, err = await _run("pub", "-h", "127.0.0.1", "-p", str(port), "-t", "x", "-m", "y")
    assert code == 1 and err.startswith("siftmq pub: cannot connect to 127.0.0.1:"), err
    code, _, err = await _run("sub", "-p", str(port))  # bad input: status 2, before connecting
    assert code == 2 and err.startswith("siftmq sub: ") and "-t TOPIC" in err, err
    code, out, _ = await _run("pub", "--help")
    assert code == 0 and all(
        f in out for f in ("-h HOST", "-t TOPIC", "-m MESSAGE", "-q", "-r", "--cafile", "-D")
    )


async def test_tls_with_cafile_and_mqtts_url(tmp_path: Path) -> None:
    """--cafile and -L mqtts://... connect with TLS (the URL's scheme alone turns it on)."""
    from broker import BrokerConfig, Listener
    from tests.security.helpers import make_certs

    certs = make_certs(tmp_path)
    listener = Listener("tcp", "127.0.0.1", 0, str(certs.server_cert), str(certs.server_key))
    async with Broker(config=BrokerConfig(listeners=(listener,), sys_interval=0)) as b:
        port = str(b.ports[0])
        code, _, err = await _run(
            "pub", "-p", port, "-h", "127.0.0.1", "--cafile", str(certs.ca), "-t", "s/t", "-m", "tls", "-r"
        )
        assert code == 0, err
        url = f"mqtts://127.0.0.1:{port}/s/#"
        code, out, err = await _run("sub", "-L", url, "--cafile", str(certs.ca), "-C", "1", "-v")
        assert (code, out) == (0, "s/t tls\n"), err
        # without the CA the server's certificate is refused: one line, status 1
        code, _, err = await _run("sub", "-L", url, "-C", "1")
        assert code == 1 and err.startswith("siftmq sub: ") and len(err.splitlines()) == 1, err


async def test_mqtt31_and_debug_lines() -> None:
    """-V mqttv31 (a client id is made up: MQTT 3.1 has no assigned ids) and -d's packet lines
    in mosquitto's words."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        at = ("-h", "127.0.0.1", "-p", str(b.port), "-V", "mqttv31")
        code, _, err = await _run("pub", *at, "-t", "v31/t", "-m", "old", "-r", "-q", "1")
        assert code == 0, err
        code, out, err = await _run("sub", *at, "-i", "old-timer", "-t", "v31/#", "-C", "1", "-d")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[:5] == [
            "Client old-timer sending CONNECT",
            "Client old-timer received CONNACK (0)",
            "Client old-timer sending SUBSCRIBE (Mid: 1, Topic: v31/#, QoS: 0, Options: 0x00)",
            "Client old-timer received SUBACK",
            "Subscribed (mid: 1): 0",
        ], out
        assert "old" in lines and lines[-1] == "Client old-timer sending DISCONNECT", out
