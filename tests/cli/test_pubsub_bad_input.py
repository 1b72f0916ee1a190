"""Bad input to ``siftmq pub`` / ``siftmq sub`` (issue 38 item 7): each is one line
``siftmq pub: ...`` / ``siftmq sub: ...`` on stderr, no traceback, and a status that says what
went wrong: 2 for an input refused before connecting (the port used for those has nothing
listening, so a refusal proves that nothing was sent), 1 for a refusal by the broker (with its
reason code and, on MQTT 5, its reason string), the CONNACK's reason code for a refused
connection (as mosquitto's clients do)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker import Broker
from broker.auth import FileAuth
from tests.auth.helpers import FAST, write_passwords
from tests.cli._pubsub import SIFTMQ, free_port, one_line, run, run_main
from tests.waiting import eventually

NOWHERE = ("-h", "127.0.0.1", "-p", str(free_port()))  # nothing listens: checked before connecting


async def _bad(command: str, *args: str, process: bool = False) -> str:
    """The one error line of an input refused before connecting: through ``broker._cli.main``
    in-process, and with ``process`` as a process of the ``siftmq`` script too, which must
    print the same (tests/cli/_pubsub.py, ``run_main``)."""
    status, out, err = run_main(command, *NOWHERE, *args)
    assert (status, out) == (2, ""), err
    if process:
        assert await run(SIFTMQ, command, *NOWHERE, *args) == (status, out, err)
    return one_line(err, command)


# the findings of issue 38 item 7, one test each


@pytest.mark.parametrize("version", ["mqttv5", "mqttv311"])
async def test_a_bad_selector_is_named_with_its_position(version: str) -> None:
    line = await _bad("sub", "-t", "sensors/#", "--filter", "temp >", "-V", version, process=True)
    assert line == (
        "siftmq sub: --filter 'temp >': bad selector: expected a value after '>' but found end of input at 6"
    )


async def test_a_bad_composite_expression_is_named_with_its_position() -> None:
    line = await _bad("sub", "--composite", "x=(a|")
    assert (
        line
        == "siftmq sub: --composite 'x=(a|': bad expression: expected an atom but found end of input at 3"
    )


async def test_a_wildcard_in_a_published_topic() -> None:
    line = await _bad("pub", "-t", "a/#", "-m", "x", process=True)
    assert "wildcard '#' at position 2" in line


async def test_a_misplaced_hash_in_a_filter() -> None:
    line = await _bad("sub", "-t", "a/#/b")
    assert line == "siftmq sub: -t 'a/#/b': topic filter 'a/#/b': '#' must be the last level (position 2)"


async def test_an_empty_topic() -> None:
    line = await _bad("pub", "-q", "1", "-t", "", "-m", "x")
    assert line == "siftmq pub: -t '': topic name is empty (at least one character is required)"


# more inputs of the same kind


@pytest.mark.parametrize(
    ("command", "args", "says"),
    [
        ("sub", ["-t", "$filter/temp >/a"], "selector 'temp >': bad selector:"),
        ("sub", ["-t", "$composite/c/(a|"], "bad expression: expected an atom"),
        ("sub", ["-t", "a/b+"], "'+' must occupy a whole level"),
        ("sub", ["--composite", "no-equals-sign"], "expected NAME=EXPRESSION"),
        ("sub", ["--composite", "a/b=x"], "the name is one topic level"),
        ("sub", [], "at least one -t TOPIC"),
        ("sub", ["-t", "a", "-C", "-1"], "-C -1"),
        ("pub", ["-m", "x"], "a topic is needed"),
        ("pub", ["-t", "a", "-m", "x", "-k", "70000"], "keep-alive must be 0-65535"),
        ("pub", ["-t", "a", "-m", "x", "--will-topic", "w/#"], "--will-topic 'w/#'"),
        ("pub", ["-t", "a", "-m", "x", "--will-payload", "p"], "need --will-topic"),
        ("pub", ["-t", "a", "-m", "x", "-D", "k"], "expected -D KEY VALUE"),
        ("pub", ["-t", "a", "-f", "/nonexistent/file"], "No such file or directory"),
    ],
)
async def test_other_bad_inputs(command: str, args: list[str], says: str) -> None:
    assert says in await _bad(command, *args)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1/t", "expected mqtt://"),
        ("mqtt:///t", "no host"),
        ("mqtt://127.0.0.1:99999/t", "port '99999'"),
        ("mqtt://127.0.0.1/a/#", "wildcard '#'"),  # the URL's topic is checked like -t's
    ],
)
async def test_bad_urls(url: str, says: str) -> None:
    status, out, err = await run(SIFTMQ, "pub", "-L", url, "-m", "x")
    assert (status, out) == (2, "") and says in one_line(err, "pub"), err


async def test_url_and_host_together_are_refused() -> None:
    status, _, err = await run(SIFTMQ, "pub", "-L", "mqtt://127.0.0.1/t", "-h", "127.0.0.1", "-m", "x")
    assert status == 2 and "drop -h / -p" in one_line(err, "pub")


async def test_nothing_listening_is_one_line_and_status_1() -> None:
    status, _, err = await run(SIFTMQ, "sub", *NOWHERE, "-t", "a")
    assert status == 1 and "cannot connect to 127.0.0.1:" in one_line(err, "sub")


# refusals by the broker


async def test_a_subscription_the_broker_refuses_shows_its_reason_string() -> None:
    """The selector is sent as mosquitto_sub sends it (a user property the client does not
    read): the broker's SUBACK 0x8F and its reason string, with the position, are shown."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        at = ("-h", "127.0.0.1", "-p", str(b.port))
        status, _, err = await run(
            SIFTMQ, "sub", *at, "-t", "f/t", "-D", "subscribe", "user-property", "filter", "temp >"
        )
        line = one_line(err, "sub")
        assert status == 1, err
        assert line.startswith("siftmq sub: subscription to 'f/t' refused: Topic filter invalid (0x8f): "), (
            line
        )
        assert "at 6" in line, line  # the broker's reason string names the position


