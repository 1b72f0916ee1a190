"""The Prometheus endpoint (issue 19, item 1): scraped with a real HTTP client."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest

from broker import Broker
from broker._metrics import parse_listen
from broker.packets import SubscriptionRequest
from tests.rawclient import RawClient


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
