"""``Broker.add_hook``: a hook registered in a broker that serves (uplink's first bridge at a
reload, docs/bridging-out.md) is asked from then on, in the place asked for among the others.

A CONNECT held by a slow authenticate hook while a hook is added before that one goes on, once
the slow hook has no opinion, with the hook after it (the core keeps the awaited hook, not its
index, which the new hook moved: ``Core.observe``).  Real broker on port 0, raw MQTT clients.
"""

from __future__ import annotations

import asyncio

from broker import Broker
from broker.hooks import Hooks
from broker.packets import Connack, Connect, ReasonCode
from tests.rawclient import RawClient
from tests.waiting import eventually


class _Slow(Hooks):
    """No opinion, after ``release`` is set; asked twice it refuses (the bug it tests)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.asked: list[str] = []

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> object:
        self.asked.append(client_id)
        if len(self.asked) > 1:
            return False

        async def later() -> None:
            await self.release.wait()

        return later()


class _Allow(Hooks):
    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> bool:
        return True


class _Early(Hooks):
    """Added while the CONNECT waits: asked by the next CONNECTs, first; no opinion."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.calls: list[str] = []

    def attach(self, broker: Broker) -> None:
        self.calls.append("attach")

    async def start(self) -> None:
        self.calls.append("start")

    async def ready(self) -> None:
        self.calls.append("ready")

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> None:
        self.asked.append(client_id)


async def test_a_hook_added_before_an_awaited_one_keeps_the_held_connect_going() -> None:
    slow, allow, early = _Slow(), _Allow(), _Early()
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[slow, allow]) as b:
        held = await RawClient.open(b.port, 5)
        try:
            held.send(Connect("held", protocol_level=5))
            await eventually(lambda: slow.asked == ["held"])  # waiting for the slow hook
            await b.add_hook(early, before=slow)
            assert b.hooks == [early, slow, allow]
            assert early.calls == ["attach", "start", "ready"]
            slow.release.set()
            ack = await held.recv()
            assert isinstance(ack, Connack) and ack.reason_code is ReasonCode.SUCCESS  # allow decided
            assert slow.asked == ["held"]  # not asked again (it would refuse)
            assert early.asked == []  # the held CONNECT was past it
        finally:
            await held.close()
        slow.asked.clear()
        slow.release.set()
        c, ack = await RawClient.connect(b.port, "next", 5)
        await c.close()
        assert early.asked == ["next"]  # the next CONNECT asks the added hook first
        assert ack.reason_code is ReasonCode.SUCCESS