@pytest.fixture
def acl(tmp_path: Path) -> FileAuth:
    rules = tmp_path / "acl"
    rules.write_text("user alice\ntopic readwrite allowed/#\n")
    return FileAuth(write_passwords(tmp_path / "pw", {"alice": "pw"}), rules, params=FAST)


@pytest.mark.parametrize("version", ["mqttv5", "mqttv311"])
async def test_refusals_by_the_broker_exit_non_zero(acl: FileAuth, version: str) -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[acl]) as b:
        at = ("-h", "127.0.0.1", "-p", str(b.port), "-V", version)
        alice = (*at, "-u", "alice", "-P", "pw")
        # CONNACK refused: its reason code is the status, as mosquitto's clients exit
        status, _, err = await run(SIFTMQ, "sub", *at, "-u", "alice", "-P", "wrong", "-t", "allowed/x")
        code = 0x87 if version == "mqttv5" else 5  # not authorized
        assert status == code, err
        assert one_line(err, "sub").startswith("siftmq sub: connection refused: ")
        # SUBACK failure
        status, _, err = await run(SIFTMQ, "sub", *alice, "-t", "denied/x", "-W", "10")
        assert status == 1 and "subscription to 'denied/x' refused: " in one_line(err, "sub"), err
        if version == "mqttv5":  # PUBACK / PUBREC error codes (3.1.1 has none: the broker drops it)
            for qos, packet in (("1", "PUBLISH refused: "), ("2", "PUBLISH refused (PUBREC): ")):
                status, _, err = await run(SIFTMQ, "pub", *alice, "-q", qos, "-t", "denied/x", "-m", "x")
                line = one_line(err, "pub")
                assert status == 1 and packet in line and "(0x87): " in line, err  # + reason string


async def test_a_connection_the_broker_closes_exits_1() -> None:
    """A sub taken over by another client with its id: 'connection lost', status 1 (it was 0)."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        at = ("-h", "127.0.0.1", "-p", str(b.port))
        sub = asyncio.create_task(run(SIFTMQ, "sub", *at, "-i", "twin", "-t", "t/#"))
        await eventually(lambda: b.core.router.index.entry_count("twin") >= 1, 20.0)
        status, _, err = await run(SIFTMQ, "pub", *at, "-i", "twin", "-t", "t/x", "-m", "x")
        assert status == 0, err
        status, _, err = await sub
        assert status == 1 and "connection lost: Session taken over (0x8e)" in one_line(err, "sub"), err


async def test_debug_flag_shows_packets_and_keeps_errors_one_line() -> None:
    status, out, err = await run(SIFTMQ, "sub", *NOWHERE, "-d", "-t", "a/#/b")
    assert (status, out) == (2, "") and one_line(err, "sub")


@pytest.mark.parametrize("version", ["mqttv5", "mqttv311"])
async def test_a_publish_the_broker_drops_the_connection_for_exits_1(version: str) -> None:
    """A QoS 1 PUBLISH over the broker's packet size: the broker closes the connection (MQTT 5
    with DISCONNECT 0x95) instead of a PUBACK; pub said nothing and exited 0 before.  (QoS 0
    has no acknowledgement: like mosquitto_pub, pub is done once it is written.)"""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, max_packet_size=200) as b:
        at = ("-h", "127.0.0.1", "-p", str(b.port), "-V", version)
        status, _, err = await run(SIFTMQ, "pub", *at, "-q", "1", "-t", "big", "-m", "x" * 1000)
        line = one_line(err, "pub")
        assert status == 1 and "connection lost: " in line, err
        if version == "mqttv5":
            assert "Packet too large (0x95)" in line, line
