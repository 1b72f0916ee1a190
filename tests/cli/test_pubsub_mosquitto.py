"""``siftmq pub`` / ``siftmq sub`` against mosquitto_pub / mosquitto_sub (issue 38 item 3):
the same inputs give the same output and exit status, in both directions (``siftmq pub`` ->
``mosquitto_sub``, ``mosquitto_pub`` -> ``siftmq sub``, and each family alone), against a
siftmq broker and against a real mosquitto broker, over MQTT 3.1.1 and 5.0.

A scenario runs a subscriber with ``-d`` and waits for its ``Subscribed (mid: ...)`` line (both
families print it after the SUBACK) before the publishers run, so nothing races; the ``-d``
lines are then left out of the compared output.  Where the families differ on purpose
(docs/operations.md, "Command-line clients") the test says so and checks both sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker import Broker
from tests.cli._pubsub import MOSQUITTO, SIFTMQ, mosquitto, one_line, run

pytestmark = pytest.mark.skipif(
    MOSQUITTO is None or shutil.which("mosquitto_sub") is None,
    reason="mosquitto and mosquitto-clients not installed (make test installs them)",
)

#: (publisher, subscriber) command lines; mosquitto_sub's stdout is line-buffered by stdbuf so that
#: its ``-d`` lines reach a pipe as they are printed (ours flushes each line)
FAMILIES = {
    "siftmq": ([SIFTMQ, "pub"], [SIFTMQ, "sub"]),
    "mosquitto": (["mosquitto_pub"], ["stdbuf", "-oL", "mosquitto_sub"]),
}
TIMEOUT = 30.0


@contextlib.asynccontextmanager
async def _broker(kind: str, tmp: Path) -> AsyncIterator[int]:
    if kind == "siftmq":
        async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
            yield b.port
    else:
        with mosquitto(tmp, "allow_anonymous true\n") as port:
            yield port


def _pub(family: str) -> list[str]:
    return FAMILIES[family][0]


def _sub(family: str) -> list[str]:
    return FAMILIES[family][1]


def _payload_lines(out: str) -> str:
    """stdout without the ``-d`` lines."""
    keep = [
        line for line in out.splitlines(keepends=True) if not line.startswith(("Client ", "Subscribed ("))
    ]
    return "".join(keep)


async def _started(argv: list[str]) -> tuple[asyncio.subprocess.Process, list[str]]:
    """A subscriber run with ``-d``, once its SUBACK arrived; the lines it printed so far."""
    proc = await asyncio.create_subprocess_exec(
        *argv, "-d", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    seen: list[str] = []
    async with asyncio.timeout(TIMEOUT):
        while not (seen and seen[-1].startswith("Subscribed (")):
            line = (await proc.stdout.readline()).decode()
            assert line, f"{argv} ended before its SUBACK: {seen}"
            seen.append(line)
    return proc, seen


async def _finished(proc: asyncio.subprocess.Process, seen: list[str]) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode is not None and "Traceback" not in err.decode()
    return proc.returncode, _payload_lines("".join(seen) + out.decode()), err.decode()


async def _live(sub: list[str], pubs: list[list[str]]) -> tuple[int, str]:
    proc, seen = await _started(sub)
    for argv in pubs:
        status, _, err = await run(*argv)
        assert status == 0, (argv, err)
    status, out, err = await _finished(proc, seen)
    return status, out


@pytest.mark.parametrize("broker", ["siftmq", "mosquitto"])
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
async def test_live_messages_are_printed_alike(tmp_path: Path, broker: str, version: str) -> None:
    """-t -m -q -C -v -i -k -V and -L: every (publisher, subscriber) family pair prints the
    same lines and exits 0 after -C messages."""
    async with _broker(broker, tmp_path) as port:
        at = ["-h", "127.0.0.1", "-p", str(port), "-V", version]
        url = f"mqtt://127.0.0.1:{port}"
        results = {}
        for pf in FAMILIES:
            for sf in FAMILIES:
                sub = [
                    *_sub(sf),
                    *at,
                    "-t",
                    "cli/#",
                    "-v",
                    "-C",
                    "3",
                    "-q",
                    "2",
                    "-i",
                    f"s-{pf}-{sf}",
                    "-k",
                    "30",
                ]
                pubs = [
                    [*_pub(pf), *at, "-t", "cli/a", "-m", "hello", "-q", "1", "-i", f"p-{pf}", "-k", "20"],
                    [*_pub(pf), *at, "-t", "cli/b", "-m", "two words", "-q", "2"],
                    [*_pub(pf), "-L", f"{url}/cli/url", "-m", "via -L", "-V", version],
                ]
                results[pf, sf] = await _live(sub, pubs)
                # -L on the subscriber's side
                sub = [*_sub(sf), "-L", f"{url}/url/#", "-V", version, "-C", "1", "-v"]
                results[pf, sf, "L"] = await _live(sub, [[*_pub(pf), *at, "-t", "url/x", "-m", "1"]])
        for pair, (status, out) in results.items():
            # MQTT orders messages of one QoS only: a QoS 0 message may overtake a QoS 2 one
            lines = ["url/x 1"] if "L" in pair else ["cli/a hello", "cli/b two words", "cli/url via -L"]
            assert (status, sorted(out.splitlines()), out.endswith("\n")) == (0, lines, True), (pair, out)


@pytest.mark.parametrize("broker", ["siftmq", "mosquitto"])
async def test_retained_no_eol_no_retained_and_timeout_alike(tmp_path: Path, broker: str) -> None:
    """-r, -N (no newline), -R (retained not printed), -W (exit 27 when it runs out)."""
    async with _broker(broker, tmp_path) as port:
        at = ["-h", "127.0.0.1", "-p", str(port)]
        for pf in FAMILIES:
            status, _, err = await run(*_pub(pf), *at, "-t", f"r/{pf}", "-m", "kept", "-r", "-q", "1")
            assert status == 0, err

        async def reads(sf: str, version: str) -> None:
            v = ["-V", version]
            # -C 2 -N: both retained messages, no newline (their order is the broker's)
            status, out, err = await run(*_sub(sf), *at, *v, "-t", "r/#", "-C", "2", "-N")
            assert (status, out) == (0, "keptkept"), (sf, out, err)
            status, out, err = await run(*_sub(sf), *at, *v, "-t", "r/#", "-C", "2", "-N", "-v")
            assert status == 0 and out in {
                "r/mosquitto keptr/siftmq kept",
                "r/siftmq keptr/mosquitto kept",
            }, (sf, out, err)
            # -R: retained messages are not printed; -W 1 then ends it with status 27
            status, out, err = await run(*_sub(sf), *at, *v, "-t", "r/#", "-R", "-W", "1")
            assert (status, out) == (27, ""), (sf, err)
            # -W with nothing at all
            status, out, err = await run(*_sub(sf), *at, *v, "-t", "nothing/here", "-W", "1")
            assert (status, out) == (27, ""), (sf, err)
            assert "imed out" in err  # mosquitto: "Timed out"; siftmq: "siftmq sub: timed out after 1 s (-W)"

        # the four readers only read the retained messages: they run side by side (each waits
        # out its -W seconds; one after the other they took 11-12 s)
        await asyncio.gather(*(reads(sf, version) for sf in FAMILIES for version in ("mqttv311", "mqttv5")))
        for pf in FAMILIES:
            status, _, err = await run(*_pub(pf), *at, "-t", f"r/{pf}", "-n", "-r")
            assert status == 0, err


@pytest.mark.parametrize("broker", ["siftmq", "mosquitto"])
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
async def test_wills_alike(tmp_path: Path, broker: str, version: str) -> None:
    """--will-topic/--will-payload/--will-qos/--will-retain: a client of one family killed
    (SIGKILL: no DISCONNECT) has its will delivered to a subscriber of the other."""
    async with _broker(broker, tmp_path) as port:
        at = ["-h", "127.0.0.1", "-p", str(port), "-V", version]
        for dying, watching in (("siftmq", "mosquitto"), ("mosquitto", "siftmq")):
            topic = f"will/{dying}"
            watcher, seen = await _started([*_sub(watching), *at, "-t", topic, "-C", "1", "-v"])
            will = ["--will-topic", topic, "--will-payload", f"{dying} gone", "--will-qos", "1"]
            victim, _ = await _started([*_sub(dying), *at, "-t", "x/none", *will, "--will-retain"])
            os.kill(victim.pid, signal.SIGKILL)
            await victim.wait()
            status, out, err = await _finished(watcher, seen)
            assert (status, out) == (0, f"{topic} {dying} gone\n"), err
            # --will-retain: the will is retained, a later subscriber gets it too
            status, out, err = await run(*_sub(watching), *at, "-t", topic, "-C", "1", "-v")
            assert (status, out) == (0, f"{topic} {dying} gone\n"), err
            status, _, err = await run(*_pub(dying), *at, "-t", topic, "-n", "-r")
            assert status == 0, err


async def test_refused_connections_exit_alike(tmp_path: Path) -> None:
    """A CONNACK refusal (a mosquitto broker without anonymous access): both families exit with
    the CONNACK's code (3.1.1: return code 5; 5.0: reason code 0x87 = 135)."""
    with mosquitto(tmp_path, "allow_anonymous false\n") as port:
        at = ["-h", "127.0.0.1", "-p", str(port)]
        for version, code in (("mqttv311", 5), ("mqttv5", 135)):
            for family in FAMILIES:
                status, out, err = await run(*_sub(family), *at, "-V", version, "-t", "a", "-W", "5")
                assert (status, out) == (code, ""), (family, err)
                status, out, err = await run(*_pub(family), *at, "-V", version, "-t", "a", "-m", "x")
                assert (status, out) == (code, ""), (family, err)
                if family == "siftmq":
                    assert "connection refused: Not authorized" in one_line(err, "pub")


