"""End to end through paho-mqtt (3.1.1 and 5.0, threaded) and amqtt's MQTTClient."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from amqtt.client import MQTTClient
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from broker import Broker

T = 5.0


class Paho:
    """A paho client on its network thread; waits are done off the event loop."""

    def __init__(self, port: int, client_id: str, protocol: int = mqtt.MQTTv311, clean: bool = True) -> None:
        kw: dict[str, Any] = {}
        if protocol != mqtt.MQTTv5:
            kw["clean_session"] = clean
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id, protocol=protocol, **kw)
        self.port = port
        self.protocol = protocol
        self.clean = clean
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connected = threading.Event()
        self.acks: queue.Queue[Any] = queue.Queue()
        self.c.on_connect = lambda *a: self.connected.set()
        self.c.on_message = lambda _c, _u, m: self.messages.put(m)
        self.c.on_subscribe = lambda _c, _u, _mid, codes, _p: self.acks.put(codes)
        self.c.on_unsubscribe = lambda _c, _u, _mid, codes, _p: self.acks.put(codes)

    async def start(self, props: PahoProperties | None = None) -> None:
        if self.protocol == mqtt.MQTTv5:
            self.c.connect_async("127.0.0.1", self.port, clean_start=self.clean, properties=props)
        else:
            self.c.connect_async("127.0.0.1", self.port)
        self.c.loop_start()
        assert await asyncio.to_thread(self.connected.wait, T)

    async def ack(self) -> Any:
        return await asyncio.to_thread(self.acks.get, True, T)

    async def subscribe(self, topic: str, qos: int = 1, props: PahoProperties | None = None) -> Any:
        self.c.subscribe(topic, qos, properties=props)
        return await self.ack()

    async def message(self) -> mqtt.MQTTMessage:
        return await asyncio.to_thread(self.messages.get, True, T)

    async def stop(self) -> None:
        self.c.disconnect()
        await asyncio.to_thread(self.c.loop_stop)


@pytest.mark.parametrize("protocol", [mqtt.MQTTv31, mqtt.MQTTv311, mqtt.MQTTv5])
async def test_paho_qos_levels(broker: Broker, protocol: int) -> None:
    c = Paho(broker.port, f"p{protocol}", protocol)
    await c.start()
    await c.subscribe("p/#", qos=2)
    for qos in (0, 1, 2):
        c.c.publish(f"p/{qos}", f"m{qos}".encode(), qos=qos)
    got = sorted([(m.topic, m.payload, m.qos) for m in [await c.message() for _ in range(3)]])
    assert got == [("p/0", b"m0", 0), ("p/1", b"m1", 1), ("p/2", b"m2", 2)]
    await c.stop()


async def test_paho_v311_content_filter_and_partial_unsubscribe(broker: Broker) -> None:
    c = Paho(broker.port, "p311")
    await c.start()
    codes = await c.subscribe("$filter/level >= 3 AND msg LIKE 'disk%'/logs/#", qos=1)
    assert [int(getattr(x, "value", x)) for x in codes] == [1]
    await c.subscribe("metrics/#", qos=0)
    c.c.unsubscribe("metrics/cpu/#")  # partial: negative entry
    await c.ack()
    await broker.publish("logs/a", b'{"level": 2, "msg": "disk full"}')
    await broker.publish("logs/b", b'{"level": 4, "msg": "cpu hot"}')
    await broker.publish("logs/c", b'{"level": 5, "msg": "disk gone"}')
    await broker.publish("metrics/cpu/0", b"1")
    await broker.publish("metrics/mem", b"2")
    m1 = await c.message()
    m2 = await c.message()
    assert [m1.topic, m2.topic] == ["logs/c", "metrics/mem"]
    await c.stop()


async def test_paho_v5_content_filter(broker: Broker) -> None:
    c = Paho(broker.port, "p5", mqtt.MQTTv5)
    await c.start()
    props = PahoProperties(PacketTypes.SUBSCRIBE)
    props.UserProperty = [("filter", "price BETWEEN 10 AND 20")]
    await c.subscribe("shop/#", 1, props)
    bad = PahoProperties(PacketTypes.SUBSCRIBE)
    bad.UserProperty = [("filter", "price BETWEEN 10")]
    codes = await c.subscribe("shop2/#", 1, bad)
    assert [int(x.value) for x in codes] == [0x8F]
    await broker.publish("shop/a", b'{"price": 5}')
    await broker.publish("shop/b", b'{"price": 15}')
    m = await c.message()
    assert m.topic == "shop/b"
    await c.stop()


async def test_paho_v311_qos1_queued_for_persistent_session(broker: Broker) -> None:
    c = Paho(broker.port, "persist", clean=False)
    await c.start()
    await c.subscribe("pq/#", qos=1)
    await c.stop()
    await broker.publish("pq/1", b"kept", qos=1)
    c2 = Paho(broker.port, "persist", clean=False)
    await c2.start()
    m = await c2.message()
    assert (m.topic, m.payload) == ("pq/1", b"kept")
    await c2.stop()


async def test_amqtt_client(broker: Broker) -> None:
    sub = MQTTClient(client_id="am-sub")
    pub = MQTTClient(client_id="am-pub")
    await sub.connect(f"mqtt://127.0.0.1:{broker.port}/")
    await pub.connect(f"mqtt://127.0.0.1:{broker.port}/")
    await sub.subscribe([("am/#", 1)])
    await pub.publish("am/x", b"from amqtt", qos=1)
    msg = await asyncio.wait_for(sub.deliver_message(), T)
    assert msg is not None
    assert (msg.topic, bytes(msg.data)) == ("am/x", b"from amqtt")
    await pub.disconnect()
    await sub.disconnect()
