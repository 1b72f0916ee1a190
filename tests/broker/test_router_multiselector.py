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
