"""Released content selectors leave the engine in slices, from ``Core.tick`` (issue 42 item 2).

A fleet disconnecting released each of its selectors from the engine in the loop turn that
read its DISCONNECTs (~15-25 us each): 100,000 selectors stalled the broker's loop for
seconds.  Now a selector's last release only queues it; ``Core.tick`` removes
``RELEASE_SLICE`` of them per tick, a selector subscribed again meanwhile is taken back as
it is, and routing never sees the difference (a queued selector matches but reaches no
client).  Sans-IO: a real :class:`Core` with in-process connections, no mocks.
"""

from __future__ import annotations

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
