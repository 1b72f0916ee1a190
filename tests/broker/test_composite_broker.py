"""Composite subscriptions through the broker (issue 16, broker/core/_composite.py): real
clients (paho-mqtt 3.1.1 and 5.0, aiomqtt) over loopback, the embedding API, and atom
matching through the router's index (engine offers counted, never timed)."""

from __future__ import annotations

import json
import logging
import pathlib

import aiomqtt
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from broker import Broker, Hooks, Message, SubscriptionAction, SubscriptionChange
from broker.core._composite import ATOM_CLIENT, split_composite
from broker.hooks import DeliveryEntry
from tests.broker.test_broker_paho_amqtt import Paho
from tests.waiting import eventually, next_message

ROOT = pathlib.Path(__file__).resolve().parents[2]
V5 = aiomqtt.ProtocolVersion.V5
V311 = aiomqtt.ProtocolVersion.V311


def sub_props(**user: str) -> PahoProperties:
    p = PahoProperties(PacketTypes.SUBSCRIBE)
    p.UserProperty = [(k.replace("_", "-"), v) for k, v in user.items()]
    return p


def client(b: Broker, ident: str, protocol: aiomqtt.ProtocolVersion = V5) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", b.port, identifier=ident, protocol=protocol)


def event(payload: bytes) -> dict[str, object]:
    doc = json.loads(payload)
    assert isinstance(doc, dict)
    return doc


def components(doc: dict[str, object]) -> list[tuple[str, str, str]]:
    parts = doc["components"]
    assert isinstance(parts, list)
    return [(p["element"], p["topic"], p["payload"]) for p in parts]


def codes_of(codes: object) -> list[int]:
    assert isinstance(codes, list)
    return [int(getattr(c, "value", c)) for c in codes]


def test_split_composite() -> None:
    assert split_composite("$composite/n/a/b & 'c d/#'") == ("n", "a/b & 'c d/#'")
    assert split_composite("$composite/n") == ("n", None)
    assert split_composite("$composite/n/") == ("n", "")
    for bad in ("$composite/", "$composite//a", "$composite/a+b/x", "$composite/#"):
        with pytest.raises(ValueError, match="expected"):
            split_composite(bad)


@pytest.mark.parametrize("protocol", [V311, V5])
async def test_aiomqtt_or_and_event_once_then_unsubscribe(
    broker: Broker, protocol: aiomqtt.ProtocolVersion
) -> None:
    async with client(broker, "sub", protocol) as sub, client(broker, "pub", protocol) as pub:
        # the expression inside the filter: '/' in topics survives, the name ends at the first '/'
        codes = await sub.subscribe("$composite/ship/(ent/1 | ent/2) & ent/3", qos=1)
        assert codes_of(codes) == [1]
        await sub.subscribe("marker", qos=0)
        await pub.publish("ent/1", b"one", qos=1)
        await pub.publish("other/x", b"no", qos=1)
        await pub.publish("ent/3", b'{"v": 3}', qos=1)
        m = await next_message(sub)
        assert m.topic.value == "$composite/ship"
        assert m.qos == 1
        doc = event(m.payload)  # type: ignore[arg-type]
        assert doc["expression"] == "(ent/1 | ent/2) & ent/3"
        assert components(doc) == [("ent/1", "ent/1", "one"), ("ent/3", "ent/3", '{"v": 3}')]
        assert doc["begin"] <= doc["end"]  # type: ignore[operator]
        # consumed: ent/3 alone completes nothing, and the event came exactly once
        await pub.publish("ent/3", b"again", qos=1)
        await pub.publish("marker", b"m")
        m = await next_message(sub)
        assert m.topic.value == "marker"
        # unsubscribe stops the events and removes the atoms from the index
        await sub.unsubscribe("$composite/ship")
        await eventually(lambda: not broker.core.composite.clients)
        broker.core.composite._check()
        await pub.publish("ent/2", b"two", qos=1)
        await pub.publish("marker", b"m2")
        m = await next_message(sub)
        assert (m.topic.value, m.payload) == ("marker", b"m2")
        assert broker.core.composite.engine.stats().atoms == 0
        assert len(broker.core.router.index) == 1  # the marker subscription only: atoms gone


