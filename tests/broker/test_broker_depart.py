"""A departing client costs the read of its DISCONNECT O(1) in the router (issue 42 item 2).

When 10,000 clients left at once, a live client's PINGREQ waited 280-360 ms for its
PINGRESP: epoll hands the broker the ready sockets first in, first out, and each departure
cost ~35 us of read-path work, a third of it the session's end (the index's
``remove_client`` of its filters, its selectors released).  Now a departed clean session
leaves the registry at once (nothing is routed to it any more) and its entries and
selectors leave the router in slices between loop turns (``Router.depart``,
``Router.settle_selectors``); a client connecting again with the same id finishes that
first, so MQTT's session rules are unchanged.  And a client that ended with DISCONNECT is
closed at once, not half-closed with a linger for its end of stream
(``MQTTProtocol.shut``): one read per departure instead of two.

The sans-IO tests drive a real :class:`Core` with in-process connections; the others a
real embedded broker with real clients (aiomqtt, raw sockets) over loopback.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiomqtt
import pytest

import broker.net._transport as transport_mod
from broker import Broker
from broker._config import BrokerConfig
from broker.core._connection import Callbacks, Connection
from broker.core._core import Core
from broker.net import _lean
from broker.packets import Connect, Disconnect, Properties, Subscribe, SubscriptionRequest
from broker.values import Message
from tests.rawclient import RawClient
from tests.waiting import eventually, next_message

PINGREQ = b"\xc0\x00"
DISCONNECT = b"\xe0\x00"


def _connect(cid: str) -> bytes:
    """A 3.1.1 CONNECT of ``cid``, clean session, no keep-alive."""
    body = b"\x00\x04MQTT\x04\x02\x00\x00" + len(cid).to_bytes(2, "big") + cid.encode()
    return bytes([0x10, len(body)]) + body


def _client(core: Core, cid: str, filters: list[tuple[str, str | None]], out: list[bytes]) -> Connection:
    conn = Connection(core, Callbacks(out.append, lambda: None), 0.0, cid)
    conn.received([Connect(cid, protocol_level=5, keep_alive=0)], 0.0)
    for i, (f, sel) in enumerate(filters):
        props = Properties(user_properties=(("filter", sel),)) if sel is not None else Properties()
        conn.received([Subscribe(i + 1, (SubscriptionRequest(f, 0),), props)], 0.0)
    core.flush()
    out.clear()
    return conn


def _fleet_filters(i: int) -> list[tuple[str, str | None]]:
    return [(f"f/{k}/#", f"v > {i * 10 + k}") for k in range(5)] + [("f/plain", None)]


def test_a_departure_leaves_the_router_to_the_ticks_and_reaches_no_one() -> None:
    core = Core(BrokerConfig(sys_interval=0, content_engine="iccounting"))
    router = core.router
    outs = [[] for _ in range(50)]  # type: list[list[bytes]]
    fleet = [_client(core, f"c{i}", _fleet_filters(i), outs[i]) for i in range(50)]
    stays: list[bytes] = []
    _client(core, "stays", [("f/0/#", "v > 0.5"), ("f/plain", None)], stays)
    for conn in fleet:
        conn.received([Disconnect()], 1.0)
    core.flush()
    # the reads of the DISCONNECTs ended the sessions but left their entries to the ticks
    assert not any(f"c{i}" in core.sessions for i in range(50))
    assert router.departed == 50 and router.index.entry_count("c0") == 6
    core._check()
    router._check()
    # nothing reaches a departed client meanwhile, and the deliveries counted are the live ones
    for o in outs:
        o.clear()
    assert core.publish(Message("f/0/x", b'{"v": 1000000}', 0, False), 2.0) == 1
    assert core.publish(Message("f/plain", b"{}", 0, False), 2.0) == 1
    core.flush()
    got = b"".join(stays)
    assert not any(outs) and b"f/0/x" in got and b"f/plain" in got
    ticks = 0
    while router.releasing:
        core.tick(3.0 + ticks)
        ticks += 1
        core._check()
        router._check()
    assert router.index.entry_count("c0") == 0 and len(router.index) == 2
    assert set(router.engine) == {"v > 0.5"}


def test_a_client_connecting_again_gets_a_fresh_session_not_its_predecessors() -> None:
    core = Core(BrokerConfig(sys_interval=0, content_engine="iccounting"))
    out: list[bytes] = []
    a = _client(core, "a", [("t/#", "v > 1"), ("u/#", None)], out)
    a.received([Disconnect()], 1.0)
    core.flush()
    assert core.router.is_departing("a")
    again: list[bytes] = []
    conn = Connection(core, Callbacks(again.append, lambda: None), 1.0, "a")
    conn.received([Connect("a", protocol_level=5, keep_alive=0, clean_start=False)], 1.0)
    core.flush()
    assert again and again[0][3] == 0  # CONNACK: session present 0 (a clean session is never reused)
    assert not core.router.is_departing("a") and core.router.index.entry_count("a") == 0
    again.clear()
    assert core.publish(Message("t/x", b'{"v": 5}', 0, False), 2.0) == 0
    assert core.publish(Message("u/x", b"{}", 0, False), 2.0) == 0
    core.flush()
    assert again == []
    core._check()
    core.router._check()


def test_a_filter_still_waiting_for_removal_does_not_hide_another_clients() -> None:
    core = Core(BrokerConfig(sys_interval=0, content_engine="iccounting"))
    out: list[bytes] = []
    a = _client(core, "a", [("t/#", "v > 1")], out)
    a.received([Disconnect()], 1.0)
    core.flush()
    b_out: list[bytes] = []
    _client(core, "b", [("t/#", "v > 1")], b_out)  # the same filter and selector, another client
    assert core.publish(Message("t/x", b'{"v": 5}', 0, False), 2.0) == 1
    core.flush()
    assert b"".join(b_out).count(b"t/x") == 1 and out == []
    core.tick(3.0)  # a's entries and its reference to the selector go; b's stay
    assert not core.router.releasing
    assert core.publish(Message("t/x", b'{"v": 5}', 0, False), 4.0) == 1
    core.flush()
    assert b"".join(b_out).count(b"t/x") == 2 and out == []
    assert set(core.router.engine) == {"v > 1"}


def test_a_shared_group_member_that_leaves_is_removed_at_once() -> None:
    core = Core(BrokerConfig(sys_interval=0, shared_subscription_strategy="round_robin"))
    gone: list[bytes] = []
    a = _client(core, "a", [("$share/g/t/#", None)], gone)
    b_out: list[bytes] = []
    _client(core, "b", [("$share/g/t/#", None)], b_out)
    a.received([Disconnect()], 1.0)
    core.flush()
    assert not core.router.is_departing("a") and core.router.index.entry_count("a") == 0
    for i in range(6):  # every message to the member left, none to the one gone
        assert core.publish(Message("t/x", b"%d" % i, 0, False), 2.0) == 1
    core.flush()
    assert gone == [] and b"".join(b_out).count(b"t/x") == 6
    assert core.stats.messages_received == 6


async def test_clean_clients_leaving_and_coming_back_over_the_network() -> None:
    """aiomqtt clients (MQTT 5) leave, then connect again with the same ids before the
    ticks settled them: no old subscription reaches the new session, the new ones work."""
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, tick_interval=60.0) as b:
        for i in range(5):
            async with aiomqtt.Client(
                "127.0.0.1", b.port, identifier=f"c{i}", protocol=aiomqtt.ProtocolVersion.V5
            ) as c:
                await c.subscribe("old/#")
        await eventually(lambda: not b.core.sessions)
        async with contextlib.AsyncExitStack() as stack:
            clients = []
            for i in range(5):
                c = await stack.enter_async_context(
                    aiomqtt.Client(
                        "127.0.0.1", b.port, identifier=f"c{i}", protocol=aiomqtt.ProtocolVersion.V5
                    )
                )
                await c.subscribe("new/#")
                clients.append(c)
            async with aiomqtt.Client("127.0.0.1", b.port, identifier="pub") as pub:
                await pub.publish("old/x", b"stale", qos=1)
                await pub.publish("new/x", b"fresh", qos=1)
            for c in clients:
                m = await next_message(c)
                assert m.payload == b"fresh"
            assert not any(b.core.router.is_departing(f"c{i}") for i in range(5))


@pytest.mark.parametrize("version", [4, 5])
async def test_a_client_that_said_disconnect_is_closed_at_once(
    version: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker closes the connection of a client that sent DISCONNECT at once, without
    waiting for the client's end of stream (before: half-closed, then read until the client
    closed or LINGER passed). The client here keeps its socket open; LINGER is long."""
    monkeypatch.setattr(transport_mod, "LINGER", 60.0)
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        c, _ack = await RawClient.connect(b.port, "leaver", version)
        await eventually(lambda: len(b._protocols()) == 1)
        c.send(Disconnect())
        # gone from the broker's open connections without the client closing its side
        await eventually(lambda: not b._protocols(), 30.0)
        assert await asyncio.wait_for(c.reader.read(), 5.0) == b""  # the broker's FIN
        assert not b.core.connections and not b.core.sessions


