"""Message hooks (issue 39, item 3; docs/broker.md, "Message hooks"): ``Hooks.on_publish``
drops, rewrites or adds to a client's PUBLISH before routing.

Real clients over loopback: a paho-mqtt MQTT 5 publisher (its ``on_publish`` callback gives the
PUBACK's reason code) and aiomqtt subscribers.  Ordering makes the "nothing delivered" checks
exact: after the refused publication the publisher sends a marker on a topic the subscriber
also has, and the marker must be the first message it receives.
"""

from __future__ import annotations

import asyncio
import threading

import aiomqtt
import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from broker import Broker, DerivedMessage, Hooks, PublishContext, PublishDecision
from broker.packets import Properties, ReasonCode
from tests.waiting import eventually, next_message

T = 10.0


class PahoPublisher:
    """A paho client (MQTT 5 or 3.1.1) whose QoS 1 publications return the PUBACK's reason code."""

    def __init__(self, port: int, ident: str, v5: bool = True) -> None:
        self.codes: dict[int, int] = {}
        self.acked = threading.Condition()
        proto = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, ident, protocol=proto)
        self.c.on_publish = self._on_publish
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()

    def _on_publish(self, _c: object, _u: object, mid: int, rc: mqtt.ReasonCode, _p: object = None) -> None:
        with self.acked:
            self.codes[mid] = rc.value
            self.acked.notify_all()

    def _publish(
        self, topic: str, payload: bytes, qos: int, retain: bool, props: PahoProperties | None
    ) -> int:
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=props)
        with self.acked:
            assert self.acked.wait_for(lambda: info.mid in self.codes, T), "no PUBACK"
            return self.codes[info.mid]

    async def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 1,
        retain: bool = False,
        props: PahoProperties | None = None,
    ) -> int:
        """Publish and wait for the acknowledgement; the PUBACK's reason code."""
        return await asyncio.to_thread(self._publish, topic, payload, qos, retain, props)

    def stop(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


class Policy(Hooks):
    """drop/# dropped with 0x99; boom/# raises; in/X becomes out/X with the payload in upper
    case and a user property; copy/# kept plus a derived message; secret/# is denied to publish
    (the ACL); to-secret/X is rewritten to secret/X, to-cluster/X to the cluster's internal
    $cluster/X."""

    def on_publish(self, ctx: PublishContext) -> PublishDecision | None:
        if ctx.topic.startswith("drop/"):
            return PublishDecision.drop(ReasonCode.PAYLOAD_FORMAT_INVALID)
        if ctx.topic.startswith("boom/"):
            raise RuntimeError("a hook bug")
        if ctx.topic.startswith("in/"):
            props = Properties(
                content_type="text/upper", user_properties=(*ctx.properties.user_properties, ("by", "hook"))
            )
            return PublishDecision.replace("out/" + ctx.topic[3:], ctx.payload.upper(), props)
        if ctx.topic.startswith("copy/"):
            derived = DerivedMessage("derived/" + ctx.topic[5:], b"from " + ctx.client_id.encode(), qos=1)
            return PublishDecision.keep(extra=[derived])
        if ctx.topic.startswith("to-secret/"):
            return PublishDecision.replace(topic="secret/" + ctx.topic[10:])
        if ctx.topic.startswith("to-cluster/"):
            return PublishDecision.replace(topic="$cluster/" + ctx.topic[11:])
        return None

    def authorize(self, client_id: str, username: str | None, action: str, topic: str) -> bool | None:
        if action == "publish" and topic.startswith("secret/"):
            return False
        return None


class Suffix(Hooks):
    """A second hook: sees the first one's result (appends its mark to a rewritten payload)."""

    def on_publish(self, ctx: PublishContext) -> PublishDecision | None:
        if ctx.topic.startswith("out/"):
            return PublishDecision.replace(payload=ctx.payload + b"!")
        return None


def _broker() -> Broker:
    return Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[Policy(), Suffix()])


async def _sub(b: Broker, ident: str, *filters: str) -> aiomqtt.Client:
    c = aiomqtt.Client("127.0.0.1", b.port, identifier=ident, protocol=aiomqtt.ProtocolVersion.V5)
    await c.__aenter__()
    for f in filters:
        await c.subscribe(f, qos=1)
    return c


async def test_drop_gives_the_reason_code_and_delivers_nothing() -> None:
    async with _broker() as b:
        sub = await _sub(b, "s1", "drop/#", "mark")
        pub = PahoPublisher(b.port, "p1")
        try:
            assert await pub.publish("drop/x", b"bad") == ReasonCode.PAYLOAD_FORMAT_INVALID
            assert await pub.publish("mark", b"m") == ReasonCode.SUCCESS
            m = await next_message(sub)
            assert (str(m.topic), m.payload) == ("mark", b"m")  # the dropped one never came
            assert b.core.stats.hook_dropped == 1
            assert b.core.stats.hook_errors == 0
        finally:
            pub.stop()
            await sub.__aexit__(None, None, None)


