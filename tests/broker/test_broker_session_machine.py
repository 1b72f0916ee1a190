"""The sans-IO core without an event loop: packets and times in, packets and closes out."""

from __future__ import annotations

import logging

import pytest

from broker._config import BrokerConfig
from broker.core._clock import ManualClock
from broker.core._connection import Callbacks, Connection
from broker.core._core import LIMIT_LOG_INTERVAL, Core
from broker.core._session import ConnectionState
from broker.hooks import Hooks, SubscriptionChange
from broker.packets import (
    Connack,
    Connect,
    Decoder,
    Disconnect,
    Packet,
    Properties,
    Puback,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
)


class Wire:
    """One fake connection: what the core wrote, decoded, and whether it closed."""

    def __init__(self, core: Core, now: float, version: int = 5) -> None:
        self.core = core
        self.decoder = Decoder(version, server=False)
        self.out: list[Packet] = []
        self.closed = False
        self.conn = Connection(core, Callbacks(self._write, self._close), now, "test")

    def _write(self, data: bytes) -> None:
        self.out.extend(self.decoder.feed(data))

    def _close(self) -> None:
        self.closed = True

    def feed(self, *packets: Packet, now: float = 0.0) -> list[Packet]:
        self.conn.received(packets, now)
        self.core.flush()
        got, self.out = self.out, []
        return got

    def drop(self, now: float = 0.0) -> None:
        """The network connection ends."""
        self.conn.lost(now)
        self.core.flush()

    def take(self) -> list[Packet]:
        got, self.out = self.out, []
        return got


def connect(core: Core, cid: str, now: float = 0.0, version: int = 5, **kw: object) -> tuple[Wire, Connack]:
    w = Wire(core, now, version)
    kw.setdefault("keep_alive", 0)  # tests jump in time
    ack, *rest = w.feed(Connect(cid, protocol_level=version, **kw), now=now)  # type: ignore[arg-type]
    assert isinstance(ack, Connack)
    w.out = rest  # resent in-flight messages of a resumed session
    return w, ack


def sub(w: Wire, *filters: str, qos: int = 1, props: Properties | None = None) -> Suback:
    (ack, *_rest) = w.feed(
        Subscribe(1, tuple(SubscriptionRequest(f, qos) for f in filters), props or Properties())
    )
    assert isinstance(ack, Suback)
    return ack


def test_connect_subscribe_publish_qos1() -> None:
    core = Core(BrokerConfig(sys_interval=0))
    a, ack = connect(core, "a")
    assert ack.reason_code == ReasonCode.SUCCESS and not ack.session_present
    b, _ = connect(core, "b")
    assert sub(a, "x/#").reason_codes == (ReasonCode.GRANTED_QOS_1,)
    assert b.feed(Publish("x/1", b"hi", qos=1, packet_id=9)) == [Puback(9)]
    (p,) = a.take()
    assert isinstance(p, Publish) and (p.topic, p.payload, p.qos) == ("x/1", b"hi", 1)
    assert p.packet_id is not None
    a.feed(Puback(p.packet_id))
    assert not core.sessions["a"].inflight
    core._check()


def test_first_packet_must_be_connect() -> None:
    core = Core(BrokerConfig(sys_interval=0))
    w = Wire(core, 0.0)
    assert w.feed(Publish("a", b"")) == []
    assert w.closed


def test_puback_no_matching_subscribers_v5() -> None:
    core = Core(BrokerConfig(sys_interval=0))
    w, _ = connect(core, "p")
    assert w.feed(Publish("nobody", b"", qos=1, packet_id=1)) == [
        Puback(1, ReasonCode.NO_MATCHING_SUBSCRIBERS)
    ]


def test_keep_alive_is_one_and_a_half_times() -> None:
    core = Core(BrokerConfig(sys_interval=0))
    w, _ = connect(core, "k", keep_alive=10)
    core.tick(14.9)
    core.flush()
    assert not w.closed
    core.tick(15.1)
    core.flush()
    assert w.closed
    assert [p.reason_code for p in w.take() if isinstance(p, Disconnect)] == [ReasonCode.KEEP_ALIVE_TIMEOUT]
    assert "k" not in core.sessions  # session expiry 0: ended


