"""``siftmq ctl`` against an embedded broker (its HTTP listener and real MQTT clients on the
test's loop): every verb, the login, one-line errors and exit statuses (0 done, 1 refused or
unreachable, 2 usage). The errors, the environment and the terminal are tested on real
subprocesses; the tour of every verb (~35 commands) calls the script's entry point
``broker._cli.main`` in a thread instead (a process start is ~0.2-0.4 s of CPU), after
checking that a process prints the same."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
import pytest_asyncio

from broker import Broker
from broker._ctl_cli import Client
from broker.auth import FileAuth
from tests.auth.helpers import FAST, write_passwords
from tests.cli._pubsub import run_main
from tests.waiting import eventually, next_message

V5 = aiomqtt.ProtocolVersion.V5
V311 = aiomqtt.ProtocolVersion.V311


async def ctl(b: Broker, *argv: str, login: tuple[str, str] | None = None) -> tuple[int, Any, str]:
    """(exit status, the JSON printed, stderr) of ``siftmq ctl --url ... ARGV``."""
    url = f"http://127.0.0.1:{b.metrics_port}"
    creds = ["-u", login[0], "-P", login[1]] if login else []
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "broker._cli",
        "ctl",
        "--url",
        url,
        *creds,
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, json.loads(out) if out.strip() else None, err.decode()


async def ctl_main(b: Broker, *argv: str, login: tuple[str, str] | None = None) -> tuple[int, Any, str]:
    """:func:`ctl` through ``broker._cli.main`` in a thread of this process (the broker runs on
    this loop); stdout and stderr captured as ``tests/cli/_pubsub.run_main`` does."""
    url = f"http://127.0.0.1:{b.metrics_port}"
    creds = ["-u", login[0], "-P", login[1]] if login else []
    code, out, err = await asyncio.to_thread(run_main, "ctl", "--url", url, *creds, *argv)
    return code, json.loads(out) if out.strip() else None, err


def mqtt(b: Broker, ident: str, protocol: aiomqtt.ProtocolVersion = V5, **kw: Any) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", b.port, identifier=ident, protocol=protocol, **kw)


@pytest_asyncio.fixture
async def b(tmp_path: Path) -> AsyncIterator[Broker]:
    pw = write_passwords(tmp_path / "passwd", {"root": "rootpw"})
    acl = tmp_path / "acl"
    acl.write_text("user root\ntopic readwrite #\n")
    auth = FileAuth(pw, acl, allow_anonymous=True, params=FAST)
    async with Broker(
        host="127.0.0.1",
        port=0,
        sys_interval=0,
        metrics_listen="127.0.0.1:0",
        hooks=[auth],
        dashboard_admins=("root",),
    ) as broker:
        yield broker


ROOT = ("root", "rootpw")


async def test_every_verb(b: Broker) -> None:
    async def run(*argv: str) -> Any:
        code, out, err = await ctl_main(b, *argv, login=ROOT)
        assert code == 0, (argv, code, err)
        return out

    # the script as a process prints what its entry point prints
    assert await ctl(b, "users", "list", login=ROOT) == await ctl_main(b, "users", "list", login=ROOT)

    # users: a user added by ctl connects at once
    assert (await run("users", "add", "dora", "--password", "dorapw"))["created"]
    assert [u["username"] for u in (await run("users", "list"))["users"]] == ["dora", "root"]
    # acl: dora may read and write dora/#
    await run("acl", "add", "--user", "dora", "--access", "readwrite", "dora/#")
    assert any(r["user"] == "dora" for r in (await run("acl", "list"))["rules"])
    async with (
        mqtt(b, "dora-1", username="dora", password="dorapw") as dora,
        mqtt(b, "watch", V311, username="root", password="rootpw", clean_session=False) as watch,
    ):
        await dora.subscribe("dora/#", qos=1)
        await watch.subscribe("dora/#", qos=1)
        # publish and retained
        await run("publish", "-t", "dora/cfg", "-m", "v1", "-q", "1", "-r")
        assert (await next_message(dora)).payload == b"v1"
        assert (await next_message(watch)).payload == b"v1"
        listed = await run("retained", "list", "dora/#")
        assert [m["topic"] for m in listed["retained"]] == ["dora/cfg"]
        assert (await run("retained", "show", "dora/cfg"))["payload"]["text"] == "v1"
        assert (await run("retained", "delete", "dora/cfg"))["deleted"] == 1
        await run("publish", "-t", "dora/a", "-m", "x", "-r")
        assert (await next_message(dora)).payload == (await next_message(watch)).payload == b"x"
        assert (await run("retained", "delete", "--filter", "dora/#"))["deleted"] == 1
        assert len(b.core.router.retained) == 0
        # clients and subscriptions
        clients = await run("clients", "list", "--prefix", "dora")
        assert [c["client_id"] for c in clients["clients"]] == ["dora-1"]
        assert (await run("clients", "list", "--username", "root"))["total"] == 1
        assert (await run("clients", "list", "--address", "127.0.0.1"))["total"] == 2
        assert (await run("clients", "show", "dora-1"))["subscription_list"][0]["filter"] == "dora/#"
        await run("subscriptions", "add", "watch", "extra/#", "-q", "1")
        subs = await run("subscriptions", "list", "--client-id", "watch")
        assert [s["filter"] for s in subs["subscriptions"]] == ["dora/#", "extra/#"]
        assert (await run("subscriptions", "list", "--filter", "extra/#"))["total"] == 1
        await run("subscriptions", "remove", "watch", "extra/#")
        assert [e.topic_filter for e in b.core.router.index.entries("watch")] == ["dora/#"]
        # acl remove: dora's next message is not delivered
        await run("acl", "remove", "--user", "dora", "--access", "readwrite", "dora/#")
        await b.publish("dora/b", b"2", qos=1)
        assert (await next_message(watch)).payload == b"2"  # root still gets it: a barrier
        await eventually(lambda: b.core.stats.receive_denied >= 1)
        with pytest.raises(TimeoutError):
            await next_message(dora, timeout=0.3)
        # bans: kicks dora-1 and refuses it
        got = await run("bans", "add", "--username", "dora", "--expiry", "3600", "--reason", "tests")
        assert got["disconnected"] == ["dora-1"]
        await eventually(lambda: "dora-1" not in b.core.sessions)
        with pytest.raises(aiomqtt.MqttCodeError):
            async with mqtt(b, "dora-2", username="dora", password="dorapw"):
                pass
        bans = (await run("bans", "list"))["bans"]
        assert [(x["kind"], x["value"], x["reason"]) for x in bans] == [("username", "dora", "tests")]
        await run("bans", "remove", "--username", "dora")
        await run("bans", "add", "--address", "192.0.2.0/24")
        await run("bans", "remove", "--address", "192.0.2.0/24")
        await run("bans", "add", "--client-id", "nobody")
        assert len((await run("bans", "list"))["bans"]) == 1
        # kick, then users remove
        await run("clients", "kick", "watch")
        await eventually(lambda: b.core.sessions["watch"].conn is None)
    await run("clients", "kick", "watch", "--discard")
    assert "watch" not in b.core.sessions
    await run("users", "remove", "dora")
    with pytest.raises(aiomqtt.MqttCodeError):
        async with mqtt(b, "dora-3", username="dora", password="dorapw"):
            pass


async def test_errors_are_one_line_with_the_documented_status(b: Broker) -> None:
    # refused by the API: status 1, the API's JSON error on one line
    code, out, err = await ctl(b, "clients", "kick", "nobody", login=ROOT)
    assert code == 1 and out is None
    assert err.count("\n") == 1 and err.startswith("siftmq ctl: ") and '"error"' in err and "404" in err
    # no or wrong credentials: 401
    code, _, err = await ctl(b, "clients", "list")
    assert code == 1 and "401" in err
    code, _, err = await ctl(b, "clients", "list", login=("root", "nope"))
    assert code == 1 and "401" in err
    # bad input the API refuses
    code, _, err = await ctl(b, "bans", "add", "--address", "300.1.1.1", login=ROOT)
    assert code == 1 and "400" in err
    # usage: status 2, one line
    for argv in (
        ("bans", "add"),
        ("bans", "add", "--client-id", "a", "--username", "b"),
        ("publish", "-m", "x"),
        ("clients",),
        ("retained", "delete"),
        ("nonsense",),
    ):
        code, _, err = await ctl(b, *argv, login=ROOT)
        assert code == 2, (argv, err)
        assert err.count("\n") == 1 and err.startswith("siftmq ctl: "), (argv, err)


async def test_unreachable_broker_is_status_1() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "broker._cli",
        "ctl",
        "--url",
        "http://127.0.0.1:1",
        "bans",
        "list",
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 1 and err.decode().startswith("siftmq ctl: cannot reach 127.0.0.1:1")


async def _ctl_env(b: Broker, env: dict[str, str], *argv: str) -> tuple[int, Any, str]:
    """``siftmq ctl`` with ``env`` added to the environment (stdin not a terminal)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker._cli", "ctl", "--url", f"http://127.0.0.1:{b.metrics_port}", *argv,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, json.loads(out) if out.strip() else None, err.decode()


