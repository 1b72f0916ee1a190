"""Conformance through real clients over loopback: paho-mqtt (3.1.1 and 5.0), aiomqtt (5.0 and
3.1.1) and amqtt's MQTTClient (3.1.1). Test names cite the conformance statement they check."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

import aiomqtt
import paho.mqtt.client as mqtt
import pytest
from amqtt.client import MQTTClient
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from broker import Broker

T = 5.0


class Paho:
    """paho on its network thread; every wait happens off the event loop with a timeout."""

    def __init__(self, port: int, client_id: str, protocol: int, clean: bool = True) -> None:
        kw: dict[str, Any] = {} if protocol == mqtt.MQTTv5 else {"clean_session": clean}
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id, protocol=protocol, **kw)
        self.port, self.protocol, self.clean = port, protocol, clean
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connacks: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.acks: queue.Queue[Any] = queue.Queue()
        self.disconnected = threading.Event()
        self.c.on_connect = lambda _c, _u, flags, rc, props: self.connacks.put((flags, rc))
        self.c.on_message = lambda _c, _u, m: self.messages.put(m)
        self.c.on_subscribe = lambda _c, _u, _mid, codes, _p: self.acks.put(codes)
        self.c.on_disconnect = lambda *a: self.disconnected.set()

    async def start(self, props: PahoProperties | None = None) -> Any:
        if self.protocol == mqtt.MQTTv5:
            self.c.connect_async("127.0.0.1", self.port, clean_start=self.clean, properties=props)
        else:
            self.c.connect_async("127.0.0.1", self.port)
        self.c.loop_start()
        return await asyncio.to_thread(self.connacks.get, True, T)

    async def subscribe(self, topic: str, qos: Any = 1, props: PahoProperties | None = None) -> Any:
        if self.protocol == mqtt.MQTTv5:
            self.c.subscribe(
                topic,
                options=qos if isinstance(qos, SubscribeOptions) else SubscribeOptions(qos),
                properties=props,
            )
        else:
            self.c.subscribe(topic, qos)
        return await asyncio.to_thread(self.acks.get, True, T)

    async def message(self) -> mqtt.MQTTMessage:
        return await asyncio.to_thread(self.messages.get, True, T)

    async def stop(self) -> None:
        self.c.disconnect()
        await asyncio.to_thread(self.c.loop_stop)


def _props(**kw: Any) -> PahoProperties:
    p = PahoProperties(PacketTypes.PUBLISH)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


async def test_paho5_mqtt_3_3_2_request_response_properties_passed_through(broker: Broker) -> None:
    responder = Paho(broker.port, "resp", mqtt.MQTTv5)
    requester = Paho(broker.port, "req", mqtt.MQTTv5)
    await responder.start()
    await requester.start()
    await responder.subscribe("svc/req", 1)
    await requester.subscribe("svc/reply/req", 1)
    requester.c.publish(
        "svc/req",
        b"ping",
        1,
        properties=_props(ResponseTopic="svc/reply/req", CorrelationData=b"\x07", UserProperty=[("k", "v")]),
    )
    m = await responder.message()
    assert m.properties.ResponseTopic == "svc/reply/req"  # [MQTT-3.3.2-15]
    assert m.properties.CorrelationData == b"\x07"  # [MQTT-3.3.2-16]
    assert m.properties.UserProperty == [("k", "v")]  # [MQTT-3.3.2-17]
    responder.c.publish(m.properties.ResponseTopic, b"pong", 1, properties=_props(CorrelationData=b"\x07"))
    r = await requester.message()
    assert (r.payload, r.properties.CorrelationData) == (b"pong", b"\x07")
    await responder.stop()
    await requester.stop()


async def test_paho5_mqtt_3_8_3_3_no_local_and_subscription_identifier(broker: Broker) -> None:
    c = Paho(broker.port, "nl-sid", mqtt.MQTTv5)
    await c.start()
    sp = PahoProperties(PacketTypes.SUBSCRIBE)
    sp.SubscriptionIdentifier = 42
    await c.subscribe("nls/a", SubscribeOptions(qos=1, noLocal=True))
    await c.subscribe("nls/b", SubscribeOptions(qos=1), props=sp)
    c.c.publish("nls/a", b"own", 1)  # not delivered back [MQTT-3.8.3-3]
    c.c.publish("nls/b", b"ids", 1)
    m = await c.message()
    assert m.topic == "nls/b" and m.properties.SubscriptionIdentifier == [42]  # [MQTT-3.3.4-3]
    await c.stop()


async def test_paho311_mqtt_3_2_2_2_session_present_and_queued_qos1(broker: Broker) -> None:
    c = Paho(broker.port, "p311-sess", mqtt.MQTTv311, clean=False)
    await c.start()
    await c.subscribe("q/#", 1)
    await c.stop()
    pub = Paho(broker.port, "p311-pub", mqtt.MQTTv311)
    await pub.start()
    info = pub.c.publish("q/x", b"while away", 1)
    await asyncio.to_thread(info.wait_for_publish, T)
    await pub.stop()
    c = Paho(broker.port, "p311-sess", mqtt.MQTTv311, clean=False)
    flags, rc = await c.start()
    assert rc == 0
    assert flags.session_present  # [MQTT-3.2.2-2]
    m = await c.message()
    assert (m.topic, m.payload, m.qos) == ("q/x", b"while away", 1)  # stored for the session [MQTT-3.1.2-5]
    await c.stop()


async def test_paho311_mqtt_3_1_4_2_takeover(broker: Broker) -> None:
    a = Paho(broker.port, "same", mqtt.MQTTv311)
    await a.start()
    a.c.reconnect_delay_set(60, 60)  # do not fight back
    b = Paho(broker.port, "same", mqtt.MQTTv311)
    await b.start()
    assert await asyncio.to_thread(a.disconnected.wait, T)
    await a.stop()
    await b.stop()


async def test_aiomqtt5_content_filter_and_shared_subscription(broker: Broker) -> None:
    from paho.mqtt.properties import Properties as P

    sp = P(PacketTypes.SUBSCRIBE)
    sp.UserProperty = [("filter", "temp > 20")]
    async with (
        aiomqtt.Client(
            "127.0.0.1", broker.port, identifier="aio-a", protocol=aiomqtt.ProtocolVersion.V5
        ) as a,
        aiomqtt.Client(
            "127.0.0.1", broker.port, identifier="aio-b", protocol=aiomqtt.ProtocolVersion.V5
        ) as b,
    ):
        await a.subscribe("$share/g/aio/#", qos=1, properties=sp)
        await b.subscribe("$share/g/aio/#", qos=1, properties=sp)
        for i in range(10):
            await b.publish("aio/t", f'{{"temp": {20 + i}}}'.encode(), qos=1)

        got_a: list[bytes] = []
        got_b: list[bytes] = []
        enough = asyncio.Event()

        async def drain(c: aiomqtt.Client, out: list[bytes]) -> None:
            async for m in c.messages:
                out.append(bytes(m.payload))  # type: ignore[arg-type]
                if len(got_a) + len(got_b) >= 9:
                    enough.set()

        tasks = [asyncio.create_task(drain(a, got_a)), asyncio.create_task(drain(b, got_b))]
        await asyncio.wait_for(enough.wait(), T)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        expected = sorted(f'{{"temp": {20 + i}}}'.encode() for i in range(1, 10))
        assert sorted(got_a + got_b) == expected  # temp 20 filtered out; each once in the group


async def test_aiomqtt311_partial_unsubscribe(broker: Broker) -> None:
    async with aiomqtt.Client(
        "127.0.0.1", broker.port, identifier="aio311", protocol=aiomqtt.ProtocolVersion.V311
    ) as c:
        await c.subscribe("site/#", qos=1)
        await c.unsubscribe("site/secret/#")
        await c.publish("site/secret/x", b"hidden", qos=1)
        await c.publish("site/open/x", b"shown", qos=1)
        async with asyncio.timeout(T):
            m = await anext(aiter(c.messages))
        assert (m.topic.value, m.payload) == ("site/open/x", b"shown")


async def test_amqtt_mqtt_4_3_3_qos2_round_trip_and_retained(broker: Broker) -> None:
    url = f"mqtt://127.0.0.1:{broker.port}/"
    pub = MQTTClient(client_id="am-pub")
    await pub.connect(url)
    await pub.publish("am/ret", b"retained", qos=2, retain=True)
    sub = MQTTClient(client_id="am-sub")
    await sub.connect(url)
    await sub.subscribe([("am/#", 2)])
    m = await sub.deliver_message(timeout_duration=T)
    assert m is not None and (m.topic, bytes(m.data), m.qos, m.retain) == ("am/ret", b"retained", 2, True)
    await pub.publish("am/live", b"live", qos=2)
    m = await sub.deliver_message(timeout_duration=T)
    assert m is not None and (m.topic, bytes(m.data), m.qos, m.retain) == ("am/live", b"live", 2, False)
    await sub.disconnect()
    await pub.disconnect()


@pytest.mark.parametrize("v", [mqtt.MQTTv311, mqtt.MQTTv5])
async def test_paho_mqtt_3_1_2_8_will_on_abnormal_close(broker: Broker, v: int) -> None:
    sub = Paho(broker.port, f"w-sub{v}", v)
    await sub.start()
    await sub.subscribe("lw/#", 1)
    dying = Paho(broker.port, f"w-dying{v}", v)
    dying.c.will_set("lw/x", b"dead", 1)
    await dying.start()
    sock = dying.c.socket()
    assert sock is not None
    dying.c.reconnect_delay_set(60, 60)
    sock.close()  # no DISCONNECT
    m = await sub.message()
    assert (m.topic, m.payload) == ("lw/x", b"dead")
    await asyncio.to_thread(dying.c.loop_stop)
    # paho closes its internal socket pair only on a disconnect or when it is reset: left to the
    # garbage collector, the pair's finaliser can run first and warn in whatever test runs then
    dying.c.reinitialise()
    await sub.stop()
