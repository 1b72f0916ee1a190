"""Cost of the core's housekeeping tick with many idle connections (issue 27, item 2).

Sans-IO: a ``Core`` with N connections driven by plain callables (no sockets), each
CONNECTed (MQTT 3.1.1, clean session, keep-alive 60 s) with one subscription to its own
topic and then idle, each sending a PINGREQ once per keep-alive (spread evenly). The
simulated clock advances by the tick interval (0.25 s) for ``--seconds`` of simulated time
and each ``Core.tick`` is timed (wall time of the call). For comparison, in the same run:
the per-tick scan of every connection that the timer wheel replaced (the same ``check`` on
every connection, as ``Core.tick`` did before), timed over the same ticks.

    .venv/bin/python benchmarks/bench_tick.py --connections 19000 --seconds 120

Results: docs/performance-connections.md ("Housekeeping tick").
"""

from __future__ import annotations

import argparse
import statistics
import time

from broker._config import BrokerConfig
from broker.core._clock import ManualClock
from broker.core._connection import Callbacks, Connection
from broker.core._conntimers import check
from broker.core._core import Core
from broker.packets import Connect, Pingreq, Subscribe, SubscriptionRequest


def _nothing(*_: object) -> None:
    """The writer and closer of a connection without a socket."""


def build(n: int, keep_alive: int) -> tuple[Core, ManualClock, list[Connection]]:
    clock = ManualClock()
    core = Core(BrokerConfig(sys_interval=0), clock=clock)
    conns = []
    for i in range(n):
        c = Connection(core, Callbacks(_nothing, _nothing), 0.0, f"peer{i}")
        c.received([Connect(f"dev{i}", 4, keep_alive=keep_alive)], 0.0)
        c.received([Subscribe(1, (SubscriptionRequest(f"dev/{i}/cmd", 1),))], 0.0)
        conns.append(c)
    core.flush()
    return core, clock, conns


def run(n: int, seconds: float, keep_alive: int) -> None:
    core, clock, conns = build(n, keep_alive)
    step = core.config.tick_interval
    ticks = int(seconds / step)
    per_tick = n * step / keep_alive  # PINGREQs per tick, spread over the keep-alive period
    wheel: list[float] = []
    scan: list[float] = []
    sent = 0.0
    cursor = 0
    for _ in range(ticks):
        now = clock.advance(step)
        sent += per_tick
        while sent >= 1:  # the devices' PINGREQs of this tick, round robin
            sent -= 1
            conns[cursor % n].received([Pingreq()], now)
            cursor += 1
        t0 = time.perf_counter()
        core.tick(now)
        wheel.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for c in list(core.connections):  # what Core.tick did before the wheel
            check(c, now)
        scan.append(time.perf_counter() - t0)
        core.flush()
    print(f"{n} idle connections, keep-alive {keep_alive} s, {ticks} ticks of {step} s")
    for name, xs in (("timer wheel (Core.tick)", wheel), ("scan of every connection (before)", scan)):
        print(
            f"  {name}: mean {statistics.fmean(xs) * 1e6:,.1f} us, p99 "
            f"{sorted(xs)[int(0.99 * (len(xs) - 1))] * 1e6:,.1f} us, max {max(xs) * 1e6:,.1f} us per tick"
        )
    print(f"  connections still open: {len(core.connections)} (none timed out)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=19_000)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--keep-alive", type=int, default=60)
    a = ap.parse_args()
    run(a.connections, a.seconds, a.keep_alive)


if __name__ == "__main__":
    main()
