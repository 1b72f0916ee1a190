"""Shared subscription strategies (issue 39 item 5), each checked for its promise with real
aiomqtt clients on an embedded broker; the cluster's ``local`` with two real nodes; the
selection itself (broker.core._shared) against a brute-force model with Hypothesis."""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker import Broker
from broker._cli import build_parser
from broker._config import SHARED_STRATEGIES, BrokerConfig, load_toml
from broker.core._router import Router
from broker.core._shared import Members, SharedPolicy, Strategy
from broker.packets import NO_PROPERTIES
from broker.values import PEER_PREFIX, Message, SubOptions
from tests.cluster._support import cluster, node_of
from tests.waiting import eventually

FILTER = "$share/g/jobs/#"


class Member:
    """A connected aiomqtt client of a shared group and the payloads it received."""

    def __init__(self, client: aiomqtt.Client, name: str) -> None:
        self.client = client
        self.name = name
        self.got: list[str] = []
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for m in self.client.messages:
            assert isinstance(m.payload, bytes)
            self.got.append(m.payload.decode())


@contextlib.asynccontextmanager
async def members(port: int, names: list[str], topic_filter: str = FILTER) -> AsyncIterator[list[Member]]:
    async with contextlib.AsyncExitStack() as stack:
        out = []
        for name in names:
            c = await stack.enter_async_context(aiomqtt.Client("127.0.0.1", port, identifier=name))
            await c.subscribe(topic_filter, qos=1)
            m = Member(c, name)
            stack.callback(m.task.cancel)
            out.append(m)
        yield out


async def publish(port: int, client_id: str, topics: list[str], tag: str) -> None:
    async with aiomqtt.Client("127.0.0.1", port, identifier=client_id) as p:
        for i, t in enumerate(topics):
            await p.publish(t, f"{tag}{i}", qos=1)


async def delivered(ms: list[Member], total: int) -> None:
    """Wait until ``total`` messages have arrived across ``ms`` (then no more may come)."""
    await eventually(lambda: sum(len(m.got) for m in ms) >= total, timeout=10)
    assert sum(len(m.got) for m in ms) == total


def receivers(ms: list[Member], tag: str) -> set[str]:
    return {m.name for m in ms if any(p.startswith(tag) for p in m.got)}


async def test_round_robin_is_the_default_and_takes_turns() -> None:
    async with Broker("127.0.0.1", 0, sys_interval=0) as b, members(b.port, ["w0", "w1", "w2"]) as ms:
        await publish(b.port, "p", [f"jobs/{i}" for i in range(9)], "r")
        await delivered(ms, 9)
        assert [len(m.got) for m in ms] == [3, 3, 3]


async def test_sticky_sends_everything_to_one_member_until_it_leaves() -> None:
    async with (
        Broker("127.0.0.1", 0, sys_interval=0, shared_subscription_strategy="sticky") as b,
        members(b.port, ["w0", "w1", "w2"]) as ms,
    ):
        await publish(b.port, "p", [f"jobs/{i}" for i in range(10)], "a")
        await delivered(ms, 10)
        (first,) = receivers(ms, "a")
        assert [len(m.got) for m in ms if m.name == first] == [10]
        leaving = next(m for m in ms if m.name == first)
        await leaving.client.__aexit__(None, None, None)
        await eventually(lambda: first not in b.core.sessions)
        await publish(b.port, "p", [f"jobs/{i}" for i in range(10)], "b")
        rest = [m for m in ms if m is not leaving]
        await delivered(rest, 10)
        (second,) = receivers(rest, "b")
        assert second != first
        assert [len(m.got) for m in rest if m.name == second] == [10]


async def test_hash_clientid_sends_each_publisher_to_one_member_stably() -> None:
    names = ["w0", "w1", "w2"]
    publishers = ["pub-a", "pub-b"]  # crc32 % 3: 1 and 2, two different members
    expected = {p: names[zlib.crc32(p.encode()) % 3] for p in publishers}
    assert len(set(expected.values())) == 2
    async with (
        Broker("127.0.0.1", 0, sys_interval=0, shared_subscription_strategy="hash_clientid") as b,
        members(b.port, names) as ms,
    ):
        for round_ in range(2):  # the same member again: stable while the group is unchanged
            for p in publishers:
                await publish(b.port, p, [f"jobs/{i}" for i in range(6)], f"{p}/{round_}/")
            await delivered(ms, 12 * (round_ + 1))
            for p in publishers:
                assert receivers(ms, f"{p}/{round_}/") == {expected[p]}