async def test_drop_for_a_311_publisher_is_acknowledged_and_not_delivered() -> None:
    async with _broker() as b:
        sub = await _sub(b, "s1", "drop/#", "mark")
        pub = PahoPublisher(b.port, "p1", v5=False)
        try:
            assert await pub.publish("drop/x", b"bad") == 0  # 3.1.1: no refusal to give
            await pub.publish("mark", b"m")
            m = await next_message(sub)
            assert str(m.topic) == "mark"
            assert b.core.stats.hook_dropped == 1
        finally:
            pub.stop()
            await sub.__aexit__(None, None, None)


async def test_rewrite_topic_payload_properties_in_hook_order() -> None:
    async with _broker() as b:
        sub = await _sub(b, "s1", "in/#", "out/#")
        pub = PahoPublisher(b.port, "p1")
        try:
            props = PahoProperties(PacketTypes.PUBLISH)
            props.UserProperty = ("origin", "client")
            assert await pub.publish("in/a", b"hello", props=props) == ReasonCode.SUCCESS
            m = await next_message(sub)
            assert str(m.topic) == "out/a"
            assert m.payload == b"HELLO!"  # Policy upper-cased it, then Suffix saw that
            assert m.properties is not None
            assert m.properties.ContentType == "text/upper"
            assert ("origin", "client") in m.properties.UserProperty
            assert ("by", "hook") in m.properties.UserProperty
        finally:
            pub.stop()
            await sub.__aexit__(None, None, None)


async def test_derived_messages_are_delivered_after_the_original() -> None:
    async with _broker() as b:
        sub = await _sub(b, "s1", "copy/#", "derived/#")
        pub = PahoPublisher(b.port, "p1")
        try:
            assert await pub.publish("copy/7", b"data") == ReasonCode.SUCCESS
            first = await next_message(sub)
            second = await next_message(sub)
            assert (str(first.topic), first.payload) == ("copy/7", b"data")
            assert (str(second.topic), second.payload) == ("derived/7", b"from p1")
            assert second.qos == 1
            assert b.core.stats.hook_derived == 1
        finally:
            pub.stop()
            await sub.__aexit__(None, None, None)


async def test_a_raising_hook_is_counted_and_the_message_dropped() -> None:
    async with _broker() as b:
        sub = await _sub(b, "s1", "boom/#", "mark")
        pub = PahoPublisher(b.port, "p1")
        try:
            assert await pub.publish("boom/1", b"x") == ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
            await pub.publish("mark", b"m")
            assert str((await next_message(sub)).topic) == "mark"  # fail-closed: not delivered
            assert b.core.stats.hook_errors == 1
            assert b.core.stats.hook_dropped == 1
            assert b.core.connections  # the broker and the publisher go on
            assert await pub.publish("mark", b"again") == ReasonCode.SUCCESS
        finally:
            pub.stop()
            await sub.__aexit__(None, None, None)


async def test_a_rewritten_topic_the_acl_denies_is_refused() -> None:
    async with _broker() as b:
        sub = await _sub(b, "s1", "secret/#", "to-secret/#", "mark")
        pub = PahoPublisher(b.port, "p1")
        try:
            assert await pub.publish("to-secret/x", b"leak") == ReasonCode.NOT_AUTHORIZED
            await pub.publish("mark", b"m")
            assert str((await next_message(sub)).topic) == "mark"
            assert b.core.stats.hook_rewrite_refused == 1
        finally:
            pub.stop()
            await sub.__aexit__(None, None, None)


async def test_a_hook_cannot_rewrite_into_the_cluster_control_plane() -> None:
    """``$cluster/...`` is published to only by verified peer links (broker/core/_internal.py):
    a hook's rewrite into it is refused like a client's own PUBLISH there, no ACL needed."""
    async with _broker() as b:
        pub = PahoPublisher(b.port, "p1")
        try:
            assert await pub.publish("to-cluster/routes", b"forged") == ReasonCode.NOT_AUTHORIZED
            assert b.core.stats.hook_rewrite_refused == 1
        finally:
            pub.stop()


async def test_a_retained_publication_is_stored_rewritten() -> None:
    async with _broker() as b:
        pub = PahoPublisher(b.port, "p1")
        try:
            code = await pub.publish("in/r", b"state", retain=True)
            assert code == ReasonCode.NO_MATCHING_SUBSCRIBERS  # accepted (no subscriber yet)
            await eventually(lambda: len(b.core.router.retained) == 1)
            sub = await _sub(b, "s1", "in/#", "out/#")
            try:
                m = await next_message(sub)
                assert (str(m.topic), m.payload, m.retain) == ("out/r", b"STATE!", True)
                await pub.publish("mark", b"m")  # nothing retained under in/
                assert len(b.core.router.retained) == 1
            finally:
                await sub.__aexit__(None, None, None)
        finally:
            pub.stop()


async def test_without_a_message_hook_the_publish_path_tests_one_empty_list() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[Hooks()]) as b:
        assert b.core.obs.message == []
    async with _broker() as b:
        assert len(b.core.obs.message) == 2