def test_will_delay_and_session_expiry_timeline() -> None:
    core = Core(BrokerConfig(sys_interval=0))
    watcher, _ = connect(core, "watch")
    sub(watcher, "will/#", qos=0)
    will = Will("will/x", b"bye", properties=Properties(will_delay_interval=5))
    w, _ = connect(core, "x", will=will, properties=Properties(session_expiry_interval=10), clean_start=False)
    w.drop(now=100.0)
    core.tick(104.0)
    core.flush()
    assert watcher.take() == []
    core.tick(105.0)
    core.flush()
    (p,) = watcher.take()
    assert isinstance(p, Publish) and p.payload == b"bye"
    assert "x" in core.sessions
    core.tick(110.5)
    assert "x" not in core.sessions


def test_will_published_at_session_end_before_delay() -> None:
    core = Core(BrokerConfig(sys_interval=0))
    watcher, _ = connect(core, "watch")
    sub(watcher, "will/#", qos=0)
    will = Will("will/y", b"end", properties=Properties(will_delay_interval=100))
    w, _ = connect(core, "y", will=will, properties=Properties(session_expiry_interval=2))
    w.drop(now=0.0)
    core.tick(2.5)
    core.flush()
    assert [p.payload for p in watcher.take() if isinstance(p, Publish)] == [b"end"]


def test_takeover_and_resume_with_dup() -> None:
    core = Core(BrokerConfig(sys_interval=0))
    props = Properties(session_expiry_interval=60)
    a, _ = connect(core, "c", properties=props, clean_start=False)
    sub(a, "t/#", qos=2)
    pub, _ = connect(core, "pub")
    pub.feed(Publish("t/1", b"1", qos=2, packet_id=1))
    (p,) = a.take()
    assert isinstance(p, Publish) and p.qos == 2 and not p.dup
    a2, ack = connect(core, "c", properties=props, clean_start=False)
    assert ack.session_present
    assert a.closed and [type(x) for x in a.take()] == [Disconnect]
    assert a.conn.state is ConnectionState.CLOSED
    (again,) = a2.take()
    assert isinstance(again, Publish) and again.dup and again.packet_id == p.packet_id
    assert a2.feed(Pubrec(p.packet_id or 0)) == [Pubrel(p.packet_id or 0)]
    core._check()


def test_clean_start_discards_session() -> None:
    core = Core(BrokerConfig(sys_interval=0))
    a, _ = connect(core, "c", properties=Properties(session_expiry_interval=60), clean_start=False)
    sub(a, "t/#")
    a.drop()
    _, ack = connect(core, "c", clean_start=True)
    assert not ack.session_present
    assert core.router.index.entry_count("c") == 0


def test_partial_unsubscribe_entries_and_codes() -> None:
    core = Core(BrokerConfig(sys_interval=0))
    a, _ = connect(core, "a")
    sub(a, "s/#")
    (ack,) = a.feed(Unsubscribe(3, ("s/x/#", "nothing")))
    assert ack == Unsuback(3, (ReasonCode.SUCCESS, ReasonCode.NO_SUBSCRIPTION_EXISTED))
    assert core.router.index.entry_count("a") == 2
    pub, _ = connect(core, "p")
    pub.feed(Publish("s/x/1", b""), Publish("s/y", b""))
    assert [p.topic for p in a.take() if isinstance(p, Publish)] == ["s/y"]


def test_pure_mqtt_unsubscribe() -> None:
    core = Core(BrokerConfig(sys_interval=0, partial_unsubscribe=False))
    a, _ = connect(core, "a")
    sub(a, "s/#")
    (ack,) = a.feed(Unsubscribe(3, ("s/x/#",)))
    assert ack == Unsuback(3, (ReasonCode.NO_SUBSCRIPTION_EXISTED,))
    assert core.router.index.entry_count("a") == 1


def test_selector_refcounts_released() -> None:
    core = Core(BrokerConfig(sys_interval=0))
    a, _ = connect(core, "a")
    props = Properties(user_properties=(("filter", "v > 1"),))
    sub(a, "f/#", "g/#", props=props)
    assert len(core.router.engine) == 1
    a.feed(Unsubscribe(2, ("f/#",)))
    assert len(core.router.engine) == 1
    a.drop()
    assert len(core.router.engine) == 0


