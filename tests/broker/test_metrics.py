"""The Prometheus endpoint (issue 19, item 1): scraped with a real HTTP client."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

import aiomqtt
import pytest

from broker import Broker
from broker._metrics import parse_listen
from broker.packets import SubscriptionRequest
from tests.rawclient import RawClient
from tests.waiting import next_message


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.status == 200
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def _get_json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        assert r.status == 200
        return json.loads(r.read())


async def test_metrics_endpoint_exports_the_sys_counters() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0") as b:
        assert b.metrics_port is not None
        sub, _ = await RawClient.connect(b.port, "m-sub", 5)
        await sub.subscribe(SubscriptionRequest("m/t", 1))
        pub, _ = await RawClient.connect(b.port, "m-pub", 5)
        for _ in range(3):
            await pub.publish1("m/t", b"x")
        await pub.publish1("$SYS/fake", b"x")  # refused and counted
        values = await asyncio.to_thread(_scrape, b.metrics_port)
        assert values["siftmq_messages_received_total"] == 3
        assert values["siftmq_refused_reserved_publish_total"] == 1
        assert values["siftmq_connections"] == 2
        assert values["siftmq_publishers_paused"] == 0  # flow-control gauges are there
        assert "siftmq_slow_consumer_events_total" in values
        await RawClient.close_all()


async def test_metrics_off_by_default() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        assert b.metrics_port is None


def test_listen_address_is_checked() -> None:
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("9464", "host:", ":1", "h:99999", "h:x"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_listen(bad)


async def test_sys_rounds_are_not_counted_as_clients_messages() -> None:
    """Issue 38, item 5: with nobody publishing, `$SYS` rounds every 50 ms leave the clients'
    `messages_received` at 0 ($SYS, /metrics, the dashboard's overview) and count as
    `messages_internal`."""
    async with (
        Broker(
            host="127.0.0.1", port=0, sys_interval=0.05, tick_interval=0.02, metrics_listen="127.0.0.1:0"
        ) as b,
        aiomqtt.Client("127.0.0.1", b.port, identifier="sys-watch") as watch,
    ):
        assert b.metrics_port is not None
        await watch.subscribe("$SYS/broker/messages/#")
        seen: dict[str, int] = {}
        async with asyncio.timeout(10):  # rounds keep coming: a deadline, not next_message's
            # wait until a round reports internal messages of earlier rounds
            while seen.get("$SYS/broker/messages/internal", 0) == 0:
                m = await next_message(watch)
                seen[str(m.topic)] = int(bytes(m.payload).decode())  # type: ignore[arg-type]
            # the same round's value of messages/received (rounds publish in one callback)
            while "$SYS/broker/messages/received" not in seen:
                m = await next_message(watch)
                seen[str(m.topic)] = int(bytes(m.payload).decode())  # type: ignore[arg-type]
        assert seen["$SYS/broker/messages/received"] == 0
        values = await asyncio.to_thread(_scrape, b.metrics_port)
        assert values["siftmq_messages_received_total"] == 0
        assert values["siftmq_messages_internal_total"] >= seen["$SYS/broker/messages/internal"] > 0
        overview = await asyncio.to_thread(_get_json, b.metrics_port, "/api/overview")
        assert overview["messages_received"] == 0 and overview["messages_internal"] > 0
        assert b.core.stats.messages_sent > 0  # the subscriber got $SYS messages: deliveries
