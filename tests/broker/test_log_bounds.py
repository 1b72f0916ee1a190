"""A client's strings are bounded in every log line (a 64 KiB client id made a 64 KiB line).

Real brokers on port 0, real auth services on loopback (tests/auth/authservice.py), raw MQTT
clients; every log record the broker writes during the test is formatted as ``--log-format
text`` and ``--log-format json`` would (``broker._logging``) and measured.  The client ids
are about 60,000 characters (an MQTT string holds 65,535 bytes): without the bounds each of
these lines was longer than the client id.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from broker import Broker
from broker._logging import TEXT_FORMAT, JsonFormatter
from broker.authn import HttpAuth, HttpAuthz
from broker.packets import ReasonCode
from tests.auth.authservice import auth_service, keep_alive
from tests.rawclient import RawClient

HUGE = "c" * 60_000
#: a log line, text or JSON, is at most this long whatever a client sends
MAX_LINE = 1_500


@pytest.fixture(autouse=True)
def _debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="broker")


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The broker's log records of the test (DEBUG and up), each formatted as text and JSON,
    checked to be short single lines."""
    text, js = logging.Formatter(TEXT_FORMAT), JsonFormatter()
    out = []
    for record in caplog.records:
        if not record.name.startswith("broker"):
            continue
        record.exc_info = record.exc_text = None  # a traceback is the broker's, not the client's
        for line in (text.format(record), js.format(record)):
            assert len(line) <= MAX_LINE, line[:300]
            assert "\n" not in line, line[:300]
            out.append(line)
    assert out
    return out


def _said(caplog: pytest.LogCaptureFixture, words: str) -> logging.LogRecord:
    found = [r for r in caplog.records if words in r.getMessage()]
    assert found, f"no line says {words!r}"
    return found[0]


async def test_auth_service_bad_answer_for_a_huge_client_id(caplog: pytest.LogCaptureFixture) -> None:
    """HttpAuth's "bad answer" warning quoted the client id (``%r``) and the service's answer
    whole: both are cut now."""
    with auth_service() as svc:
        svc.answer = (200, {"result": "x" * 70_000})  # a broken service: a huge bad result
        async with Broker(
            host="127.0.0.1", port=0, hooks=[HttpAuth(svc.url, timeout=5.0)], sys_interval=0
        ) as b:
            c, ack = await RawClient.connect(b.port, HUGE, username="u", password=b"p")
            await c.close()
    assert ack.reason_code is ReasonCode.NOT_AUTHORIZED
    said = _said(caplog, "bad answer").getMessage()
    assert "'" + "c" * 100 + "'... (60000 characters)" in said
    assert len(said) < 1_000, len(said)
    _lines(caplog)


async def test_authorization_service_bad_answers_for_a_huge_client_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """HttpAuthz's "bad answer" (not JSON) and "bad result" (a huge one) warnings (one broker
    each: the second line of a kind within 10 s is not logged, ``Core.log_limit``)."""
    for bad in (b"[not json", json.dumps({"result": "y" * 70_000}).encode()):

        async def answer(_request: bytes, bad: bytes = bad) -> bytes:
            return bad

        server = await asyncio.start_server(lambda r, w: keep_alive(r, w, answer), "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/authz"
        try:
            authz = HttpAuthz(url, timeout=5.0)
            async with Broker(host="127.0.0.1", port=0, hooks=[authz], sys_interval=0) as b:
                c, ack = await RawClient.connect(b.port, HUGE)
                assert ack.reason_code is ReasonCode.SUCCESS
                granted = await c.subscribe("a/#")
                await c.close()
        finally:
            server.close()
            await server.wait_closed()
        assert granted.reason_codes == (ReasonCode.NOT_AUTHORIZED,)
    assert len(_said(caplog, "authorization service").getMessage()) < 1_000
    assert len(_said(caplog, "bad result").getMessage()) < 1_000
    _lines(caplog)


async def test_core_refusal_lines_bound_the_client_id(caplog: pytest.LogCaptureFixture) -> None:
    """``Core.log_limit`` (here: a filter beyond max_topic_levels) and the DEBUG lines of a
    client connecting and disconnecting; the JSON line's ``client_id`` field is bounded too."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, max_topic_levels=3) as b:
        c, ack = await RawClient.connect(b.port, HUGE)
        assert ack.reason_code is ReasonCode.SUCCESS
        assert (await c.subscribe("a/b/c/d/e")).reason_codes[0] >= 0x80
        await c.close()
    record = _said(caplog, "beyond max_topic_levels")
    assert len(record.getMessage()) < 1_000
    assert len(json.loads(JsonFormatter().format(record))["client_id"]) < 200
    assert any("connected" in r.getMessage() for r in caplog.records)  # DEBUG lines were written
    _lines(caplog)


async def test_a_client_id_cannot_forge_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    """A client id with a line break is quoted (escaped), whatever the broker then decides."""
    forged = "dev\n2026-11-29 00:00:00,000 WARNING broker: forged"
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, max_topic_levels=3) as b:
        c, ack = await RawClient.connect(b.port, forged)
        if ack.reason_code is ReasonCode.SUCCESS:
            await c.subscribe("a/b/c/d/e")
        await c.close()
    lines = _lines(caplog)
    assert not any(line.startswith("2026-11-29 00:00:00") for line in lines)
    # the client id is in the log, escaped (without it in a line the check above checks nothing)
    assert any("'dev\\n2026-11-29 00:00:00" in line for line in lines)