async def test_the_password_from_the_environment(b: Broker) -> None:
    code, out, err = await _ctl_env(b, {"SIFTMQ_PASSWORD": "rootpw"}, "-u", "root", "bans", "list")
    assert code == 0 and isinstance(out, dict) and "bans" in out, err
    # the user from the environment too
    code, out, err = await _ctl_env(
        b, {"SIFTMQ_USERNAME": "root", "SIFTMQ_PASSWORD": "rootpw"}, "bans", "list"
    )
    assert code == 0 and "bans" in out, err
    # -P wins over the environment
    code, _, err = await _ctl_env(
        b, {"SIFTMQ_PASSWORD": "rootpw"}, "-u", "root", "-P", "nope", "bans", "list"
    )
    assert code == 1 and "401" in err
    code, _, err = await _ctl_env(b, {"SIFTMQ_PASSWORD": "nope"}, "-u", "root", "bans", "list")
    assert code == 1 and "401" in err
    # no password anywhere and no terminal: no prompt, the API refuses
    env = {k: v for k, v in os.environ.items() if k not in ("SIFTMQ_PASSWORD",)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker._cli", "ctl", "--url", f"http://127.0.0.1:{b.metrics_port}",
        "-u", "root", "bans", "list",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env,
    )  # fmt: skip
    _, err_b = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1 and b"401" in err_b


