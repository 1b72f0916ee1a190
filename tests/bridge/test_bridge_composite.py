"""Composite subscriptions through the whole data path (issue 16 item 5): real aiomqtt clients
over loopback make composite subscriptions on an embedded broker with the bridge on, publications
complete N events and let components expire or be dropped, and the local-Spark analytics give
exact counts; then the CLI's JSON view and the HTML report's composite section.

Time is a ``ManualClock`` handed to the broker, so windows pass without waiting and every time
to completion is an exact binary fraction of a second.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np
import pyarrow.dataset as ds
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from bridge import Bridge, Kind
from bridge._analytics import console_summary, start_queries
from bridge._cli import register
from bridge._composite import COMPOSITE_KEYS, composite_view
from bridge._report import render_report
from broker.core._clock import ManualClock
from tests.waiting import eventually, next_message

pytestmark = pytest.mark.spark

T0 = 1_800_000_000.0
V5 = aiomqtt.ProtocolVersion.V5
SHIP = "(t/a | t/b) & t/c"
PAIR = "x/1 & x/2"
LATE = "y/1 & y/2"
#: time to completion of ship's events: t/a, then t/c this much later
SHIP_COMPLETION = [0.25, 0.25, 0.25, 0.25, 1.0, 1.0, 1.0, 4.0]
N = len(SHIP_COMPLETION)
PAIR_COMPLETION = 0.5
COMPOSITE = tuple(COMPOSITE_KEYS)


def _props(packet: int, **user: str) -> PahoProperties:
    p = PahoProperties(packet)
    p.UserProperty = [(k.replace("_", "-"), v) for k, v in user.items()]
    return p


async def _scenario(landing: Path) -> Bridge:
    """ship: N events (the last leaves a t/a buffered), then 3 t/b and that t/a expire and ship
    is unsubscribed; pair: cap 2, five x/1 (3 dropped) then x/2, one event, session end;
    late: subscribed by a session with an expiry interval that then expires."""
    from broker import Broker

    clock = ManualClock(monotonic=100.0, wall=T0)
    bridge = Bridge(landing, roll_interval=0.1)
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[bridge], clock=clock) as b:
        port = b.port
        expiry = PahoProperties(PacketTypes.CONNECT)
        expiry.SessionExpiryInterval = 5
        async with aiomqtt.Client(
            "127.0.0.1", port, identifier="late", protocol=V5, clean_start=False, properties=expiry
        ) as late:
            await late.subscribe(f"$composite/late/{LATE}", qos=1)  # the expression in the filter
        async with (
            aiomqtt.Client("127.0.0.1", port, identifier="c1", protocol=V5) as c1,
            aiomqtt.Client("127.0.0.1", port, identifier="c2", protocol=V5) as c2,
            aiomqtt.Client("127.0.0.1", port, identifier="pub", protocol=V5) as pub,
        ):
            sub = PacketTypes.SUBSCRIBE
            await c1.subscribe(
                "$composite/ship", qos=1, properties=_props(sub, composite=SHIP, composite_window="10")
            )
            await c2.subscribe(
                "$composite/pair", qos=1, properties=_props(sub, composite=PAIR, composite_max_buffer="2")
            )
            for i, dt in enumerate(SHIP_COMPLETION):
                await pub.publish("t/a", b"a%d" % i, qos=1)  # QoS 1: routed when PUBACK returns
                if i == N - 1:
                    await pub.publish("t/a", b"left", qos=1)  # stays buffered
                clock.advance(dt)
                await pub.publish("t/c", b"c%d" % i, qos=1)
                m = await next_message(c1)
                assert m.topic.value == "$composite/ship"
            for i in range(5):
                await pub.publish("x/1", b"%d" % i, qos=1)
            clock.advance(PAIR_COMPLETION)
            await pub.publish("x/2", b"x", qos=1)
            assert (await next_message(c2)).topic.value == "$composite/pair"
            for i in range(3):
                await pub.publish("t/b", b"b%d" % i, qos=1)
            clock.advance(11)  # past ship's window: 3 t/b and the buffered t/a expire
            await c1.unsubscribe("$composite/ship")
        await eventually(lambda: "late" not in b.core.sessions)  # clock moved past its expiry
    return bridge  # the broker's graceful stop committed everything


@pytest.fixture(scope="module")
def composite_run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Bridge]:
    import asyncio

    root = tmp_path_factory.mktemp("composite")
    bridge = asyncio.run(_scenario(root / "landing"))
    for q in start_queries(spark, root / "landing", root / "out", once=True, only=COMPOSITE):
        q.awaitTermination()
        assert q.exception() is None
    return root, bridge


def _rows(landing: Path, kind: Kind) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = ds.dataset(landing / kind.value, format="parquet").to_table().to_pylist()
    return rows


def _inverted_cdf(values: list[float], q: float) -> float:
    """The percentile Spark's ``percentile_approx`` gives on few values (a value of the data)."""
    return float(np.percentile(values, q * 100, method="inverted_cdf"))


