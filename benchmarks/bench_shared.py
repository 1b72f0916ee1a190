"""Shared subscription routing per strategy (issue 39 item 5) against a peer: the router of
another source tree (by default ``main``, exported with ``git archive``), in the same run.

    .venv/bin/python benchmarks/bench_shared.py [--peer-ref main | --peer-src DIR] \
        [--messages 100000] [--rounds 5]

``--peer-src /work/main`` compares with a tree as it is (compiled if it was built: then build
this tree too, ``make build``, so that both sides run compiled code).

For each group size (2, 16, 256 members of ``$share/g/jobs/#``) it routes ``--messages``
QoS 1 messages on one topic (a cached plan, the steady state) through ``Router.route`` and
prints the median ns per message over ``--rounds`` rounds, each round measuring the peer's
round robin and then every strategy of this tree, each in a fresh process (so both sides run
the same way: pure Python unless the tree was built with ``make build``).  The ratio is this
tree's time over the peer's round robin for the same group size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = (2, 16, 256)
STRATEGIES = ("round_robin", "random", "sticky", "hash_clientid", "hash_topic", "local")


def child(src: str, strategy: str, members: int, messages: int) -> None:
    sys.path.insert(0, src)
    import broker.core._router
    from broker.core._message import Message
    from broker.core._router import Router
    from broker.packets import SubscriptionRequest

    origin = broker.core._router.__file__
    assert origin is not None and origin.startswith(src), (origin, src)  # the tree asked for

    if strategy == "peer":
        router = Router()
    else:
        from broker.core._shared import SharedPolicy, Strategy

        router = Router(shared=SharedPolicy(Strategy(strategy), seed=1))
    for i in range(members):
        ok = router.subscribe(f"m{i}", {}, SubscriptionRequest("$share/g/jobs/#", 1), None, None)
        assert ok.ok
    msgs = [Message("jobs/1", b"x", 1, False, publisher_id=f"p{i % 7}") for i in range(messages)]
    route = router.route
    for m in msgs[:1000]:  # the plan is built on the second miss
        route(m)
    t0 = time.perf_counter_ns()
    for m in msgs:
        route(m)
    elapsed = time.perf_counter_ns() - t0
    print(elapsed / messages)


def run(src: Path, strategy: str, members: int, messages: int) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(src), strategy, str(members), str(messages)],
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},  # the peer tree is only read
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer-ref", default="main")
    ap.add_argument("--peer-src", type=Path, help="an existing tree (a built main) instead")
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--child", nargs=4, metavar=("SRC", "STRATEGY", "MEMBERS", "MESSAGES"))
    args = ap.parse_args()
    if args.child:
        src, strategy, members, messages = args.child
        child(src, strategy, int(members), int(messages))
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.peer_src is not None:
            peer = args.peer_src.resolve()
        else:
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.peer_ref], check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            peer = Path(tmp)
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds):
            for n in SIZES:
                times.setdefault(("peer", n), []).append(run(peer, "peer", n, args.messages))
                for s in STRATEGIES:
                    times.setdefault((s, n), []).append(run(ROOT, s, n, args.messages))
    print(f"ns per routed message, median of {args.rounds} rounds ({args.messages} messages each)")
    print(f"{'strategy':<16}" + "".join(f"{n:>10} members   ratio" for n in SIZES))
    for s in ("peer", *STRATEGIES):
        name = str(args.peer_src or args.peer_ref) + " (rr)" if s == "peer" else s
        row = f"{name:<16}"
        for n in SIZES:
            t = statistics.median(times[s, n])
            base = statistics.median(times["peer", n])
            row += f"{t:>18.0f}  {t / base:>6.2f}"
        print(row)


if __name__ == "__main__":
    main()
