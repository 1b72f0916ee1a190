"""The batched delivery hook against the per-record one, in a real broker (no Spark).

A reference hook overrides the per-record ``on_delivery``/``on_publication``; the bridge uses the
batched ``on_deliveries``.  Both are registered on the same broker, so they observe the same
traffic: live fan-out, queued QoS 1 messages drained on reconnect (written after their
publication), a retained message on SUBSCRIBE, and a content filter.  The bridge's rows must be
the reference records, one per delivery and per publication, with the same values.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import aiomqtt
import pyarrow.dataset as ds

from bridge import Bridge, Kind
from broker.hooks import Delivery, Hooks, Publication
from tests.bridge.records import NO_COMPOSITE

_FIELDS = (
    "message_id",
    "publisher_id",
    "subscriber_id",
    "topic",
    "subscription_filter",
    "content_filter",
    "qos",
    "retained",
    "payload_size",
)


class _Reference(Hooks):
    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.publications: list[Publication] = []

    def on_delivery(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)

    def on_publication(self, publication: Publication) -> None:
        self.publications.append(publication)


async def _receive(client: aiomqtt.Client, n: int) -> list[str]:
    got: list[str] = []
    async for message in client.messages:
        got.append(str(message.topic))
        if len(got) == n:
            break
    return got


async def test_batched_rows_equal_the_per_record_hook(tmp_path: Path) -> None:
    from broker import Broker

    bridge = Bridge(tmp_path, roll_interval=0.05)
    ref = _Reference()
    async with Broker(host="127.0.0.1", port=0, hooks=[bridge, ref]) as b:
        port = b.port
        async with aiomqtt.Client("127.0.0.1", port, identifier="s1", clean_session=False) as s1:
            await s1.subscribe("r/#", qos=1)
        async with aiomqtt.Client("127.0.0.1", port, identifier="pub") as pub:
            await pub.publish("r/keep", b"kept", qos=1, retain=True)
            for i in range(3):  # s1 is offline: queued, written when it comes back
                await pub.publish("r/x", f"q{i}".encode(), qos=1)
            async with (
                aiomqtt.Client("127.0.0.1", port, identifier="s1", clean_session=False) as s1,
                aiomqtt.Client("127.0.0.1", port, identifier="s2") as s2,
            ):
                drained = asyncio.create_task(_receive(s1, 4 + 5))
                await s2.subscribe("r/#", qos=0)  # the retained message, written on SUBSCRIBE
                await s2.subscribe("$filter/v > 2/r/x", qos=0)
                live = asyncio.create_task(_receive(s2, 1 + 5))  # overlapping: one copy
                for i in range(5):  # live fan-out to s1 and s2
                    await pub.publish("r/x", f'{{"v": {i}}}'.encode(), qos=1)
                got1, got2 = await asyncio.wait_for(asyncio.gather(drained, live), timeout=30)
                assert len(got1) == 9 and len(got2) == 6
    # The broker's graceful stop committed everything.
    rows = ds.dataset(tmp_path / Kind.DELIVERIES.value, format="parquet").to_table().to_pylist()
    assert Counter(tuple(r[f] for f in _FIELDS) for r in rows) == Counter(
        tuple(getattr(d, f) for f in _FIELDS) for d in ref.deliveries
    )
    assert len(rows) == len(ref.deliveries) == 9 + 6
    # Latencies are measured by both (the batched one once per publication's fan-out).
    ref_latency = {(d.message_id, d.subscriber_id, d.subscription_filter): d.latency for d in ref.deliveries}
    for r in rows:
        assert 0.0 <= r["latency"] < 5.0
        assert (
            abs(r["latency"] - ref_latency[r["message_id"], r["subscriber_id"], r["subscription_filter"]])
            < 1.0
        )
    pubs = ds.dataset(tmp_path / Kind.PUBLICATIONS.value, format="parquet").to_table().to_pylist()
    pub_fields = ("message_id", "publisher_id", "topic", "payload_size", "qos", "retained", "deliveries")
    assert sorted(tuple(p[f] for f in pub_fields) for p in pubs) == sorted(
        tuple(getattr(p, f) for f in pub_fields) for p in ref.publications
    )
    assert bridge.stats().pending == {
        "deliveries": 0,
        "publications": 0,
        "subscription_changes": 0,
        **NO_COMPOSITE,
    }
    bridge._check()
