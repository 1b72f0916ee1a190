"""A shared group's members are built once per change of the group, not once per message.

A message on a topic without a routing plan (:meth:`Router._route_direct`) and a message another
node of a cluster forwarded for a group (:meth:`Router.route_peer`) each built the group's
:class:`broker.core._shared.Members` again: O(members) per message.  They are kept now
(:class:`broker.core._shared.Groups`) and dropped when the group changes: these tests check
that nothing is built while the group is unchanged, and that every kind of change (a member
joins, leaves, re-subscribes, its session ends; a cluster node becomes unreachable and
reachable again) still takes effect on the very next message.  The last test does it end to
end with real aiomqtt clients, on one broker and across two cluster nodes.
"""

from __future__ import annotations

import aiomqtt

from broker import Broker
from broker.core._router import Router
from broker.packets import NO_PROPERTIES
from broker.values import PEER_PREFIX, Message, SubOptions
from tests.broker.test_shared_strategies import FILTER, delivered, members, publish, receivers
from tests.cluster._support import cluster, node_of
from tests.waiting import eventually, next_message

KEY = ("g", "jobs/#")


def _opts(qos: int = 1) -> SubOptions:
    return SubOptions(qos, False, False, 0, None, None, "jobs/#")


def _msg(topic: str) -> Message:
    return Message.create(topic, b"x", 1, False, NO_PROPERTIES, "p", 0.0)


def _direct(router: Router, n: int, start: int) -> list[str]:
    """Route ``n`` messages, each on a topic seen for the first time: none has a plan."""
    got = [r.client_id for i in range(start, start + n) for r in router.route(_msg(f"jobs/{i}"))]
    assert len(got) == n, got  # one delivery per message: one member of the group
    return got


def test_uncached_topics_build_the_group_once_and_see_every_change() -> None:
    router = Router(cache_size=4)
    for cid in ("a", "b"):
        router.index.subscribe(cid, FILTER, _opts())
    assert sorted(set(_direct(router, 40, 0))) == ["a", "b"]
    assert router.groups.built == 1  # was one Members per message
    assert router.cache_misses >= 40

    router.index.subscribe("c", FILTER, _opts())  # joins: in turn at once
    assert sorted(set(_direct(router, 30, 100))) == ["a", "b", "c"]
    assert router.groups.built == 2

    router.index.unsubscribe("b", FILTER)  # leaves
    assert sorted(set(_direct(router, 30, 200))) == ["a", "c"]

    router.index.subscribe("a", FILTER, _opts(qos=0))  # re-subscribes with other options
    routes = [r for i in range(300, 310) for r in router.route(_msg(f"jobs/{i}"))]
    assert {r.qos for r in routes if r.client_id == "a"} == {0}

    router.index.remove_client("c")  # its session ends
    assert set(_direct(router, 10, 400)) == {"a"}
    router._check()


def test_plans_share_the_kept_group() -> None:
    """A topic's plan and a topic without one pick from the same kept members (and the plan's
    check, :meth:`Router._check`, compares the kept groups with fresh ones)."""
    router = Router()
    for cid in ("a", "b", "c"):
        router.index.subscribe(cid, FILTER, _opts())
    got = [r.client_id for _ in range(9) for r in router.route(_msg("jobs/same"))]
    assert got.count("a") == got.count("b") == got.count("c") == 3, got
    _direct(router, 9, 0)
    assert router.groups.built == 1
    router._check()


def test_peer_messages_reach_local_members_without_rebuilding() -> None:
    """A message a peer forwarded for the group goes to a local member (never to another
    node's link), built once; a local member that joins or leaves counts at once."""
    router = Router()
    link = PEER_PREFIX + "n2"
    for cid in ("a", link, "b"):
        router.index.subscribe(cid, FILTER, _opts())
    groups = {KEY}

    def peer(n: int, start: int) -> list[str]:
        return [
            r.client_id
            for i in range(start, start + n)
            for r in router.route_peer(_msg(f"jobs/{i}"), False, groups)
        ]

    assert sorted(set(peer(20, 0))) == ["a", "b"]
    built = router.groups.built
    assert built == 2  # the whole group and its local members, once
    peer(20, 100)
    assert router.groups.built == built

    router.index.subscribe("c", FILTER, _opts())
    assert sorted(set(peer(30, 200))) == ["a", "b", "c"]
    router.index.unsubscribe("a", FILTER)
    assert sorted(set(peer(30, 300))) == ["b", "c"]
    router._check()


