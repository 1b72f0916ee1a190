"""mosquitto's last behavioural differences (issue 31, item 5), black box with raw packets over
loopback; the names are the scripts of mosquitto's own broker tests (v2.0.11, test/broker/).

* ``03-publish-c2b-disconnect-qos2`` with protocol level 3: MQTT 3.1 gives PUBREL (and
  SUBSCRIBE, UNSUBSCRIBE) a DUP flag, which 3.1.1 and 5 reserve: accepted for 3.1 only.
* ``07-will-takeover``: a client with a will whose session is taken over by a new connection.
  MQTT 3.1 / 3.1.1 leave it open; as mosquitto, the will is published when the session ends
  (either connection asked for a clean session) and dropped when the new connection continues
  it. MQTT 5: the Will Delay Interval decides (0: published; more: cancelled by the new
  connection, [MQTT-3.1.2-8]).
* the topic depth (``02-subpub-qos0-long-topic``) is in test_mosquitto_parity.py, section 8.

A will published at a takeover is published before the new connection's CONNACK, so a
PINGREQ round trip of the watcher after that CONNACK sees it (or proves it was not sent).
"""

from __future__ import annotations

import pytest

from broker import Broker
from broker.packets import (
    Connack,
    Disconnect,
    Properties,
    Pubcomp,
    Publish,
    Pubrec,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
)
from tests.rawclient import RawClient

RC = ReasonCode
MQIsdp = {"protocol_name": "MQIsdp"}


def _with_dup(packet: bytes) -> bytes:
    return bytes((packet[0] | 0x08,)) + packet[1:]


# ---------------------------------------------------------------- PUBREL with DUP (MQTT 3.1)
async def test_mqtt31_pubrel_with_dup_after_a_reconnect_completes_the_flow(broker: Broker) -> None:
    """03-publish-c2b-disconnect-qos2: PUBLISH QoS 2, PUBREC, connection lost; the client
    resends the PUBLISH (DUP) and then a PUBREL with DUP set; the broker completes it and
    the message is delivered once."""
    sub, _ = await RawClient.connect(broker.port, "dup-sub", 4)
    await sub.subscribe(SubscriptionRequest("pubrel/dup", 2))
    c, _ = await RawClient.connect(broker.port, "dup31", 3, clean_start=False, **MQIsdp)
    c.send(Publish("pubrel/dup", b"message", 2, packet_id=7))
    assert await c.recv() == Pubrec(7)
    c.writer.transport.abort()
    c, _ = await RawClient.connect(broker.port, "dup31", 3, clean_start=False, **MQIsdp)
    c.send(Publish("pubrel/dup", b"message", 2, dup=True, packet_id=7))
    assert await c.recv() == Pubrec(7)
    c.send_bytes(b"\x6a\x02\x00\x07")  # PUBREL, DUP and QoS 1
    assert await c.recv() == Pubcomp(7)
    got = [p for p in await sub.barrier() if isinstance(p, Publish)]
    assert [(p.topic, p.payload) for p in got] == [("pubrel/dup", b"message")]


async def test_mqtt31_subscribe_and_unsubscribe_with_dup_are_accepted(broker: Broker) -> None:
    c, _ = await RawClient.connect(broker.port, "dupsub31", 3, **MQIsdp)
    c.send_bytes(_with_dup(encode(Subscribe(3, (SubscriptionRequest("a/b", 1),)), 3)))
    ack = await c.recv()
    assert isinstance(ack, Suback) and ack.packet_id == 3 and ack.reason_codes == (RC.GRANTED_QOS_1,)
    c.send_bytes(_with_dup(encode(Unsubscribe(4, ("a/b",)), 3)))
    assert isinstance(await c.recv(), Unsuback)


@pytest.mark.parametrize("version", [4, 5])
async def test_pubrel_with_dup_is_malformed_from_mqtt311(broker: Broker, version: int) -> None:
    c, _ = await RawClient.connect(broker.port, f"dup{version}", version)
    c.send(Publish("pubrel/dup", b"m", 2, packet_id=7))
    assert isinstance(await c.recv(), Pubrec)
    c.send_bytes(b"\x6a\x02\x00\x07")
    got = await c.closed()
    assert [p.reason_code for p in got if isinstance(p, Disconnect)] == (
        [RC.MALFORMED_PACKET] if version == 5 else []
    )
    assert not any(isinstance(p, Pubcomp) for p in got)


# ---------------------------------------------------------------- will on takeover
async def _takeover(
    broker: Broker, version: int, first: dict[str, object], second: dict[str, object]
) -> list[bytes]:
    """The payloads the watcher of ``will/t`` gets when a client with a will is taken over."""
    extra: dict[str, object] = MQIsdp if version == 3 else {}
    watcher, _ = await RawClient.connect(broker.port, "will-watch", 4)
    await watcher.subscribe(SubscriptionRequest("will/t", 0))
    old, _ = await RawClient.connect(broker.port, "wt", version, **first, **extra)
    new, ack = await RawClient.connect(broker.port, "wt", version, **second, **extra)
    assert isinstance(ack, Connack) and ack.reason_code == RC.SUCCESS
    await old.closed()
    got = [p.payload for p in await watcher.barrier() if isinstance(p, Publish)]
    await new.close()
    return got


WILL = Will("will/t", b"gone", 0)


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize(("clean1", "clean2"), [(True, True), (True, False), (False, True), (False, False)])
async def test_will_on_takeover_mqtt311_as_mosquitto(
    broker: Broker, version: int, clean1: bool, clean2: bool
) -> None:
    """07-will-takeover: published when the session ends, not when it is continued."""
    got = await _takeover(broker, version, {"clean_start": clean1, "will": WILL}, {"clean_start": clean2})
    assert got == ([] if not clean1 and not clean2 else [b"gone"])


@pytest.mark.parametrize(("delay", "published"), [(0, True), (30, False)])
async def test_will_on_takeover_mqtt5_follows_the_will_delay(
    broker: Broker, delay: int, published: bool
) -> None:
    expiry = Properties(session_expiry_interval=60)
    will = Will("will/t", b"gone", 0, False, Properties(will_delay_interval=delay))
    got = await _takeover(
        broker,
        5,
        {"clean_start": False, "will": will, "properties": expiry},
        {"clean_start": False, "properties": expiry},
    )
    assert got == ([b"gone"] if published else [])
    assert not broker.core.pending_wills  # a delayed will is cancelled, not left pending
