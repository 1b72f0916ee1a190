"""``siftmq serve --log-format json`` (issue 38, item 6; broker/_logging.py): a subprocess, real
paho clients; every stderr line is one JSON object with the stable keys, the important sites
name their event and fields, a repeated refusal stays rate-limited; the formatter on its own."""

from __future__ import annotations

import io
import json
import logging
import threading
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.reasoncodes import ReasonCode as PahoReason

from broker._cli import main
from broker._logging import HeldRecords, JsonFormatter, LogFormat, configure, fields
from tests.auth.helpers import write_passwords
from tests.serving import Serve

T = 15.0
KEYS = {"time", "level", "logger", "event", "message"}


def _connect(port: int, ident: str, password: str) -> tuple[bool, int]:
    """(connected, CONNACK reason code value) of a v5 paho client; it disconnects at once."""
    done = threading.Event()
    result: list[tuple[bool, int]] = []

    def on_connect(_c: object, _u: object, _f: object, rc: PahoReason, _p: object = None) -> None:
        result.append((not rc.is_failure, rc.value))
        done.set()

    def on_fail(_c: object, _u: object) -> None:
        result.append((False, -1))
        done.set()

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, ident, protocol=mqtt.MQTTv5)
    c.username_pw_set("alice", password)
    c.on_connect = on_connect
    c.on_connect_fail = on_fail
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        assert done.wait(T), "no CONNACK"
        if result[0][0]:
            c.disconnect()
    finally:
        c.loop_stop()
    return result[0]


def _event(serve: Serve, until: str, **match: str) -> dict[str, Any]:
    """The first JSON log record with ``event`` ``until`` and ``match`` (waits for it)."""

    def hit(line: str) -> bool:
        record = json.loads(line)  # every line is one JSON object
        return bool(record["event"] == until and all(record.get(k) == v for k, v in match.items()))

    record: dict[str, Any] = json.loads(serve.lines[serve.wait_line(hit, timeout=T, what=until)])
    return record


def test_serve_log_format_json(tmp_path: Path) -> None:
    pw = write_passwords(tmp_path / "passwd", {"alice": "wonderland"})
    with Serve(
        *("--sys-interval", "0", "--no-persistence", "--password-file", str(pw)),
        *(
            "--log-level",
            "DEBUG",
            "--log-format",
            "json",
            "--data-dir",
            str(tmp_path / "data"),
            "--no-bridge",
        ),
    ) as serve:
        listening = _event(serve, "broker.listening")
        port = int(listening["address"].rpartition(":")[2])
        assert listening["address"] == f"127.0.0.1:{port}"

        # refused twice with a wrong password: CONNACK 0x87 (not authorized) each time, one log line (10 s)
        assert _connect(port, "mallory", "guess-1") == (False, 0x87)
        assert _connect(port, "mallory", "guess-2") == (False, 0x87)
        # a good client connects and disconnects
        assert _connect(port, "good", "wonderland") == (True, 0)
        connected = _event(serve, "client.connected", client_id="good")
        assert connected["level"] == "DEBUG" and connected["address"].startswith("127.0.0.1:")
        gone = _event(serve, "client.disconnected", client_id="good")
        assert gone["reason"] == "client disconnected" and gone["address"] == connected["address"]

        assert serve.stop(T) == 0
        _event(serve, "broker.stopped")
    seen = [json.loads(line) for line in serve.lines]  # the whole log, every line one JSON object
    for record in seen:
        assert isinstance(record, dict), record
        assert set(record) >= KEYS, record
        assert record["level"] in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
        assert record["time"].endswith("Z") and datetime.fromisoformat(record["time"]).tzinfo is not None
        assert isinstance(record["message"], str) and record["event"]
    refused = [r for r in seen if r["event"] == "client.refused"]
    assert len(refused) == 1, refused  # the second refusal within 10 s is not logged
    r = refused[0]
    assert r["client_id"] == "mallory" and r["reason"] == "not authorized" and r["level"] == "INFO"
    assert r["address"].startswith("127.0.0.1:") and "CONNECT refused" in r["message"]
    mallory = [r for r in seen if r.get("client_id") == "mallory"]
    assert mallory == refused  # never connected, so never disconnected either


