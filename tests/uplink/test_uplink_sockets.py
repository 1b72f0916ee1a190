"""A stopped bridge leaves no socket open (issue 41 spirit: docs' examples ran in one process
gave ``ResourceWarning: unclosed socket``, both ends of one loopback connection).

When the bridge's legs were paho-mqtt clients, ``loop_start`` made a socket pair (its wake-up
pipe) that ``loop_stop`` did not close (eclipse-paho/paho.mqtt.python#627), and the cycle
collector finalized it in no set order. The legs are asyncio clients now; the test keeps the
collector off while the bridge runs and stops, so any socket a stop leaves open is still there
to be found whatever the collector's order, then collects with ResourceWarning an error.
"""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker import Broker
from uplink import BridgeConfig, Direction, TopicRule, Uplink


def _open_sockets() -> dict[int, socket.socket]:
    """The socket objects alive and not closed (O(objects in the collector))."""
    return {id(o): o for o in gc.get_objects() if isinstance(o, socket.socket) and o.fileno() != -1}


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.filterwarnings("error::ResourceWarning")
async def test_a_stopped_bridge_closes_every_socket_it_opened(tmp_path: Path, no_collector: None) -> None:
    before = _open_sockets()
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        bridge = BridgeConfig(
            name="central",
            urls=(f"mqtt://127.0.0.1:{central.port}",),
            topics=(TopicRule("sensors/#", Direction.OUT, 1, remote_prefix="sites/17/"),),
            backoff_min=0.05,
        )
        uplink = Uplink([bridge])
        edge_broker = Broker(host="127.0.0.1", port=0, store_path=tmp_path / "e.db", hooks=[uplink])
        async with central.subscribe("sites/#") as remote, edge_broker as edge:
            await asyncio.wait_for(uplink.bridges["central"].wait_connected(), 10)
            await edge.publish("sensors/a", b"1", qos=1)
            msg = await remote.get(timeout=10)
            assert msg.topic == "sites/17/sensors/a"
    left = [s for k, s in _open_sockets().items() if k not in before]
    assert left == [], f"sockets still open after stop: {left}"
    del left
    gc.collect()  # nothing left to warn about (a ResourceWarning here is an error)
