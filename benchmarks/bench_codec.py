"""PUBLISH encode/decode throughput of broker.packets against paho-mqtt's and amqtt's own packet
code, measured in the same run (ratios are what to read; absolute numbers depend on the machine).

    .venv/bin/python benchmarks/bench_codec.py [--payload 64] [--out docs/performance-codec.md]

Peers, as close to their codec as their APIs allow:
* paho-mqtt: encode = ``Client._send_publish`` with ``_packet_queue`` captured (builds the bytes,
  queues nothing); decode = ``paho.mqtt._packet.decode_publish`` on the body (paho parses the
  fixed header in its socket reader, so its decode figure *excludes* fixed-header parsing).
* amqtt (3.1.1 only): encode = ``PublishPacket.build(...).to_bytes()``; decode =
  ``PublishPacket.from_stream(BufferReader(data))`` driven without an event loop.
Ours: encode = ``encode_publish``; decode = ``Decoder.feed`` of one packet (fixed header
included, full validation); fan-out = ``PublishTemplate.render`` per subscriber.
"""

from __future__ import annotations

import argparse
import platform
import time
import timeit
from collections.abc import Callable, Coroutine
from typing import Any

import paho.mqtt.client as paho
from amqtt.adapters import BufferReader
from amqtt.mqtt.publish import PublishPacket
from paho.mqtt import _packet as paho_packet
from paho.mqtt.enums import MQTTProtocolVersion

from broker.packets import NO_PROPERTIES, Decoder, Properties, PublishTemplate, encode_publish

TOPIC = "sensors/building-7/floor-3/room-12/temperature"


def best(fn: Callable[[], object], number: int) -> float:
    """Best of 5 repeats: seconds per call."""
    return min(timeit.repeat(fn, number=number, repeat=5)) / number


class _FakeSock:
    """Stands in for paho's socket: only checked for None and closed at exit."""

    def close(self) -> None:
        pass


def header_len(wire: bytes) -> int:
    i = 1
    while wire[i] & 0x80:
        i += 1
    return i + 1


def run_coro(c: Coroutine[Any, Any, Any]) -> Any:
    try:
        c.send(None)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("coroutine suspended")


