"""Issue 39: a ban added on one node applies on every node of the cluster (cluster/_bans.py).

Two real nodes (brokers with their cluster hooks, loopback, ports 0) with the admin API on
their HTTP listeners; the ban is added and lifted through node A's API over real HTTP, and
real MQTT clients (raw, to read the reason codes) connect to node B: one connected before the
ban is disconnected (0x98), a reconnect is refused 0x8A, and after the lift it is accepted.
The ban message's checks and the last-writer-wins merge are tested on their own too.
"""

from __future__ import annotations

import pytest

from broker.core import Ban, BanKind
from broker.packets import Disconnect, ReasonCode
from cluster._control import BadControl
from tests.admin.api import call
from tests.cluster._support import cluster, node_of
from tests.rawclient import RawClient
from tests.waiting import eventually


async def test_a_ban_added_on_one_node_applies_on_every_node() -> None:
    async with cluster(2, metrics_listen="127.0.0.1:0") as (a, b):
        victim, ack = await RawClient.connect(b.port, "victim")
        assert ack.reason_code is ReasonCode.SUCCESS
        r = await call(a.metrics_port, "POST", "/api/v1/bans",
                       {"kind": "client_id", "value": "victim", "reason": "test"})  # fmt: skip
        assert r.status == 201, r.body
        # node B disconnects the client connected there, and refuses it from then on
        gone = await victim.closed(timeout=15.0)
        assert any(
            isinstance(p, Disconnect) and p.reason_code is ReasonCode.ADMINISTRATIVE_ACTION for p in gone
        )
        again, ack = await RawClient.connect(b.port, "victim")
        await again.close()
        assert ack.reason_code is ReasonCode.BANNED
        ban = b.core.bans.get(BanKind.CLIENT_ID, "victim")
        assert ban is not None and ban.reason == "test"
        # B's admin API lists it too
        listed = await call(b.metrics_port, "GET", "/api/v1/bans")
        assert [x["value"] for x in listed.json()["bans"]] == ["victim"]
        # lifted on A: lifted on B
        r = await call(
            a.metrics_port, "DELETE", "/api/v1/bans", query={"kind": "client_id", "value": "victim"}
        )
        assert r.status == 200, r.body
        await eventually(lambda: b.core.bans.get(BanKind.CLIENT_ID, "victim") is None, timeout=15.0)
        back, ack = await RawClient.connect(b.port, "victim")
        await back.close()
        assert ack.reason_code is ReasonCode.SUCCESS
        # an address ban added on B reaches A (either way)
        r = await call(b.metrics_port, "POST", "/api/v1/bans", {"kind": "address", "value": "10.9.0.0/16"})
        assert r.status == 201, r.body
        await eventually(lambda: a.core.bans.get(BanKind.ADDRESS, "10.9.0.0/16") is not None, timeout=15.0)
        assert node_of(a).bans is not None and node_of(a).bans.applied >= 1  # type: ignore[union-attr]


async def test_last_writer_wins_and_bad_messages_are_refused() -> None:
    async with cluster(1) as (a,):
        shared = node_of(a).bans
        assert shared is not None
        bans = a.core.bans
        old = shared.message(Ban(BanKind.USERNAME, "eve", None, "first", 1000.0), False, 1000.0)
        new = shared.message(Ban(BanKind.USERNAME, "eve", None, "second", 2000.0), False, 2000.0)
        shared.receive(new)
        shared.receive(old)  # older: ignored, whatever the order of arrival
        got = bans.get(BanKind.USERNAME, "eve")
        assert got is not None and got.reason == "second" and shared.stale == 1
        lift_old = shared.message(Ban(BanKind.USERNAME, "eve"), True, 1500.0)
        shared.receive(lift_old)  # a lift older than the ban: the ban stays
        assert bans.get(BanKind.USERNAME, "eve") is not None
        shared.receive(shared.message(Ban(BanKind.USERNAME, "eve"), True, 2500.0))
        assert bans.get(BanKind.USERNAME, "eve") is None
        shared.receive(new)  # a late copy of the ban the lift overrode: stays lifted
        assert bans.get(BanKind.USERNAME, "eve") is None
        # a stamp far in the future is refused; a value not in canonical form is malformed
        shared.receive(shared.message(Ban(BanKind.CLIENT_ID, "x"), False, 9e12))
        assert bans.get(BanKind.CLIENT_ID, "x") is None and shared.refused == 1
        with pytest.raises(BadControl):
            shared.receive({"t": "ban", "k": "address", "v": "10.1.2.3", "rm": False, "s": 1.0})
        with pytest.raises(BadControl):
            shared.receive({"t": "ban", "k": "nonsense", "v": "x", "rm": False, "s": 1.0})


async def test_a_stamp_or_expiry_that_is_not_finite_is_malformed() -> None:
    # json.loads (cluster._control.check) takes NaN/Infinity: a NaN stamp compares false both ways
    async with cluster(1) as (a,):
        shared = node_of(a).bans
        assert shared is not None
        for bad in ({"s": float("nan")}, {"s": 1.0, "x": float("nan")}, {"s": float("-inf")}):
            with pytest.raises(BadControl, match="finite"):
                shared.receive({"t": "ban", "k": "username", "v": "eve", "rm": False, **bad})
        assert a.core.bans.get(BanKind.USERNAME, "eve") is None