async def test_the_password_typed_at_a_prompt_on_a_terminal(b: Broker) -> None:
    """On a terminal (a pseudo-terminal made the child's controlling terminal) with no -P and
    no $SIFTMQ_PASSWORD, ctl asks for the password; what is typed logs in."""
    master, slave = pty.openpty()
    argv = [sys.executable, "-m", "broker._cli", "ctl", "--url", f"http://127.0.0.1:{b.metrics_port}",
            "-u", "root", "bans", "list"]  # fmt: skip
    # a new session whose controlling terminal is the pty, then ctl itself
    boot = (
        "import fcntl, os, sys, termios\n"
        "os.setsid()\n"
        "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
        "os.execv(sys.argv[1], sys.argv[1:])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SIFTMQ_PASSWORD"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", boot, *argv,
        stdin=slave, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    os.close(slave)
    try:

        def answer() -> bytes:
            seen = b""
            deadline = time.monotonic() + 30
            while b"password of root" not in seen:
                assert time.monotonic() < deadline, seen
                ready, _, _ = select.select([master], [], [], 1.0)
                if ready:
                    seen += os.read(master, 1024)
            os.write(master, b"rootpw\n")
            return seen

        prompt = await asyncio.to_thread(answer)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        os.close(master)
    assert b"siftmq ctl: password of root:" in prompt
    assert proc.returncode == 0, err
    assert "bans" in json.loads(out)
    assert b"rootpw" not in prompt  # not echoed


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://[::1", "ftp://x"])
def test_a_bad_url_names_the_option(url: str) -> None:
    # urlsplit's own 'Port out of range 0-65535' / 'Invalid IPv6 URL' said nothing of --url
    with pytest.raises(ValueError, match=r"^--url"):
        Client(url, None, None)
