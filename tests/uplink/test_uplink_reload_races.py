"""Reloads of outbound bridges that overlap something else (review rev15).

* Two reloads while the remote refuses the bridge: the first removes an ``in`` rule, whose
  remote filter must be unsubscribed at the next connection; the second changes something
  else.  The filter still has to go at the remote when it takes the bridge again (the second
  restart used to forget what the first one left to unsubscribe: the remote kept sending
  messages nobody had a rule for, counted as ``no_rule`` drops).
* A reload that is replacing the bridges while the broker stops: no bridge may start once
  the broker is stopping (its task ran on, reconnecting to a broker that was gone).  The
  overlap is made certain, not hoped for: a hook holds the removed bridge's unsubscription
  (its local CONNECT) until the broker has stopped.
"""

from __future__ import annotations

import asyncio
import dataclasses

import aiomqtt

from broker import Broker, LocalSubscription
from broker.hooks import Hooks
from tests.waiting import eventually
from uplink import BridgeConfig, Direction, TopicRule, Uplink


class _Door(Hooks):
    """The remote's gate: refuses every CONNECT while ``closed`` (no opinion otherwise)."""

    def __init__(self) -> None:
        self.closed = False
        self.refused = 0

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> bool | None:
        if self.closed:
            self.refused += 1
            return False
        return None


def _cfg(port: int, *rules: TopicRule, backoff_max: float = 0.2) -> BridgeConfig:
    return BridgeConfig(
        name="both",
        urls=(f"mqtt://127.0.0.1:{port}",),
        topics=rules,
        backoff_min=0.05,
        backoff_max=backoff_max,
    )


async def _arrivals(sub: LocalSubscription, n: int) -> list[str]:
    async with asyncio.timeout(10):
        return [(await sub.queue.get()).topic for _ in range(n)]


async def test_two_reloads_while_the_remote_refuses_still_unsubscribe_a_removed_in_rule() -> None:
    door = _Door()
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[door]) as central:
        in1, in2 = TopicRule("in1/#", Direction.IN), TopicRule("in2/#", Direction.IN)
        current = [_cfg(central.port, in1, in2)]
        uplink = Uplink(current, source=lambda: current)
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge:
            await asyncio.wait_for(uplink.bridges["both"].wait_connected(), 10)
            remote_index = central.core.router.index
            assert remote_index.entry_count("siftmq-both") == 2
            door.closed = True
            current[0] = _cfg(central.port, in1)  # in2/# removed: to unsubscribe at the remote
            assert (await edge.reload()).ok
            await eventually(lambda: door.refused >= 1, 10)  # the restarted bridge is refused
            current[0] = _cfg(central.port, in1, backoff_max=0.3)  # another change, still refused
            assert (await edge.reload()).ok
            refused = door.refused
            await eventually(lambda: door.refused > refused, 10)
            assert remote_index.entry_count("siftmq-both") == 2  # the remote session kept both
            door.closed = False
            bridge = uplink.bridges["both"]
            await asyncio.wait_for(bridge.wait_connected(), 10)
            async with edge.subscribe("#", qos=1) as got:
                async with aiomqtt.Client("127.0.0.1", central.port) as c:  # in order on one link
                    await c.publish("in2/x", b"0", qos=1)
                    await c.publish("in1/marker", b"1", qos=1)
                assert await _arrivals(got, 1) == ["in1/marker"]
            assert remote_index.entry_count("siftmq-both") == 1
            assert bridge.state.no_rule == 0  # in2/x was not sent to the bridge any more


class _Gate(Hooks):
    """Once ``armed``, holds the CONNECT of the bridge's local session ``$uplink/both`` (asked
    before the Uplink hook) until ``release``: the reload's unsubscription of the removed bridge
    waits there, so the broker can be stopped while the reload is certainly mid-way."""

    def __init__(self) -> None:
        self.armed = False
        self.held = 0
        self.release = asyncio.Event()

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> object:
        if not (self.armed and client_id == "$uplink/both"):
            return None
        self.held += 1

        async def wait() -> None:
            await self.release.wait()

        return wait()


async def test_no_bridge_starts_when_a_reload_overlaps_the_broker_stopping() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        old = _cfg(central.port, TopicRule("a/#"))
        new = dataclasses.replace(old, name="other")
        uplink = Uplink([old])
        gate = _Gate()
        edge = Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[gate, uplink])
        await edge.start()
        try:
            await asyncio.wait_for(uplink.bridges["both"].wait_connected(), 10)
            gate.armed = True
            replacing = asyncio.create_task(uplink.replace([new]))
            await eventually(lambda: gate.held == 1, 10)  # the removal waits at the gate
            # the overlap: the old bridge is stopped, the new one not started, the reload runs
            assert not replacing.done() and not uplink.bridges
        finally:
            await edge.stop()  # while the reload still removes the old bridge
        gate.release.set()
        await asyncio.wait_for(replacing, 30)
        assert "other" not in uplink.bridges  # nothing started once the broker was stopping
        running = [t for t in asyncio.all_tasks() if t.get_name().startswith("uplink-") and not t.done()]
        assert running == []
        assert all(b._task is None or b._task.done() for b in uplink.bridges.values())
