"""MQTT 4.13 / 5.0 4.13: malformed packets and protocol errors.
v5: DISCONNECT with the reason code, then close; 3.1.1: close without a packet."""

from __future__ import annotations

import pytest

from broker import Broker
from broker.packets import Disconnect, ReasonCode
from tests.rawclient import RawClient

RC = ReasonCode

CASES = [
    pytest.param(b"\x36\x05\x00\x01a\x00\x01", RC.MALFORMED_PACKET, id="MQTT-3.3.1-4-qos3"),
    pytest.param(b"\x30\x04\x00\x02\xc3\x28", RC.MALFORMED_PACKET, id="MQTT-1.5.4-1-bad-utf8"),
    pytest.param(b"\x30\x04\x00\x02a\x00", RC.MALFORMED_PACKET, id="MQTT-1.5.4-2-nul"),
    pytest.param(b"\x80\x06\x00\x01\x00\x01a\x00", RC.MALFORMED_PACKET, id="MQTT-3.8.1-1-subscribe-flags"),
    pytest.param(b"\x82\x03\x00\x01\x00", RC.PROTOCOL_ERROR, id="MQTT-3.8.3-3-empty-subscribe"),
    pytest.param(b"\x30\xff\xff\xff\xff\x01", RC.MALFORMED_PACKET, id="MQTT-1.5.5-remaining-length"),
    pytest.param(b"\x32\x05\x00\x01a\x00\x00", RC.MALFORMED_PACKET, id="MQTT-2.3.1-1-packet-id-0"),
]


@pytest.mark.parametrize(("data", "code"), CASES)
async def test_malformed_v5_disconnect_then_close(broker: Broker, data: bytes, code: ReasonCode) -> None:
    c, _ = await RawClient.connect(broker.port, "mal5", 5)
    c.send_bytes(data)
    got = await c.closed()
    assert [type(p) for p in got] == [Disconnect]
    assert got[0].reason_code == code  # type: ignore[union-attr]


@pytest.mark.parametrize(("data", "code"), CASES)
async def test_malformed_311_close(broker: Broker, data: bytes, code: ReasonCode) -> None:
    c, _ = await RawClient.connect(broker.port, "mal4", 4)
    c.send_bytes(data)
    assert await c.closed() == []


async def test_broker_survives_malformed_input(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "mal-x", 5)
    c.send_bytes(b"\x00\x00\xff\xff")
    await c.closed()
    ok, ack = await RawClient.connect(broker.port, "after", 5)
    assert ack.reason_code == RC.SUCCESS
    assert await ok.barrier() == []
