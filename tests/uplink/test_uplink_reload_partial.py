"""A reload whose change of one bridge raises applies the others and says which one failed.

Before, ``Uplink._apply`` stopped at the first bridge whose stop or start raised: the bridges
after it were neither added, removed nor changed while ``Uplink.configs`` already named the new
list (so the next reload, finding it equal, did not try again), and the exception came out of
``Broker.reload``.  Now each bridge's change is applied on its own: the failed one is named
(``ReloadResult.error``, one error line, the reload counted failed), it keeps the configuration
it runs with, and the next reload changes it.  Real brokers (an edge with the bridges, a central
remote) and real bridges; the fault is a bridge whose ``stop`` raises (as ``Bridge.stop`` did
after a crash before it was mended: tests/uplink/test_uplink_stop_after_crash.py).
"""

from __future__ import annotations

import asyncio
import logging

import aiomqtt
import pytest

from broker import Broker, LocalSubscription
from tests.uplink.test_uplink_reload import _bridge
from tests.waiting import eventually
from uplink import Uplink


async def _publish(port: int, *topics: str) -> None:
    async with aiomqtt.Client("127.0.0.1", port) as c:
        for topic in topics:
            await c.publish(topic, b"x", qos=1)


async def _arrivals(sub: LocalSubscription, n: int) -> list[str]:
    async with asyncio.timeout(10):
        return sorted([(await sub.queue.get()).topic for _ in range(n)])


async def test_one_bridge_failing_to_change_leaves_the_others_applied(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        port = central.port
        keep, bad_old = _bridge("keep", port, "k/#"), _bridge("bad", port, "b/#")
        current = [keep, bad_old, _bridge("gone", port, "g/#")]
        uplink = Uplink(current, source=lambda: current)
        async with (
            Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge,
            central.subscribe("#", qos=1) as got,
        ):
            await eventually(lambda: all(b.state.connected for b in uplink.bridges.values()), 10)
            kept = uplink.bridges["keep"]

            async def stop_fails() -> None:
                raise ValueError("cannot convert float NaN to integer")

            monkeypatch.setattr(uplink.bridges["bad"], "stop", stop_fails)
            bad_new = _bridge("bad", port, "b/#", "c/#")
            current[:] = [keep, bad_new, _bridge("new", port, "n/#")]
            with caplog.at_level(logging.ERROR):
                result = await edge.reload()
            assert not result.ok
            want = "bridge bad: restarting failed: ValueError: cannot convert float NaN to integer"
            assert result.error == want + " (retried at the next reload)"
            assert edge.reload_counters.failed == 1 and edge.reload_counters.done == 0
            changes = "; ".join(result.changed)
            assert "bridge gone removed" in changes and "bridge new added" in changes, changes
            assert "keep" not in changes
            # the failed one keeps the configuration it runs with; the others are applied
            assert [c.name for c in uplink.configs] == ["keep", "bad", "new"]
            assert uplink.configs[1] == bad_old
            assert set(uplink.bridges) == {"keep", "bad", "new"} and uplink.names == {"keep", "bad", "new"}
            errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            assert sum(want in m for m in errors) == 2, errors  # the bridge's line, the reload's line
            await eventually(lambda: uplink.bridges["new"].state.connected, 10)
            await _publish(edge.port, "k/1", "n/1", "b/1", "c/1", "g/1")
            assert await _arrivals(got, 3) == ["b/1", "k/1", "n/1"]  # c/# not yet, g/# gone
            assert uplink.bridges["keep"] is kept and kept.state.connections == 1

            monkeypatch.undo()  # the fault is gone: the next reload changes the bridge
            result = await edge.reload()
            assert result.ok, result
            assert any(c.startswith("bridge bad restarted (topics changed") for c in result.changed)
            assert uplink.configs[1] == bad_new
            await eventually(lambda: uplink.bridges["bad"].state.connected, 10)
            await _publish(edge.port, "c/2")
            assert await _arrivals(got, 1) == ["c/2"]
            assert got.queue.empty()  # g/1 never crossed


async def test_replace_names_the_failed_bridge_and_the_next_replace_retries_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Uplink.replace`` directly: the same configuration again restarts a bridge whose
    earlier change failed half-way (its stop raised, so what runs is unknown)."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        a = _bridge("a", central.port, "a/#")
        uplink = Uplink([a])
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]):
            await eventually(lambda: uplink.bridges["a"].state.connected, 10)

            async def stop_fails() -> None:
                raise OSError("stop failed")

            monkeypatch.setattr(uplink.bridges["a"], "stop", stop_fails)
            assert await uplink.replace([]) == [
                "bridge a: removing failed: OSError: stop failed (retried at the next reload)"
            ]
            assert uplink.configs == (a,) and "a" in uplink.names
            monkeypatch.undo()
            changed = await uplink.replace([a])  # the same table: restarted all the same
            assert changed == ["bridge a restarted (after a failed change; 0 queued message(s) kept)"]
            await eventually(lambda: uplink.bridges["a"].state.connected, 10)
            assert await uplink.replace([a]) == []  # and then left alone


async def test_a_bridge_that_failed_to_start_is_not_left_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """An added bridge whose start raises is not kept in ``Uplink.bridges`` (before: the entry
    stayed, shown in the status and $SYS, and a reload without that bridge never removed it)."""
    from uplink._bridge import Bridge

    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        port = central.port
        keep = _bridge("keep", port, "k/#")
        current = [keep]
        uplink = Uplink(current, source=lambda: current)
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge:
            await eventually(lambda: uplink.bridges["keep"].state.connected, 10)

            def start_fails(self: Bridge) -> None:
                raise ValueError("no start")

            monkeypatch.setattr(Bridge, "start", start_fails)
            current[:] = [keep, _bridge("bad", port, "b/#")]
            result = await edge.reload()
            assert not result.ok and "bridge bad: adding failed" in (result.error or "")
            assert set(uplink.bridges) == {"keep"}
            monkeypatch.undo()
            current[:] = [keep]
            assert (await edge.reload()).ok
            assert set(uplink.bridges) == {"keep"} and uplink.names == {"keep"}
            assert [s.name for s in uplink.bridge_status()] == ["keep"]
