"""Publishers that outrun their subscribers are paced, not dropped (issue 14; docs/broker.md,
"Flow control").

Real clients over loopback: paho-mqtt publishers with 32 unacknowledged QoS 1 PUBLISHes each
(the way SDKs publish, no closed loop on deliveries) and an aiomqtt subscriber that reads
slowly. The queue bound is small, so without flow control the broker would acknowledge and
then drop (or disconnect the subscriber). Every acknowledged message must arrive, exactly in
each publisher's order, and the broker must have paused the publishers at least once.
"""

from __future__ import annotations

import asyncio
import threading

import aiomqtt
import paho.mqtt.client as mqtt

from broker import Broker

N = 1500  # per publisher
PUBLISHERS = 2
T = 60.0


class Publisher:
    """A paho client publishing N QoS 1 messages with a window of 32 in flight."""

    def __init__(self, port: int, ident: str, topic: str) -> None:
        self.acked = 0
        self.done = threading.Event()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, ident, protocol=mqtt.MQTTv5)
        self.c.max_inflight_messages_set(32)
        self.c.max_queued_messages_set(0)
        self.c.on_publish = self._acked
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        self.topic = topic

    def _acked(self, *_args: object) -> None:
        self.acked += 1
        if self.acked == N:
            self.done.set()

    def run(self) -> None:
        for i in range(N):
            self.c.publish(self.topic, b"%06d" % i, qos=1)

    def stop(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


async def test_publishers_outrunning_a_subscriber_lose_nothing() -> None:
    async with Broker(
        port=0, sys_interval=0, max_queued_messages=40, max_inflight=10, slow_consumer_policy="pace"
    ) as b:
        got: dict[str, list[int]] = {f"fc/{i}": [] for i in range(PUBLISHERS)}
        async with aiomqtt.Client(
            "127.0.0.1", b.port, identifier="slow-sub", protocol=aiomqtt.ProtocolVersion.V5
        ) as sub:
            await sub.subscribe("fc/#", qos=1)
            pubs = [Publisher(b.port, f"fc-pub{i}", f"fc/{i}") for i in range(PUBLISHERS)]
            try:
                threads = [threading.Thread(target=p.run) for p in pubs]
                for t in threads:
                    t.start()
                n = 0
                async with asyncio.timeout(T):
                    async for m in sub.messages:
                        got[str(m.topic)].append(int(bytes(m.payload)))  # type: ignore[arg-type]
                        n += 1
                        if n % 50 == 0:
                            await asyncio.sleep(0.01)  # a reader slower than its publishers
                        if n == N * PUBLISHERS:
                            break
                for t in threads:
                    t.join(T)
                assert all(p.done.wait(T) for p in pubs)
                acked = sum(p.acked for p in pubs)
            finally:
                for p in pubs:
                    p.stop()
        assert acked == N * PUBLISHERS
        # every acknowledged message arrived, in each publisher's order, none twice
        assert all(v == list(range(N)) for v in got.values())
        st = b.core.stats
        assert st.publisher_pauses >= 1  # the publishers were paced ...
        assert st.dropped_queue_full == 0 and st.queue_overflow == 0  # ... and nothing was dropped
        assert all(len(s.queue) <= 40 for s in b.core.sessions.values())
        b.core._check()