async def test_hash_topic_sends_each_topic_to_one_member() -> None:
    names = ["w0", "w1", "w2"]
    topics = [f"jobs/{k}" for k in range(6)]
    expected = {t: names[zlib.crc32(t.encode()) % 3] for t in topics}
    assert len(set(expected.values())) > 1
    async with (
        Broker("127.0.0.1", 0, sys_interval=0, shared_subscription_strategy="hash_topic") as b,
        members(b.port, names) as ms,
    ):
        await publish(b.port, "p", topics * 4, "")  # payload i: topic i % 6
        await delivered(ms, 24)
        for m in ms:
            assert {topics[int(p) % 6] for p in m.got} == {t for t in topics if expected[t] == m.name}


async def test_random_with_a_seed_reaches_every_member() -> None:
    """With a configured seed the draw is reproducible: the bound cannot fail by chance."""
    async with (
        Broker(
            "127.0.0.1", 0, sys_interval=0, shared_subscription_strategy="random", shared_subscription_seed=7
        ) as b,
        members(b.port, ["w0", "w1", "w2"]) as ms,
    ):
        await publish(b.port, "p", [f"jobs/{i}" for i in range(60)], "x")
        await delivered(ms, 60)
        counts = [len(m.got) for m in ms]
        assert all(c >= 5 for c in counts), counts
        assert counts != [20, 20, 20]  # not round robin in disguise (seed 7 gives an uneven split)


async def test_a_group_strategy_overrides_the_broker_default() -> None:
    async with (
        Broker("127.0.0.1", 0, sys_interval=0, shared_subscription_group_strategy=("sticky=sticky",)) as b,
        members(b.port, ["s0", "s1"], "$share/sticky/jobs/#") as sticky,
        members(b.port, ["r0", "r1"], "$share/rr/jobs/#") as rr,
    ):
        await publish(b.port, "p", [f"jobs/{i}" for i in range(8)], "m")
        await delivered(sticky, 8)
        await delivered(rr, 8)
        assert sorted(len(m.got) for m in sticky) == [0, 8]
        assert [len(m.got) for m in rr] == [4, 4]


async def test_local_prefers_members_on_the_publishers_node() -> None:
    async with (
        cluster(2, shared_subscription_strategy="local") as bs,
        members(bs[0].port, ["far"]) as far,
        members(bs[1].port, ["near"]) as near,
    ):
        # node 1 holds node 0's group subscription on node 0's link: a member there too
        link0 = PEER_PREFIX + node_of(bs[0]).name
        index = bs[1].core.router.index
        await eventually(lambda: any(e.topic_filter == FILTER for e in index.entries(link0)))
        await publish(bs[1].port, "p", [f"jobs/{i}" for i in range(10)], "n")
        await delivered(far + near, 10)
        assert [len(m.got) for m in near] == [10]
        # once the local member leaves, the other node's member gets everything
        await near[0].client.__aexit__(None, None, None)
        await eventually(lambda: "near" not in bs[1].core.sessions)
        await publish(bs[1].port, "p", [f"jobs/{i}" for i in range(10)], "f")
        await delivered(far, 10)
        assert receivers(far, "f") == {"far"}


def test_configuration_forms(tmp_path: Path) -> None:
    toml = tmp_path / "siftmq.toml"
    toml.write_text(
        '[broker]\nshared_subscription_strategy = "hash_topic"\n'
        'shared_subscription_group_strategy = { g1 = "sticky", g2 = "random" }\n'
    )
    cfg = load_toml(toml)
    assert cfg.shared_subscription_strategy == "hash_topic"
    assert cfg.shared_subscription_group_strategy == ("g1=sticky", "g2=random")
    with pytest.raises(ValueError, match="round_robin, random, sticky"):
        BrokerConfig(shared_subscription_strategy="fastest")
    with pytest.raises(ValueError, match="GROUP=round_robin"):
        BrokerConfig(shared_subscription_group_strategy=("g1",))
    flags = "serve --shared-subscription-strategy local --shared-subscription-group-strategy g=random"
    args = build_parser().parse_args(flags.split())
    assert args.shared_subscription_strategy == "local"
    assert args.shared_subscription_group_strategy == ["g=random"]
    assert {s.value for s in Strategy} == set(SHARED_STRATEGIES)


