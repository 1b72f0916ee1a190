"""Bridges reloaded without a restart (issue 40, brief I item 1): ``Broker.reload`` with the
``Uplink``'s ``source``, and SIGHUP to a real ``siftmq serve --config`` (``siftmq reload``).

The remote is an embedded siftmq ("central"); a bridge whose remote is a port that nothing
listens on (``dead_port``: bound, not listening) keeps its messages queued in its local
session.  One reload keeps an unchanged bridge as it is (the same object, no new
connection), starts a new one, stops a removed one (its queued messages stay in its session,
nothing more is queued for it, and adding it again sends them), and restarts a changed one on
the same session (its queue crosses once it points at central; a queued message whose rule
was removed is counted ``no_rule``).  A bad ``[[bridges]]`` table fails the whole reload and
the bridges run on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import aiomqtt
import pytest

from broker import Broker, LocalSubscription
from broker._cli import main
from broker._config import Listener
from tests.auth.helpers import write_passwords
from tests.security.helpers import make_certs
from tests.serving import Serve
from tests.uplink._remote import free_port
from tests.waiting import eventually
from uplink import BridgeConfig, Direction, TopicRule, Uplink
from uplink._plugin import read_bridges

START = 60.0  # seconds a `siftmq serve` child may take to start on a loaded machine


def _bridge(name: str, port: int, *patterns: str) -> BridgeConfig:
    return BridgeConfig(
        name=name,
        urls=(f"mqtt://127.0.0.1:{port}",),
        topics=tuple(TopicRule(p, Direction.OUT, 1) for p in patterns),
        backoff_min=0.05,
        backoff_max=0.2,
    )


async def _publish(port: int, *topics: str) -> None:
    async with aiomqtt.Client("127.0.0.1", port) as c:
        for i, topic in enumerate(topics):
            await c.publish(topic, str(i).encode(), qos=1)


async def _arrivals(sub: LocalSubscription, n: int) -> list[str]:
    async with asyncio.timeout(10):
        return [(await sub.queue.get()).topic for _ in range(n)]


def _held(edge: Broker, name: str) -> int:
    s = edge.core.sessions[f"$uplink/{name}"]
    return len(s.queue) + len(s.inflight)


async def test_reload_adds_removes_changes_and_leaves_unchanged_bridges_alone(
    caplog: pytest.LogCaptureFixture, dead_port: int
) -> None:
    dead = dead_port  # nothing listens there: what is bound for it stays queued
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        keep = _bridge("keep", central.port, "k/#")
        current = [keep, _bridge("move", dead, "m/#", "x/#"), _bridge("gone", dead, "g/#")]
        uplink = Uplink(current, source=lambda: current)
        async with (
            Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=":memory:", hooks=[uplink]) as edge,
            central.subscribe("#", qos=1) as got,
        ):
            kept = uplink.bridges["keep"]
            await asyncio.wait_for(kept.wait_connected(), 10)
            await eventually(lambda: all(b.state.connects >= 1 for b in uplink.bridges.values()), 10)
            await _publish(edge.port, "m/1", "m/2", "x/1", "m/3", "g/1", "g/2", "g/3", "g/4")
            await eventually(lambda: _held(edge, "move") == 4 and _held(edge, "gone") == 4, 10)
            move_state = uplink.bridges["move"].state

            current[:] = [
                keep,
                _bridge("move", central.port, "m/#"),  # now reachable, x/# gone
                _bridge("new", central.port, "n/#"),
            ]
            with caplog.at_level(logging.INFO):
                result = await edge.reload()
            assert result.ok, result
            changes = "; ".join(result.changed)
            assert "bridge gone removed (4 queued message(s) kept in $uplink/gone)" in changes
            assert "bridge move restarted (urls, topics changed" in changes
            assert "bridge new added" in changes
            assert "keep" not in changes
            assert any("bridge gone removed: 4 message(s) kept" in r.getMessage() for r in caplog.records)

            # the changed bridge: its queue crosses in order; x/1 has no rule any more
            assert await _arrivals(got, 3) == ["m/1", "m/2", "m/3"]
            move = uplink.bridges["move"]
            assert move.state is move_state  # its counters go on
            await eventually(lambda: move.state.no_rule == 1 and move.state.sent == 3, 10)
            # the unchanged one: the same bridge, never reconnected, still crossing
            assert uplink.bridges["keep"] is kept and kept.state.connections == 1 and kept.state.connected
            await _publish(edge.port, "k/1")
            assert await _arrivals(got, 1) == ["k/1"]
            # the new one
            await asyncio.wait_for(uplink.bridges["new"].wait_connected(), 10)
            await _publish(edge.port, "n/1")
            assert await _arrivals(got, 1) == ["n/1"]
            # the removed one: stopped, its 4 messages kept, nothing more queued for it
            assert "gone" not in uplink.bridges and "gone" not in uplink.names
            await _publish(edge.port, "g/5")
            assert _held(edge, "gone") == 4
            assert not any(k.startswith("$SYS/uplink/gone/") for k in uplink.sys_values())

            current.append(_bridge("gone", central.port, "g/#"))  # added again: it sends them
            result = await edge.reload()
            assert result.ok and "bridge gone added" in result.changed
            assert await _arrivals(got, 4) == ["g/1", "g/2", "g/3", "g/4"]
            await _publish(edge.port, "k/2")  # after g/5 would have been, had it been queued
            assert await _arrivals(got, 1) == ["k/2"]
            assert kept.state.connections == 1 and uplink.bridges["keep"] is kept
            assert _held(edge, "gone") == 0


async def test_a_bad_bridges_table_refuses_the_whole_reload(tmp_path: Path) -> None:
    conf = tmp_path / "bridges.toml"
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        table = f'[[bridges]]\nname = "up"\nurl = "mqtt://127.0.0.1:{central.port}"\n'
        conf.write_text(table + '[[bridges.topics]]\npattern = "t/#"\n')
        uplink = Uplink(read_bridges(conf), source=lambda: read_bridges(conf))
        async with (
            Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge,
            central.subscribe("t/#", qos=1) as got,
        ):
            bridge = uplink.bridges["up"]
            await asyncio.wait_for(bridge.wait_connected(), 10)
            conf.write_text(table + '[[bridges.topics]]\npattern = "t/#/x"\n')  # '#' not last
            limits = dataclasses.replace(edge.config, max_inflight=7)
            result = await edge.reload(limits)
            assert not result.ok
            assert result.error is not None and f"{conf}: bridges[0].topics[0].pattern" in result.error
            assert edge.config.max_inflight != 7  # nothing of the reload applied
            assert edge.reload_counters.failed == 1
            assert uplink.bridges["up"] is bridge and bridge.state.connections == 1
            assert uplink.configs == read_bridges_ok(central.port)
            await _publish(edge.port, "t/1")
            assert await _arrivals(got, 1) == ["t/1"]


def read_bridges_ok(port: int) -> tuple[BridgeConfig, ...]:
    return (BridgeConfig(name="up", urls=(f"mqtt://127.0.0.1:{port}",), topics=(TopicRule("t/#"),)),)


def _table(name: str, port: int, pattern: str) -> str:
    return (
        f'[[bridges]]\nname = "{name}"\nurl = "mqtt://127.0.0.1:{port}"\nbackoff_min = 0.05\n'
        f'[[bridges.topics]]\npattern = "{pattern}"\n'
    )


async def _sighup(data: Path) -> None:
    """``siftmq reload --data-dir DATA`` (the pid file ``siftmq serve`` wrote there)."""
    await eventually((data / "siftmq.pid").exists, START)
    assert await asyncio.to_thread(main, ["reload", "--data-dir", str(data)]) == 0


async def test_sighup_to_siftmq_serve_adds_a_bridge_and_refuses_a_bad_table(tmp_path: Path) -> None:
    conf = tmp_path / "siftmq.toml"
    data = tmp_path / "data"
    flags = ("--no-bridge", "--config", str(conf), "--data-dir", str(data), "--log-level", "INFO")
    async with (
        Broker(host="127.0.0.1", port=0, sys_interval=0) as central,
        central.subscribe("#", qos=1) as got,
    ):
        first = _table("central", central.port, "s/#")
        conf.write_text("[broker]\nsys_interval = 0\n" + first)
        with Serve(*flags) as serve:
            port = int((await serve.line(r"listening on 127\.0\.0\.1:(\d+) \(tcp\)", timeout=START))[1])
            await serve.line(r"bridge central: connected to")
            conf.write_text("[broker]\nsys_interval = 0\n" + first + _table("second", central.port, "u/#"))
            mark = len(serve.lines)
            await _sighup(data)
            done = await serve.line(r"INFO +broker: reload: (.*)", mark)
            assert "bridge second added" in done[1] and "central" not in done[1]
            await serve.line(r"bridge second: connected to", mark)
            await _publish(port, "s/1", "u/1")
            assert sorted(await _arrivals(got, 2)) == ["s/1", "u/1"]
            assert not any("central: connected to" in x for x in serve.lines[mark:])  # not touched

            conf.write_text("[broker]\nsys_interval = 0\n" + first + "qos = 3\n")  # bad, and second gone
            mark = len(serve.lines)
            await _sighup(data)
            await serve.line(rf"ERROR +broker: reload: .*{conf.name}: bridges\[0\]\.topics\[0\].*qos", mark)
            await _publish(port, "s/2", "u/2")  # both bridges run on
            assert sorted(await _arrivals(got, 2)) == ["s/2", "u/2"]
            assert not any("connected to" in x for x in serve.lines[mark:])  # not reconnected
            assert await asyncio.to_thread(serve.stop) == 0


async def test_sighup_to_siftmq_serve_started_without_bridges_starts_the_first_bridge(
    tmp_path: Path,
) -> None:
    """A broker started without ``[[bridges]]`` gets its first bridge at a reload (it needed a
    restart): a bad table still fails the reload; a good one starts the bridge, whose local
    session logs in although a password file refuses unknown clients (the bridges' hook is
    asked before it, as at start); a later reload removes it."""
    conf = tmp_path / "siftmq.toml"
    conf.write_text("[broker]\nsys_interval = 0\n")  # no [[bridges]]: no bridge hook
    write_passwords(tmp_path / "passwd", {"alice": "one"})
    data = tmp_path / "data"
    flags = (
        "--no-bridge", "--config", str(conf), "--data-dir", str(data), "--log-level", "INFO",
        "--password-file", str(tmp_path / "passwd"),
    )  # fmt: skip
    async with (
        Broker(host="127.0.0.1", port=0, sys_interval=0) as central,
        central.subscribe("#", qos=1) as got,
    ):
        with Serve(*flags) as serve:
            port = int((await serve.line(r"listening on 127\.0\.0\.1:(\d+) \(tcp\)", timeout=START))[1])
            table = _table("central", central.port, "s/#")
            conf.write_text("[broker]\nsys_interval = 0\n" + table + "qos = 3\n")
            mark = len(serve.lines)
            await _sighup(data)
            await serve.line(rf"ERROR +broker: reload: .*{conf.name}: bridges\[0\]\.topics\[0\].*qos", mark)
            conf.write_text("[broker]\nsys_interval = 0\n" + table)
            mark = len(serve.lines)
            await _sighup(data)
            done = await serve.line(r"INFO +broker: reload: (.*)", mark)
            assert "bridge central added" in done[1] and "restart" not in done[1], done[1]
            await serve.line(r"bridge central: connected to", mark)
            async with aiomqtt.Client("127.0.0.1", port, username="alice", password="one") as c:
                await c.publish("s/1", b"1", qos=1)
            assert await _arrivals(got, 1) == ["s/1"]

            conf.write_text("[broker]\nsys_interval = 0\n")  # the hook that runs it reloads it now
            mark = len(serve.lines)
            await _sighup(data)
            done = await serve.line(r"INFO +broker: reload: (.*)", mark)
            assert "bridge central removed" in done[1], done[1]
            assert await asyncio.to_thread(serve.stop) == 0


async def test_a_reload_restarts_a_bridge_whose_tls_files_changed_and_refuses_a_bad_one(
    tmp_path: Path,
) -> None:
    (tmp_path / "certs").mkdir()
    certs = make_certs(tmp_path / "certs")
    ca = tmp_path / "ca.pem"
    ca.write_bytes(certs.ca.read_bytes())
    listener = Listener(port=0, certfile=str(certs.server_cert), keyfile=str(certs.server_key))
    async with Broker(listeners=(listener,), sys_interval=0) as central:
        cfg = BridgeConfig(
            name="tls",
            urls=(f"mqtts://127.0.0.1:{central.port}",),
            topics=(TopicRule("t/#"),),
            cafile=str(ca),
            backoff_min=0.05,
            backoff_max=0.2,
        )
        uplink = Uplink([cfg], source=lambda: [cfg])
        async with (
            Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge,
            central.subscribe("t/#", qos=1) as got,
        ):
            bridge = uplink.bridges["tls"]
            await asyncio.wait_for(bridge.wait_connected(), 10)
            result = await edge.reload()  # nothing changed: not touched
            assert result.ok and not any("bridge" in c for c in result.changed)
            assert uplink.bridges["tls"] is bridge

            ca.write_text("not a certificate\n")
            result = await edge.reload()
            assert not result.ok and result.error is not None and "bridge tls: TLS files" in result.error
            assert uplink.bridges["tls"] is bridge and bridge.state.connected

            ca.write_bytes(certs.ca.read_bytes() + b"\n")  # the same CA, another file: restarted
            result = await edge.reload()
            assert result.ok and "bridge tls restarted (TLS files changed" in "; ".join(result.changed)
            restarted = uplink.bridges["tls"]
            assert restarted is not bridge
            await eventually(lambda: restarted.state.connections == 2 and restarted.state.connected, 10)
            await _publish(edge.port, "t/1")
            assert await _arrivals(got, 1) == ["t/1"]


async def test_a_removed_bridge_leaves_no_retained_sys_values() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        current = [_bridge("keep", central.port, "k/#"), _bridge("gone", central.port, "g/#")]
        uplink = Uplink(current, source=lambda: current)
        async with Broker(host="127.0.0.1", port=0, sys_interval=0.1, hooks=[uplink]) as edge:
            retained = edge.core.router.retained
            await eventually(lambda: retained.get("$SYS/uplink/gone/connected") is not None, 10)
            del current[1]
            assert (await edge.reload()).ok
            assert retained.get("$SYS/uplink/gone/connected") is None
            assert retained.get("$SYS/uplink/gone/dropped/no_rule") is None
            assert retained.get("$SYS/uplink/keep/connected") is not None


async def test_a_reload_unsubscribes_the_filters_of_removed_rules_on_both_sides() -> None:
    def cfg(*rules: TopicRule) -> BridgeConfig:
        return BridgeConfig(
            name="both",
            urls=(f"mqtt://127.0.0.1:{central.port}",),
            topics=rules,
            backoff_min=0.05,
            backoff_max=0.2,
        )

    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        in1, in2 = TopicRule("in1/#", Direction.IN), TopicRule("in2/#", Direction.IN)
        out1, out2 = TopicRule("out1/#"), TopicRule("out2/#")
        current = [cfg(in1, in2, out1, out2)]
        uplink = Uplink(current, source=lambda: current)
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge:
            await asyncio.wait_for(uplink.bridges["both"].wait_connected(), 10)
            remote_index, local_index = central.core.router.index, edge.core.router.index
            assert remote_index.entry_count("siftmq-both") == 2
            assert local_index.entry_count("$uplink/both") == 2
            current[0] = cfg(in1, out1)
            assert (await edge.reload()).ok
            assert local_index.entry_count("$uplink/both") == 1  # unsubscribed before the restart
            bridge = uplink.bridges["both"]
            await asyncio.wait_for(bridge.wait_connected(), 10)
            await eventually(lambda: remote_index.entry_count("siftmq-both") == 1, 10)
            async with edge.subscribe("#", qos=1) as got:
                await _publish(central.port, "in2/x", "in1/marker")  # in order on one link
                assert await _arrivals(got, 1) == ["in1/marker"]
            assert bridge.state.no_rule == 0  # in2/x was not sent to the bridge any more


async def test_a_bridge_broken_since_its_start_does_not_fail_other_reloads(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    cfg = BridgeConfig(
        name="tls", urls=(f"mqtts://127.0.0.1:{free_port()}",), topics=(TopicRule("t/#"),), cafile=str(ca)
    )
    uplink = Uplink([cfg], source=lambda: [cfg])
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge:
        bridge = uplink.bridges["tls"]
        await eventually(lambda: bridge.state.failures.get("tls", 0) >= 1, 10)  # counted as it runs
        result = await edge.reload()  # its files as they were: not a reason to refuse the reload
        assert result.ok and uplink.bridges["tls"] is bridge
