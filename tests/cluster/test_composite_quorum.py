"""One composite core per group (issue 30, finding 5): a node that sees less than a majority
of its group's CSSU does not match the group, so the two sides of a partition never both
have a core (real brokers in one loop, loopback, ports 0; stopping nodes cuts the core off)."""

from __future__ import annotations

import aiomqtt

import composite
from tests.cluster._support import cluster, core_of, node_of, tables_of
from tests.waiting import eventually


async def test_a_core_cut_off_from_the_majority_of_its_cssu_stops_matching() -> None:
    expression = "valve/open & pump/+"
    async with cluster(3) as bs:
        canon = composite.canonical(expression)
        placement = node_of(bs[0]).placement
        assert placement is not None
        members = placement.members(placement._code(canon))
        assert len(members) == 3  # alpha 3: every node
        core = next(b for b in bs if node_of(b).name == members[0])
        # the subscriber at the core's node: it stays connected while the others stop
        async with aiomqtt.Client("127.0.0.1", core.port, identifier="plant") as c:
            await c.subscribe(f"$composite/flow/{expression}", qos=1)
            await eventually(lambda: core_of(bs, canon) is core)
            await eventually(lambda: sum(1 for b in bs if tables_of(b)) == 3)
            for b in bs:
                if b is not core:
                    await b.stop()  # the core alone: 1 of 3
            core_placement = node_of(core).placement
            assert core_placement is not None
            await eventually(lambda: core_of([core], canon) is None, timeout=15)
            assert core_placement.stepped_down == 1
            assert canon in core_placement.local  # still subscribed: only not matched
