"""A process that feeds a Bridge forever (used by the hard-kill test and benchmark).

``python -m tests.bridge.feeder LANDING ROLL_INTERVAL RATE`` writes deliveries with ids 0, 1, 2,
... stamped with the wall clock, about RATE per second, and prints ``tick <id>`` every 1000
records once the first file is committed.  The parent kills it with SIGKILL.
"""

from __future__ import annotations

import sys
import time

from bridge import Bridge
from tests.bridge.records import delivery, feed


def main() -> None:
    landing, roll, rate = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    b = Bridge(landing, roll_interval=roll)
    b.start_writer()
    i = 0
    start = time.monotonic()
    committed = False
    while True:
        for _ in range(100):
            feed(b, delivery(i, time.time()))
            i += 1
        if not committed and b.stats().files > 0:
            committed = True
        if committed and i % 1000 == 0:
            print(f"tick {i}", flush=True)
        ahead = i / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)  # pacing the load generator, not waiting for a condition


if __name__ == "__main__":
    main()
