"""The composite hooks (issue 16 item 5, broker/hooks.py): ``on_composite_change``,
``on_composite_event`` and ``on_composite_loss`` from a broker driven by real aiomqtt clients
over loopback, time moved by a ``ManualClock`` (windows pass without waiting): every change,
event and loss reported once, with its values; and nothing built for methods no hook overrides.
"""

from __future__ import annotations

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from broker import Broker, CompositeAction, CompositeChange, CompositeEventRecord, CompositeLoss, Hooks
from broker.core._clock import ManualClock
from tests.waiting import eventually, next_message

T0 = 1_800_000_000.0
V5 = aiomqtt.ProtocolVersion.V5


def sub_props(**user: str) -> PahoProperties:
    p = PahoProperties(PacketTypes.SUBSCRIBE)
    p.UserProperty = [(k.replace("_", "-"), v) for k, v in user.items()]
    return p


class Recorder(Hooks):
    def __init__(self) -> None:
        self.changes: list[CompositeChange] = []
        self.events: list[CompositeEventRecord] = []
        self.losses: list[CompositeLoss] = []

    def on_composite_change(self, change: CompositeChange) -> None:
        self.changes.append(change)

    def on_composite_event(self, event: CompositeEventRecord) -> None:
        self.events.append(event)

    def on_composite_loss(self, loss: CompositeLoss) -> None:
        self.losses.append(loss)

    def lost(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(expression, element) -> (expired, dropped), summed over the records."""
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for r in self.losses:
            e, d = out.get((r.expression, r.element), (0, 0))
            out[(r.expression, r.element)] = (e + r.expired, d + r.dropped)
        return out


async def test_changes_events_and_losses_are_reported_once() -> None:
    clock = ManualClock(monotonic=100.0, wall=T0)
    rec = Recorder()
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[rec], clock=clock) as b:
        port = b.port
        async with (
            aiomqtt.Client("127.0.0.1", port, identifier="c1", protocol=V5) as c1,
            aiomqtt.Client("127.0.0.1", port, identifier="pub", protocol=V5) as pub,
        ):
            await c1.subscribe(
                "$composite/ship",
                qos=1,
                properties=sub_props(composite="(t/a|t/b) & t/c", composite_window="10"),
            )
            await c1.subscribe(
                "$composite/pair",
                qos=0,
                properties=sub_props(composite="x/1 & x/2", composite_max_buffer="2"),
            )
            # ship: t/a, 0.25 s later t/c completes it; a second t/a stays buffered
            await pub.publish("t/a", b"1", qos=1)
            await pub.publish("t/a", b"2", qos=1)
            clock.advance(0.25)
            await pub.publish("t/c", b"3", qos=1)
            assert (await next_message(c1)).topic.value == "$composite/ship"
            # pair: five x/1 with a cap of 2 (three dropped), then x/2 pairs with the fourth
            for i in range(5):
                await pub.publish("x/1", b"%d" % i, qos=1)
            clock.advance(0.5)
            await pub.publish("x/2", b"x", qos=1)
            assert (await next_message(c1)).topic.value == "$composite/pair"
            # two t/b and the buffered t/a pass the 10 s window, then ship is unsubscribed
            await pub.publish("t/b", b"b1", qos=1)
            await pub.publish("t/b", b"b2", qos=1)
            clock.advance(11)
            await c1.unsubscribe("$composite/ship")
            await eventually(lambda: len(rec.changes) == 3)
        await eventually(lambda: len(rec.changes) == 4)  # c1's clean session ended: pair goes
    ship, pair = "(t/a | t/b) & t/c", "x/1 & x/2"
    assert [
        (c.client_id, c.name, c.action, c.expression, c.window, c.max_buffer, c.qos, c.subscriptions)
        for c in rec.changes
    ] == [
        ("c1", "ship", CompositeAction.SUBSCRIBE, ship, 10.0, 64, 1, 1),
        ("c1", "pair", CompositeAction.SUBSCRIBE, pair, 60.0, 2, 0, 2),
        ("c1", "ship", CompositeAction.UNSUBSCRIBE, ship, 10.0, 64, 1, 1),
        ("c1", "pair", CompositeAction.SESSION_END, pair, 60.0, 2, 0, 0),
    ]
    assert [c.time for c in rec.changes] == [T0, T0, T0 + 11.75, T0 + 11.75]
    assert [(e.expression, e.subscribers, e.components, e.completion, e.buffered) for e in rec.events] == [
        (ship, (("c1", "ship"),), 2, 0.25, 1),  # the second t/a is still buffered
        (pair, (("c1", "pair"),), 2, 0.5, 1),  # the fifth x/1 is still buffered
    ]
    assert [(e.begin, e.end) for e in rec.events] == [(T0, T0 + 0.25), (T0 + 0.25, T0 + 0.75)]
    # every loss once: ship's t/a and two t/b expired, pair's three x/1 dropped
    assert rec.lost() == {(ship, "t/a"): (1, 0), (ship, "t/b"): (2, 0), (pair, "x/1"): (0, 3)}
    assert all(r.window == (10.0 if r.expression == ship else 60.0) for r in rec.losses)


async def test_sweep_reports_expiries_of_an_idle_subscription() -> None:
    """Losses are counted lazily; the broker's tick settles idle subscriptions while a hook
    observes losses, so an expiry is reported with no further publication or unsubscribe."""
    clock = ManualClock(monotonic=100.0, wall=T0)
    rec = Recorder()
    async with (
        Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[rec], clock=clock) as b,
        b.subscribe_composite("i/a & i/b", qos=0, name="idle", window=5) as sub,
    ):
        await b.publish("i/a", b"1")
        await b.publish("i/a", b"2")
        clock.advance(6)
        await eventually(lambda: sum(r.expired for r in rec.losses) == 2)
        assert [(r.expression, r.element, r.expired, r.dropped) for r in rec.losses] == [
            ("i/a & i/b", "i/a", 2, 0)
        ]
        assert sub.canonical == "i/a & i/b" and not rec.events
    assert [c.action for c in rec.changes] == [CompositeAction.SUBSCRIBE, CompositeAction.SESSION_END]


async def test_expired_session_is_reported_as_expired() -> None:
    clock = ManualClock(monotonic=100.0, wall=T0)
    rec = Recorder()
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[rec], clock=clock) as b:
        props = PahoProperties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 5
        async with aiomqtt.Client(
            "127.0.0.1", b.port, identifier="late", protocol=V5, clean_start=False, properties=props
        ) as c:
            await c.subscribe("$composite/late/y/1 & y/2", qos=1)
        await eventually(lambda: b.core.sessions["late"].conn is None)
        clock.advance(6)
        await eventually(lambda: "late" not in b.core.sessions)
    assert [(c.name, c.action, c.subscriptions) for c in rec.changes] == [
        ("late", CompositeAction.SUBSCRIBE, 1),
        ("late", CompositeAction.EXPIRED, 0),
    ]


async def test_nothing_is_built_without_a_composite_hook() -> None:
    """A hook that overrides none of the composite methods: the engine keeps no losses and no
    composite record is built (the broker asks ``Observers`` which methods are overridden)."""

    class Other(Hooks):
        def on_connect(self, client_id: str, username: str | None, protocol_level: int) -> None:
            pass

    async with (
        Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[Other()]) as b,
        b.subscribe_composite("n/a & n/b", qos=0, name="n") as sub,
    ):
        obs = b.core.obs
        assert not (obs.composite_change or obs.composite_event or obs.composite_loss)
        assert b.core.composite.engine._lost is None
        await b.publish("n/a", b"1")
        await b.publish("n/b", b"2")
        assert (await sub.get(timeout=5)).topic == "$composite/n"