def test_paused_transport_drops_qos0_and_queues_qos1() -> None:
    # high-water mark above the queue bound: no pacing, the "disconnect" policy at a full queue
    core = Core(
        BrokerConfig(
            sys_interval=0, max_queued_messages=2, queue_high_water=10, slow_consumer_policy="disconnect"
        )
    )
    a, _ = connect(core, "slow")
    sub(a, "s/#")
    a.conn.paused = True
    pub, _ = connect(core, "p")
    pub.feed(Publish("s/0", b"", qos=0))
    pub.feed(Publish("s/1", b"", qos=1, packet_id=1), Publish("s/2", b"", qos=1, packet_id=2))
    assert core.stats.publish_dropped == 1
    assert len(core.sessions["slow"].queue) == 2
    pub.feed(Publish("s/3", b"", qos=1, packet_id=3))
    assert core.stats.queue_overflow == 1 and a.closed
    assert [p.reason_code for p in a.take() if isinstance(p, Disconnect)] == [ReasonCode.QUOTA_EXCEEDED]


def test_protocol_errors_close_with_reason() -> None:
    core = Core(BrokerConfig(sys_interval=0))
    a, _ = connect(core, "a")
    got = a.feed(Connect("a"))
    assert [p.reason_code for p in got if isinstance(p, Disconnect)] == [ReasonCode.PROTOCOL_ERROR]
    assert a.closed
    b, _ = connect(core, "b")
    got = b.feed(Publish("x", b"", properties=Properties(topic_alias=0)))
    assert [p.reason_code for p in got if isinstance(p, Disconnect)] == [ReasonCode.TOPIC_ALIAS_INVALID]


class Paced(Wire):
    """A Wire whose transport read switch is recorded (flow control pauses the publisher)."""

    def __init__(self, core: Core, now: float, version: int = 5) -> None:
        super().__init__(core, now, version)
        self.reading = True
        self.conn = Connection(core, Callbacks(self._write, self._close, self._reader), now, "test")

    def _reader(self, pause: bool) -> None:
        self.reading = not pause


def paced(core: Core, cid: str) -> Paced:
    w = Paced(core, 0.0)
    (ack,) = w.feed(Connect(cid, protocol_level=5, keep_alive=0))
    assert isinstance(ack, Connack)
    return w


def ack_all(r: Wire) -> list[bytes]:
    """Acknowledge every PUBLISH ``r`` receives until none comes; their payloads in order."""
    delivered: list[bytes] = []
    out = r.take()
    while True:
        pubs = [x for x in out if isinstance(x, Publish)]
        if not pubs:
            return delivered
        out = []
        for x in pubs:
            delivered.append(x.payload)
            assert x.packet_id is not None
            out += r.feed(Puback(x.packet_id))


def test_flow_control_pauses_publisher_until_receiver_drains() -> None:
    """A QoS 1 PUBLISH that finds its receiver's queue at the high-water mark is delivered
    and acknowledged; the packets after it wait unread (no PUBACK) until the receiver's
    PUBACKs bring its queue to the low-water mark; nothing is dropped."""
    core = Core(BrokerConfig(sys_interval=0, max_inflight=1, queue_high_water=2, queue_low_water=1))
    r, _ = connect(core, "r")
    sub(r, "t")
    p = paced(core, "p")
    got = p.feed(*(Publish("t", b"%d" % i, qos=1, packet_id=i + 1) for i in range(6)))
    # 1 in flight + 2 queued: the third PUBLISH reached the mark, so 3 PUBACKs and a pause
    assert [a.packet_id for a in got if isinstance(a, Puback)] == [1, 2, 3]
    assert not p.reading and core.stats.publishers_paused == 1 and len(p.conn.pending) == 3
    core._check()
    delivered = ack_all(r)
    assert delivered == [b"%d" % i for i in range(6)]  # every acknowledged message, in order
    assert [a.packet_id for a in p.take() if isinstance(a, Puback)] == [4, 5, 6]
    assert p.reading and core.stats.publishers_paused == 0 and core.stats.publisher_pauses >= 1
    assert core.stats.queue_overflow == 0 and not core.congested
    core._check()


