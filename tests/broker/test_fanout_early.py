"""A big fan-out of a PUBLISH read alone starts writing before it is fully encoded (issue 42
item 2): ``Core.publish`` flushes the connections it made dirty every ``EARLY_CHUNK``
deliveries once the fan-out has ``EARLY_MIN`` routes, so the first receiver's copy does not
wait for every other copy's routing and encoding.  Write coalescing is kept: a read of several
PUBLISHes still gives each receiver one write, and no receiver gets a message twice or out of
order.  The sans-IO core with recording transports (as test_broker_session_machine.py)."""

from __future__ import annotations

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

N = EARLY_MIN * 3


class Receiver:
    def __init__(self, core: Core, i: int, log: list[tuple[int, int]]) -> None:
        self.core = core
        self.i = i
        self.log = log  # (receiver, messages encoded by the core when this write happened)
        self.writes = 0
        self.packets: list[Packet] = []
        self.decoder = Decoder(5, server=False)
        self.conn = Connection(core, Callbacks(self._write, lambda: None), 0.0, f"r{i}")

    def _write(self, data: bytes) -> None:
        self.writes += 1
        self.log.append((self.i, self.core.stats.messages_sent))
        self.packets.extend(self.decoder.feed(data))


def _fleet(selector: str | None = None) -> tuple[Core, Connection, list[Receiver], list[tuple[int, int]]]:
    core = Core(BrokerConfig(sys_interval=0, content_engine="iccounting"))
    log: list[tuple[int, int]] = []
    rs = [Receiver(core, i, log) for i in range(N)]
    props = Properties() if selector is None else Properties(user_properties=(("filter", selector),))
    for r in rs:
        r.conn.received([Connect(f"r{r.i}", protocol_level=5, keep_alive=0)], 0.0)
        r.conn.received([Subscribe(1, (SubscriptionRequest("fleet/t", 0),), props)], 0.0)
    pub = Connection(core, Callbacks(lambda _d: None, lambda: None), 0.0, "pub")
    pub.received([Connect("pub", protocol_level=5, keep_alive=0)], 0.0)
    core.flush()
    for r in rs:
        r.writes = 0
        r.packets.clear()
    log.clear()
    return core, pub, rs, log


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
    assert all([p.payload for p in r.packets if isinstance(p, Publish)] == [b'{"temp": 20}'] for r in rs)


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