# ------------------------------------------------------------ model test of the selection
_OPTS = SubOptions(1, False, False, 0, None, None, "jobs/#")
_NAMES = ["a", "b", "c", "d", PEER_PREFIX + "n1", PEER_PREFIX + "n2"]

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.sampled_from(_NAMES)),
        st.tuples(st.just("leave"), st.sampled_from(_NAMES)),
        st.tuples(st.just("pick"), st.sampled_from(["p1", "p2", None]), st.sampled_from(["t/1", "t/2"])),
    ),
    max_size=60,
)


@given(strategy=st.sampled_from([s for s in Strategy if s is not Strategy.RANDOM]), ops=_ops)
def test_pick_matches_a_brute_force_model(strategy: Strategy, ops: list[tuple[object, ...]]) -> None:
    """:meth:`SharedPolicy.pick` (O(1) lookups in :class:`Members`) against a reference that
    scans the member list for everything it needs."""
    policy = SharedPolicy(strategy)
    key = ("g", "jobs/#")
    group: list[str] = []
    turn = 0
    sticky: str | None = None
    for op in ops:
        if op[0] == "join" and op[1] not in group:
            group.append(str(op[1]))
        elif op[0] == "leave" and op[1] in group:
            group.remove(str(op[1]))
        elif op[0] == "pick" and group:
            publisher, topic = op[1], str(op[2])
            assert publisher is None or isinstance(publisher, str)
            got = group[policy.pick(key, Members.of([(m, _OPTS) for m in group]), publisher, topic)]
            match strategy:
                case Strategy.ROUND_ROBIN:
                    want = group[turn % len(group)]
                    turn += 1
                case Strategy.STICKY:
                    if sticky not in group:
                        sticky = group[turn % len(group)]
                        turn += 1
                    want = sticky
                case Strategy.HASH_CLIENTID:
                    want = group[zlib.crc32((publisher or "").encode()) % len(group)]
                case Strategy.HASH_TOPIC:
                    want = group[zlib.crc32(topic.encode()) % len(group)]
                case _:  # LOCAL
                    local = [m for m in group if not m.startswith(PEER_PREFIX)]
                    pool = local or group
                    want = pool[turn % len(pool)]
                    turn += 1
            assert got == want


@given(seed=st.integers(0, 2**32), n=st.integers(1, 6))
def test_random_picks_a_member_reproducibly(seed: int, n: int) -> None:
    group = Members.of([(str(i), _OPTS) for i in range(n)])
    one, two = SharedPolicy(Strategy.RANDOM, seed=seed), SharedPolicy(Strategy.RANDOM, seed=seed)
    picks = [one.pick(("g", "f"), group, None, "t") for _ in range(20)]
    assert picks == [two.pick(("g", "f"), group, None, "t") for _ in range(20)]
    assert all(0 <= i < n for i in picks)


def test_round_robin_skips_unreachable_members_in_turn() -> None:
    """A member behind an unreachable node (``Router.unavailable``) is skipped and the others
    take strict turns: the candidates are filtered before the one pick (picking among all and
    again among the reachable advanced the counter twice: 3 members, one unreachable, gave the
    last member three messages of four)."""
    router = Router()
    far = PEER_PREFIX + "n1"
    for cid in (far, "b", "c"):
        router.index.subscribe(cid, FILTER, SubOptions(1, False, False, 0, None, None, "jobs/#"))
    router.unavailable = {far}
    got = [r.client_id for i in range(12) for r in router.route(_message(f"jobs/{i % 2}"))]
    assert got.count("b") == got.count("c") == 6, got
    assert far not in got
    router.unavailable = {far, "b", "c"}  # none reachable: every member again, in turn
    got = [r.client_id for _ in range(6) for r in router.route(_message("jobs/1"))]
    assert sorted(set(got)) == sorted([far, "b", "c"]), got


def _message(topic: str) -> Message:
    return Message.create(topic, b"x", 1, False, NO_PROPERTIES, "p", 0.0)
