"""Long nemesis runs by hand (issue 30; results in docs/fault.md):

    sudo .venv/bin/python benchmarks/nemesis.py --nodes 5 --cycles 100 --seed 30

N ``siftmq serve`` nodes each in its own network namespace on a bridge this script creates,
paho clients in the namespaces, random faults from the seed (``tests/nemesis/_run.py``), and
the checker's report over the whole history as JSON on stdout (``--out`` also writes it and
the history).  Needs root, iproute2 and nftables.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.nemesis import _net
from tests.nemesis._run import FAULTS, Options, run, summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5)
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--seed", type=int, default=30)
    ap.add_argument("--fault-s", type=float, default=6.0, help="seconds each fault is held")
    ap.add_argument("--settle-s", type=float, default=4.0, help="seconds after each heal")
    ap.add_argument("--rate", type=float, default=20.0, help="messages/s per publisher (2 per node)")
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--failure-timeout", type=float, default=2.0, help="cluster_failure_timeout")
    ap.add_argument("--refresh", type=float, default=1.0, help="cluster_refresh")
    ap.add_argument(
        "--max-queued-messages",
        type=int,
        default=100_000,
        help="max_queued_messages of every node (a queue must hold what a restart brings at once)",
    )
    ap.add_argument(
        "--stock-paho",
        action="store_true",
        help="paho's own client, without the harness's fix of its QoS 2 resend (tests/nemesis/_cluster.py)",
    )
    ap.add_argument("--out", type=Path, default=None, help="write the summary and faults here (JSON)")
    ap.add_argument("--history", action="store_true", help="--out gets every event (large)")
    ap.add_argument("--keep", type=Path, default=None, help="run in this directory and keep it (logs)")
    args = ap.parse_args()
    faulthandler.register(signal.SIGUSR1)  # kill -USR1: where every thread is
    signal.signal(signal.SIGTERM, lambda *_a: sys.exit(3))  # kill: the cleanup still runs
    why = _net.why_not()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    serve = (
        f"cluster_refresh = {args.refresh}\ncluster_failure_timeout = {args.failure_timeout}\n"
        "cluster_peer_expiry = 300\n"
    )
    opts = Options(
        nodes=args.nodes,
        cycles=args.cycles,
        seed=args.seed,
        fault_s=args.fault_s,
        settle_s=args.settle_s,
        rate=args.rate,
        faults=tuple(args.faults.split(",")),
        serve=serve,
        broker=f"max_queued_messages = {args.max_queued_messages}\n",
        final_wait_s=60.0,
        stock_paho=args.stock_paho,
        log=lambda s: print(time.strftime("%H:%M:%S"), s, file=sys.stderr, flush=True),
    )
    if args.keep is not None:  # data directories and node logs kept for a post-mortem
        args.keep.mkdir(parents=True, exist_ok=True)
        res = run(args.keep, opts)
    else:
        with tempfile.TemporaryDirectory(prefix="nemesis-") as tmp:
            res = run(Path(tmp), opts)
    out = summary(res, opts)
    for tb in res.tracebacks:
        print(tb, file=sys.stderr)
    out["started_utc"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime(time.time() - res.wall_s))
    out["command"] = " ".join(sys.argv)
    print(json.dumps(out, indent=1))
    if args.out is not None:  # the history without the data events unless --history
        events = [e for e in res.history.events if args.history or e[1] not in ("pub", "ack", "recv")]
        args.out.write_text(json.dumps({"summary": out, "history": events}, indent=0))
    return 0 if res.report.ok and not res.tracebacks else 1


if __name__ == "__main__":
    sys.exit(main())