async def test_a_live_clients_ping_is_not_read_after_the_departures_ahead_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """epoll reports ready sockets first in, first out: a PINGREQ sent right after 600
    clients' DISCONNECTs was read only once every one of them had been handled (their
    sessions ended). Now a departure's read is only held, and the PINGREQ is handled while
    most of the 600 sessions are still there. Counted where the broker reads the PINGREQ
    (the protocol's ``data_received``, wrapped only to look)."""
    n = 600
    seen: list[int] = []
    received = _lean.LeanProtocol.data_received

    def looked(self: _lean.LeanProtocol, data: bytes) -> None:
        if data == PINGREQ:
            seen.append(len(self.core.sessions))
        received(self, data)

    monkeypatch.setattr(_lean.LeanProtocol, "data_received", looked)
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        clients = []
        for i in range(n):
            r, w = await asyncio.open_connection("127.0.0.1", b.port)
            w.write(_connect(f"c{i}"))
            assert (await asyncio.wait_for(r.readexactly(4), 10))[0] == 0x20
            clients.append((r, w))
        pr, pw = await asyncio.open_connection("127.0.0.1", b.port)
        pw.write(_connect("live"))
        assert (await asyncio.wait_for(pr.readexactly(4), 10))[0] == 0x20
        assert len(b.core.sessions) == n + 1
        for _, w in clients:  # every departure ready before the ping: no await in between
            w.write(DISCONNECT)
        pw.write(PINGREQ)
        assert await asyncio.wait_for(pr.readexactly(2), 10) == b"\xd0\x00"
        assert seen and seen[0] > n // 2, seen  # before: 1 (every departure handled first)
        await eventually(lambda: len(b.core.sessions) == 1, 30.0)  # then they all leave
        for _, w in clients:
            w.close()
        pw.close()


