"""What a lone PUBLISH costs the sans-IO core, in instructions: an A/B that the machine's noise
does not move.

``bench_brokers.py``'s pairs on this shared 2-core machine move by 10-30 % between two runs of
one build when other work shares the cores; a change of a few attribute reads per message on
``Core.publish`` (the streamed routing of a big lone fan-out, docs/performance-content.md,
"Routing streamed into the delivery") cannot be seen there. This counts it instead: a
:class:`broker.core.Core` with one publisher and ``--subscribers`` plain subscribers (QoS 0,
no content filter: ``bench_brokers.py``'s one-to-one and fan-out shapes), ``--messages``
PUBLISHes each read alone (``Connection.received`` of one packet, then ``Core.flush``, into
transports that only count), at QoS 0 and QoS 1.

    .venv/bin/python benchmarks/bench_lone_publish.py --trees /work/main,/work/wt-fanout7 --callgrind

``--callgrind`` runs each tree's measurement under ``valgrind --tool=callgrind`` twice (``N``
and ``2 N`` messages) and prints the instructions per message (the difference over ``N``: start-up
and setup cancel out); without it, the CPU time per message (``time.process_time``) in this
process, with whatever tree ``PYTHONPATH`` selects.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path


def measure(subscribers: int, messages: int, qos: int) -> float:
    """CPU seconds for ``messages`` lone PUBLISHes (after 200 of warm-up)."""
    from broker._config import BrokerConfig
    from broker.core._connection import Callbacks, Connection
    from broker.core._core import Core
    from broker.packets import Connect, Puback, Publish, Subscribe, SubscriptionRequest

    core = Core(BrokerConfig(sys_interval=0))
    sent = [0]

    def write(data: bytes) -> None:
        sent[0] += 1

    for i in range(subscribers):
        conn = Connection(core, Callbacks(write, lambda: None), 0.0, f"s{i}")
        conn.received([Connect(f"s{i}", protocol_level=5, keep_alive=0)], 0.0)
        conn.received([Subscribe(1, (SubscriptionRequest("bench/t", qos),))], 0.0)
    pub = Connection(core, Callbacks(write, lambda: None), 0.0, "pub")
    pub.received([Connect("pub", protocol_level=5, keep_alive=0)], 0.0)
    core.flush()
    subs = [c for c in core.connections if c is not pub]
    payload = b'{"temp": 21.5, "site": "site-07"}'

    def one(j: int) -> None:
        pid = j % 60000 + 1 if qos else None
        pub.received([Publish("bench/t", payload, qos, packet_id=pid)], 0.0)
        core.flush()
        if qos:  # the subscribers acknowledge, each in a read of its own
            for c in subs:
                s = c.session
                assert s is not None
                for spid in list(s.inflight):
                    c.received([Puback(spid)], 0.0)
            core.flush()

    for j in range(200):
        one(j)
    t = time.process_time()
    for j in range(messages):
        one(j)
    return time.process_time() - t


def _instructions(tree: str, args: argparse.Namespace, messages: int, qos: int) -> int:
    env = {**os.environ, "PYTHONPATH": tree}
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--subscribers",
        str(args.subscribers),
        "--messages",
        str(messages),
        "--qos",
        str(qos),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd="/")
    m = re.search(r"Collected : (\d+)", out.stderr)
    if m is None:
        raise RuntimeError(out.stderr[-2000:])
    return int(m.group(1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--subscribers", type=int, default=1)
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--qos", default="0,1", help="comma-separated QoS levels (0, 1)")
    ap.add_argument("--trees", default="", help="--callgrind: comma-separated source trees")
    ap.add_argument("--callgrind", action="store_true", help="instructions per message, per tree")
    args = ap.parse_args(argv)
    try:
        levels = [int(q) for q in args.qos.split(",")]
    except ValueError:
        ap.error(f"--qos: not a list of 0 and 1: {args.qos!r}")
    if not set(levels) <= {0, 1} or args.messages < 1 or args.subscribers < 1:
        ap.error("--qos 0 and/or 1, --messages and --subscribers at least 1")
    if not args.callgrind:
        for qos in levels:
            s = measure(args.subscribers, args.messages, qos)
            print(json.dumps({"qos": qos, "us_per_message": round(s * 1e6 / args.messages, 3)}))
        return
    trees = [t for t in args.trees.split(",") if t]
    if not trees or not all((Path(t) / "broker").is_dir() for t in trees):
        ap.error("--callgrind needs --trees: source trees holding broker/")
    n = args.messages
    for qos in levels:
        for tree in trees:
            a = _instructions(tree, args, n, qos)
            b = _instructions(tree, args, 2 * n, qos)
            print(
                json.dumps(
                    {
                        "tree": tree,
                        "qos": qos,
                        "subscribers": args.subscribers,
                        "instructions_per_message": round((b - a) / n),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