def test_bad_log_format_in_the_serve_table_is_reported(tmp_path: Path) -> None:
    cfg = tmp_path / "siftmq.toml"
    cfg.write_text('[serve]\nlog_format = "xml"\n')
    assert main(["serve", "--config", str(cfg), "--no-bridge", "--no-persistence"]) == 2


def test_json_formatter_keys_fields_and_exceptions() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure("INFO", LogFormat.JSON, stream)
    try:
        log = logging.getLogger("broker.test")
        log.info("plain %d", 1)
        log.warning("with fields", extra=fields("limit.queue", "c1", "10.0.0.1:5", "queue"))
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("failed")
        log.debug("below the level")
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # the suite makes warnings errors
            warnings.warn("old API", DeprecationWarning, stacklevel=1)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        logging.captureWarnings(False)
    plain, limit, failed, warned = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert warned["logger"] == "py.warnings" and "old API" in warned["message"]
    assert plain["event"] == "log" and plain["message"] == "plain 1" and plain["logger"] == "broker.test"
    assert "client_id" not in plain and "exception" not in plain
    assert (limit["event"], limit["client_id"], limit["address"], limit["reason"]) == (
        "limit.queue",
        "c1",
        "10.0.0.1:5",
        "queue",
    )
    assert failed["level"] == "ERROR" and "RuntimeError: boom" in failed["exception"]
    # the text format ignores the fields: the same line as before
    text = logging.Formatter("%(message)s")
    record = logging.LogRecord("broker", logging.INFO, __file__, 1, "m %s", ("x",), None)
    assert text.format(record) == "m x"
    assert json.loads(JsonFormatter().format(record))["message"] == "m x"


def test_rate_limited_lines_carry_their_event_in_both_formats(caplog: pytest.LogCaptureFixture) -> None:
    """``Core.log_limit`` names ``limit.<kind>`` (or the site's event); the limiter acts before
    a record exists, so the JSON and the text lines are the same lines."""
    from broker._config import BrokerConfig
    from broker.core._clock import ManualClock
    from broker.core._core import LIMIT_LOG_INTERVAL, Core

    clock = ManualClock(monotonic=100.0, wall=5_000.0)
    core = Core(BrokerConfig(sys_interval=0), clock=clock)
    with caplog.at_level(logging.INFO, logger="broker"):
        core.log_limit("queue", "c1", "queue full")
        core.log_limit("queue", "c2", "queue full")  # within 10 s: not logged
        core.log_limit("connect_refused", "c3", "refused", logging.INFO, "client.refused", "[::1]:5", "bad")
        clock.advance(LIMIT_LOG_INTERVAL)
        core.log_limit("queue", "c4", "queue full")
    records = caplog.records
    assert [(r.event, r.client_id) for r in records] == [  # type: ignore[attr-defined]
        ("limit.queue", "c1"),
        ("client.refused", "c3"),
        ("limit.queue", "c4"),
    ]
    as_json = [json.loads(JsonFormatter().format(r)) for r in records]
    assert as_json[0]["reason"] == "queue" and as_json[0]["level"] == "WARNING"
    assert (as_json[1]["address"], as_json[1]["reason"], as_json[1]["level"]) == ("[::1]:5", "bad", "INFO")
    assert all(j["message"] == r.getMessage() for j, r in zip(as_json, records, strict=True))


def test_records_held_while_parsing_are_replayed_in_the_chosen_format() -> None:
    """A plugin's load warning comes before ``--log-format`` is known: held, then replayed
    through the JSON handler (every stderr line stays JSON)."""
    root = logging.getLogger()
    level = root.level
    held = HeldRecords()
    root.addHandler(held)
    try:
        logging.getLogger("siftmq").warning("plugin %s could not be loaded", "x")
    finally:
        root.removeHandler(held)
    assert len(held.records) == 1
    stream = io.StringIO()
    handler = configure("INFO", LogFormat.JSON, stream)
    try:
        held.replay()
        held.replay()  # once
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    (line,) = stream.getvalue().splitlines()
    record = json.loads(line)
    assert (record["logger"], record["level"], record["message"]) == (
        "siftmq",
        "WARNING",
        "plugin x could not be loaded",
    )
