"""The dashboard's server-side history (issue 38, item 5; broker/_history.py, docs/dashboard.md):
the ring's bound and order with its invariants, then ``/api/history`` of a real broker whose
history is sampled every 50 ms, with real MQTT clients publishing and no page ever opened."""

from __future__ import annotations

import asyncio

import aiomqtt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker import Broker
from broker._history import SERIES, History, Ring
from tests.dashboard import httpclient as http
from tests.waiting import eventually


def test_ring_keeps_the_newest_in_order() -> None:
    ring = Ring(3)
    ring._check()
    assert ring.values() == [] and ring.last() is None
    for v in range(1, 8):
        ring.append(float(v))
        ring._check()
        assert ring.values() == [float(x) for x in range(max(1, v - 2), v + 1)]
        assert ring.last() == v and len(ring) == min(v, 3)
    ring.clear()
    ring._check()
    assert ring.values() == []
    with pytest.raises(ValueError):
        Ring(0)


@given(st.integers(1, 20), st.lists(st.floats(allow_nan=False), max_size=80))
def test_ring_is_the_tail_of_what_was_appended(capacity: int, values: list[float]) -> None:
    ring = Ring(capacity)
    for i, v in enumerate(values):
        ring.append(v)
        ring._check()
        assert ring.values() == values[max(0, i + 1 - capacity) : i + 1]
    assert len(ring) == min(capacity, len(values))


def test_history_points_are_aligned_and_bounded() -> None:
    h = History(4, 5.0)
    for i in range(10):
        h.record({name: float(i) for name in SERIES})
        h._check()
    assert len(h) == 4
    assert [p["t"] for p in h.points()] == [6.0, 7.0, 8.0, 9.0]
    assert h.as_json()["capacity"] == 4 and h.as_json()["interval"] == 5.0
    with pytest.raises(KeyError):
        h.record({"t": 10.0})  # a partial point is refused, the rings stay aligned
    h._check()
    assert len(h) == 4


async def test_api_history_is_recorded_without_a_page() -> None:
    async with Broker(
        host="127.0.0.1",
        port=0,
        sys_interval=0,
        metrics_listen="127.0.0.1:0",
        dashboard_history_interval=0.05,
        dashboard_history_points=8,
    ) as b:
        dash = b.dashboard
        assert dash is not None and b.metrics_port is not None
        async with aiomqtt.Client("127.0.0.1", b.port, identifier="hist-pub") as pub:
            # publish until a recorded point shows a non-zero rate of the clients' messages
            async with asyncio.timeout(10):
                while not any(r > 0 for r in dash.recorded.rings["rate_in"]):
                    await pub.publish("hist/x", b"1", qos=1)
            await eventually(lambda: len(dash.recorded) == 8)  # the ring's bound
            assert not dash.sampling  # nobody looked: only the recorder ran
            dash.recorded._check()
            body = (await http.get(b.metrics_port, "/api/history")).json()
        hist = body["history"]
        assert hist["interval"] == 0.05 and hist["capacity"] == 8
        points = hist["points"]
        assert 1 <= len(points) <= 8  # a point or two may have come since: still bounded
        assert set(points[0]) == set(SERIES)
        times = [p["t"] for p in points]
        assert times == sorted(times)  # oldest first
        assert max(p["connections"] for p in points) == 1
        assert all(p["memory_rss"] > 1_000_000 for p in points)
        assert all(p["rate_internal"] == 0 for p in points)  # no $SYS rounds (sys_interval 0)
        # the live part: the first request started the 1 s sampler with one point
        assert body["interval"] == 1.0 and len(body["points"]) == 1


async def test_history_is_off_with_the_dashboard() -> None:
    async with Broker(
        host="127.0.0.1",
        port=0,
        sys_interval=0,
        metrics_listen="127.0.0.1:0",
        dashboard=False,
        dashboard_history_interval=0.01,
    ) as b:
        dash = b.dashboard
        assert dash is not None
        await asyncio.sleep(0)  # the recorder would have been created by start()
        assert dash._recorder is None and len(dash.recorded) == 0


def test_bad_history_settings_are_refused() -> None:
    from broker._config import BrokerConfig

    with pytest.raises(ValueError, match="dashboard_history"):
        BrokerConfig(dashboard_history_interval=0)
    with pytest.raises(ValueError, match="dashboard_history"):
        BrokerConfig(dashboard_history_points=0)