def test_unreachable_node_is_skipped_and_back_in_turn_once_reachable() -> None:
    router = Router()
    far = PEER_PREFIX + "n1"
    for cid in (far, "b", "c"):
        router.index.subscribe(cid, FILTER, _opts())
    router.unavailable = {far}
    got = _direct(router, 20, 0)
    assert far not in got and got.count("b") == got.count("c") == 10, got
    built = router.groups.built
    _direct(router, 20, 100)
    assert router.groups.built == built  # the reachable members are kept too

    router.index.subscribe("d", FILTER, _opts())  # the group changes while n1 is down
    got = _direct(router, 30, 200)
    assert far not in got and sorted(set(got)) == ["b", "c", "d"], got

    router.unavailable = set()  # n1 is back: in turn again
    assert far in _direct(router, 8, 300)
    router.unavailable = {far, "b", "c", "d"}  # nobody reachable: every member, in turn
    assert sorted(set(_direct(router, 8, 400))) == sorted([far, "b", "c", "d"])


async def test_a_member_joining_and_leaving_counts_on_the_next_message(broker: Broker) -> None:
    """End to end: every message on a new topic (no routing plan), the group changing between
    them through real SUBSCRIBE / UNSUBSCRIBE / DISCONNECT."""
    port = broker.port
    async with (
        aiomqtt.Client("127.0.0.1", port, identifier="w1") as w1,
        aiomqtt.Client("127.0.0.1", port, identifier="w2") as w2,
    ):
        await w1.subscribe(FILTER, qos=1)
        await broker.publish("jobs/0", b"j", qos=1)
        assert (await next_message(w1)).topic.value == "jobs/0"  # the only member
        await w2.subscribe(FILTER, qos=1)
        for i in range(1, 5):  # round robin over both: two each
            await broker.publish(f"jobs/{i}", b"j", qos=1)
        got1 = {(await next_message(w1)).topic.value for _ in range(2)}
        got2 = {(await next_message(w2)).topic.value for _ in range(2)}
        assert got1 | got2 == {f"jobs/{i}" for i in range(1, 5)}
        await w1.unsubscribe(FILTER)
        for i in range(5, 8):  # w2 alone: all three
            await broker.publish(f"jobs/{i}", b"j", qos=1)
        assert [(await next_message(w2)).topic.value for _ in range(3)] == [f"jobs/{i}" for i in range(5, 8)]
    await eventually(lambda: broker.core.router.index.entry_count("w2") == 0)  # its session ended
    async with aiomqtt.Client("127.0.0.1", port, identifier="w3") as w3:
        await w3.subscribe(FILTER, qos=1)  # w3 alone: everything
        for i in range(8, 11):
            await broker.publish(f"jobs/{i}", b"j", qos=1)
        assert [(await next_message(w3)).topic.value for _ in range(3)] == [f"jobs/{i}" for i in range(8, 11)]


async def test_across_two_nodes_the_receiving_node_sees_its_group_change() -> None:
    """Two real nodes: the publisher's node has no member of its own, so every message crosses
    the link and node 0 picks one of its local members (``route_peer``), from members kept
    while its group is unchanged; a member leaving or joining there counts at once."""
    async with (
        cluster(2) as bs,
        members(bs[0].port, ["a", "b"]) as ab,
    ):
        link0 = PEER_PREFIX + node_of(bs[0]).name
        index = bs[1].core.router.index
        await eventually(lambda: any(e.topic_filter == FILTER for e in index.entries(link0)))
        await publish(bs[1].port, "p", [f"jobs/{i}" for i in range(10)], "x")
        await delivered(ab, 10)
        assert [len(m.got) for m in ab] == [5, 5]
        await ab[1].client.unsubscribe(FILTER)
        await publish(bs[1].port, "p", [f"jobs/{i}" for i in range(10, 20)], "y")
        await delivered(ab, 20)
        assert receivers(ab, "y") == {"a"}
        async with members(bs[0].port, ["c"]) as c:
            await publish(bs[1].port, "p", [f"jobs/{i}" for i in range(20, 30)], "z")
            await delivered(ab + c, 30)
            assert receivers(ab + c, "z") == {"a", "c"}
        # three memberships, each built once (whole and local members), not once per message
        assert bs[0].core.router.groups.built <= 6, bs[0].core.router.groups.built
