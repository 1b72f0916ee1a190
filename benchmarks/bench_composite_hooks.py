"""What recording composite subscriptions costs the broker (issue 16 item 5).

The compiled sans-IO core of ``bench_composite.py --broker`` (real ``Connection`` objects
encoding every PUBLISH, counting transports, N composite subscriptions of the paper's workload
``(A|B)&(C|D)`` over 100 kinds, a plain subscriber on ``kind/#``), built three times, fed the
same QoS 0 publications 1 ms apart, alternately per round:

* **none**: no hook;
* **bridge without composite**: the :class:`bridge.Bridge` (writer thread running, landing zone
  in a temporary directory) with its three composite methods reset to the ``Hooks`` defaults,
  i.e. what the bridge cost before composite records existed (deliveries of composite events
  are recorded by the delivery log in both bridge variants);
* **bridge**: the bridge as shipped, recording composite changes, events and losses.

Two streams: *uniform* (each publication completes many composite events: the per-event cost
of building a ``CompositeEventRecord``, settling the firing subscription for its occupancy and
appending it) and *one kind* (completions rare: shows that a publication with no composite event
pays nothing for the composite hooks).  The rate is publications per second (total / time).
The bridges' writer threads run as in a broker (a round every 0.5 s, taking the GIL to
convert rows); after each run the bridge commits what it still buffers, untimed, so its writer
does not run into the next variant's run (fsync latency is not CPU the broker loses), and the
order of the variants rotates per round.
The sweep of idle subscriptions (``Composites.tick``, from the broker's timer) is not run here;
its cost is timed separately: the ticks of one round over every subscription
(``SWEEP_BUDGET`` subscriptions settled per tick; the first also lists them).  The *one kind*
stream has 10 x ``--pubs`` publications per round (its runs would be too short to time).

Usage::

    .venv/bin/python benchmarks/bench_composite_hooks.py [--subs 5000] [--pubs 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_composite as bc

from bridge import Bridge
from broker.core._composite import SWEEP_BUDGET
from broker.hooks import Hooks


class BridgeWithoutComposite(Bridge):
    """The bridge before composite records: the composite methods are the no-op defaults."""

    on_composite_change = Hooks.on_composite_change
    on_composite_event = Hooks.on_composite_event
    on_composite_loss = Hooks.on_composite_loss


def core_with(exprs: list[str], hooks: list[Hooks]) -> tuple[Any, Any]:
    """``bench_composite.broker_core`` with ``hooks`` registered once it is built (its Core is
    built without any: the subscriptions are made before the hooks observe)."""
    from broker.core._observers import Observers

    core, pub, _ = bc.broker_core(exprs)
    core.obs = Observers(hooks)
    core.composite._observe()
    for h in hooks:
        if isinstance(h, Bridge):
            h.start_writer()
    return core, pub


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subs", type=int, default=5000)
    ap.add_argument("--pubs", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-composite-hooks-"))
    exprs = bc.workload(args.subs)
    bridges = [BridgeWithoutComposite(tmp / "plain"), Bridge(tmp / "composite")]
    variants = {
        "none": core_with(exprs, []),
        "bridge without composite": core_with(exprs, [bridges[0]]),
        "bridge": core_with(exprs, [bridges[1]]),
    }
    owner = {"bridge without composite": bridges[0], "bridge": bridges[1]}
    gc.collect()
    gc.freeze()
    rnd = random.Random(5)
    streams = {
        "one kind": ["kind/7"] * (10 * args.pubs),  # 10x: each run is short otherwise
        "uniform": [f"kind/{rnd.randrange(bc.KINDS)}" for _ in range(args.pubs)],
    }
    clock = [1.0]

    def wall() -> float:
        return clock[0]

    for core, _ in variants.values():
        core.clock.wall = wall
    from broker.packets import Publish

    def run(core: Any, pub: Any, topics: list[str], start: float, bridge: Bridge | None) -> float:
        clock[0] = start  # every variant sees the same times
        packets = [Publish(t, b'{"v": 1}', 0) for t in topics]
        received = pub.received
        flush = core.flush
        t0 = time.perf_counter()
        for packet in packets:
            clock[0] += 0.001
            received([packet], 0.0)
            flush()
        took = time.perf_counter() - t0
        if bridge is not None:
            bridge.flush()  # what it buffered is committed before the next variant runs
        return took

    print(
        f"bench_composite_hooks: {args.subs} composite subscriptions, {args.pubs} publications x "
        f"{args.rounds} rounds per stream and variant"
    )
    print("| stream | variant | publications/s | vs none | composite events per publication |")
    print("|---|---|---|---|---|")
    start = 1000.0
    for stream, topics in streams.items():
        spent = dict.fromkeys(variants, 0.0)
        events = dict.fromkeys(variants, 0)
        names = list(variants)
        for r in range(args.rounds):
            start += 200.0  # past every window: each round starts with the same empty buffers
            for name in names[r % 3 :] + names[: r % 3]:  # rotated: no variant always last
                core, pub = variants[name]
                before = core.composite.events
                spent[name] += run(core, pub, topics, start, owner.get(name))
                events[name] += core.composite.events - before
            start = clock[0]
        total = len(topics) * args.rounds
        base = total / spent["none"]
        for name in variants:
            rate = total / spent[name]
            print(f"| {stream} | {name} | {rate:,.0f} | {rate / base:.3f} | {events[name] / total:.2f} |")
    gc.unfreeze()
    core, _ = variants["bridge"]
    comp = core.composite
    ticks = []
    for _ in range(max(1, -(-len(exprs) // SWEEP_BUDGET))):  # one round over every subscription
        t0 = time.perf_counter()
        comp.tick()
        ticks.append(time.perf_counter() - t0)
    print(
        f"Composites.tick (sweep of {SWEEP_BUDGET} subscriptions), {len(ticks)} ticks = one round: "
        f"mean {sum(ticks) / len(ticks) * 1e3:.2f} ms, first {ticks[0] * 1e3:.2f} ms (starts the round), "
        f"max of the others {max(ticks[1:], default=0.0) * 1e3:.2f} ms"
    )
    for b in bridges:
        b.close()
    shutil.rmtree(tmp, ignore_errors=True)
    written = bridges[1].stats().written
    rows = {k: written[k] for k in ("composite_events", "composite_losses")}
    print("bridge rows:", " ".join(f"{k}={v}" for k, v in rows.items()))


if __name__ == "__main__":
    main()
