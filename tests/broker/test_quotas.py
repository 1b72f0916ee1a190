"""Publish quotas and retained store caps (issue 39, item 4; docs/broker.md, "Quotas").

The token bucket against an exact reference (Hypothesis), then real clients over loopback: a
client publishing far beyond its quota is paced (the bound is checked against the broker's own
clock and count, so it cannot fail by timing: the broker may never have processed more than
``burst + rate * elapsed + 1`` of its PUBLISHes), the ``disconnect`` action gives MQTT 5
DISCONNECT 0x96, and the retained caps refuse with PUBACK 0x97.
"""

from __future__ import annotations

import asyncio
import threading
from fractions import Fraction
from pathlib import Path

import aiomqtt
import paho.mqtt.client as mqtt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import Broker
from broker._config import load_toml
from broker.core._quota import QuotaRule, TokenBucket
from broker.packets import ReasonCode
from tests.broker.test_message_hooks import PahoPublisher
from tests.waiting import eventually

T = 20.0


class ReferenceBucket:
    """The token bucket in exact arithmetic, written from its definition."""

    def __init__(self, rate: Fraction, burst: Fraction, now: Fraction) -> None:
        self.rate, self.burst, self.tokens, self.stamp = rate, burst, burst, now

    def take(self, cost: Fraction, now: Fraction) -> Fraction:
        now = max(now, self.stamp)
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate) - cost
        self.stamp = now
        return Fraction(0) if self.tokens >= 0 else -self.tokens / self.rate


@settings(max_examples=300, deadline=None)
@given(
    rate=st.integers(1, 1000),
    burst=st.integers(1, 1000),
    steps=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 500)), max_size=60),
)
def test_token_bucket_matches_the_reference(rate: int, burst: int, steps: list[tuple[int, int]]) -> None:
    bucket = TokenBucket(float(rate), float(burst), 0.0)
    ref = ReferenceBucket(Fraction(rate), Fraction(burst), Fraction(0))
    now = 0
    for dt_ms, cost in steps:
        now += dt_ms
        wait = bucket.take(float(cost), now / 1000)
        expected = ref.take(Fraction(cost), Fraction(now, 1000))
        bucket._check()
        assert wait == pytest.approx(float(expected), rel=1e-9, abs=1e-9)
        assert bucket.tokens == pytest.approx(float(ref.tokens), rel=1e-9, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.integers(1, 100),
    burst=st.integers(1, 100),
    costs=st.lists(st.integers(1, 20), min_size=1, max_size=80),
)
def test_a_paced_sender_gets_at_most_burst_plus_rate_times_time(
    rate: int, burst: int, costs: list[int]
) -> None:
    """A sender that always sends and waits as told: charged <= burst + rate * elapsed + last cost."""
    bucket = TokenBucket(float(rate), float(burst), 0.0)
    now = 0.0
    charged = 0
    for cost in costs:
        charged += cost
        assert charged <= burst + rate * now + cost + 1e-6
        now += bucket.take(float(cost), now)


def _quota_of(b: Broker, client_id: str) -> object:
    for c in b.core.connections:
        if c.client_id == client_id:
            return c.quota
    return None


async def test_a_client_far_over_its_quota_is_paced_not_dropped() -> None:
    rate, burst_s, m = 100, 0.25, 200  # bucket of 25 messages; 200 sent at once (~8x)
    rule = QuotaRule(client_id="fast*", messages_per_second=rate, burst_seconds=burst_s)
    async with (
        Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=0.05, quotas=(rule,)) as b,
        aiomqtt.Client("127.0.0.1", b.port, identifier="sub") as sub,
        aiomqtt.Client("127.0.0.1", b.port, identifier="fast-1") as pub,
        aiomqtt.Client("127.0.0.1", b.port, identifier="other"),
    ):
        await sub.subscribe("q/#")
        quota = _quota_of(b, "fast-1")
        assert quota is not None
        assert _quota_of(b, "other") is None and _quota_of(b, "sub") is None
        for i in range(m):
            await pub.publish("q/fast", b"%d" % i)
        got: list[int] = []
        async with asyncio.timeout(T):
            async for msg in sub.messages:
                # the broker's own count against its own clock (no timing assumption)
                elapsed = b.core.clock.monotonic() - quota.since  # type: ignore[attr-defined]
                assert quota.admitted <= rate * burst_s + rate * elapsed + 1  # type: ignore[attr-defined]
                got.append(int(bytes(msg.payload)))  # type: ignore[arg-type]
                if len(got) == m:
                    break
        assert got == list(range(m))  # paced: all of them, in order
        assert b.core.stats.quota_pauses >= 1
        assert b.core.sys_values(b.core.clock.monotonic())["$SYS/broker/quotas/pauses"] != "0"
        await eventually(lambda: b.core.stats.publishers_paused == 0)
        b.core._check()


