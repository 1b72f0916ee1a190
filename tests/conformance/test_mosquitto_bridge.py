"""A real mosquitto on the edge bridged both ways to siftmq (issue 21, item 1).

Debian's mosquitto (installed by the Makefile when missing) runs with a bridge ``topic edge/#
both 1`` to an embedded siftmq, once with ``bridge_protocol_version mqttv311`` (the CONNECT
carries protocol level 0x84, the bridge bit) and once with ``mqttv50``. One message published
on each side must reach each side's local subscriber exactly once (no loop), and the bridge
must come up on its first attempt (mosquitto retries a refused bridge only after its restart
timeout, so a refused first attempt shows as a missing bridge within the wait below).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from broker import Broker
from broker.packets import Publish, SubscriptionRequest
from tests.mosquitto import MOSQUITTO, mosquitto
from tests.rawclient import RawClient
from tests.waiting import eventually

pytestmark = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (make installs it)")


def _edge(tmp: Path, central: int, version: str) -> contextlib.AbstractContextManager[int]:
    """mosquitto bridged to ``central`` (``edge/#`` both ways, QoS 1); its port."""
    return mosquitto(
        tmp,
        "allow_anonymous true\n"
        f"connection central\naddress 127.0.0.1:{central}\ntopic edge/# both 1\n"
        f"bridge_protocol_version {version}\nremote_clientid edge-bridge\nrestart_timeout 10\n",
    )


async def _connect_retrying(port: int, cid: str) -> RawClient:
    for _ in range(100):
        with contextlib.suppress(OSError):
            c, _ = await RawClient.connect(port, cid, 4)
            return c
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


async def _received(c: RawClient, n: int) -> list[tuple[str, bytes]]:
    """(topic, payload) of the first ``n`` PUBLISHes (waited for, each within the raw client's
    timeout: the way through mosquitto's bridge has no bound to wait on) and of any that
    arrive in the next half second (a duplicate or a loop would), sorted."""
    got = [await c.recv_where(lambda p: isinstance(p, Publish)) for _ in range(n)]
    await asyncio.sleep(0.5)  # a window for what must NOT arrive (a looped-back copy)
    got += await c.barrier()
    return sorted((p.topic, p.payload) for p in got if isinstance(p, Publish))


@pytest.mark.parametrize("version", ["mqttv311", "mqttv50"])
async def test_mosquitto_bridge_both_ways_exactly_once(tmp_path: Path, version: str) -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as b:
        with _edge(tmp_path, b.port, version) as edge_port:
            index = b.core.router.index
            # up on the first attempt: a refused one would be retried only after 10 s
            await eventually(lambda: index.entry_count("edge-bridge") >= 1, 5.0)
            assert b.core.stats.malformed == 0
            central_sub, _ = await RawClient.connect(b.port, "central-sub", 4)
            await central_sub.subscribe(SubscriptionRequest("edge/#", 1))
            edge_sub = await _connect_retrying(edge_port, "edge-sub")
            await edge_sub.subscribe(SubscriptionRequest("edge/#", 1))
            edge_pub = await _connect_retrying(edge_port, "edge-pub")
            await edge_pub.publish1("edge/from-edge", b"e")
            central_pub, _ = await RawClient.connect(b.port, "central-pub", 4)
            await central_pub.publish1("edge/from-center", b"c")
            both = [("edge/from-center", b"c"), ("edge/from-edge", b"e")]
            assert await _received(central_sub, 2) == both
            assert await _received(edge_sub, 2) == both  # each exactly once: nothing looped back
            await RawClient.close_all()
