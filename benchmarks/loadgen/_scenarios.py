"""The issue-8 scenarios as :class:`WorkerPlan` builders.

Every scenario is split over ``procs`` worker processes (pairs, idle connections and retained
subscribers are dealt round-robin; fan-out stays in one process so its window is local). All
traffic is MQTT 3.1.1; the content filter travels as ``$filter/<selector>/<topic>`` (docs/reference.md,
broker). Sizes are chosen so that each scenario's setup takes seconds even on the slowest peer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ._codec import Block, connect, make_payload, publish, subscribe, unsubscribe
from ._plan import ClientSpec, GroupSpec, RetainedSpec, WorkerPlan

__all__ = ["SCENARIOS", "Scenario"]

PAYLOAD = 64


@dataclass(frozen=True, slots=True)
class Scenario:
    """``build(procs, rate)`` returns one plan per worker process; ``rate`` (msgs/s, total) turns a
    closed-loop scenario into an open-loop one. ``siftmq_only`` scenarios use siftmq semantics."""

    name: str
    title: str
    build: Callable[[int, float], list[WorkerPlan]]
    siftmq_only: bool = False


def _deal(n: int, procs: int) -> list[list[int]]:
    return [list(range(p, n, procs)) for p in range(procs)]


def _pairs(
    tag: str,
    procs: int,
    rate: float,
    pairs: int,
    per_pair_window: int,
    qos: int,
    sub_setup: Callable[[int], tuple[bytes, ...]],
    pub_blocks: Callable[[int], tuple[Block, ...]],
) -> list[WorkerPlan]:
    plans = []
    for p, idx in enumerate(_deal(pairs, procs)):
        if not idx:
            plans.append(WorkerPlan())
            continue
        subs = tuple(ClientSpec(connect(f"{tag}-s{i}"), sub_setup(i)) for i in idx)
        pubs = tuple(ClientSpec(connect(f"{tag}-p{i}"), blocks=pub_blocks(i)) for i in idx)
        share = rate * len(idx) / pairs
        plans.append(WorkerPlan(groups=(GroupSpec(pubs, subs, per_pair_window * len(idx), share),)))
        del p
    return plans


def _qos0_blocks(topic: str, n: int = 10) -> tuple[Block, ...]:
    return (Block.of([publish(topic, make_payload(PAYLOAD))] * n, n),)


def qos0_1to1(procs: int, rate: float) -> list[WorkerPlan]:
    return _pairs(
        "q0",
        procs,
        rate,
        50,
        200,
        0,
        lambda i: (subscribe(1, [(f"bench/q0/{i}", 0)]),),
        lambda i: _qos0_blocks(f"bench/q0/{i}"),
    )


def qos1_1to1(procs: int, rate: float) -> list[WorkerPlan]:
    block, nblocks = 10, 100  # packet ids cycle over 1..1000; the window keeps < 1000 in flight

    def blocks(i: int) -> tuple[Block, ...]:
        pl = make_payload(PAYLOAD)
        return tuple(
            Block.of(
                [publish(f"bench/q1/{i}", pl, qos=1, pid=m * block + k + 1) for k in range(block)], block
            )
            for m in range(nblocks)
        )

    return _pairs("q1", procs, rate, 50, 50, 1, lambda i: (subscribe(1, [(f"bench/q1/{i}", 1)]),), blocks)


def fan_in(procs: int, rate: float) -> list[WorkerPlan]:
    plans = []
    for p, idx in enumerate(_deal(100, procs)):
        sub = ClientSpec(connect(f"fi-s{p}"), (subscribe(1, [(f"bench/fi/{p}/+", 0)]),))
        pubs = tuple(ClientSpec(connect(f"fi-p{i}"), blocks=_qos0_blocks(f"bench/fi/{p}/{i}")) for i in idx)
        plans.append(WorkerPlan(groups=(GroupSpec(pubs, (sub,), 40 * len(idx), rate / procs),)))
    return plans


def fan_out(procs: int, rate: float) -> list[WorkerPlan]:
    n = 1000
    subs = tuple(ClientSpec(connect(f"fo-s{i}"), (subscribe(1, [("bench/fo/t", 0)]),)) for i in range(n))
    pub = ClientSpec(connect("fo-p"), blocks=(Block.of([publish("bench/fo/t", make_payload(PAYLOAD))], n),))
    return [WorkerPlan(groups=(GroupSpec((pub,), subs, 20 * n, rate),))] + [WorkerPlan()] * (procs - 1)


def wildcard(procs: int, rate: float) -> list[WorkerPlan]:
    k = 20

    def setup(i: int) -> tuple[bytes, ...]:
        fs = [(f"wc/+/{i}/{j}/#", 0) for j in range(k)] + [(f"wc/{i}/+/{j}/x", 0) for j in range(k)]
        return (subscribe(1, fs),)

    def blocks(i: int) -> tuple[Block, ...]:
        pl = make_payload(PAYLOAD)
        return (Block.of([publish(f"wc/a/{i}/{j}/z", pl) for j in range(k)], k),)

    return _pairs("wc", procs, rate, 50, 200, 0, setup, blocks)


_CF_GROUPS, _CF_PER_GROUP, _CF_TOPICS, _CF_PUBS = 10, 100, 10, 2


def _cf_payload(c: int) -> bytes:
    return make_payload(PAYLOAD + 20, f',"id":{c},"temp":{20 + c % 7}')


def _content(procs: int, rate: float, filtered: bool) -> list[WorkerPlan]:
    """1,000 subscribers x 10 subscriptions = 10,000. Client ``c`` of group ``g = c % 10``
    subscribes to the 10 topics ``cf/<g>/<k>`` with selector ``id = c AND temp > 10``: every
    message on ``cf/<g>/<k>`` has 100 topic-matching candidates and its ``id`` picks one. The
    unfiltered reference routes the same deliveries by topic alone (``cu/<c>/<k>``, no selector):
    same connections, subscriptions and deliveries per publish."""
    plans = []
    per = 20
    for gs in _deal(_CF_GROUPS, procs):
        subs, pubs = [], []
        for g in gs:
            clients = [g + _CF_GROUPS * m for m in range(_CF_PER_GROUP)]
            for c in clients:
                if filtered:
                    setup = tuple(
                        subscribe(k + 1, [(f"$filter/id = {c} AND temp > 10/cf/{g}/{k}", 0)])
                        for k in range(_CF_TOPICS)
                    )
                else:
                    setup = tuple(subscribe(k + 1, [(f"cu/{c}/{k}", 0)]) for k in range(_CF_TOPICS))
                subs.append(ClientSpec(connect(f"cf{int(filtered)}-s{c}"), setup))
            msgs = [
                publish(f"cf/{g}/{k}" if filtered else f"cu/{c}/{k}", _cf_payload(c))
                for c in clients
                for k in range(_CF_TOPICS)
            ]
            for q in range(_CF_PUBS):
                mine = msgs[q::_CF_PUBS]
                blocks = tuple(Block.of(mine[i : i + per], per) for i in range(0, len(mine), per))
                pubs.append(ClientSpec(connect(f"cf{int(filtered)}-p{g}-{q}"), blocks=blocks))
        plans.append(
            WorkerPlan(
                groups=(GroupSpec(tuple(pubs), tuple(subs), 1000 * len(gs), rate * len(gs) / _CF_GROUPS),)
            )
        )
    return plans


def content_filtered(procs: int, rate: float) -> list[WorkerPlan]:
    return _content(procs, rate, True)


def content_unfiltered(procs: int, rate: float) -> list[WorkerPlan]:
    return _content(procs, rate, False)


def partial_unsubscribe(procs: int, rate: float) -> list[WorkerPlan]:
    neg, per = 100, 20

    def setup(i: int) -> tuple[bytes, ...]:
        return (subscribe(1, [(f"pu/{i}/#", 0)]), *(unsubscribe(2 + j, [f"pu/{i}/{j}"]) for j in range(neg)))

    def blocks(i: int) -> tuple[Block, ...]:
        pl = make_payload(PAYLOAD)
        return tuple(
            Block.of(
                [publish(f"pu/{i}/{j}", pl) for j in range(b, b + per)],
                sum(1 for j in range(b, b + per) if j >= neg),
            )
            for b in range(0, 2 * neg, per)
        )

    return _pairs("pu", procs, rate, 50, 200, 0, setup, blocks)


def connections_10k(procs: int, rate: float) -> list[WorkerPlan]:
    plans = qos0_1to1_n(procs, rate, 20, "ck")
    return [
        WorkerPlan(groups=pl.groups, idle=tuple(connect(f"idle-{i}") for i in idx))
        for pl, idx in zip(plans, _deal(10_000, procs), strict=True)
    ]


def qos0_1to1_n(procs: int, rate: float, pairs: int, tag: str) -> list[WorkerPlan]:
    return _pairs(
        tag,
        procs,
        rate,
        pairs,
        200,
        0,
        lambda i: (subscribe(1, [(f"bench/{tag}/{i}", 0)]),),
        lambda i: _qos0_blocks(f"bench/{tag}/{i}"),
    )


def retained(procs: int, rate: float) -> list[WorkerPlan]:
    side = 100  # 10,000 retained topics
    pl = make_payload(PAYLOAD)
    prefill = ClientSpec(
        connect("rt-fill"),
        tuple(
            publish(f"ret/{a}/{b}", pl, qos=1, pid=a * side + b + 1, retain=True)
            for a in range(side)
            for b in range(side)
        ),
    )
    plans = []
    for p, idx in enumerate(_deal(10, procs)):
        plans.append(
            WorkerPlan(
                retained=RetainedSpec(
                    prefill if p == 0 else ClientSpec(connect(f"rt-fill{p}")),
                    side * side,
                    tuple(ClientSpec(connect(f"rt-s{i}")) for i in idx),
                    subscribe(1, [("ret/#", 0)]),
                    side * side,
                )
            )
        )
    return plans


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("qos0", "QoS 0 one-to-one (50 pairs)", qos0_1to1),
        Scenario("qos1", "QoS 1 one-to-one (50 pairs)", qos1_1to1),
        Scenario("fanin", "fan-in (100 publishers -> 1 subscriber per process, `+`)", fan_in),
        Scenario("fanout", "fan-out (1 publisher -> 1,000 subscribers)", fan_out),
        Scenario("wildcard", "wildcard-heavy (50 pairs, 40 wildcard filters each)", wildcard),
        Scenario("content_base", "content workload without selectors (100 pairs, JSON)", content_unfiltered),
        Scenario("content", "content-filtered (10,000 selector subscriptions)", content_filtered, True),
        Scenario(
            "partial_unsub",
            "partial-unsubscribe-heavy (50 x 100 negative entries)",
            partial_unsubscribe,
            True,
        ),
        Scenario("conn10k", "10,000 idle connections + 20 QoS 0 pairs", connections_10k),
        Scenario("retained", "retained-heavy subscribe (10 subscribers x 10,000 retained)", retained),
    )
}