async def test_aiomqtt_v5_user_property_and_qos_minimum(broker: Broker) -> None:
    async with client(broker, "sub5") as sub:
        codes = await sub.subscribe(
            "$composite/w", qos=2, properties=sub_props(composite="a/+[t > 20] & 'b b/#'")
        )
        assert codes_of(codes) == [2]
        broker.core.composite._check()
        await broker.publish("a/1", b'{"t": 10}', qos=2)  # selector false: not a component
        await broker.publish("a/2", b'{"t": 25}', qos=2)
        await broker.publish("b b/x", b"\xff\x00", qos=1)
        m = await next_message(sub)
        assert (m.topic.value, m.qos) == ("$composite/w", 1)  # min(2, 2, 1)
        doc = event(m.payload)  # type: ignore[arg-type]
        assert doc["expression"] == '"b b/#" & a/+[t > 20]'
        parts = doc["components"]
        assert isinstance(parts, list)
        assert [(p["topic"], p["encoding"], p["qos"]) for p in parts] == [
            ("a/2", "text", 2),
            ("b b/x", "base64", 1),
        ]


async def test_aiomqtt_bad_expression_refused(broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="broker")
    long_junk = "x" * 5000 + " & ("
    async with client(broker, "bad5") as c5, client(broker, "bad3", V311) as c3:
        assert codes_of(
            await c5.subscribe("$composite/n", qos=1, properties=sub_props(composite="a & (b"))
        ) == [0x8F]
        assert codes_of(await c5.subscribe("$composite/n", qos=1)) == [0x8F]  # no expression
        assert codes_of(await c5.subscribe("$composite/n/a[x >] & b", qos=1)) == [0x8F]  # selector
        assert codes_of(await c3.subscribe(f"$composite/n/{long_junk}", qos=1)) == [0x80]
        assert codes_of(await c3.subscribe("$composite/n/'$share/g/a' & c", qos=1)) == [0x80]
    async with client(broker, "badw") as c5:
        bad_window = sub_props(composite="a & b", composite_window="x" * 5000)
        assert codes_of(await c5.subscribe("$composite/n", qos=1, properties=bad_window)) == [0x8F]
        zero = sub_props(composite="a & b", composite_max_buffer="0")
        assert codes_of(await c5.subscribe("$composite/n", qos=1, properties=zero)) == [0x8F]
    assert broker.core.composite.refused == 7
    assert broker.core.sys_values(0.0)["$SYS/broker/composite/refused"] == "7"
    assert not broker.core.composite.clients
    logged = [r.getMessage() for r in caplog.records if "composite subscription refused" in r.getMessage()]
    assert logged  # logged (rate-limited: at most one line per 10 s)
    assert all(len(line) < 700 for line in logged)  # client input is never echoed unbounded


@pytest.mark.parametrize("protocol", [mqtt.MQTTv311, mqtt.MQTTv5])
async def test_paho_composite(broker: Broker, protocol: int) -> None:
    c = Paho(broker.port, f"pc{protocol}", protocol)
    await c.start()
    if protocol == mqtt.MQTTv5:
        codes = await c.subscribe("$composite/pair", 1, sub_props(composite="(p/a|p/b)&p/c"))
        assert codes_of(codes) == [1]
        bad = await c.subscribe("$composite/bad", 1, sub_props(composite="p/a &"))
        assert codes_of(bad) == [0x8F]
    else:
        assert codes_of(await c.subscribe("$composite/pair/(p/a|p/b)&p/c", 1)) == [1]
        assert codes_of(await c.subscribe("$composite/bad/p/a &", 1)) == [0x80]
    # a and b both buffered: the event consumes both branches of the | (maximal witness)
    await broker.publish("p/a", b"a1", qos=1)
    await broker.publish("p/b", b"b1", qos=1)
    await broker.publish("p/c", b"c1", qos=1)
    m = await c.message()
    assert (m.topic, m.qos) == ("$composite/pair", 1)
    assert [p for _, _, p in components(event(m.payload))] == ["a1", "b1", "c1"]
    c.c.unsubscribe("$composite/pair")
    assert codes_of(await c.ack()) in ([0], [])  # 3.1.1 UNSUBACK has no codes
    await broker.publish("p/a", b"a2", qos=1)
    await broker.publish("p/c", b"c2", qos=1)
    await broker.publish("p/marker", b"x")
    await c.subscribe("p/marker", 0)
    await broker.publish("p/marker", b"y")
    m = await c.message()
    assert (m.topic, m.payload) == ("p/marker", b"y")
    await c.stop()


async def test_session_end_removes_composite(broker: Broker) -> None:
    async with client(broker, "gone") as c:
        await c.subscribe("$composite/x/s/a & s/b", qos=0)
        assert broker.core.composite.engine.stats().subscriptions == 1
    await eventually(lambda: broker.core.composite.engine.stats().subscriptions == 0)
    assert not broker.core.composite.clients
    assert len(broker.core.router.index) == 0  # the atoms' index entries are gone