async def _greedy_is_disconnected_with_0x96(b: Broker, port: int) -> None:
    """A paho MQTT 5 client ``greedy`` on ``port`` publishes 50 QoS 0 messages at once: past
    its quota it is disconnected with 0x96 (message rate too high), counted once."""
    gone = threading.Event()
    codes: list[int] = []

    def on_disconnect(_c: object, _u: object, _f: object, rc: mqtt.ReasonCode, _p: object = None) -> None:
        codes.append(rc.value)
        gone.set()

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, "greedy", protocol=mqtt.MQTTv5)
    c.on_disconnect = on_disconnect
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        await eventually(lambda: _quota_of(b, "greedy") is not None)
        for i in range(50):
            c.publish("g/x", b"%d" % i, qos=0)
        assert await asyncio.to_thread(gone.wait, T)
        assert codes[0] == ReasonCode.MESSAGE_RATE_TOO_HIGH
        assert b.core.stats.quota_disconnects == 1
    finally:
        c.loop_stop()


async def test_the_disconnect_action_gives_0x96() -> None:
    rule = QuotaRule(client_id="greedy", messages_per_second=5, action="disconnect")
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, quotas=(rule,)) as b:
        await _greedy_is_disconnected_with_0x96(b, b.port)


async def test_retained_caps_refuse_with_0x97() -> None:
    async with Broker(
        host="127.0.0.1", port=0, sys_interval=0, max_retained_messages=2, max_retained_bytes=20
    ) as b:
        pub = PahoPublisher(b.port, "p1")
        try:
            accepted = ReasonCode.NO_MATCHING_SUBSCRIBERS  # accepted, nobody subscribed
            assert await pub.publish("r/a", b"aaaaaaaa", retain=True) == accepted
            assert await pub.publish("r/b", b"bbbbbbbb", retain=True) == accepted
            # a third topic: over max_retained_messages
            assert await pub.publish("r/c", b"c", retain=True) == ReasonCode.QUOTA_EXCEEDED
            # replacing one is not a new message, but 8 + 13 bytes is over max_retained_bytes
            assert await pub.publish("r/a", b"a" * 13, retain=True) == ReasonCode.QUOTA_EXCEEDED
            assert await pub.publish("r/a", b"a" * 12, retain=True) == accepted  # 20 bytes: fits
            assert await pub.publish("r/b", b"", retain=True) == accepted  # a deletion always passes
            assert await pub.publish("r/c", b"c", retain=True) == accepted  # room again
            assert sorted(t for t, _ in b.core.router.retained.match("#")) == ["r/a", "r/c"]
            assert b.core.router.retained_bytes == 13
            assert b.core.stats.refused_retained_quota == 2
            assert b.core.sys_values(0.0)["$SYS/broker/retained/refused/quota"] == "2"
            assert await pub.publish("r/d", b"d") == accepted  # not retained: no cap
        finally:
            pub.stop()


async def test_retained_cap_for_a_311_client_drops_and_counts() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, max_retained_messages=1) as b:
        pub = PahoPublisher(b.port, "p1", v5=False)
        try:
            await pub.publish("r/a", b"1", retain=True)
            await pub.publish("r/b", b"2", retain=True)  # acknowledged (3.1.1), not stored
            assert [t for t, _ in b.core.router.retained.match("#")] == ["r/a"]
            assert b.core.stats.refused_retained_quota == 1
        finally:
            pub.stop()