@pytest.mark.parametrize("broker", ["siftmq", "mosquitto"])
async def test_inputs_refused_before_connecting_alike(tmp_path: Path, broker: str) -> None:
    """A topic the client refuses: neither family sends anything, both exit non-zero (mosquitto
    1, siftmq 2 = bad input: a documented difference) with one error line; the broker saw
    nothing: a subscriber of the topic's parent gets no message."""
    async with _broker(broker, tmp_path) as port:
        at = ["-h", "127.0.0.1", "-p", str(port)]
        for family, status_wanted in (("mosquitto", 1), ("siftmq", 2)):
            status, out, err = await run(*_pub(family), *at, "-t", "a/#", "-m", "x")
            assert (status, out) == (status_wanted, "") and "a/#" in err, (family, err)
            status, out, err = await run(*_sub(family), *at, "-t", "a/#/b", "-W", "5")
            assert (status, out) == (status_wanted, "") and "a/#/b" in err, (family, err)


async def test_refusals_in_acknowledgements_differ_as_documented() -> None:
    """A PUBLISH the broker refuses (MQTT 5 PUBACK 0x87: a broker-owned ``$SYS`` topic) and a
    SUBSCRIBE it refuses (SUBACK 0x8F: a bad selector sent as a raw user property, past
    siftmq sub's own check): mosquitto's clients print a warning and exit 0; ours print the
    reason code and the broker's reason string and exit 1 (docs/operations.md)."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        at = ["-h", "127.0.0.1", "-p", str(b.port), "-V", "mqttv5"]
        publish = [*at, "-t", "$SYS/x", "-m", "x", "-q", "1"]
        status, _, err = await run(*_pub("mosquitto"), *publish)
        assert status == 0 and "Not authorized" in err, err
        status, _, err = await run(*_pub("siftmq"), *publish)
        assert status == 1, err
        assert (
            one_line(err, "pub") == "siftmq pub: PUBLISH refused: Not authorized (0x87): broker-owned topic"
        )
        subscribe = [*at, "-t", "f/t", "-D", "subscribe", "user-property", "filter", "temp >", "-W", "10"]
        status, out, err = await run(*_sub("mosquitto"), *subscribe)
        assert (status, out) == (0, "") and "All subscription requests were denied" in err, err
        status, out, err = await run(*_sub("siftmq"), *subscribe)
        assert (status, out) == (1, "") and "refused: Topic filter invalid (0x8f): " in one_line(
            err, "sub"
        ), err


@pytest.mark.parametrize("broker", ["siftmq", "mosquitto"])
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
async def test_debug_lines_alike(tmp_path: Path, broker: str, version: str) -> None:
    """-d prints the same packet lines as mosquitto's clients, QoS 0, 1 and 2 (client ids the
    broker assigns differ per run: they are compared as <assigned>).  The one difference:
    ``sub`` prints a QoS 1/2 message before its PUBACK / PUBCOMP line, mosquitto_sub after."""

    def lines(out: str) -> list[str]:
        return [re.sub(r"^Client (?!\(null\))\S+", "Client <assigned>", line) for line in out.splitlines()]

    async with _broker(broker, tmp_path) as port:
        at = ["-h", "127.0.0.1", "-p", str(port), "-V", version]
        for qos in ("0", "1", "2"):
            outs = {}
            for family in FAMILIES:
                status, out, err = await run(
                    *_pub(family), *at, "-t", "d/x", "-m", "hi", "-q", qos, "-r", "-d"
                )
                assert status == 0, err
                outs[family] = lines(out)
            assert outs["siftmq"] == outs["mosquitto"], outs
            for family in FAMILIES:
                status, out, err = await run(
                    *_sub(family), *at, "-t", "d/#", "-q", qos, "-C", "1", "-v", "-d"
                )
                assert status == 0, err
                outs[family] = lines(out)
            assert sorted(outs["siftmq"]) == sorted(outs["mosquitto"]), outs
            assert outs["siftmq"][:5] == outs["mosquitto"][:5], outs  # CONNECT ... Subscribed
        status, _, err = await run(*_pub("mosquitto"), *at, "-t", "d/x", "-n", "-r")
        assert status == 0, err
