"""Listener admission: connection limit, per-IP connection rate, anonymous clients; $SYS counters."""

from __future__ import annotations

import asyncio
import contextlib

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker import Broker
from broker._config import BrokerConfig, Listener
from broker.core._session import Stats
from broker.net._admission import ConnectionLimits, Refusal
from broker.packets import Connack, Connect, ReasonCode
from tests.security.helpers import T, raw_connect

REFUSED = "$SYS/broker/connections/refused/"


async def test_max_connections() -> None:
    async with Broker(port=0, sys_interval=0, max_connections=2) as b:
        held = [await asyncio.open_connection("127.0.0.1", b.port) for _ in range(2)]
        try:
            ack, closed = await raw_connect(b.port, Connect("over5", protocol_level=5))
            assert isinstance(ack, Connack) and ack.reason_code == ReasonCode.QUOTA_EXCEEDED and closed
            assert ack.properties.reason_string == "too many connections"
            ack, closed = await raw_connect(b.port, Connect("over4", protocol_level=4))
            assert isinstance(ack, Connack) and ack.reason_code == ReasonCode.SERVER_UNAVAILABLE and closed
            assert b.core.sys_values(0.0)[REFUSED + "max_connections"] == "2"
        finally:
            for _, w in held:
                w.close()
        # the slots are given back when the connections end
        for _, w in held:
            with contextlib.suppress(OSError):
                await w.wait_closed()
        async with asyncio.timeout(T):
            while True:
                ack, _ = await raw_connect(b.port, Connect("again", protocol_level=5))
                assert isinstance(ack, Connack)
                if ack.reason_code == 0:
                    break


async def test_connection_rate_per_source() -> None:
    async with Broker(port=0, sys_interval=0, connection_rate=0.001, connection_burst=2) as b:
        for i in range(2):
            ack, _ = await raw_connect(b.port, Connect(f"ok{i}", protocol_level=5))
            assert isinstance(ack, Connack) and ack.reason_code == 0
        ack, closed = await raw_connect(b.port, Connect("fast5", protocol_level=5))
        assert isinstance(ack, Connack) and ack.reason_code == ReasonCode.CONNECTION_RATE_EXCEEDED and closed
        ack, closed = await raw_connect(b.port, Connect("fast3", protocol_level=3, protocol_name="MQIsdp"))
        assert isinstance(ack, Connack) and ack.reason_code == ReasonCode.SERVER_UNAVAILABLE and closed
        assert b.core.sys_values(0.0)[REFUSED + "connection_rate"] == "2"


async def test_anonymous_refused_on_closed_listener() -> None:
    listeners = (Listener(port=0, allow_anonymous=False), Listener(port=0))
    async with Broker(config=BrokerConfig(listeners=listeners, sys_interval=0)) as b:
        closed_port, open_port = b.ports
        ack, closed = await raw_connect(closed_port, Connect("anon5", protocol_level=5))
        assert isinstance(ack, Connack) and ack.reason_code == ReasonCode.NOT_AUTHORIZED and closed
        ack, closed = await raw_connect(closed_port, Connect("anon4", protocol_level=4))
        assert isinstance(ack, Connack) and ack.reason_code == ReasonCode.NOT_AUTHORIZED and closed
        ack, _ = await raw_connect(closed_port, Connect("named", protocol_level=5, username="u"))
        assert isinstance(ack, Connack) and ack.reason_code == 0
        ack, _ = await raw_connect(open_port, Connect("anon-loopback", protocol_level=5))
        assert isinstance(ack, Connack) and ack.reason_code == 0
        assert b.core.sys_values(0.0)[REFUSED + "anonymous"] == "2"


class _SmallLimits(ConnectionLimits):
    MIN_SWEEP = 3  # sweep often, to check that sweeping never changes a decision


class LimitsMachine(RuleBasedStateMachine):
    """ConnectionLimits against a brute-force reference that replays each source's history."""

    def __init__(self) -> None:
        super().__init__()
        self.rate, self.burst, self.cap = 2.0, 3, 5
        cfg = BrokerConfig(max_connections=self.cap, connection_rate=self.rate, connection_burst=self.burst)
        self.limits = _SmallLimits(cfg, Stats())
        self.now = 0.0
        self.open = 0
        self.history: dict[str, list[tuple[float, bool]]] = {}  # accepted (token taken) or not

    def reference(self, ip: str) -> Refusal | None:
        if self.open + 1 > self.cap:
            return Refusal.MAX_CONNECTIONS
        tokens, last = float(self.burst), 0.0
        for t, took in self.history.get(ip, []):
            tokens = min(float(self.burst), tokens + (t - last) * self.rate)
            last = t
            if took:
                tokens -= 1.0
        tokens = min(float(self.burst), tokens + (self.now - last) * self.rate)
        return None if tokens >= 1.0 else Refusal.CONNECTION_RATE

    @rule(ip=st.sampled_from(["a", "b", "c", "d", "e", "f"]))
    def connect(self, ip: str) -> None:
        expected = self.reference(ip)
        assert self.limits.admit(ip, self.now) is expected
        self.open += 1
        if expected is not Refusal.MAX_CONNECTIONS:
            self.history.setdefault(ip, []).append((self.now, expected is None))

    @precondition(lambda self: self.open > 0)
    @rule()
    def disconnect(self) -> None:
        self.limits.release()
        self.open -= 1

    @rule(dt=st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 3.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @invariant()
    def consistent(self) -> None:
        self.limits._check()
        assert self.limits.open == self.open


LimitsMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_limits_model = LimitsMachine.TestCase
