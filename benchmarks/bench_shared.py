"""Shared subscription routing per strategy (issue 39 item 5) against a peer: the router of
another source tree (by default ``main``, exported with ``git archive``), in the same run.

    .venv/bin/python benchmarks/bench_shared.py [--peer-ref main | --peer-src DIR] \
        [--messages 100000] [--rounds 5] [--path plan|direct|peer] [--strategies round_robin,...]

``--peer-src /work/main`` compares with a tree as it is (compiled if it was built: then build
this tree too, ``make build``, so that both sides run compiled code).

For each group size (2, 16, 256 members of ``$share/g/jobs/#``) it routes ``--messages``
QoS 1 messages on one topic (a cached plan, the steady state) through ``Router.route`` and
prints the median ns per message over ``--rounds`` rounds, each round measuring the peer's
round robin and then every strategy of this tree, each in a fresh process (so both sides run
the same way: pure Python unless the tree was built with ``make build``).  The ratio is this
tree's time over the peer's round robin for the same group size.

``--path direct``: every message on a topic of its own (``jobs/<i>``), so none has a routing
plan (``Router._route_direct``); ``--path peer``: every message as another cluster node's
forward for the group (``Router.route_peer``).  Both built the group's members once per message
before the groups were kept (``broker.core._shared.Groups``).
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


def child(src: str, strategy: str, members: int, messages: int, path: str) -> None:
    sys.path.insert(0, src)
    import broker.core._router
    from broker.core._router import Router
    from broker.packets import SubscriptionRequest
    from broker.values import Message

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
    topic = (lambda i: f"jobs/{i}") if path == "direct" else (lambda i: "jobs/1")
    msgs = [Message(topic(i), b"x", 1, False, publisher_id=f"p{i % 7}") for i in range(messages)]
    route = router.route
    if path == "peer":
        groups = {("g", "jobs/#")}

        def route(m: Message) -> object:
            return router.route_peer(m, False, groups)

    for m in msgs[:1000]:  # the plan is built on the second miss
        route(m)
    t0 = time.perf_counter_ns()
    for m in msgs:
        route(m)
    elapsed = time.perf_counter_ns() - t0
    print(elapsed / messages)


def run(src: Path, strategy: str, members: int, messages: int, path: str) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(src), strategy, str(members), str(messages), path],
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
    ap.add_argument("--path", choices=("plan", "direct", "peer"), default="plan")
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated")
    ap.add_argument("--child", nargs=5, metavar=("SRC", "STRATEGY", "MEMBERS", "MESSAGES", "PATH"))
    args = ap.parse_args()
    if args.child:
        src, strategy, members, messages, path = args.child
        child(src, strategy, int(members), int(messages), path)
        return
    strategies = [s for s in args.strategies.split(",") if s]
    assert all(s in STRATEGIES for s in strategies), strategies
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
                times.setdefault(("peer", n), []).append(run(peer, "peer", n, args.messages, args.path))
                for s in strategies:
                    times.setdefault((s, n), []).append(run(ROOT, s, n, args.messages, args.path))
    print(
        f"ns per routed message ({args.path}), median of {args.rounds} rounds ({args.messages} messages each)"
    )
    print(f"{'strategy':<16}" + "".join(f"{n:>10} members   ratio" for n in SIZES))
    for s in ("peer", *strategies):
        name = str(args.peer_src or args.peer_ref) + " (rr)" if s == "peer" else s
        row = f"{name:<16}"
        for n in SIZES:
            t = statistics.median(times[s, n])
            base = statistics.median(times["peer", n])
            row += f"{t:>18.0f}  {t / base:>6.2f}"
        print(row)


if __name__ == "__main__":
    main()
