"""What holding a QoS 2 message's deliveries until its packet id is committed costs (issue 30).

    .venv/bin/python benchmarks/bench_qos2_commit.py [--messages 400] [--rounds 3]

A broker with a file store (``synchronous=FULL``), a persisted publisher and a persisted
subscriber (raw MQTT 5 clients in the same process), one message at a time: the latency from
the PUBLISH to its arrival at the subscriber, per configuration, interleaved in each round:

* ``qos1``: QoS 1 (its path does not wait for the commit: the reference);
* ``qos2 before commit``: QoS 2 delivered as it is routed, the commit after (the behaviour
  before issue 30: a crash between the two and the publisher's resend deliver it twice);
* ``qos2 after commit``: QoS 2 delivered once its packet id and copies are durable (now).

Prints p50/p99 per configuration and the ratio of the two QoS 2 ones; the commit itself
(``store_commit_delay``, 2 ms by default, plus an fsync) is what the third one adds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker import Broker
from broker.packets import (
    Connack,
    Connect,
    Decoder,
    Packet,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
    encode,
)

EXPIRY = Properties(session_expiry_interval=3600)
PAYLOAD = b'{"temp": 21.5, "room": "b7-f3-r12"}'


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.dec = reader, writer, Decoder(5, server=False)
        self.pending: list[Packet] = []

    async def next(self) -> Packet:
        while not self.pending:
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionError("closed")
            self.pending.extend(self.dec.feed(data))
        return self.pending.pop(0)


async def _connect(port: int, cid: str) -> _Conn:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    c = _Conn(reader, writer)
    writer.write(encode(Connect(cid, 5, clean_start=True, keep_alive=0, properties=EXPIRY), 5))
    assert isinstance(await c.next(), Connack)
    return c


async def run_one(qos: int, defer: bool, messages: int, tmp: Path) -> list[float]:
    async with Broker(
        host="127.0.0.1", port=0, sys_interval=0, store_path=str(tmp / f"{qos}{defer}.db")
    ) as b:
        b.core.hold_qos2 = defer
        sub = await _connect(b.port, "sub")
        sub.writer.write(encode(Subscribe(1, (SubscriptionRequest("b/t", qos),)), 5))
        assert isinstance(await sub.next(), Suback)
        pub = await _connect(b.port, "pub")
        out: list[float] = []
        for i in range(messages):
            pid = i % 60000 + 1
            t0 = time.perf_counter()
            pub.writer.write(encode(Publish("b/t", PAYLOAD, qos, packet_id=pid), 5))
            while True:
                p = await sub.next()
                if isinstance(p, Publish):
                    out.append(time.perf_counter() - t0)
                    ack = Puback(p.packet_id or 0) if qos == 1 else Pubrec(p.packet_id or 0)
                    sub.writer.write(encode(ack, 5))
                    break
            # the rest of both handshakes before the next message (one message at a time)
            if qos == 1:
                while not isinstance(await pub.next(), Puback):
                    pass
            else:
                while not isinstance(await pub.next(), Pubrec):
                    pass
                pub.writer.write(encode(Pubrel(pid), 5))
                while True:
                    p = await sub.next()
                    if isinstance(p, Pubrel):
                        sub.writer.write(encode(Pubcomp(p.packet_id), 5))
                        break
                while not isinstance(await pub.next(), Pubcomp):
                    pass
        for c in (pub, sub):
            c.writer.close()
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    configs = {"qos1": (1, True), "qos2 before commit": (2, False), "qos2 after commit": (2, True)}
    lat: dict[str, list[float]] = {k: [] for k in configs}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for name, (qos, defer) in configs.items():
                tmp = Path(d) / f"r{r}"
                tmp.mkdir(exist_ok=True)
                lat[name] += asyncio.run(run_one(qos, defer, args.messages, tmp))
    for name, xs in lat.items():
        print(
            f"{name:20s} n={len(xs)} p50 {_pct(xs, 0.5):.2f} ms  p99 {_pct(xs, 0.99):.2f} ms  "
            f"mean {statistics.mean(xs) * 1000:.2f} ms"
        )
    a, b = lat["qos2 before commit"], lat["qos2 after commit"]
    print(
        f"qos2 after/before commit: p50 x{_pct(b, 0.5) / _pct(a, 0.5):.2f},",
        f"p99 x{_pct(b, 0.99) / _pct(a, 0.99):.2f}",
    )


if __name__ == "__main__":
    main()
