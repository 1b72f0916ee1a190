"""The outbound bridge's PUBACK: ``uplink._bridge._puback`` (four bytes built by hand) against the
protocol codec (``broker.packets.encode(Puback(pid), version)``), measured in the same run.

    flock /work/bench.lock .venv/bin/python benchmarks/bench_uplink_puback.py

after ``make build`` (the codec compiled with mypyc, as in the wheel; the script says how many
modules run compiled).  The relay sends one PUBACK per QoS 1 message it passes on (a remote's
PUBACK of an ``out`` message to the local broker, the local broker's of an ``in`` message to
the remote), so the difference is paid per relayed message; docs/bridging-out.md
("Performance") has the edge's whole CPU cost per message (about 11 us in memory) to set it
against.  Prints the best of 7 repeats of 200,000 calls, per call, for each, twice.
"""

from __future__ import annotations

import timeit
from collections.abc import Callable

from broker._build import compiled_modules
from broker.packets import Puback, encode
from uplink._bridge import _puback

N = 200_000
PID = 4242


def best(fn: Callable[[], object]) -> float:
    """Best of 7 repeats: nanoseconds per call."""
    return min(timeit.repeat(fn, number=N, repeat=7)) / N * 1e9


def main() -> None:
    print(f"compiled modules: {len(compiled_modules())}")
    assert _puback(PID) == encode(Puback(PID), 5) == encode(Puback(PID), 4)
    for _ in range(2):
        hand = best(lambda: _puback(PID))
        v5 = best(lambda: encode(Puback(PID), 5))
        v4 = best(lambda: encode(Puback(PID), 4))
        print(f"_puback {hand:.0f} ns | codec MQTT 5 {v5:.0f} ns ({v5 / hand:.2f}x) | "
              f"codec 3.1.1 {v4:.0f} ns ({v4 / hand:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