def test_landing_zone_has_every_composite_record_once(composite_run: tuple[Path, Bridge]) -> None:
    root, bridge = composite_run
    written = bridge.stats().written
    events = _rows(root / "landing", Kind.COMPOSITE_EVENTS)
    assert len(events) == written["composite_events"] == N + 1
    assert sum(bridge.stats().dropped.values()) == 0
    changes = _rows(root / "landing", Kind.COMPOSITE_CHANGES)
    assert sorted((c["client_id"], c["name"], c["action"], c["expression"]) for c in changes) == [
        ("c1", "ship", "subscribe", SHIP),
        ("c1", "ship", "unsubscribe", SHIP),
        ("c2", "pair", "session_end", PAIR),
        ("c2", "pair", "subscribe", PAIR),
        ("late", "late", "expired", LATE),
        ("late", "late", "subscribe", LATE),
    ]
    # the composite events' deliveries are also ordinary deliveries on $composite/<name>
    deliveries = _rows(root / "landing", Kind.DELIVERIES)
    assert sum(1 for d in deliveries if d["topic"] == "$composite/ship") == N
    assert [d["subscriber_id"] for d in deliveries if d["topic"] == "$composite/pair"] == ["c2"]


def test_spark_composite_view_is_exact(composite_run: tuple[Path, Bridge]) -> None:
    root, _ = composite_run
    view = composite_view(root / "out")
    by_expr = {s["expression"]: s for s in view["subscriptions"]}
    assert set(by_expr) == {SHIP, PAIR, LATE}
    ship, pair, late = by_expr[SHIP], by_expr[PAIR], by_expr[LATE]
    assert (ship["window"], ship["max_buffer"], pair["window"], pair["max_buffer"]) == (10.0, 64, 60.0, 2)
    assert (ship["events"], pair["events"], late["events"]) == (N, 1, 0)
    assert ship["components"] == 2 * N
    assert ship["completion_p50"] == _inverted_cdf(SHIP_COMPLETION, 0.5) == 0.25
    assert ship["completion_p99"] == _inverted_cdf(SHIP_COMPLETION, 0.99) == 4.0
    assert ship["completion_mean"] == pytest.approx(sum(SHIP_COMPLETION) / N)
    assert ship["completion_max"] == 4.0
    assert (ship["buffered_max"], ship["buffered_mean"]) == (1, pytest.approx(1 / N))
    assert (pair["completion_p50"], pair["buffered_max"]) == (PAIR_COMPLETION, 1)
    assert (ship["expired"], ship["dropped"]) == (4, 0)  # three t/b and the left t/a
    assert (pair["expired"], pair["dropped"]) == (0, 3)  # five x/1 under a cap of 2
    assert ship["changes"] == {"subscribe": 1, "unsubscribe": 1, "session_end": 0, "expired": 0}
    assert pair["changes"] == {"subscribe": 1, "unsubscribe": 0, "session_end": 1, "expired": 0}
    assert late["changes"] == {"subscribe": 1, "unsubscribe": 0, "session_end": 0, "expired": 1}
    everything = [*SHIP_COMPLETION, PAIR_COMPLETION]
    o = view["overall"]
    assert (o["events"], o["subscriptions"], o["expired"], o["dropped"]) == (N + 1, 3, 4, 3)
    assert o["completion_p50"] == _inverted_cdf(everything, 0.5) == 0.5
    assert o["completion_p99"] == 4.0
    assert o["changes"] == {"subscribe": 3, "unsubscribe": 1, "session_end": 1, "expired": 1}
    assert f"composite: {N + 1} events over 3 composite subscriptions" in console_summary(root / "out")


def test_cli_prints_the_composite_view_as_json(
    composite_run: tuple[Path, Bridge], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = composite_run
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["analytics", "composite", "--json", "--output", str(root / "out")])
    assert args.func(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(json.dumps(composite_view(root / "out")))
    assert doc["overall"]["events"] == N + 1
    args = parser.parse_args(["analytics", "composite", "--output", str(root / "out")])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert f"{SHIP}: {N} events, p50 250.0 ms, p99 4.00 s, buffered max 1, expired 4, dropped 0" in text


def test_report_has_the_composite_section(composite_run: tuple[Path, Bridge]) -> None:
    root, _ = composite_run
    page = render_report(root / "out")
    assert f'id="composite-events">{N + 1}<' in page
    assert '<img alt="Composite subscriptions: events and time to completion"' in page
    assert f'<p id="composite-overall">{N + 1} composite events over 3 composite subscriptions' in page
    assert "<h2>Composite subscriptions (per subscription)</h2>" in page
    assert "<td>(t/a | t/b) &amp; t/c</td>" in page  # escaped
    assert "no composite data" not in page


def test_old_landing_zone_without_composite_kinds(spark: Any, tmp_path: Path) -> None:
    """A landing zone from before the composite kinds: the queries run, the view is empty and
    the report says so."""
    landing = tmp_path / "landing"
    with Bridge(landing):
        pass
    for kind in (Kind.COMPOSITE_CHANGES, Kind.COMPOSITE_EVENTS, Kind.COMPOSITE_LOSSES):
        shutil.rmtree(landing / kind.value)
    for q in start_queries(spark, landing, tmp_path / "out", once=True, only=COMPOSITE):
        q.awaitTermination()
        assert q.exception() is None
    view = composite_view(tmp_path / "out")
    assert view["subscriptions"] == [] and view["overall"]["events"] == 0
    assert "composite: no composite data" in console_summary(tmp_path / "out")
    page = render_report(tmp_path / "out")
    assert '<h2>Composite subscriptions</h2><p class="empty">no composite data</p>' in page
    assert "composite-events" not in page