async def test_held_departures_keep_each_connections_bytes_in_order() -> None:
    """A client whose DISCONNECT is read alone after a PUBLISH that was read earlier: its
    PUBLISH is delivered, its session ends, and a client sending more than a DISCONNECT
    in one read is handled at once (its read is not a bare DISCONNECT)."""
    async with (
        Broker(host="127.0.0.1", port=0, sys_interval=0) as b,
        aiomqtt.Client("127.0.0.1", b.port, identifier="sub") as sub,
    ):
        await sub.subscribe("t/#")
        r, w = await asyncio.open_connection("127.0.0.1", b.port)
        w.write(_connect("pub"))
        assert (await asyncio.wait_for(r.readexactly(4), 10))[0] == 0x20
        w.write(bytes([0x30, 5, 0, 3]) + b"t/a")  # PUBLISH QoS 0 t/a, empty payload
        w.write(DISCONNECT)
        m = await next_message(sub)
        assert m.topic.value == "t/a"
        await eventually(lambda: "pub" not in b.core.sessions)
        _r2, w2 = await asyncio.open_connection("127.0.0.1", b.port)
        w2.write(_connect("pub2") + bytes([0x30, 5, 0, 3]) + b"t/b" + DISCONNECT)
        m = await next_message(sub)
        assert m.topic.value == "t/b"
        await eventually(lambda: "pub2" not in b.core.sessions)
        w.close()
        w2.close()
