"""Cost of message hooks (issue 39, item 3) on the PUBLISH path, main vs this tree in one run.

A micro-benchmark of the sans-IO core (no sockets, no event loop): one publisher
:class:`~broker.core._connection.Connection` is fed PUBLISH packets in reads of 64 (QoS 0 or
QoS 1, 64-byte payloads, 16 topics), one subscriber connection subscribed to ``b/#`` (QoS 0)
receives them; the transports discard the bytes.  Measured: PUBLISHes per CPU second of the
process (``time.process_time``) over ``--messages`` PUBLISHes, after a warm-up.

Variants, each in its own child process, interleaved over ``--rounds`` rounds (the machine is
noisy: the median of each variant and ratios to ``branch/none`` of the same run are reported):

* ``base/none``: the tree at ``--base-root`` (e.g. ``git archive main | tar -x -C /tmp/main``),
  no hook: the PUBLISH path before message hooks existed;
* ``branch/none``: this tree, no hook (the path tests one empty list);
* ``branch/identity``: an ``on_publish`` hook that returns None (keep);
* ``branch/rewrite``: an ``on_publish`` hook that replaces the topic and payload.

Both trees run pure Python, or both compiled (``make build`` in each) -- the script reports
which.  Usage::

    flock /work/bench.lock .venv/bin/python benchmarks/bench_hooks.py --base-root /tmp/main \
        [--messages 200000] [--rounds 5] [--qos 0,1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
from broker._config import BrokerConfig
from broker.core._connection import Callbacks, Connection
from broker.core._core import Core
from broker.packets import Connect, Properties, Publish, Subscribe, SubscriptionRequest
import broker.hooks as H

hook, qos, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hooks = []
if hook == "identity":
    class Identity(H.Hooks):
        def on_publish(self, ctx):
            return None
    hooks = [Identity()]
elif hook == "rewrite":
    class Rewrite(H.Hooks):
        def on_publish(self, ctx):
            return H.PublishDecision.replace(topic="b/r/" + ctx.topic[2:], payload=ctx.payload[::-1])
    hooks = [Rewrite()]

def sink(data):
    pass

def close():
    pass

core = Core(BrokerConfig(sys_interval=0), hooks)
sub = Connection(core, Callbacks(sink, close), 0.0, "sub")
sub.received([Connect("sub", protocol_level=5, keep_alive=0)], 0.0)
sub.received([Subscribe(1, (SubscriptionRequest("b/#", 0),), Properties())], 0.0)
pub = Connection(core, Callbacks(sink, close), 0.0, "pub")
pub.received([Connect("pub", protocol_level=5, keep_alive=0)], 0.0)
core.flush()
payload = bytes(range(64))
reads = []
pid = 0
for r in range(64):
    batch = []
    for i in range(64):
        pid = pid % 65535 + 1
        batch.append(Publish(f"b/{(r * 64 + i) % 16}", payload, qos, False, False, pid if qos else None))
    reads.append(batch)

def run(count):
    k = 0
    for _ in range(count // 64):
        pub.received(reads[k], 1.0)
        core.flush()
        k = (k + 1) & 63

run(20000)  # warm-up
t0 = time.process_time()
run(n)
cpu = time.process_time() - t0
import broker._build as b
print(json.dumps({"per_cpu_s": n / cpu, "compiled": bool(b.compiled_modules())}))
"""


def one(root: Path, hook: str, qos: int, n: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, hook, str(qos), str(n)],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-root", required=True, help="the tree before the change (its broker/ package)")
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--qos", default="0,1")
    a = ap.parse_args()
    base = Path(a.base_root).resolve()
    variants = [("base", "none"), ("branch", "none"), ("branch", "identity"), ("branch", "rewrite")]
    for qos in (int(q) for q in a.qos.split(",")):
        got: dict[str, list[float]] = {f"{t}/{h}": [] for t, h in variants}
        compiled: set[bool] = set()
        for _ in range(a.rounds):
            for tree, hook in variants:
                r = one(base if tree == "base" else HERE, hook, qos, a.messages)
                got[f"{tree}/{hook}"].append(r["per_cpu_s"])
                compiled.add(bool(r["compiled"]))
        ref = statistics.median(got["branch/none"])
        print(f"QoS {qos}, {a.messages} PUBLISHes x {a.rounds} rounds, compiled={sorted(compiled)}")
        for name, values in got.items():
            med = statistics.median(values)
            print(f"  {name:18s} {med:10.0f} PUBLISH/CPU s   ratio to branch/none {med / ref:.3f}")


if __name__ == "__main__":
    main()
