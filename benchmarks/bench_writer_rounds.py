"""What a round of the bridge's writer process costs the child, committed alone or grouped
(issue 42 item 4b), with a real child interpreter writing real files.

A delivery log of ``--rows`` publications with one delivery each (10 publishers, subscribers
and topics, times 5 us apart, as ``bench_recording.py``) is handed to a real writer process
(``bridge._writerproc.WriterProcess``, the program ``siftmq serve`` runs) ``--rounds`` times,
as the broker's writer thread does every round, in two ways alternated ``--alternations``
times:

* ``every round``: each round committed at once (two Parquet files, their fsyncs, renames and
  directory fsyncs), what the writer process did before grouping;
* ``grouped by G``: ``G - 1`` rounds held by the child (``Job.hold``: their columns copied, the
  answer ``held``) and the ``G``-th committing them all as one group, one file per kind (what
  ``Bridge(writer="process")`` does below ``commit_rows`` rows a round, ``G`` = 4 at the
  default roll interval).

Reported: the child's CPU per round (user + system, from ``/proc`` through psutil), the
sending thread's CPU per round, the files written.  Timing only; nothing is asserted.  Files
go to a temporary directory (``--dir``, default the system's; its filesystem's fsync is part
of what is measured), removed at the end.

    .venv/bin/python benchmarks/bench_writer_rounds.py [--rows 3500] [--rounds 80] [--group 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bridge._schema import Kind  # noqa: E402
from bridge._writer import _Sink  # noqa: E402
from bridge._writerproc import Job, WriterProcess, fanout_payload  # noqa: E402
from broker.core._deliverylog import DeliveryLog  # noqa: E402
from broker.values import Message  # noqa: E402


def _columns(n: int) -> object:
    topics = [f"sat/{i}" for i in range(10)]
    entries = [[(f"s{i}", topics[i], None, 1, False)] for i in range(10)]
    log = DeliveryLog(10**9, 10**9)
    now = time.time()
    for k in range(n):
        i = k % 10
        msg = Message(topics[i], b"x" * 60, 1, False, publisher_id=f"p{i}", message_id=k, received=now)
        log.record(now + k * 5e-6, msg, entries[i], 1)
    return log.take()


def measure(rows: int, rounds: int, group: int, directory: str | None) -> tuple[float, float, int]:
    """(child ms per round, sender ms per round, deliveries files) for rounds grouped by ``group``."""
    d = tempfile.mkdtemp(prefix="bench-writer-rounds-", dir=directory)
    try:
        sink = _Sink(d)
        proc = WriterProcess(d)
        proc.start()
        cols = _columns(rows)

        def job(k: int) -> Job:
            def names(kind: Kind) -> tuple[str, tuple[str, ...]]:
                return kind.value, (sink.next_name(),)

            return Job(
                "fanout",
                fanout_payload(cols),  # type: ignore[arg-type]
                None,
                10**7,
                (names(Kind.DELIVERIES), names(Kind.PUBLICATIONS)),
                ((Kind.DELIVERIES.value, rows), (Kind.PUBLICATIONS.value, rows)),
                2 * rows,
                hold=(k + 1) % group != 0,
                at=time.monotonic(),
            )

        try:
            for k in range(2 * group):  # the child's imports and first allocations: not measured
                proc.run(job(k))
            assert proc.proc is not None
            child = psutil.Process(proc.proc.pid)
            before = os.listdir(os.path.join(d, Kind.DELIVERIES.value))
            t = child.cpu_times()
            c0, s0 = t.user + t.system, time.thread_time()
            for k in range(rounds):
                proc.run(job(k))
            t = child.cpu_times()
            c1, s1 = t.user + t.system, time.thread_time()
            files = len(os.listdir(os.path.join(d, Kind.DELIVERIES.value))) - len(before)
        finally:
            proc.close()
        return (c1 - c0) * 1e3 / rounds, (s1 - s0) * 1e3 / rounds, files
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=3500, help="publications (one delivery each) per round")
    ap.add_argument("--rounds", type=int, default=80, help="measured rounds (a multiple of --group)")
    ap.add_argument("--group", type=int, default=4, help="rounds per commit when grouped")
    ap.add_argument("--alternations", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the landing zone goes (default: the system's temp)")
    a = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"{a.rows} publications + {a.rows} deliveries per round, {a.rounds} rounds, load {load:.1f}")
    for _ in range(a.alternations):
        for group in (1, a.group):
            child, sender, files = measure(a.rows, a.rounds, group, a.dir)
            label = "every round" if group == 1 else f"grouped by {group}"
            print(
                f"{label:12s}: child {child:5.2f} ms/round, sender {sender:5.2f} ms/round, "
                f"{files} deliveries files"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