def test_quotas_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "siftmq.toml"
    path.write_text(
        "[broker]\nmax-retained-messages = 100\n\n"
        '[[quotas]]\nclient_id = "sensor-*"\nmessages_per_second = 10\nbytes_per_second = 4096\n\n'
        '[[quotas]]\nusername = "batch"\nmessages_per_second = 1000\naction = "disconnect"\n'
    )
    cfg = load_toml(path)
    assert cfg.max_retained_messages == 100
    assert cfg.quotas == (
        QuotaRule(client_id="sensor-*", messages_per_second=10, bytes_per_second=4096),
        QuotaRule(username="batch", messages_per_second=1000, action="disconnect"),
    )
    assert cfg.quotas[0].matches("sensor-7", None) and not cfg.quotas[0].matches("other", None)
    assert cfg.quotas[1].matches("x", "batch") and not cfg.quotas[1].matches("x", None)
    path.write_text('[[quotas]]\nclient_id = "x"\naction = "kick"\nmessages_per_second = 1\n')
    with pytest.raises(ValueError, match="action"):
        load_toml(path)


async def test_a_client_that_leaves_while_paced_is_forgotten() -> None:
    rule = QuotaRule(client_id="slowpoke", messages_per_second=2)  # a bucket of 2 messages
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, quotas=(rule,)) as b:
        quotas = b.core.quotas
        assert quotas is not None
        async with aiomqtt.Client("127.0.0.1", b.port, identifier="slowpoke") as pub:
            for i in range(10):
                await pub.publish("s/x", b"%d" % i)
            await eventually(lambda: len(quotas.paused) == 1)  # refills 2/s: paused for seconds
            assert b.core.stats.publishers_paused == 1
        await eventually(lambda: not b.core.connections)
        assert not quotas.paused
        assert b.core.stats.publishers_paused == 0
        b.core._check()


async def test_a_quota_selects_clients_by_listener() -> None:
    """Two listeners; the rule names one ("devices"): a client there is held to the quota
    (disconnected 0x96 past it), the same client id on the other listener ("apps") has no
    quota and all its messages go through."""
    from broker._config import Listener

    rule = QuotaRule(listener="devices", messages_per_second=5, action="disconnect")
    listeners = (
        Listener("tcp", "127.0.0.1", 0, name="devices"),
        Listener("tcp", "127.0.0.1", 0, name="apps"),
    )
    async with Broker(listeners=listeners, sys_interval=0, quotas=(rule,)) as b:
        devices, apps = b.ports
        # on "apps": no quota; 50 messages at once all reach a subscriber
        async with aiomqtt.Client("127.0.0.1", apps, identifier="watcher") as sub:
            await sub.subscribe("g/#", qos=1)
            async with aiomqtt.Client("127.0.0.1", apps, identifier="greedy") as pub:
                await eventually(lambda: _connection(b, "greedy") is not None)
                assert _quota_of(b, "greedy") is None
                for i in range(50):
                    await pub.publish("g/x", b"%d" % i, qos=1)
                got = 0
                async with asyncio.timeout(T):
                    async for _ in sub.messages:
                        got += 1
                        if got == 50:
                            break
                assert _connection(b, "greedy") is not None  # still connected
        assert b.core.stats.quota_disconnects == 0
        # on "devices": the same client gets the quota and is disconnected past it
        await _greedy_is_disconnected_with_0x96(b, devices)


def _connection(b: Broker, client_id: str) -> object:
    return next((c for c in b.core.connections if c.client_id == client_id), None)


def test_quotas_by_listener_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "siftmq.toml"
    path.write_text(
        '[[listeners]]\nname = "devices"\nport = 0\n\n[[listeners]]\nname = "apps"\nport = 0\n\n'
        '[[quotas]]\nlistener = "devices"\nmessages_per_second = 10\n'
    )
    cfg = load_toml(path)
    assert [li.name for li in cfg.listeners] == ["devices", "apps"]
    assert cfg.quotas == (QuotaRule(listener="devices", messages_per_second=10),)
    rule = cfg.quotas[0]
    assert rule.matches("c", None, "devices") and not rule.matches("c", None, "apps")
    assert not rule.matches("c", None, None)
    # a rule naming no listener of the file is refused, as are two listeners of one name
    path.write_text(
        '[[listeners]]\nname = "devices"\nport = 0\n\n'
        '[[quotas]]\nlistener = "device"\nmessages_per_second = 1\n'
    )
    with pytest.raises(ValueError, match="listener 'device' is not the name of a"):
        load_toml(path)
    path.write_text('[[listeners]]\nname = "a"\nport = 0\n\n[[listeners]]\nname = "a"\nport = 0\n')
    with pytest.raises(ValueError, match="listener names must be unique"):
        load_toml(path)