def paho_encoder(version: int) -> Callable[[int, int], bytes]:
    proto = paho.MQTTv5 if version == 5 else paho.MQTTv311
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=proto)
    c._sock = _FakeSock()  # type: ignore[assignment]
    out: list[bytes] = []
    c._packet_queue = lambda command, packet, mid, qos, info=None: out.append(packet)  # type: ignore[method-assign]
    topic = TOPIC.encode()

    def enc(qos: int, pid: int, payload: bytes = b"") -> bytes:
        c._send_publish(pid, topic, payload, qos, False, False)
        return out.pop()

    return enc  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--payload", type=int, default=64)
    ap.add_argument("--number", type=int, default=20_000)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    payload = b'{"t": 21.5, "unit": "C", "id": "room-12"}'.ljust(a.payload, b" ")
    n = a.number
    rows: list[tuple[str, float, str, float]] = []

    for version in (4, 5):
        for qos in (0, 1):
            pid = 17 if qos else None
            wire = encode_publish(TOPIC, payload, qos, False, False, pid, NO_PROPERTIES, version)
            ours_enc = best(
                lambda qos=qos, pid=pid, version=version: encode_publish(
                    TOPIC, payload, qos, False, False, pid, NO_PROPERTIES, version
                ),
                n,
            )
            penc = paho_encoder(version)
            assert penc(qos, 17, payload) == wire, "paho bytes differ"
            paho_enc = best(lambda penc=penc, qos=qos: penc(qos, 17, payload), n)
            rows.append((f"encode v{version} QoS {qos}", ours_enc, "paho", paho_enc))

            dec = Decoder(version)
            ours_dec = best(lambda dec=dec, wire=wire: dec.feed(wire), n)
            body = wire[header_len(wire) :]
            proto = MQTTProtocolVersion.MQTTv5 if version == 5 else MQTTProtocolVersion.MQTTv311
            paho_dec = best(
                lambda body=body, proto=proto, w0=wire[0]: paho_packet.decode_publish(w0, body, proto), n
            )
            rows.append((f"decode v{version} QoS {qos}", ours_dec, "paho", paho_dec))
            if version == 4:
                am = PublishPacket.build(TOPIC, payload, pid, False, qos, False).to_bytes()
                assert bytes(am) == wire, "amqtt bytes differ"
                am_enc = best(
                    lambda qos=qos, pid=pid: PublishPacket.build(
                        TOPIC, payload, pid, False, qos, False
                    ).to_bytes(),
                    n // 4,
                )
                rows.append((f"encode v{version} QoS {qos}", ours_enc, "amqtt", am_enc))
                am_dec = best(
                    lambda wire=wire: run_coro(PublishPacket.from_stream(BufferReader(wire))), n // 4
                )
                rows.append((f"decode v{version} QoS {qos}", ours_dec, "amqtt", am_dec))

    # v5 with properties (content type, message expiry, a user property)
    props = Properties(
        content_type="application/json", message_expiry_interval=60, user_properties=(("k", "v"),)
    )
    wire = encode_publish(TOPIC, payload, 1, False, False, 9, props, 5)
    ours_enc = best(lambda: encode_publish(TOPIC, payload, 1, False, False, 9, props, 5), n)
    dec = Decoder(5)
    ours_dec = best(lambda: dec.feed(wire), n)
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties as PahoProps

    pp = PahoProps(PacketTypes.PUBLISH)
    pp.ContentType = "application/json"
    pp.MessageExpiryInterval = 60
    pp.UserProperty = ("k", "v")
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    c._sock = _FakeSock()  # type: ignore[assignment]
    cap: list[bytes] = []
    c._packet_queue = lambda command, packet, mid, qos, info=None: cap.append(packet)  # type: ignore[method-assign]
    tb = TOPIC.encode()

    def paho_props_enc() -> bytes:
        c._send_publish(9, tb, payload, 1, False, False, None, pp)
        return cap.pop()

    assert len(paho_props_enc()) == len(wire)
    rows.append(("encode v5 QoS 1 + 3 properties", ours_enc, "paho", best(paho_props_enc, n)))
    body = wire[header_len(wire) :]
    rows.append(
        (
            "decode v5 QoS 1 + 3 properties",
            ours_dec,
            "paho",
            best(lambda: paho_packet.decode_publish(wire[0], body, MQTTProtocolVersion.MQTTv5), n),
        )
    )

    # fan-out: one message to 1000 subscribers with per-subscriber packet id (QoS 1) and a
    # subscription identifier (v5)
    subs = 1000
    t0 = time.perf_counter()
    for _ in range(5):
        tpl = PublishTemplate(TOPIC, payload, props, 5)
        for i in range(1, subs + 1):
            tpl.render(1, i, subscription_identifiers=(i,))
    fan_tpl = (time.perf_counter() - t0) / (5 * subs)
    t0 = time.perf_counter()
    for _ in range(5):
        for i in range(1, subs + 1):
            p = Properties(
                content_type="application/json",
                message_expiry_interval=60,
                user_properties=(("k", "v"),),
                subscription_identifiers=(i,),
            )
            encode_publish(TOPIC, payload, 1, False, False, i, p, 5)
    fan_enc = (time.perf_counter() - t0) / (5 * subs)
    t0 = time.perf_counter()
    for _ in range(5):
        for i in range(1, subs + 1):
            pq = PahoProps(PacketTypes.PUBLISH)
            pq.ContentType = "application/json"
            pq.MessageExpiryInterval = 60
            pq.UserProperty = ("k", "v")
            pq.SubscriptionIdentifier = i
            c._send_publish(i, tb, payload, 1, False, False, None, pq)
            cap.pop()
    fan_paho = (time.perf_counter() - t0) / (5 * subs)
    rows.append(("fan-out v5 per subscriber: PublishTemplate.render", fan_tpl, "paho", fan_paho))
    rows.append(("fan-out v5 per subscriber: encode_publish (new Properties)", fan_enc, "paho", fan_paho))

    lines = [
        "| operation | siftmq µs | peer | peer µs | speed-up (peer / ours) |",
        "|---|---:|---|---:|---:|",
    ]
    lines += [f"| {op} | {o * 1e6:.2f} | {peer} | {p * 1e6:.2f} | {p / o:.2f}x |" for op, o, peer, p in rows]
    table = "\n".join(lines)
    print(table)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(f"<!-- generated by benchmarks/bench_codec.py on {platform.platform()} -->\n{table}\n")


if __name__ == "__main__":
    main()
