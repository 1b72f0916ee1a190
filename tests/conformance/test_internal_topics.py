"""The broker's internal topics (``$cluster/...``: the cluster's control plane) are closed to
clients on a plain broker too, whatever an ACL or an authorize hook grants (issue 37, item 1).

A broker without a cluster has no peer link at all, so no client may PUBLISH or SUBSCRIBE
there and no client may take a link's client id ``$cluster/<node>``; here an ACL grants
``#``, ``$cluster/#`` and ``$SYS/#`` readwrite to anonymous clients and a hook grants
everything, and the refusals still hold (v5: PUBACK/PUBREC/SUBACK 0x87; 3.1.1: SUBACK 0x80,
the PUBLISH acknowledged and dropped; CONNACK 0x87 / 5).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from broker import Broker
from broker.auth import FileAuth
from broker.hooks import Hooks
from broker.packets import Connack, Connect, Publish, Pubrec, ReasonCode, SubscriptionRequest, Will
from tests.rawclient import RawClient

RC = ReasonCode

_FILTERS = (
    "$cluster/ctl/#",
    "$cluster/#",
    "$cluster/ctl/+",
    "$cluster/ctl/0123abcd",
    "$share/g/$cluster/ctl/#",
    "$filter/x > 1/$cluster/ctl/#",
    "$cluster-in/#",
)


class GrantAll(Hooks):
    """An authorize hook that grants every action on every topic."""

    def authorize(self, client_id: str, username: str | None, action: str, topic: str) -> bool | None:
        return True


@pytest_asyncio.fixture
async def open_broker(tmp_path: Path) -> AsyncIterator[Broker]:
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite #\ntopic readwrite $cluster/#\ntopic readwrite $SYS/#\n")
    auth = FileAuth(acl_file=acl, allow_anonymous=True)
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[auth, GrantAll()]) as b:
        yield b
        await RawClient.close_all()


@pytest.mark.parametrize("version", [5, 4])
async def test_subscribing_to_internal_topics_is_refused_whatever_the_acl(
    open_broker: Broker, version: int
) -> None:
    c, _ = await RawClient.connect(open_broker.port, f"spy{version}", version)
    ack = await c.subscribe(*(SubscriptionRequest(f, 1) for f in _FILTERS), "plant/#")
    refused = RC.NOT_AUTHORIZED if version == 5 else RC.UNSPECIFIED_ERROR  # 3.1.1: 0x80
    assert list(ack.reason_codes) == [refused] * len(_FILTERS) + [RC.GRANTED_QOS_1]
    assert open_broker.core.stats.refused_reserved_subscribe == len(_FILTERS)
    assert not [
        e for e in open_broker.core.router.index.entries(f"spy{version}") if "$cluster" in e.topic_filter
    ]


@pytest.mark.parametrize("version", [5, 4])
async def test_publishing_to_internal_topics_is_refused_whatever_the_acl(
    open_broker: Broker, version: int
) -> None:
    c, _ = await RawClient.connect(open_broker.port, f"forger{version}", version)
    for topic in ("$cluster/ctl/0123abcd", "$cluster/x", "$cluster-in/0123abcd"):
        ack = await c.publish1(topic, b'{"t":"ret?","src":"spy"}', retain=True)
        assert ack.reason_code == (RC.NOT_AUTHORIZED if version == 5 else RC.SUCCESS)
    c.send(Publish("$cluster/ctl/0123abcd", b"q2", 2, packet_id=77))
    rec = await c.recv_where(lambda p: isinstance(p, Pubrec))
    assert isinstance(rec, Pubrec) and rec.reason_code == (RC.NOT_AUTHORIZED if version == 5 else RC.SUCCESS)
    assert open_broker.core.stats.refused_reserved_publish == 4
    assert list(open_broker.core.router.retained_for("$cluster/#", None, 0.0)) == []
    # an ordinary topic is still granted by the same ACL
    assert (await c.publish1("plant/valve", b"1")).reason_code in (RC.SUCCESS, RC.NO_MATCHING_SUBSCRIBERS)


@pytest.mark.parametrize("version", [5, 4])
async def test_a_link_client_id_is_refused_without_a_cluster(open_broker: Broker, version: int) -> None:
    c = await RawClient.open(open_broker.port, version)
    c.send(Connect("$cluster/0123abcd", protocol_level=version, username="siftmq-cluster", password=b"1.2.3"))
    ack = await c.recv()
    assert isinstance(ack, Connack) and ack.reason_code == RC.NOT_AUTHORIZED  # 3.1.1: return code 5
    assert open_broker.core.stats.refused_non_peer == 1
    assert "$cluster/0123abcd" not in open_broker.core.sessions


@pytest.mark.parametrize("version", [5, 4])
async def test_the_brokers_own_client_ids_cannot_be_taken(open_broker: Broker, version: int) -> None:
    """An in-process subscription's session (``$local/<n>``) and a peer's QoS 2 store rows
    (``$cluster-in/<peer>``) keep their client ids: a network CONNECT with one is refused
    (0x85 / 3.1.1 return code 2) and the in-process subscriber keeps its messages."""
    async with open_broker.subscribe("plant/#") as local:
        for cid in (local.client_id, "$cluster-in/0123abcd"):
            c = await RawClient.open(open_broker.port, version)
            c.send(Connect(cid, protocol_level=version))
            ack = await c.recv()
            assert isinstance(ack, Connack) and ack.reason_code == RC.CLIENT_IDENTIFIER_NOT_VALID
        assert open_broker.core.stats.refused_reserved_client_id == 2
        await open_broker.publish("plant/valve", b"1", qos=1)
        got = await local.get(timeout=5)
        assert got.payload == b"1"


@pytest.mark.parametrize("version", [5, 4])
async def test_a_will_on_an_internal_topic_is_refused(open_broker: Broker, version: int) -> None:
    """The broker publishes a will itself when the connection ends: on ``$cluster/...`` it
    would be a control message no PUBLISH check ever saw, so the CONNECT is refused."""
    c = await RawClient.open(open_broker.port, version)
    will = Will("$cluster/ctl/0123abcd", b'{"t":"ret?","src":"spy"}', 1, False)
    c.send(Connect(f"willer{version}", protocol_level=version, will=will))
    ack = await c.recv()
    assert isinstance(ack, Connack) and ack.reason_code == RC.NOT_AUTHORIZED  # 3.1.1: return code 5
    assert f"willer{version}" not in open_broker.core.sessions
    assert open_broker.core.stats.refused_reserved_publish == 1
    # a will elsewhere is accepted as before
    _ok, ack = await RawClient.connect(
        open_broker.port, "willer", version, will=Will("plant/gone", b"1", 1, False)
    )
    assert ack.reason_code == RC.SUCCESS
