"""Outbound bridges under faults, over TLS and WebSocket, with failover (issue 40, items 1,
4, 5).  The remote is an embedded siftmq (its listeners, hooks and limits are set per test);
each fault gives a counted failure with a last error, and the local broker serves on.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiomqtt
import pytest

from broker import Broker
from broker._config import Listener
from broker.hooks import Hooks
from tests.security.helpers import Certs, make_certs
from tests.waiting import eventually
from uplink import BridgeConfig, Direction, TopicRule, Uplink

RULE = TopicRule("t/#", Direction.OUT, 1)


def _cfg(*urls: str, **kw: object) -> BridgeConfig:
    return BridgeConfig(name="up", urls=urls, topics=(RULE,), backoff_min=0.05, backoff_max=0.2, **kw)  # type: ignore[arg-type]


class RefuseAll(Hooks):
    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> bool | None:
        return False


async def _pub(port: int, topic: str, payload: bytes) -> None:
    async with aiomqtt.Client("127.0.0.1", port) as c:
        await c.publish(topic, payload, qos=1)


async def _local_serves(port: int) -> None:
    async with aiomqtt.Client("127.0.0.1", port) as c:
        await c.subscribe("local/x", qos=1)
        await c.publish("local/x", b"ok", qos=1)
        async with asyncio.timeout(5):
            async for m in c.messages:
                assert m.payload == b"ok"
                break


async def test_failover_list_metrics_and_sys(tmp_path: Path, dead_port: int) -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        dead = f"mqtt://127.0.0.1:{dead_port}"
        live = f"mqtt://127.0.0.1:{central.port}"
        uplink = Uplink([_cfg(dead, live)])
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge:
            await asyncio.wait_for(uplink.bridges["up"].wait_connected(), 10)
            sys = uplink.sys_values()
            assert sys["$SYS/uplink/up/connected"] == "1"
            assert sys["$SYS/uplink/up/remote"] == live
            assert int(sys["$SYS/uplink/up/failures"]) >= 1
            assert "Connection refused" in sys["$SYS/uplink/up/last_error"]
            metrics = uplink.metric_values()
            assert metrics["uplink_connected"] == {"up": 1}
            assert metrics["uplink_failures_unreachable"]["up"] >= 1
            assert edge.core.sys_values(edge.core.clock.monotonic())["$SYS/uplink/up/connected"] == "1"


async def test_a_refused_connect_is_counted_and_the_edge_serves_on() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[RefuseAll()]) as central:
        uplink = Uplink([_cfg(f"mqtt://127.0.0.1:{central.port}")])
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge:
            bridge = uplink.bridges["up"]
            await eventually(lambda: bridge.state.failures.get("refused", 0) >= 2, 10)
            assert "CONNECT refused" in bridge.state.last_error
            assert not bridge.state.connected
            await _local_serves(edge.port)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("uplink-certs"))


# paho leaves the socket of a failed TLS handshake to the garbage collector (ResourceWarning)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_tls_and_websocket_remotes_and_a_wrong_certificate(certs: Certs) -> None:
    listeners = (
        Listener(port=0, certfile=str(certs.server_cert), keyfile=str(certs.server_key)),
        Listener(kind="ws", port=0),
        Listener(kind="ws", port=0, certfile=str(certs.server_cert), keyfile=str(certs.server_key)),
    )
    async with Broker(listeners=listeners, sys_interval=0) as central:
        tls, ws, wss = central.ports
        bridges = [
            BridgeConfig(
                name="tls",
                urls=(f"mqtts://127.0.0.1:{tls}",),
                topics=(TopicRule("t/#"),),
                cafile=str(certs.ca),
            ),
            BridgeConfig(name="ws", urls=(f"ws://127.0.0.1:{ws}/mqtt",), topics=(TopicRule("t/#"),)),
            BridgeConfig(
                name="wss",
                urls=(f"wss://127.0.0.1:{wss}/mqtt",),
                topics=(TopicRule("t/#"),),
                cafile=str(certs.ca),
            ),
            # no cafile: the test CA is not trusted, the handshake fails
            BridgeConfig(
                name="untrusted",
                urls=(f"mqtts://127.0.0.1:{tls}",),
                topics=(TopicRule("u/#"),),
                backoff_min=0.05,
            ),
        ]
        uplink = Uplink(bridges)
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge:
            for name in ("tls", "ws", "wss"):
                await asyncio.wait_for(uplink.bridges[name].wait_connected(), 10)
            untrusted = uplink.bridges["untrusted"]
            await eventually(lambda: untrusted.state.failures.get("tls", 0) >= 1, 10)
            assert "CERTIFICATE_VERIFY_FAILED" in untrusted.state.last_error
            got = central.subscribe("t/#")
            async with got:
                await _pub(edge.port, "t/1", b"x")
                async with asyncio.timeout(10):
                    seen = [await got.queue.get() for _ in range(3)]  # one per working bridge
            assert [m.payload for m in seen] == [b"x"] * 3
            await _local_serves(edge.port)


async def test_a_message_bigger_than_the_remote_maximum_packet_size_is_dropped_and_counted() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, max_packet_size=512) as central:
        uplink = Uplink([_cfg(f"mqtt://127.0.0.1:{central.port}")])
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge:
            bridge = uplink.bridges["up"]
            await asyncio.wait_for(bridge.wait_connected(), 10)
            got = central.subscribe("t/#")
            async with got:
                await _pub(edge.port, "t/big", b"x" * 2000)
                await _pub(edge.port, "t/small", b"y")
                async with asyncio.timeout(10):
                    m = await got.queue.get()
            assert (m.topic, m.payload) == ("t/small", b"y")
            assert bridge.state.dropped == 1
            assert bridge.state.connected  # the link was not broken by the big one


async def test_a_remote_that_accepts_and_drops_every_packet_is_counted_and_the_edge_serves_on() -> None:
    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # the first byte of CONNECT, then the connection is dropped
        writer.close()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        uplink = Uplink([_cfg(f"mqtt://127.0.0.1:{port}", connect_timeout=2)])
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge:
            bridge = uplink.bridges["up"]
            await eventually(lambda: sum(bridge.state.failures.values()) >= 2, 15)
            assert not bridge.state.connected
            assert bridge.state.last_error
            await _local_serves(edge.port)
    finally:
        server.close()
        await server.wait_closed()


async def test_bridge_counters_in_metrics() -> None:
    pytest.importorskip("prometheus_client")
    import urllib.request

    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        uplink = Uplink([_cfg(f"mqtt://127.0.0.1:{central.port}")])
        async with Broker(
            host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0", hooks=[uplink]
        ) as edge:
            await asyncio.wait_for(uplink.bridges["up"].wait_connected(), 10)
            await _pub(edge.port, "t/1", b"x")
            await eventually(lambda: uplink.bridges["up"].state.sent == 1, 10)
            url = f"http://127.0.0.1:{edge.metrics_port}/metrics"
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
            assert 'siftmq_uplink_sent_total{reason="up"} 1.0' in text
            assert 'siftmq_uplink_connected_total{reason="up"} 1.0' in text


@pytest.mark.parametrize(
    ("ident", "password"), [("$uplink/up", None), ("$uplink/up", "guess"), ("$uplink/x", None)]
)
async def test_an_ordinary_client_cannot_take_a_bridge_client_id(ident: str, password: str | None) -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        uplink = Uplink([_cfg(f"mqtt://127.0.0.1:{central.port}")])
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge:
            bridge = uplink.bridges["up"]
            await asyncio.wait_for(bridge.wait_connected(), 10)
            with pytest.raises(aiomqtt.MqttError, match=r"[Nn]ot authorized"):
                async with aiomqtt.Client(
                    "127.0.0.1", edge.port, identifier=ident, username="$uplink", password=password
                ):
                    pass
            assert bridge.state.connected  # its local session was not taken over
            await _pub(edge.port, "t/1", b"still bridged")
            await eventually(lambda: bridge.state.sent >= 1, 5)


async def test_a_remote_sending_malformed_packets_is_a_counted_lost_connection() -> None:
    """A remote that answers CONNECT and then sends bytes that are no MQTT: the bridge's
    connection ends (the stream is lost), counted as ``failures_lost`` with the decoder's
    reason in ``last_error``, and it connects again; the local broker serves on."""
    connects = 0

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connects
        connects += 1
        await reader.read(1)  # the CONNECT's first byte
        writer.write(b"\x20\x03\x00\x00\x00" + b"\xf0\xff\xff\xff\xff\x7f")  # CONNACK, then junk
        await writer.drain()
        await reader.read()  # until the bridge closes
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        uplink = Uplink([_cfg(f"mqtt://127.0.0.1:{port}")])
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]) as edge:
            bridge = uplink.bridges["up"]
            await eventually(lambda: bridge.state.failures.get("lost", 0) >= 2, 15)
            assert "malformed" in bridge.state.last_error
            assert connects >= 2
            await _local_serves(edge.port)
    finally:
        server.close()