def test_slow_consumer_releases_publisher_after_grace() -> None:
    """A receiver that never acknowledges is a slow consumer after the grace time: its
    publisher reads again, QoS 1/2 queue up to the bound and are then dropped and counted."""
    cfg = BrokerConfig(sys_interval=0, max_inflight=1, max_queued_messages=4, slow_consumer_grace=1.0)
    core = Core(cfg)
    r, _ = connect(core, "r")
    sub(r, "t")
    p = paced(core, "p")
    p.feed(*(Publish("t", b"", qos=1, packet_id=i + 1) for i in range(10)))
    assert not p.reading and core.stats.publishers_paused == 1
    core.tick(0.5)
    assert not p.reading  # within the grace time it waits
    core.tick(1.5)
    core.flush()
    assert p.reading and core.stats.slow_consumers == 1 and core.stats.slow_consumer_events == 1
    assert len(core.sessions["r"].queue) == 4 and core.stats.dropped_queue_full == 10 - 1 - 4
    assert [a.packet_id for a in p.take() if isinstance(a, Puback)] == list(range(3, 11))
    assert not r.closed  # policy "drop" keeps it connected
    core._check()
    assert len(ack_all(r)) == 5  # the receiver catches up: it is no longer slow
    assert core.stats.slow_consumers == 0 and not core.congested
    core._check()


def test_slow_consumer_policies_disconnect_and_pace() -> None:
    rules = ("pacey*=pace",)
    cfg = BrokerConfig(
        sys_interval=0,
        max_inflight=1,
        slow_consumer_grace=1.0,
        slow_consumer_policy="disconnect",
        slow_consumer_rules=rules,
    )
    core = Core(cfg)
    d, _ = connect(core, "dropme")
    sub(d, "d")
    k, _ = connect(core, "pacey1")
    sub(k, "k")
    p1, p2 = paced(core, "p1"), paced(core, "p2")
    high = cfg.high_water
    p1.feed(*(Publish("d", b"", qos=1, packet_id=i + 1) for i in range(high + 5)))
    p2.feed(*(Publish("k", b"", qos=1, packet_id=i + 1) for i in range(high + 5)))
    assert not p1.reading and not p2.reading
    core.tick(5.0)
    core.flush()
    assert d.closed and core.stats.slow_disconnected == 1  # DISCONNECT 0x97, publisher released
    assert [x.reason_code for x in d.take() if isinstance(x, Disconnect)] == [ReasonCode.QUOTA_EXCEEDED]
    assert p1.reading
    assert not k.closed and not p2.reading  # "pace": its publisher keeps waiting
    core._check()


def test_paused_publisher_that_disconnects_is_forgotten() -> None:
    core = Core(BrokerConfig(sys_interval=0, max_inflight=1, queue_high_water=1))
    r, _ = connect(core, "r")
    sub(r, "t")
    p = paced(core, "p")
    p.feed(*(Publish("t", b"", qos=1, packet_id=i + 1) for i in range(5)))
    assert core.stats.publishers_paused == 1
    p.drop()
    assert core.stats.publishers_paused == 0
    core._check()
    r.drop()  # and a receiver that goes releases its publishers
    assert not core.congested
    core._check()


def test_core_reads_time_from_its_clock(caplog: pytest.LogCaptureFixture) -> None:
    """The core never reads the system clocks: uptime, log throttling and hook timestamps
    follow the injected clock."""
    clock = ManualClock(monotonic=100.0, wall=5_000.0)
    seen: list[float] = []

    class Record(Hooks):
        def on_subscription_change(self, change: SubscriptionChange) -> None:
            seen.append(change.time)

    core = Core(BrokerConfig(sys_interval=0), [Record()], clock=clock)
    assert core.sys_values(clock.advance(42.0))["$SYS/broker/uptime"] == "42"
    a, _ = connect(core, "a")
    sub(a, "t")
    assert seen == [5_042.0]
    with caplog.at_level(logging.WARNING, logger="broker"):
        core.log_limit("k", "a", "first")
        core.log_limit("k", "a", "throttled")
        clock.advance(LIMIT_LOG_INTERVAL + 1)
        core.log_limit("k", "a", "again")
    assert [r.getMessage().split(":")[1].split("(")[0].strip() for r in caplog.records] == ["first", "again"]
