"""PUBLISH intake through the sans-IO connection machine, against a peer checkout (issue 37).

Issue 37 added the broker's internal topics (``$cluster/...``) to the checks of an incoming
PUBLISH (``Connection._accept_publish``); a topic not starting with ``$`` must not pay for
it. This feeds reads of QoS 0 and QoS 1 PUBLISHes (100 topics ``plant/<n>/valve``, 64-byte
payloads, 200 per read) from one MQTT 5 publisher through ``Connection.received`` into a
core with one QoS 0 subscriber of ``plant/#`` whose output is discarded, and reports
messages per second. No sockets: the machine, routing and delivery encoding only.

Each round is a fresh process. With ``--peer DIR`` the rounds alternate between this
checkout and ``DIR`` (another checkout, e.g. main, built the same way: ``make build`` in
both; run under its own ``.venv/bin/python`` with ``DIR`` as the working directory), and the
ratios are printed (of the medians, of the best rounds, and the median of the ratios of
rounds run one after the other: on a shared machine the paired one is the least noisy)::

    flock /work/bench.lock .venv/bin/python benchmarks/bench_publish_accept.py --peer ../base

``--one`` runs a single round here and prints its rate (what the peer runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())  # the checkout under test (the peer's cwd)

from broker._build import compiled_modules
from broker._config import BrokerConfig
from broker.core._connection import Callbacks, Connection
from broker.core._core import Core
from broker.packets import Connect, Properties, Publish, Subscribe, SubscriptionRequest


def one_round(messages: int, per_read: int = 200) -> float:
    """Messages per second of one round (QoS 0 and 1 alternating by read)."""
    core = Core(BrokerConfig(sys_interval=0))
    sub = Connection(core, Callbacks(lambda _d: None, lambda: None), 0.0)
    sub.received([Connect("sub", protocol_level=5, keep_alive=0)], 0.0)
    sub.received([Subscribe(1, (SubscriptionRequest("plant/#", 0),), Properties())], 0.0)
    pub = Connection(core, Callbacks(lambda _d: None, lambda: None), 0.0)
    pub.received([Connect("pub", protocol_level=5, keep_alive=0)], 0.0)
    core.flush()
    payload = b"x" * 64
    reads = []
    pid = 0
    for r in range(messages // per_read):
        qos = r % 2
        batch = []
        for j in range(per_read):
            packet_id = None
            if qos:
                pid = pid % 65535 + 1
                packet_id = pid
            batch.append(
                Publish(f"plant/{(r * per_read + j) % 100}/valve", payload, qos, packet_id=packet_id)
            )
        reads.append(batch)
    t0 = time.perf_counter()
    for batch in reads:
        pub.received(batch, 0.0)
        core.flush()
    return messages / (time.perf_counter() - t0)


def _round_in(checkout: Path, messages: int) -> float:
    """One round in a fresh process of ``checkout``'s venv, with it as the working directory."""
    out = subprocess.run(
        [
            str(checkout / ".venv/bin/python"),
            str(Path(__file__).resolve()),
            "--one",
            "--messages",
            str(messages),
        ],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    compiled, rate = out.stdout.split()
    print(f"  {checkout.name}: {float(rate):,.0f} msg/s ({compiled} modules compiled)", flush=True)
    return float(rate)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--peer", type=Path, help="another checkout to compare with (same run)")
    ap.add_argument("--one", action="store_true", help="one round, print its rate")
    args = ap.parse_args()
    if args.one:
        print(len(compiled_modules()), f"{one_round(args.messages):.1f}")
        return
    here_dir = Path(__file__).resolve().parent.parent
    here: list[float] = []
    peer: list[float] = []
    for _ in range(args.rounds):
        here.append(_round_in(here_dir, args.messages))
        if args.peer is not None:
            peer.append(_round_in(args.peer.resolve(), args.messages))
    med = statistics.median(here)
    print(f"here: median {med:,.0f} msg/s (rounds: {', '.join(f'{x:,.0f}' for x in here)})")
    if peer:
        pmed = statistics.median(peer)
        print(f"peer {args.peer}: median {pmed:,.0f} msg/s (rounds: {', '.join(f'{x:,.0f}' for x in peer)})")
        pairs = sorted(h / p for h, p in zip(here, peer, strict=True))
        print(
            f"here / peer: medians {med / pmed:.3f}, best rounds {max(here) / max(peer):.3f}, "
            f"paired rounds median {statistics.median(pairs):.3f} (range {pairs[0]:.3f}-{pairs[-1]:.3f})"
        )


if __name__ == "__main__":
    main()
