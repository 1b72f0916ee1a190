"""The cluster's section of the dashboard (issue 28, item 2): ClusterNode registers a provider
on the broker it attaches to, and GET /api/cluster shows members, links and routes."""

from __future__ import annotations

import aiomqtt

from tests.cluster._support import cluster, node_of
from tests.dashboard import httpclient as http
from tests.waiting import eventually


async def test_cluster_tab_shows_members_links_and_routes() -> None:
    async with cluster(2, metrics_listen="127.0.0.1:0", sys_interval=0) as (b0, b1):
        assert b1.metrics_port is not None
        async with aiomqtt.Client("127.0.0.1", b1.port, identifier="routed") as c:
            await c.subscribe("plant/+/temp")
            await eventually(lambda: len(node_of(b1).table) == 1)
            body = (await http.get(b1.metrics_port, "/api/cluster")).json()
        assert body["clustered"] is True
        section = body["cluster"]
        assert section["node_id"] == node_of(b1).name and section["members"] == 2
        (link,) = section["links"]
        assert link["peer"] == node_of(b0).name and link["state"] == "up"
        assert link["address"].startswith("127.0.0.1:")
        assert section["routes"] == ["plant/+/temp"] and section["route_count"] == 1