async def test_embedding_api(broker: Broker) -> None:
    async with broker.subscribe_composite("k/a & (k/b | k/c)", qos=1, name="emb") as sub:
        assert sub.canonical == "k/a & (k/b | k/c)"
        await broker.publish("k/c", b"c", qos=1)
        await broker.publish("k/a", b"a", qos=0)
        m = await sub.get(5)
        assert (m.topic, m.qos) == ("$composite/emb", 0)
        assert components(event(m.payload)) == [("k/c", "k/c", "c"), ("k/a", "k/a", "a")]
    assert broker.core.composite.engine.stats().subscriptions == 0
    with pytest.raises(ValueError, match=r"expected"):
        async with broker.subscribe_composite("k/a & & k/b"):
            pass


async def test_atoms_matched_through_the_index(broker: Broker) -> None:
    """Many composite subscriptions over 20 atom kinds: publications on unrelated topics reach
    the engine zero times; an atom's publication is one offer, whatever the subscriptions."""
    n = 300
    subs = []
    for i in range(n):
        kinds = [f"kind/{(i + j * 7) % 20}" for j in range(4)]
        s = broker.subscribe_composite(f"({kinds[0]}|{kinds[1]})&({kinds[2]}|{kinds[3]})", name=f"c{i}")
        await s.__aenter__()
        subs.append(s)
    comp = broker.core.composite
    stats = comp.engine.stats()
    assert stats.subscribers == n  # 300 keys sharing 20 distinct composite subscriptions
    assert stats.atoms == 20
    comp._check()
    assert len(broker.core.router.index) == 20  # one index entry per atom, shared by all
    assert broker.core.router.index.entry_count(ATOM_CLIENT + "1") == 1
    for k in range(200):
        await broker.publish(f"unrelated/{k}", b"x")
        await broker.publish("kindling/0", b"x")
    assert comp.offers == 0
    assert comp.engine.stats().logged == 0
    await broker.publish("kind/3", b"x")
    assert comp.offers == 1
    assert comp.engine.stats().logged == 1
    for s in subs:
        await s.__aexit__(None, None, None)
    assert comp.engine.stats().atoms == 0


async def test_restart_keeps_composite_of_persisted_session(tmp_path: pathlib.Path) -> None:
    """A graceful stop snapshots the composite subscriptions of persisted sessions with their
    buffers; after the restart the buffered component still pairs with a new one.  The clean
    session's composite subscription is not kept."""
    db = str(tmp_path / "broker.db")
    expiry = PahoProperties(PacketTypes.CONNECT)
    expiry.SessionExpiryInterval = 3600
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=db) as b:
        async with (
            aiomqtt.Client(
                "127.0.0.1", b.port, identifier="keep", protocol=V5, clean_start=False, properties=expiry
            ) as c,
            client(b, "clean") as clean,
        ):
            await c.subscribe("$composite/r/d/a & d/b", qos=1, properties=sub_props(composite_window="3600"))
            await clean.subscribe("$composite/r/d/a & d/b", qos=1)
            await b.publish("d/a", b"before", qos=1)
        await eventually(lambda: list(b.core.composite.clients) == ["keep"])
    assert (tmp_path / "broker.db.composite").exists()
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=db) as b:
        assert b.core.composite.subscriptions_of("keep") == {"r": "d/a & d/b"}
        assert "clean" not in b.core.composite.clients
        sub = b.core.composite.engine.subscription(("keep", "r"))
        assert sub is not None
        assert (sub.window, sub.buffered) == (3600.0, 1)
        b.core.composite._check()
        async with aiomqtt.Client(
            "127.0.0.1", b.port, identifier="keep", protocol=V5, clean_start=False, properties=expiry
        ) as c:
            await b.publish("d/b", b"after", qos=1)
            m = await next_message(c)
            assert m.topic.value == "$composite/r"
            assert [p for _, _, p in components(event(m.payload))] == ["before", "after"]  # type: ignore[arg-type]


class Recorder(Hooks):
    """Records subscription changes and deliveries (what the bridge plugin receives)."""

    def __init__(self) -> None:
        self.changes: list[SubscriptionChange] = []
        self.deliveries: list[tuple[str, bytes, list[DeliveryEntry], int]] = []

    def on_subscription_change(self, change: SubscriptionChange) -> None:
        self.changes.append(change)

    def on_deliveries(
        self, time: float, message: Message, deliveries: list[DeliveryEntry], routes: int
    ) -> None:
        self.deliveries.append((message.topic, message.payload, list(deliveries), routes))


