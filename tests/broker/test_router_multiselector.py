"""Clients holding several different selectors on one topic (issue 42 item 2, 100k finding).

Such a client (every matching subscription carries a selector, none has no-local) is indexed
in the topic's plan under each of its selectors (``_Plan.by_selectors``) instead of being
evaluated on every message (``_Plan.general``), and a message that matches several of its
selectors reaches it once.  The routes are compared with a brute force (every subscription
walked with ``topics.matches``, every selector compiled and evaluated on the payload: the
reference of tests/broker/test_router_model.py) through several engines, and over MQTT a
client with three filters gets exactly one copy of a message that matches two of them.
"""

from __future__ import annotations

import aiomqtt
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import content
from broker import Broker
from broker.core._router import Router
from broker.values import Message, SubOptions
from tests.broker.test_router_model import Entries, model_subscribe, reference
from tests.waiting import next_message

FILTERS = ["s/t", "s/+", "s/#", "+/t", "#"]  # all match the topic s/t
SELECTORS = ["x > 1", "x < 3", "y = 'k'", "x = 2", "x > 1 AND y = 'k'", "x >= 0"]

subscription = st.tuples(
    st.sampled_from(FILTERS),
    st.sampled_from(SELECTORS),
    st.integers(0, 2),
    st.booleans(),  # retain as published
    st.booleans(),  # with a subscription identifier
)


def _build(
    engine: str, clients: list[list[tuple[str, str, int, bool, bool]]], no_local: int
) -> tuple[Router, Entries]:
    router = Router(engine=engine)
    entries: Entries = {}
    next_id = 1
    for c, subs in enumerate(clients):
        cid = f"c{c}"
        for f, sel, qos, rap, with_id in subs:
            opts = SubOptions(qos, c == no_local, rap, 0, next_id if with_id else None, sel, f)
            next_id += 1
            router.add_selector(sel, content.compile(sel))
            old = [o for g, o in entries.get(cid, []) if g == f and o is not None]
            for o in old:
                assert o.selector is not None
                router.release_selector(o.selector)
            router.index.subscribe(cid, f, opts)
            model_subscribe(entries, cid, f, opts)
    return router, entries


@pytest.mark.parametrize("engine", ["brute-force", "iccounting", "hcem", "rabased"])
@settings(max_examples=60, deadline=None)
@given(
    clients=st.lists(st.lists(subscription, min_size=1, max_size=5), min_size=1, max_size=6),
    no_local=st.integers(-1, 5),
    messages=st.lists(
        st.tuples(st.integers(0, 4), st.sampled_from(["k", "z"]), st.integers(0, 2), st.booleans()),
        min_size=1,
        max_size=8,
    ),
    publisher=st.sampled_from([None, "c0", "c1"]),
)
def test_several_selectors_route_like_the_brute_force(
    engine: str,
    clients: list[list[tuple[str, str, int, bool, bool]]],
    no_local: int,
    messages: list[tuple[int, str, int, bool]],
    publisher: str | None,
) -> None:
    router, entries = _build(engine, clients, no_local)
    for x, y, qos, retain in [(2, "k", 1, False), *messages]:  # the first one makes no plan
        msg = Message("s/t", orjson.dumps({"x": x, "y": y}), qos, retain, publisher_id=publisher)
        routes = router.route(msg)
        got = sorted(
            ((r.client_id, r.qos, r.retain, r.subscription_ids, r.topic_filter, r.selector) for r in routes),
            key=repr,
        )
        assert got == reference(router, entries, msg)  # one Route per client, as the brute force
    router._check()


def test_a_client_with_several_selectors_is_indexed_under_each() -> None:
    """The plan lists the client under each selector and nowhere else (on main it was in
    ``general``: evaluated on every message whatever the engine answered)."""
    router = Router()
    for f, sel in [("s/t", "x > 1"), ("s/+", "x < 3"), ("#", "y = 'k'")]:
        router.add_selector(sel, content.compile(sel))
        router.index.subscribe("multi", f, SubOptions(1, False, False, 0, None, sel, f))
    router.add_selector("x = 9", content.compile("x = 9"))
    router.index.subscribe("nolocal", "s/t", SubOptions(1, True, False, 0, None, "x = 9", "s/t"))
    router.index.subscribe("nolocal", "#", SubOptions(1, True, False, 0, None, "x > 1", "#"))
    msg = Message("s/t", b'{"x": 2, "y": "k"}', 1, False)
    for _ in range(2):
        routes = router.route(msg)
    plan = router._cache["s/t"]
    assert [cid for cid, _ in plan.general] == ["nolocal"]  # no-local stays per message
    assert {sel: [cid for cid, _ in clients] for sel, clients in plan.by_selectors.items()} == {
        "x > 1": ["multi"],
        "x < 3": ["multi"],
        "y = 'k'": ["multi"],
    }
    assert sorted(r.client_id for r in routes) == ["multi", "nolocal"]
    router._check()


def test_routes_through_a_selector_are_made_once_and_reused() -> None:
    """A selector's deliveries are cached in the plan per (QoS, RETAIN) key: a later message
    matching the same selectors gets the very same Route objects (no ``_client_route`` and no
    new Route per delivery), a client reached through two matched selectors still once with
    the Route from all its subscriptions, and a no-local client per message (on main every
    message made every Route anew)."""
    router = Router()
    subs = [
        ("single", "s/t", "x > 1", 1, None),  # one selector: by_selector
        ("multi", "s/t", "x > 1", 0, 7),  # two selectors: by_selectors (x > 1 keys both maps)
        ("multi", "#", "y = 'k'", 2, 8),
    ]
    for cid, f, sel, qos, sid in subs:
        router.add_selector(sel, content.compile(sel))
        router.index.subscribe(cid, f, SubOptions(qos, False, False, 0, sid, sel, f))
    router.add_selector("x >= 0", content.compile("x >= 0"))
    router.index.subscribe("nolocal", "s/+", SubOptions(1, True, False, 0, None, "x >= 0", "s/+"))

    def route(payload: bytes, publisher: str | None = None) -> dict[str, tuple[object, ...]]:
        routes = router.route(Message("s/t", payload, 1, False, publisher_id=publisher))
        assert len({r.client_id for r in routes}) == len(routes)  # one Route per client
        return {r.client_id: (r, r.qos, r.subscription_ids, r.topic_filter, r.selector) for r in routes}

    route(b'{"x": 2}')  # the topic's first message: no plan yet
    first = route(b'{"x": 2}')
    again = route(b'{"x": 5, "y": "z"}', publisher="other")
    assert set(first) == set(again) == {"single", "multi", "nolocal"}
    assert first["single"] == (first["single"][0], 1, (), "s/t", "x > 1")
    assert first["multi"] == (first["multi"][0], 0, (7,), "s/t", "x > 1")
    for cid in ("single", "multi"):
        assert again[cid][0] is first[cid][0]  # the cached Route itself
    plan = router._cache["s/t"]
    key = 2 * 1 + 0
    assert [r.client_id for r in plan.sel_routes[key]["x > 1"]] == ["single"]
    assert [r.client_id for r in plan.sel_routes[6 + key]["x > 1"]] == ["multi"]
    assert plan.local == {"x >= 0"}  # the no-local client's selector: routed per message
    assert "x >= 0" not in plan.sel_routes[key]
    assert "nolocal" not in route(b'{"x": 2}', publisher="nolocal")
    both = route(b'{"x": 2, "y": "k"}')  # both of multi's selectors: best QoS, both ids
    assert both["multi"][1] == 1  # min(message QoS, best subscription QoS 2)
    assert sorted(both["multi"][2]) == [7, 8]  # type: ignore[call-overload]
    assert both["multi"][3:] == ("#", "y = 'k'")
    assert route(b'{"x": 2}')["multi"][0] is first["multi"][0]  # the cache was not overwritten
    router._check()


async def test_one_copy_of_a_message_matching_two_of_three_selectors(broker: Broker) -> None:
    """Over MQTT: three filters with different selectors on one topic; a message matching two
    of them arrives once, one matching none does not arrive, one matching one arrives once."""
    async with (
        aiomqtt.Client(
            "127.0.0.1", broker.port, identifier="sub", protocol=aiomqtt.ProtocolVersion.V5
        ) as sub,
        aiomqtt.Client(
            "127.0.0.1", broker.port, identifier="pub", protocol=aiomqtt.ProtocolVersion.V5
        ) as pub,
    ):
        await sub.subscribe("$filter/temp > 20/room/lab", qos=1)
        await sub.subscribe("$filter/hum < 50/room/+", qos=1)
        await sub.subscribe("$filter/temp < 0/room/#", qos=1)
        for n in range(3):  # the topic gets its plan on its second message
            await pub.publish("room/lab", orjson.dumps({"n": n, "temp": 25, "hum": 40}), qos=1)  # 2 of 3
            await pub.publish("room/lab", orjson.dumps({"n": n, "temp": 10, "hum": 90}), qos=1)  # none
            await pub.publish("room/lab", orjson.dumps({"n": n, "temp": -5, "hum": 90}), qos=1)  # 1 of 3
        await pub.publish("room/lab", b'{"end": true, "temp": 30}', qos=1)  # marker: after all others
        got = []
        while True:
            m = await next_message(sub)
            doc = orjson.loads(m.payload)  # type: ignore[arg-type]
            if doc.get("end"):
                break
            got.append((doc["n"], doc["temp"]))
        assert got == [(0, 25), (0, -5), (1, 25), (1, -5), (2, 25), (2, -5)]
        assert broker.core.router._cache.get("room/lab") is not None
