"""Issue 40's "done when" run for outbound bridges, by hand (docs/bridging-out.md "Outages").

Run from the repository root (after ``make build``), under the benchmark lock:

    flock /work/bench.lock .venv/bin/python benchmarks/uplink_outage.py [--messages 10000]
        [--outage 30] [--protocol 5|3.1.1]

Two scenarios against a real Debian mosquitto as the central (persistence on), with an edge
``siftmq serve --data-dir`` bridging ``sensors/#`` out at QoS 1 (remote prefix ``central/``),
a paho publisher on the edge (QoS 1, 10 topics, sequence numbers as payloads) and a persistent
paho subscriber on the central recording every arrival:

1. **remote outage**: after a fifth of the messages were acknowledged by the edge, the central
   is stopped for ``--outage`` seconds while the publisher goes on (the edge acknowledges and
   queues), then started again;
2. **local kill -9**: after a third of the messages, the edge is killed with SIGKILL and
   started again on the same data directory; the publisher reconnects and sends again what
   the edge had not acknowledged.

Each prints the messages, the seconds from the restart to the last arrival, whether every
message arrived, whether each topic's messages arrived in order (a message sent again may
come twice, at least once, but never after a later one of its topic without having come
before), and the duplicates.  The suite keeps smaller versions (tests/uplink/).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_uplink import Proc, free_port, mosquitto

TOPICS = 10


class Recorder:
    """A persistent QoS 1 subscriber on the central recording (topic, seq) in arrival order."""

    def __init__(self, port: int) -> None:
        self.got: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id="outage-recorder", clean_session=False)
        self.c.reconnect_delay_set(0.2, 0.5)
        self.c.on_connect = lambda c, *_: c.subscribe("central/#", 1)
        self.c.on_message = self._on
        self.port = port

    def _on(self, _c: object, _u: object, m: paho.MQTTMessage) -> None:
        with self.lock:
            self.got.append((m.topic, int(m.payload)))

    def distinct(self) -> int:
        with self.lock:
            return len({s for _, s in self.got})

    def start(self) -> None:
        self.c.connect("127.0.0.1", self.port, 30)
        self.c.loop_start()

    def stop(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def check(got: list[tuple[str, int]], n: int) -> tuple[bool, bool, int]:
    """(all arrived, in order per topic, duplicates)."""
    ordered = True
    seen: dict[str, list[int]] = {}
    for topic, s in got:
        prior = seen.setdefault(topic, [])
        if prior and s <= prior[-1]:
            ordered = ordered and s in prior  # a copy sent again: fine if it came before
            continue
        prior.append(s)
    every = {s for _, s in got} == set(range(n))
    return every, ordered, len(got) - len({s for _, s in got})


def edge(d: Path, port: int, central: int, protocol: str) -> Proc:
    cfg = d / "edge.toml"
    cfg.write_text(
        "[broker]\nmax_queued_messages = 1000000\nsys_interval = 0\n\n"
        f'[[bridges]]\nname = "central"\nurl = "mqtt://127.0.0.1:{central}"\nprotocol = "{protocol}"\n'
        "backoff_min = 0.2\nbackoff_max = 1.0\n\n"
        '[[bridges.topics]]\npattern = "sensors/#"\nremote_prefix = "central/"\n'
    )
    args = [
        sys.executable,
        "-m",
        "broker._cli",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(d / "edge-data"),
    ]
    return Proc([*args, "--config", str(cfg), "--no-bridge", "--log-level", "WARNING"], port)


class Publisher:
    """Publishes 0..n-1 at QoS 1 to the edge, 500 in flight, sending again after a reconnect
    what the edge had not acknowledged; ``acked`` counts PUBACKs."""

    def __init__(self, port: int, n: int) -> None:
        self.port, self.n = port, n
        self.acked = 0
        self.done = threading.Event()

    def run(self) -> None:
        nxt = 0
        while nxt < self.n:
            c = paho.Client(CallbackAPIVersion.VERSION2, client_id="outage-pub")
            c.max_inflight_messages_set(500)
            try:
                c.connect("127.0.0.1", self.port, 30)
            except OSError:
                time.sleep(0.2)
                continue
            c.loop_start()
            infos = []
            try:
                for i in range(nxt, self.n):
                    infos.append((i, c.publish(f"sensors/{i % TOPICS}", str(i).encode(), qos=1)))
                    if len(infos) >= 500:
                        j, info = infos.pop(0)
                        info.wait_for_publish(60)
                        if not info.is_published():
                            raise ConnectionError
                        nxt = j + 1
                        self.acked = nxt
                for j, info in infos:
                    info.wait_for_publish(60)
                    if not info.is_published():
                        raise ConnectionError
                    nxt = j + 1
                    self.acked = nxt
            except (ConnectionError, RuntimeError, ValueError):
                pass  # the edge went away: start again after the last acknowledged message
            finally:
                c.disconnect()
                c.loop_stop()
        self.done.set()


def wait(cond: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def remote_outage(d: Path, n: int, outage: float, protocol: str) -> None:
    cport, eport = free_port(), free_port()
    central = mosquitto(d, "central", cport, persist=True)
    central.start()
    rec = Recorder(cport)
    rec.start()
    e = edge(d, eport, cport, protocol)
    e.start()
    try:
        pub = Publisher(eport, n)
        threading.Thread(target=pub.run, daemon=True).start()
        assert wait(lambda: pub.acked >= n // 5, 120)
        central.stop()
        t_down = time.monotonic()
        print(f"  central stopped after {pub.acked} acknowledged; down for {outage:g} s", flush=True)
        time.sleep(outage)
        print(f"  {pub.acked} acknowledged by the edge when the central comes back", flush=True)
        central.start()
        t_up = time.monotonic()
        ok = wait(lambda: rec.distinct() >= n, 600)
        t_last = time.monotonic()
        assert pub.done.wait(60)
        time.sleep(1)  # copies sent again still on their way (counted as duplicates)
        every, ordered, dups = check(rec.got, n)
        print(
            f"remote outage ({protocol}): {n} messages, central down {t_up - t_down:.1f} s, "
            f"last arrival {t_last - t_up:.2f} s after its restart; all arrived {every and ok}, "
            f"in order per topic {ordered}, duplicates {dups}",
            flush=True,
        )
    finally:
        e.stop()
        rec.stop()
        central.stop()


def local_kill(d: Path, n: int, protocol: str) -> None:
    cport, eport = free_port(), free_port()
    central = mosquitto(d, "central", cport, persist=True)
    central.start()
    rec = Recorder(cport)
    rec.start()
    shutil.rmtree(d / "edge-data", ignore_errors=True)
    e = edge(d, eport, cport, protocol)
    e.start()
    try:
        pub = Publisher(eport, n)
        threading.Thread(target=pub.run, daemon=True).start()
        assert wait(lambda: pub.acked >= n // 3, 120)
        assert e.p is not None
        os.kill(e.p.pid, signal.SIGKILL)
        e.p.wait()
        e.p = None
        print(f"  edge killed (SIGKILL) after {pub.acked} acknowledged, {rec.distinct()} arrived", flush=True)
        t0 = time.monotonic()
        e.start()
        ok = wait(lambda: rec.distinct() >= n, 600)
        t_last = time.monotonic()
        assert pub.done.wait(60)
        time.sleep(1)
        every, ordered, dups = check(rec.got, n)
        print(
            f"local kill -9 ({protocol}): {n} messages, last arrival {t_last - t0:.2f} s after the "
            f"edge's restart; all arrived {every and ok}, in order per topic {ordered}, duplicates {dups}",
            flush=True,
        )
    finally:
        e.stop()
        rec.stop()
        central.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--outage", type=float, default=30.0)
    ap.add_argument("--protocol", choices=["5", "3.1.1"], default="5")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for sub in ("outage", "kill"):
            (d / sub).mkdir()
        remote_outage(d / "outage", a.messages, a.outage, a.protocol)
        local_kill(d / "kill", a.messages, a.protocol)


if __name__ == "__main__":
    main()
