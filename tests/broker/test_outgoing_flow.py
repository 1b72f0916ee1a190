"""The outgoing QoS 1/2 flow's transition table (``broker.core._session.OUTGOING_FLOW``) is what
the broker does (issue 41 item 3: a session's transitions in one place, as a table).

For every row (QoS, state) and every acknowledgement (PUBACK, PUBREC, PUBCOMP), a real broker
on loopback and raw MQTT 5 clients: a subscriber (``max_inflight`` 1, so the second message
waits in the queue) brings one message into the row's state, sends the acknowledgement, and the
test checks what the table says happens: DONE, the next queued message arrives (the packet id
was freed); PUBREL_SENT, a PUBREL comes; VIOLATION, DISCONNECT 0x82 and the connection closes.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest

from broker import Broker
from broker.core._session import (
    DONE,
    OUTGOING_FLOW,
    PUBACK,
    PUBCOMP,
    PUBREC,
    PUBREL_SENT,
    VIOLATION,
    flow_row,
)
from broker.packets import (
    Disconnect,
    Packet,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    SubscriptionRequest,
)
from broker.values import PUBLISH_SENT
from tests.rawclient import RawClient

ACKS = {PUBACK: Puback, PUBREC: Pubrec, PUBCOMP: Pubcomp}
ROWS = [(1, PUBLISH_SENT), (2, PUBLISH_SENT), (2, PUBREL_SENT)]


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    async with Broker(port=0, sys_interval=0, max_inflight=1) as b:
        try:
            yield b
        finally:
            await RawClient.close_all()


def test_the_table_has_a_row_per_state_in_flight() -> None:
    assert sorted(OUTGOING_FLOW) == sorted(flow_row(q, st) for q, st in ROWS)
    assert all(len(steps) == len(ACKS) for steps in OUTGOING_FLOW.values())


@pytest.mark.parametrize(("row", "ack"), list(itertools.product(ROWS, ACKS)))
async def test_an_acknowledgement_does_what_the_table_says(
    broker: Broker, row: tuple[int, int], ack: int
) -> None:
    qos, state = row
    sub, _ = await RawClient.connect(broker.port, "sub", 5)
    await sub.subscribe(SubscriptionRequest("t", qos))
    pub, _ = await RawClient.connect(broker.port, "pub", 5)
    pub.send(Publish("t", b"first", qos, packet_id=1))
    pub.send(Publish("t", b"second", qos, packet_id=2))
    first = await sub.recv_where(lambda p: isinstance(p, Publish))
    assert isinstance(first, Publish) and first.payload == b"first" and first.packet_id is not None
    pid = first.packet_id
    if state == PUBREL_SENT:
        sub.send(Pubrec(pid))
        assert await sub.recv_where(lambda p: isinstance(p, Pubrel)) == Pubrel(pid)
    sub.send(ACKS[ack](pid))
    step = OUTGOING_FLOW[flow_row(qos, state)][ack]
    if step == VIOLATION:
        got: list[Packet] = await sub.closed()
        assert [(type(p), p.reason_code) for p in got if isinstance(p, Disconnect)] == [
            (Disconnect, ReasonCode.PROTOCOL_ERROR)
        ]
        assert not [p for p in got if isinstance(p, Publish)]  # the flow did not end: nothing freed
    elif step == DONE:
        second = await sub.recv_where(lambda p: isinstance(p, Publish))
        assert isinstance(second, Publish) and second.payload == b"second"
    else:
        assert step == PUBREL_SENT
        assert await sub.recv_where(lambda p: isinstance(p, Pubrel)) == Pubrel(pid)
        got = await sub.barrier()
        assert not [p for p in got if isinstance(p, Publish)]  # still in flight: the queue waits