async def test_hooks_see_composite_subscriptions_and_events() -> None:
    rec = Recorder()
    async with (
        Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[rec]) as b,
        client(b, "h") as c,
    ):
        await c.subscribe("$composite/hk/h/a & h/b", qos=0)
        await b.publish("h/a", b"1")
        await b.publish("h/b", b"2")
        m = await next_message(c)
        assert m.topic.value == "$composite/hk"
        await c.unsubscribe("$composite/hk")
        await eventually(lambda: len(rec.changes) == 2)
    sub, unsub = rec.changes
    assert (sub.client_id, sub.action, sub.topic_filter, sub.content_filter) == (
        "h",
        SubscriptionAction.SUBSCRIBE,
        "$composite/hk",
        "h/a & h/b",
    )
    assert (unsub.action, unsub.topic_filter) == (SubscriptionAction.UNSUBSCRIBE, "$composite/hk")
    # the publications h/a and h/b had no subscriber (their atom routes are not deliveries);
    # the composite event is reported as a publication of its own with its one delivery
    events = [d for d in rec.deliveries if d[0] == "$composite/hk"]
    assert len(events) == 1
    _, payload, entries, routes = events[0]
    assert routes == 1 and [e[0] for e in entries] == ["h"]
    assert event(payload)["expression"] == "h/a & h/b"
    assert all(r == 0 for t, _, _, r in rec.deliveries if t in ("h/a", "h/b"))


async def test_testing_fixture_has_composite(broker_fixture: Broker) -> None:
    """The ``broker.testing`` fixture's broker serves composite subscriptions (in process and
    to clients)."""
    async with broker_fixture.subscribe_composite("f/a | f/b", qos=0) as sub:
        await broker_fixture.publish("f/b", b"x")
        m = await sub.get(5)
        assert components(event(m.payload)) == [("f/b", "f/b", "x")]


async def test_persistence_changes_move_composite_subscriptions_in_and_out_of_the_journal(
    tmp_path: pathlib.Path,
) -> None:
    """A resumption with expiry 0 stops journalling the session's composite subscription (it
    would end with the connection); a session that becomes persisted later (what a cluster
    takeover does: ``Journal.connected`` of a session kept in memory until then) journals it
    again, with fresh buffers, and it survives a restart.  ``Composites._check`` holds
    throughout."""
    from broker.core._composite_log import DURABLE
    from broker.packets import Properties
    from tests.rawclient import RawClient

    db = str(tmp_path / "broker.db")
    keep = Properties(session_expiry_interval=3600)
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=db) as b:
        comp = b.core.composite
        c, _ = await RawClient.connect(b.port, "t", clean_start=True, properties=keep)
        await c.subscribe("$composite/r/d/a & d/b")
        assert set(comp.log.keys) == {("t", "r")}
        sub = comp.engine.subscription_of(("t", "r"))
        assert sub is not None and sub[4] == DURABLE
        await c.close()
        c, ack = await RawClient.connect(b.port, "t", clean_start=False)  # expiry 0 now
        assert ack.session_present
        await eventually(lambda: not comp.log.keys)
        sub = comp.engine.subscription_of(("t", "r"))
        assert sub is not None and sub[4] == 0
        comp._check()
        await b.publish("d/a", b"lost with the partition change", qos=1)
        s = b.core.sessions["t"]
        s.expiry_interval = 3600
        b.core.journal.connected(s, b.core.clock.monotonic())
        assert s.persisted and set(comp.log.keys) == {("t", "r")}
        sub = comp.engine.subscription_of(("t", "r"))
        assert sub is not None and sub[4] == DURABLE
        comp._check()
        await b.publish("d/a", b"a1", qos=1)
        await c.close()
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=db) as b:
        comp = b.core.composite
        comp._check()
        assert set(comp.log.keys) == {("t", "r")}
        c, ack = await RawClient.connect(b.port, "t", clean_start=False, properties=keep)
        assert ack.session_present
        await b.publish("d/b", b"b1", qos=1)
        m = await c.recv()
        assert m.topic == "$composite/r"  # type: ignore[attr-defined]
        doc = event(m.payload)  # type: ignore[attr-defined]
        assert [p for _, _, p in components(doc)] == ["a1", "b1"]
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace
