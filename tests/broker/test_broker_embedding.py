"""The embedding API: Broker lifecycle, publish from code, in-process subscriptions, hooks."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Callable

import pytest

import content
from broker import (
    Broker,
    Delivery,
    Hooks,
    Publication,
    SubscriptionAction,
    SubscriptionChange,
    load_toml,
)
from broker.packets import (
    Connack,
    Connect,
    Properties,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsubscribe,
)
from tests.rawclient import RawClient
from tests.waiting import eventually

T = 5.0


class Recorder(Hooks):
    def __init__(self) -> None:
        self.events: list[object] = []
        self.started = self.stopped = False
        self.gone = asyncio.Event()

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def on_connect(self, client_id: str, username: str | None, protocol_level: int) -> None:
        self.events.append(("connect", client_id, protocol_level))

    def on_disconnect(self, client_id: str, reason: str) -> None:
        self.events.append(("disconnect", client_id))
        self.gone.set()

    def on_subscription_change(self, change: SubscriptionChange) -> None:
        self.events.append(change)

    def on_publication(self, publication: Publication) -> None:
        self.events.append(publication)

    def on_delivery(self, delivery: Delivery) -> None:
        self.events.append(delivery)


class Gate(Hooks):
    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> bool | None:
        return False if client_id.startswith("evil") else None

    def authorize(self, client_id: str, username: str | None, action: str, topic: str) -> bool | None:
        return False if topic.startswith("secret") else None


class NoOpinion(Hooks):
    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> bool | None:
        return True


async def test_broker_fixture_from_plugin(broker_fixture: Broker) -> None:
    async with broker_fixture.subscribe("x/#") as sub:
        assert await broker_fixture.publish("x/1", b"p") == 1
        assert (await sub.get(T)).payload == b"p"
    assert broker_fixture.port > 0


async def test_local_subscription_with_selector_and_retained() -> None:
    async with Broker(port=0, sys_interval=0) as b:
        await b.publish("r/1", b'{"v": 1}', retain=True)
        await b.publish("r/2", b'{"v": 5}', retain=True)
        async with b.subscribe("r/#", selector="v > 2") as sub:
            first = await sub.get(T)
            assert (first.topic, first.retain) == ("r/2", True)
            await b.publish("r/3", b'{"v": 0}')
            await b.publish("r/4", b'{"v": 9}')
            assert (await sub.get(T)).topic == "r/4"
        with pytest.raises(content.FilterSyntaxError):
            async with b.subscribe("r/#", selector="v >"):
                pass


async def test_local_subscription_bounded_queue() -> None:
    async with Broker(port=0, sys_interval=0) as b, b.subscribe("q/#", maxsize=2) as sub:
        for i in range(5):
            await b.publish("q/x", str(i))
        assert sub.dropped == 3
        assert [(await sub.get(T)).payload for _ in range(2)] == [b"0", b"1"]


async def test_hooks_receive_records() -> None:
    rec = Recorder()
    async with Broker(port=0, sys_interval=0, hooks=[rec]) as b:
        assert rec.started
        c, _ = await RawClient.connect(b.port, "h1", 5)
        c.send(Subscribe(1, (SubscriptionRequest("h/#", 1),)))
        await c.recv()
        c.send(Unsubscribe(2, ("h/no/#",)))
        await c.recv()
        await b.publish("h/yes", b"abc", qos=1)
        await c.recv()
        await c.close()
        await asyncio.wait_for(rec.gone.wait(), T)
    assert rec.stopped
    kinds = [type(e).__name__ if not isinstance(e, tuple) else e[0] for e in rec.events]
    assert kinds[0] == "connect"
    changes = [e for e in rec.events if isinstance(e, SubscriptionChange) and e.client_id == "h1"]
    assert [ch.action for ch in changes][:2] == [
        SubscriptionAction.SUBSCRIBE,
        SubscriptionAction.PARTIAL_UNSUBSCRIBE,
    ]
    assert changes[1].entries == 2
    assert changes[-1].action is SubscriptionAction.SESSION_END
    delivery = next(e for e in rec.events if isinstance(e, Delivery))
    assert (delivery.subscriber_id, delivery.topic, delivery.subscription_filter) == ("h1", "h/yes", "h/#")
    assert delivery.payload_size == 3 and delivery.latency >= 0
    pub = next(e for e in rec.events if isinstance(e, Publication) and e.topic == "h/yes")
    assert pub.deliveries == 1 and pub.message_id == delivery.message_id
    assert ("disconnect", "h1") in rec.events


async def test_authentication_and_authorization_hooks() -> None:
    async with Broker(port=0, sys_interval=0, hooks=[Gate(), NoOpinion()]) as b:
        c, ack = await RawClient.connect(b.port, "evil-1", 5)
        assert isinstance(ack, Connack) and ack.reason_code == ReasonCode.NOT_AUTHORIZED
        await c.closed()
        c, ack = await RawClient.connect(b.port, "good", 5)
        assert isinstance(ack, Connack) and ack.reason_code == ReasonCode.SUCCESS
        c.send(Subscribe(1, (SubscriptionRequest("secret/#", 1), SubscriptionRequest("open/#", 1))))
        ack2 = await c.recv()
        assert ack2.reason_codes == (ReasonCode.NOT_AUTHORIZED, ReasonCode.GRANTED_QOS_1)  # type: ignore[union-attr]
        await c.close()


async def test_anonymous_refused_when_configured() -> None:
    async with Broker(port=0, sys_interval=0, allow_anonymous=False) as b:
        c, ack = await RawClient.connect(b.port, "anon", 4)
        assert isinstance(ack, Connack) and ack.reason_code != ReasonCode.SUCCESS
        assert await c.closed() == []


async def test_sys_statistics_published() -> None:
    async with Broker(port=0, sys_interval=0.1, tick_interval=0.05) as b, b.subscribe("$SYS/broker/#") as s:
        seen = {}
        while "$SYS/broker/messages/received" not in seen:
            m = await s.get(T)
            seen[m.topic] = m.payload
        assert int(seen["$SYS/broker/messages/received"]) >= 0


async def test_content_engine_is_configurable() -> None:
    async with Broker(port=0, sys_interval=0, content_engine="counting") as b:
        assert type(b.core.router.engine).name == "counting"
        async with b.subscribe("c/#", selector="a = 1 OR b = 'x'") as s:
            await b.publish("c/1", b'{"a": 2}')
            await b.publish("c/2", b'{"b": "x"}')
            assert (await s.get(T)).topic == "c/2"


async def test_takeover_hook_record() -> None:
    rec = Recorder()
    async with Broker(port=0, sys_interval=0, hooks=[rec]) as b:
        old, _ = await RawClient.connect(b.port, "tk", 5)
        new, _ = await RawClient.connect(b.port, "tk", 5)
        await old.closed()
        await new.close()
    actions = [e.action for e in rec.events if isinstance(e, SubscriptionChange) and e.client_id == "tk"]
    assert actions == [SubscriptionAction.TAKEOVER]


class Holder(Hooks):
    """Holds every CONNACK until the test releases it (what the cluster does while a session
    comes from another node); ``now``: release while being asked instead."""

    def __init__(self, now: bool = False) -> None:
        self.now = now
        self.releases: list[Callable[[bool], None]] = []
        self.asked: list[tuple[str, bool]] = []

    def hold_connack(self, client_id: str, clean_start: bool, release: Callable[[bool], None]) -> bool:
        self.asked.append((client_id, clean_start))
        if self.now:
            release(False)
        else:
            self.releases.append(release)
        return True


@pytest.mark.parametrize("store", [False, True])
async def test_a_hook_holds_the_connack_and_may_say_session_present(
    tmp_path: pathlib.Path, store: bool
) -> None:
    """Nothing leaves before the held CONNACK (the SUBACK of a pipelined SUBSCRIBE waits behind
    it); released with ``present``, the CONNACK says "session present"; with a store it also
    waits for the commit of the persisted session."""
    holder = Holder()
    options: dict[str, object] = {"store_path": str(tmp_path / "b.db")} if store else {}
    async with Broker(port=0, sys_interval=0, hooks=[holder], **options) as b:
        c = await RawClient.open(b.port, 5)
        c.send(Connect("held", 5, False, properties=Properties(session_expiry_interval=60)))
        c.send(Subscribe(1, (SubscriptionRequest("h/#", 1),)))
        await eventually(lambda: bool(holder.releases) and b.core.router.index.entry_count("held") == 1)
        conn = b.core.sessions["held"].conn
        assert conn is not None
        # the SUBACK is queued behind the CONNACK: at once without a store, after the
        # subscription's commit with one (the route is installed before the commit)
        await eventually(lambda: bool(conn.outbox))
        assert conn.gated  # withheld
        assert holder.asked == [("held", False)]
        holder.releases[0](True)
        ack = await c.recv()
        assert isinstance(ack, Connack) and ack.session_present and ack.reason_code == ReasonCode.SUCCESS
        assert isinstance(await c.recv(), Suback)
        await c.close()


async def test_a_hook_that_releases_at_once_does_not_delay_the_connack() -> None:
    async with Broker(port=0, sys_interval=0, hooks=[Holder(now=True)]) as b:
        _c, ack = await RawClient.connect(b.port, "quick", 5)
        assert ack.reason_code == ReasonCode.SUCCESS and not ack.session_present
        await RawClient.close_all()  # before the stop: an open raw client made it wait its 1-s grace


def test_toml_config(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "b.toml"
    path.write_text('[broker]\nport = 0\npartial-unsubscribe = false\nrefused_filters = ["x/#"]\n')
    cfg = load_toml(path)
    assert (cfg.port, cfg.partial_unsubscribe, cfg.refused_filters) == (0, False, ("x/#",))
    path.write_text("[broker]\nportt = 1\n")
    with pytest.raises(ValueError, match="portt"):
        load_toml(path)
