"""A big fan-out of a PUBLISH read alone starts writing before it is fully encoded (issue 42
item 2): ``Core.publish`` flushes the connections it made dirty every ``EARLY_CHUNK``
deliveries once the fan-out has ``EARLY_MIN`` routes, so the first receiver's copy does not
wait for every other copy's routing and encoding.  Write coalescing is kept: a read of several
PUBLISHes still gives each receiver one write, and no receiver gets a message twice or out of
order.  Its routing is streamed too (``Router.route_head``): once ``EARLY_MIN`` routes are known
the rest are computed in parts between the deliveries, so the first copy leaves before the last
route is computed.  The sans-IO core with recording transports (as
test_broker_session_machine.py); the routing's progress is seen through the content engine's
answer, a set that counts the membership tests the router's join makes (one per reached
client's subscription with a selector)."""

from __future__ import annotations

import pytest

from broker import Broker
from broker._config import BrokerConfig
from broker.core._connection import Callbacks, Connection
from broker.core._core import EARLY_CHUNK, EARLY_MIN, Core
from broker.packets import (
    Connect,
    Decoder,
    Packet,
    Properties,
    Publish,
    Subscribe,
    SubscriptionRequest,
)
from content import Event, SubId
from content._engine import BruteForce
from tests.rawclient import RawClient

N = EARLY_MIN * 3
#: membership tests made in the engine's answers (the router's join: one per route here)
TESTS = [0]


class Counted(set[SubId]):
    """The matched selectors, counting the router's membership tests."""

    def __contains__(self, item: object) -> bool:
        TESTS[0] += 1
        return super().__contains__(item)


class CountingEngine(BruteForce):
    """The brute-force engine whose answer counts what the router asks of it."""

    def match(self, event: Event) -> set[SubId]:
        return Counted(super().match(event))


class BatchCountingEngine(CountingEngine):
    """The same, as a batch engine: a read's PUBLISHes go through ``Router.route_batch``."""

    batch_native = True


class Receiver:
    def __init__(self, core: Core, i: int, log: list[tuple[int, int]]) -> None:
        self.core = core
        self.i = i
        self.log = log  # (receiver, messages encoded by the core when this write happened)
        self.writes = 0
        self.tests: list[int] = []  # the router's membership tests made at each write
        self.packets: list[Packet] = []
        self.decoder = Decoder(5, server=False)
        self.conn = Connection(core, Callbacks(self._write, lambda: None), 0.0, f"r{i}")

    def _write(self, data: bytes) -> None:
        self.writes += 1
        self.log.append((self.i, self.core.stats.messages_sent))
        self.tests.append(TESTS[0])
        self.packets.extend(self.decoder.feed(data))


def _fleet(
    selector: str | None = None,
    counting: bool = False,
    filters: tuple[str, ...] = ("fleet/t",),
    batching: bool = False,
) -> tuple[Core, Connection, list[Receiver], list[tuple[int, int]]]:
    """N receivers, each subscribed to every one of ``filters`` with ``selector`` (a
    different one per filter when it holds ``{k}``), and a publisher."""
    core = Core(BrokerConfig(sys_interval=0, content_engine="iccounting", content_batch_min=1))
    if counting:  # before the first selector is indexed
        core.router._engine = BatchCountingEngine() if batching else CountingEngine()
    log: list[tuple[int, int]] = []
    rs = [Receiver(core, i, log) for i in range(N)]
    for r in rs:
        r.conn.received([Connect(f"r{r.i}", protocol_level=5, keep_alive=0)], 0.0)
        for k, topic_filter in enumerate(filters):
            props = Properties()
            if selector is not None:
                props = Properties(user_properties=(("filter", selector.format(k=k)),))
            r.conn.received([Subscribe(k + 1, (SubscriptionRequest(topic_filter, 0),), props)], 0.0)
    pub = Connection(core, Callbacks(lambda _d: None, lambda: None), 0.0, "pub")
    pub.received([Connect("pub", protocol_level=5, keep_alive=0)], 0.0)
    core.flush()
    for r in rs:
        r.writes = 0
        r.packets.clear()
        r.tests.clear()
    log.clear()
    return core, pub, rs, log


def _payloads(r: Receiver) -> list[bytes]:
    return [p.payload for p in r.packets if isinstance(p, Publish)]


@pytest.mark.parametrize("batching", [False, True], ids=["engine", "batch-engine"])
def test_a_lone_publish_routes_its_big_fan_out_as_it_writes_it(batching: bool) -> None:
    core, pub, rs, _log = _fleet("temp > 10", counting=True, batching=batching)
    assert core.router.batching is batching
    pub.received([Publish("fleet/t", b'{"temp": 20}', 0)], 0.0)  # the plan's first miss: whole
    core.flush()
    pub.received([Publish("fleet/t", b'{"temp": 21}', 0)], 0.0)  # the plan made
    core.flush()
    TESTS[0] = 0
    for r in rs:
        r.tests.clear()
    pub.received([Publish("fleet/t", b'{"temp": 22}', 0)], 0.0)
    core.flush()
    first = min(t for r in rs for t in r.tests)
    # the first copy left once EARLY_MIN routes were known, not all N (main: N)
    assert first == EARLY_MIN < N
    assert TESTS[0] == N  # every route computed once
    # every receiver got each message once, one write per message, in order
    assert all(r.writes == 3 for r in rs)
    assert all(_payloads(r) == [b'{"temp": 20}', b'{"temp": 21}', b'{"temp": 22}'] for r in rs)


def test_a_streamed_fan_out_reaches_a_client_of_several_selectors_once() -> None:
    # the 100k fleet's shape: each receiver's ten subscriptions carry ten different selectors,
    # several of which a message satisfies (the plan's by_selectors, deduplicated)
    filters = ("fleet/t", "fleet/+", "fleet/#", "+/t", "#")
    core, pub, rs, _log = _fleet("temp > {k}", counting=True, filters=filters)
    for k in range(3):
        pub.received([Publish("fleet/t", f'{{"temp": {k + 2}}}'.encode(), 0)], 0.0)
        core.flush()
    want = [b'{"temp": 2}', b'{"temp": 3}', b'{"temp": 4}']
    assert all(_payloads(r) == want for r in rs)
    assert all(r.writes == 3 for r in rs)
    # the last message: written before its join was done (each receiver's five tests)
    last = min(r.tests[-1] for r in rs)
    assert last < max(r.tests[-1] for r in rs)


def test_a_lone_publish_writes_its_big_fan_out_as_it_goes() -> None:
    core, pub, rs, log = _fleet("temp > 10")
    base = core.stats.messages_sent
    pub.received([Publish("fleet/t", b'{"temp": 20}', 0)], 0.0)
    core.flush()
    # the first copy left after EARLY_CHUNK encodings, not after all N (main: N)
    assert log[0][1] - base == EARLY_CHUNK
    assert log[-1][1] - base == N
    # every receiver got it once, in one write
    assert all(r.writes == 1 for r in rs)
    assert all(_payloads(r) == [b'{"temp": 20}'] for r in rs)


def test_a_small_fan_out_and_a_read_of_several_publishes_still_write_once_per_receiver() -> None:
    core, pub, rs, log = _fleet()
    base = core.stats.messages_sent
    pub.received([Publish("fleet/t", b"1", 0), Publish("fleet/t", b"2", 0)], 0.0)
    core.flush()
    # two messages, one write each: coalesced as before, written after both were encoded
    assert all(r.writes == 1 for r in rs)
    assert log[0][1] - base == 2 * N
    assert all([p.payload for p in r.packets if isinstance(p, Publish)] == [b"1", b"2"] for r in rs)


def test_early_writes_keep_each_receivers_order_across_reads() -> None:
    core, pub, rs, _log = _fleet()
    for k in range(3):
        pub.received([Publish("fleet/t", str(k).encode(), 0)], 0.0)
        core.flush()
    pub.received([Publish("fleet/t", b"3", 0), Publish("fleet/t", b"4", 0)], 0.0)
    core.flush()
    want = [b"0", b"1", b"2", b"3", b"4"]
    assert all([p.payload for p in r.packets if isinstance(p, Publish)] == want for r in rs)
    assert all(r.writes == 4 for r in rs)


async def test_a_streamed_fan_out_over_loopback_keeps_what_each_subscriber_gets() -> None:
    # real clients: 160 subscribers with two selective subscriptions each (QoS 1 and 0,
    # subscription identifiers), 20 plain ones, the publisher subscribed with no-local; three
    # lone QoS 1 PUBLISHes (each its read's only packet: streamed once the plan exists)
    async with Broker(port=0, sys_interval=0, content_engine="iccounting") as b:
        subs: list[RawClient] = []
        for i in range(180):
            c, _ = await RawClient.connect(b.port, f"s{i}")
            if i < 160:
                await c.subscribe(
                    SubscriptionRequest("fleet/t", 1),
                    properties=Properties(
                        subscription_identifiers=(i + 1,), user_properties=(("filter", "temp > 10"),)
                    ),
                )
                await c.subscribe(
                    SubscriptionRequest("fleet/+", 0),
                    properties=Properties(
                        subscription_identifiers=(1000 + i,),
                        user_properties=(("filter", f"temp > {20 + i % 3}"),),
                    ),
                )
            else:
                await c.subscribe(SubscriptionRequest("fleet/#", 0))
            subs.append(c)
        pub, _ = await RawClient.connect(b.port, "pub")
        await pub.subscribe(SubscriptionRequest("fleet/t", 1, no_local=True))
        temps = [15, 22, 30]
        for t in temps:
            await pub.publish1("fleet/t", f'{{"temp": {t}}}'.encode())
        for i, c in enumerate(subs):
            got = []
            for _ in temps:
                p = await c.recv_where(lambda p: isinstance(p, Publish))
                assert isinstance(p, Publish)
                got.append((p.payload, p.qos, p.properties.subscription_identifiers))
            assert not [p for p in await c.barrier() if isinstance(p, Publish)]  # nothing more
            if i >= 160:
                assert got == [(f'{{"temp": {t}}}'.encode(), 0, ()) for t in temps]
                continue
            want = []
            for t in temps:
                ids = (i + 1,) if t <= 20 + i % 3 else (i + 1, 1000 + i)
                want.append((f'{{"temp": {t}}}'.encode(), 1, ids))
            assert [(pl, q, tuple(sorted(ids))) for pl, q, ids in got] == want
        assert not [p for p in await pub.barrier() if isinstance(p, Publish)]  # no-local
        assert b.core.stats.messages_sent >= 3 * 180
