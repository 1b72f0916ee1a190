"""MQTT over WebSocket is a byte stream: any split of the client's bytes into frames and
fragmented messages delivers the same packets as one TCP write (Hypothesis, real broker)."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect as ws_connect

from broker import Broker
from broker._config import BrokerConfig, Listener
from broker.packets import Connect, Publish, encode
from tests.security.helpers import T

PAYLOADS = [bytes([i]) * (i * 37 % 300) for i in range(12)]
STREAM = encode(Connect("stream", protocol_level=5), 5) + b"".join(
    encode(Publish("s/t", p, 0), 5) for p in PAYLOADS
)


async def deliver(cuts: list[int], fragment: list[bool]) -> list[bytes]:
    """Send STREAM cut at ``cuts``; a True in ``fragment`` sends a piece and the next one as
    the two frames of one fragmented message.  Returns the payloads a local subscriber got."""
    cfg = BrokerConfig(listeners=(Listener("ws", "127.0.0.1", 0),), sys_interval=0)
    async with Broker(config=cfg) as b, b.subscribe("s/t") as sub:
        bounds = [0, *sorted(set(cuts)), len(STREAM)]
        pieces = [STREAM[a:z] for a, z in itertools.pairwise(bounds) if z > a]
        async with ws_connect(f"ws://127.0.0.1:{b.port}/mqtt", subprotocols=["mqtt"]) as ws:  # type: ignore[list-item]
            i = 0
            while i < len(pieces):
                if i + 1 < len(pieces) and fragment[i % len(fragment)]:
                    await ws.send([pieces[i], pieces[i + 1]])
                    i += 2
                else:
                    await ws.send(pieces[i])
                    i += 1
            return [(await sub.get(T)).payload for _ in PAYLOADS]


@settings(max_examples=25, deadline=None)
@given(
    cuts=st.lists(st.integers(1, len(STREAM) - 1), max_size=30),
    fragment=st.lists(st.booleans(), min_size=1, max_size=8),
)
def test_any_framing_delivers_the_same_packets(cuts: list[int], fragment: list[bool]) -> None:
    assert asyncio.run(deliver(cuts, fragment)) == PAYLOADS
