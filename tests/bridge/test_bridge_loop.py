"""The loop with real local Spark and real MQTT clients: devices publish telemetry, the bridge
lands it, ``format("siftmq")`` reads it, a per-device z-score flags outliers and the sink
publishes them to ``alerts/<device>``, where the device receives them (exact counts)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from bridge import Bridge, Kind
from bridge._loop import LoopOptions, alerts_query
from broker import Broker
from tests.bridge.conftest import spark_call
from tests.bridge.test_bridge_sink import _Collector
from tests.waiting import eventually

pytestmark = pytest.mark.spark

OUTLIERS = {"d1": (8, 30.0), "d2": (10, -20.0)}  # device: (reading number, value)
READINGS = 12


def _telemetry(port: int) -> int:
    """Each device publishes READINGS readings (10, 11, 10, 11, ... and its outlier), QoS 1,
    each acknowledged before the next (so the broker's times order them); returns how many."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    c.connect("127.0.0.1", port)
    c.loop_start()
    n = 0
    for i in range(READINGS):
        for device in ("d0", "d1", "d2"):
            at, outlier = OUTLIERS.get(device, (-1, 0.0))
            value = outlier if i == at else 10.0 + i % 2
            c.publish(f"telemetry/{device}", json.dumps({"value": value}), qos=1).wait_for_publish(10)
            n += 1
    c.disconnect()
    c.loop_stop()
    return n


async def test_devices_receive_their_alerts(spark: Any, tmp_path: Path) -> None:
    bridge = Bridge(tmp_path / "landing", roll_interval=0.1, messages=["telemetry/#"])
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[bridge]) as b:
        devices = {d: _Collector(b.port, f"alerts/{d}") for d in ("d0", "d1", "d2")}
        await eventually(lambda: all(c.subscribed.is_set() for c in devices.values()))
        o = LoopOptions(url=f"mqtt://127.0.0.1:{b.port}", trigger=0.5)
        q = await asyncio.to_thread(
            spark_call, spark, alerts_query, spark, str(tmp_path / "landing"), str(tmp_path / "ck"), o
        )
        try:
            n = await asyncio.to_thread(_telemetry, b.port)
            assert await asyncio.to_thread(bridge.wait_written, Kind.MESSAGES, n, 30)
            await asyncio.to_thread(q.processAllAvailable)
            await eventually(lambda: devices["d1"].count() == 1 and devices["d2"].count() == 1, timeout=30)
        finally:
            q.stop()
        assert q.exception() is None
        for c in devices.values():
            c.close()
    assert devices["d0"].got == []
    for device, (_, value) in OUTLIERS.items():
        ((topic, payload, props),) = devices[device].got
        alert = json.loads(payload)
        assert topic == f"alerts/{device}" and alert["device"] == device and alert["value"] == value
        assert alert["mean"] == 10.5 and alert["stddev"] == 0.5 and abs(alert["z"]) > 3
        query_id, batch, partition, row = props["siftmq-key"].split("/")
        assert query_id == str(q.id) and int(batch) >= 0 and partition == "0" and row in ("0", "1")
