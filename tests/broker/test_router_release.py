"""Released content selectors leave the engine in slices, from ``Core.tick`` (issue 42 item 2).

A fleet disconnecting released each of its selectors from the engine in the loop turn that
read its DISCONNECTs (~15-25 us each): 100,000 selectors stalled the broker's loop for
seconds.  Now a selector's last release only queues it; ``Core.tick`` removes
``RELEASE_SLICE`` of them per tick, a selector subscribed again meanwhile is taken back as
it is, and routing never sees the difference (a queued selector matches but reaches no
client).  Sans-IO: a real :class:`Core` with in-process connections, no mocks.
"""

from __future__ import annotations

import sys

import pytest

from broker._config import BrokerConfig
from broker.core._connection import Callbacks, Connection
from broker.core._core import Core
from broker.core._router import RELEASE_SLICE
from broker.packets import Connect, Properties, Subscribe, SubscriptionRequest
from broker.values import Message


def _client(core: Core, cid: str, selector: str) -> Connection:
    conn = Connection(core, Callbacks(lambda data: None, lambda: None), 0.0, cid)
    conn.received([Connect(cid, protocol_level=5, keep_alive=0)], 0.0)
    props = Properties(user_properties=(("filter", selector),))
    conn.received([Subscribe(1, (SubscriptionRequest("f/#", 0),), props)], 0.0)
    core.flush()
    return conn


def _receivers(core: Core, v: int) -> set[str]:
    """The clients a message reaches: the router's routes to clients with a session
    (``Core.publish`` delivers to those only; a departed client's entries may still wait in
    the index, ``Router.depart``)."""
    routes = core.router.route(Message("f/x", b'{"v": %d}' % v, 0, False))
    return {r.client_id for r in routes if r.client_id in core.sessions}


def test_a_fleet_disconnecting_leaves_its_selectors_to_the_ticks_in_slices() -> None:
    core = Core(BrokerConfig(sys_interval=0, content_engine="iccounting"))
    router = core.router
    n = RELEASE_SLICE + 500
    fleet = [_client(core, f"c{i}", f"v > {i}") for i in range(n)]
    _client(core, "stays", "v > 0.5")
    assert _receivers(core, 10**6) == {f"c{i}" for i in range(n)} | {"stays"}
    for conn in fleet:
        conn.lost(0.0)
    core.flush()
    # the disconnects removed nothing from the index or the engine: every departure waits
    assert router.departed == n and router.releasing == n
    assert len(router._live()) == n + 1
    assert _receivers(core, 10**6) == {"stays"} and _receivers(core, 0) == set()
    router._check()
    core._check()
    ticks = 0
    while router.releasing:
        before = len(router._live())
        core.tick(1.0 + ticks)  # one slice of departures, one of selectors
        ticks += 1
        assert before - len(router._live()) <= RELEASE_SLICE  # bounded per tick
        assert _receivers(core, 10**6) == {"stays"}
        router._check()
        core._check()
        assert ticks < 100
    assert ticks >= 2  # in slices, not at once
    assert len(router._live()) == 1 and len(router.index) == 1
    assert _receivers(core, 10**6) == {"stays"}


def test_a_selector_subscribed_again_while_it_waits_is_taken_back() -> None:
    core = Core(BrokerConfig(sys_interval=0, content_engine="iccounting"))
    router = core.router
    a = _client(core, "a", "v > 1")
    other = _client(core, "other", "v < 0")
    a.lost(0.0)
    other.lost(0.0)
    core.flush()
    assert router.departed == 2
    _client(core, "b", "v > 1")  # the same text: still indexed, one more reference
    assert _receivers(core, 5) == {"b"}
    router._check()
    core.tick(1.0)  # the departures settle: "v > 1" stays (b's), "v < 0" leaves the engine
    assert router.releasing == 0
    assert set(router.engine) == {"v > 1"}
    assert _receivers(core, 5) == {"b"} and _receivers(core, -5) == set()
    router._check()


def test_the_public_engine_holds_exactly_the_referenced_selectors() -> None:
    """``Router.engine`` (inspection, tests) settles what waits first; routing does not."""
    core = Core(BrokerConfig(sys_interval=0, content_engine="iccounting"))
    a = _client(core, "a", "v > 1")
    _client(core, "b", "v > 2")
    a.lost(0.0)
    core.flush()
    assert core.router.releasing == 1
    assert set(core.router.engine) == {"v > 2"}
    assert core.router.releasing == 0


class _Counting:
    """A clock that moves one unit each time it is read: a slice's budget is then a number of
    removals (one read after each), the same on any machine and for any engine."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return float(self.reads)


@pytest.mark.parametrize("engine", ["iccounting", "hema", "hcem"])
def test_a_slice_stops_at_its_time_budget_and_the_next_goes_on(engine: str) -> None:
    """``settle_selectors(budget=...)`` stops once the slice has spent its budget, looked at
    after every removal (a departed client's end or a selector's removal), whatever the
    engine; the next slice goes on where it stopped, and routing never reaches a departed
    client meanwhile. On main a slice was bounded by a count only (512 removals: 15-28 ms
    of one loop turn in a 100,000-selector teardown, issue 42 item 2)."""
    core = Core(BrokerConfig(sys_interval=0, content_engine=engine))
    router = core.router
    n = 40
    fleet = [_client(core, f"c{i}", f"v > {i}") for i in range(n)]
    _client(core, "stays", "v > 0.5")
    for conn in fleet:
        conn.lost(0.0)
    core.flush()
    assert router.departed == n
    clock = _Counting()
    slices = 0
    while router.releasing:
        before = router.departed + len(router._live())
        reads = clock.reads
        router.settle_selectors(RELEASE_SLICE, 3.0, clock)  # 3 units after the first read
        slices += 1
        # at most three removals (departures or selectors) per slice: the 4th read is past
        assert clock.reads - reads <= 4
        assert 1 <= before - (router.departed + len(router._live())) <= 3
        for v in (0, 7, 10**6):  # brute force: only the live client is ever reached
            assert _receivers(core, v) <= {"stays"}
        router._check()
        core._check()
        assert slices < 10 * n
    assert slices > 2 * n // 3  # 40 departures and 40 selectors, three a slice
    assert set(router.engine) == {"v > 0.5"} and len(router.index) == 1
    assert _receivers(core, 10**6) == {"stays"}


def test_the_tables_a_departed_fleet_grew_are_given_back() -> None:
    """A dict keeps its table when its keys are deleted: after a fleet of 2,000 selectors
    left and settled, main's ``_selector_refs`` still held a 2,000-key table (and the
    departure queues theirs, issue 42 item 2). Now the settled queues are new and the
    references' table is copied once it holds under a quarter of its peak."""
    core = Core(BrokerConfig(sys_interval=0, content_engine="iccounting"))
    router = core.router
    empty = sys.getsizeof({})
    one = {"v > 0.5": 1}
    fleet = [_client(core, f"c{i}", f"v > {i}") for i in range(2000)]
    _client(core, "stays", "v > 0.5")
    grown = sys.getsizeof(router._selector_refs)
    for conn in fleet:
        conn.lost(0.0)
    core.flush()
    ticks = 0
    while router.releasing:
        core.tick(1.0 + ticks)
        ticks += 1
    assert ticks > 1
    assert router._selector_refs == one
    assert sys.getsizeof(router._selector_refs) < grown // 8
    assert sys.getsizeof(router._releasing) == empty and sys.getsizeof(router._departed) == empty
    # and the subscriptions still work from the new tables
    _client(core, "again", "v > 0.5")
    assert _receivers(core, 1) == {"stays", "again"}
    router._check()
