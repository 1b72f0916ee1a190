"""What recording deliveries for the bridge costs, per publication (issue 27 item 7), in one process.

Two halves, each against a peer measured alternately in the same process, and the log alone:

* ``loop``: the event-loop side. A ``Core`` fed in-process (no sockets): 10 publishers and 10
  subscribers (MQTT 3.1.1, clean sessions, QoS 1, one topic per pair, the subscribers
  acknowledging every delivery), with no hook against a hook that hands the core a
  ``DeliveryLog`` (the bridge's form: the compiled core appends each publication's fields and
  its deliveries to the log's columns; the log is emptied every 50,000 publications as the
  writer would).  Reported: ns per publication for both and the difference.
* ``log``: the log's own calls for a fan-out of one delivery (``begin``, ``delivered``,
  ``end``: what the compiled core calls), made from a Python loop, against the same loop
  calling a no-op, with ``--clients`` publisher/subscriber pairs interleaved (one row each in
  turn, as a broker's event loop handles its clients' packets; 1: the same pair every row).
  Reported: ns per publication over the no-op loop (issue 42 item 4b, session 18: the string
  tables' lookups).
* ``writer``: the writer thread's side. A round of ``--round`` publications with one delivery
  each, recorded into a ``DeliveryLog``, turned into the two tables (``_fanout_tables``) and
  encoded as the two Parquet files in memory, with the bridge's settings (statistics on the
  scalar columns) against statistics on every column (pyarrow's default).  Reported: ns per
  publication, best of ``--reps`` rounds (the rounds' first, cold one apart).

Run from a checkout with its own ``.venv`` (``--root`` puts another checkout first on the
path, e.g. the commit before a change, run with that checkout's interpreter):

    .venv/bin/python benchmarks/bench_recording.py [--publications 200000] [--round 55000] [--root DIR]
        [--clients 10] [--parts loop,log,writer]

Times are the CPU time of the measuring thread (``time.thread_time``), so that other processes
on a shared machine shift them less than wall time would.  Timing only; nothing is asserted.
No network, no files.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _imports(root: Path) -> dict[str, Any]:
    sys.path.insert(0, str(root))
    import pyarrow.parquet as pq

    from bridge import _writer
    from bridge._schema import Kind
    from broker._config import BrokerConfig
    from broker.core import _connection
    from broker.core._connection import Connection
    from broker.core._core import Core
    from broker.core._deliverylog import DeliveryLog
    from broker.hooks import Hooks
    from broker.packets import Connect, Properties, Puback, Publish, Subscribe, SubscriptionRequest
    from broker.values import Message

    return {
        "pq": pq,
        "_writer": _writer,
        "Kind": Kind,
        "BrokerConfig": BrokerConfig,
        "Connection": Connection,
        "Callbacks": getattr(_connection, "Callbacks", None),
        "Core": Core,
        "DeliveryLog": DeliveryLog,
        "Message": Message,
        "Hooks": Hooks,
        "Connect": Connect,
        "Properties": Properties,
        "Puback": Puback,
        "Publish": Publish,
        "Subscribe": Subscribe,
        "SubscriptionRequest": SubscriptionRequest,
    }


def loop_side(m: dict[str, Any], n: int, with_log: bool) -> float:
    """ns per publication of the core with or without a delivery log."""

    class Recorder(m["Hooks"]):  # type: ignore[misc]
        def __init__(self) -> None:
            self.log = m["DeliveryLog"](10**9, 10**9)

        def delivery_log(self) -> Any:
            return self.log

    rec = Recorder() if with_log else None
    core = m["Core"](m["BrokerConfig"](sys_interval=0), [rec] if rec is not None else [])
    pubs, subs = [], []

    def conn() -> Any:
        if m["Callbacks"] is not None:  # Connection(core, link, now, peer)
            return m["Connection"](core, m["Callbacks"](lambda _d: None, lambda: None), 0.0, "bench")
        return m["Connection"](core, lambda _d: None, lambda: None, 0.0, "bench")

    for i in range(10):
        s = conn()
        s.received([m["Connect"](f"s{i}", protocol_level=4, keep_alive=0)], 0.0)
        s.received([m["Subscribe"](1, (m["SubscriptionRequest"](f"sat/{i}", 1),), m["Properties"]())], 0.0)
        p = conn()
        p.received([m["Connect"](f"p{i}", protocol_level=4, keep_alive=0)], 0.0)
        pubs.append(p)
        subs.append(s)
    core.flush()
    payload = b'{"ts":1000000000000000000,"seq":0000000001,"pad":"xxxxxxxxxxxxxxxxxxxx"}'
    packets = [m["Publish"](f"sat/{i}", payload, 1, packet_id=1) for i in range(10)]
    sessions = [core.sessions[f"s{i}"] for i in range(10)]
    puback = m["Puback"]
    t0 = time.thread_time()
    for k in range(n):
        i = k % 10
        pubs[i].received([packets[i]], 1.0)
        for pid in list(sessions[i].inflight):
            subs[i].received([puback(pid)], 1.0)
        if k % 100 == 99:
            core.flush()
        if rec is not None and k % 50_000 == 49_999:
            rec.log.take()
    core.flush()
    return (time.thread_time() - t0) / n * 1e9


def log_side(m: dict[str, Any], n: int, clients: int) -> tuple[float, float]:
    """(ns per publication of the log's calls, of the same loop calling a no-op)."""
    msgs = [
        m["Message"](f"sat/{i}", b"x" * 60, 1, False, publisher_id=f"p{i}", message_id=i, received=1.0)
        for i in range(clients)
    ]
    subs = [f"s{i}" for i in range(clients)]
    filters = [f"sat/{i}" for i in range(clients)]

    def nop(*_a: Any) -> int:
        return -1

    def run(begin: Any, delivered: Any, end: Any, take: Any) -> float:
        t0 = time.thread_time()
        for k in range(n):
            i = k % clients
            outer = begin(msgs[i])
            delivered(subs[i], filters[i], None, 1, False)
            end(outer, 2.0, 1)
            if k % 50_000 == 49_999:
                take()
        return (time.thread_time() - t0) / n * 1e9

    log = m["DeliveryLog"](10**9, 10**9)
    return run(log.begin, log.delivered, log.end, log.take), run(nop, nop, nop, nop)


def writer_side(m: dict[str, Any], n: int, reps: int, all_statistics: bool) -> tuple[float, float]:
    """(ns per publication to build both tables, ns to encode both Parquet files), best rounds."""
    w, kind, pq = m["_writer"], m["Kind"], m["pq"]
    stats = getattr(w, "_STATISTICS", None)
    topics = [f"sat/{i}" for i in range(10)]
    entries = [[(f"s{i}", topics[i], None, 1, False)] for i in range(10)]
    build = encode = float("inf")
    for r in range(reps + 1):
        log = m["DeliveryLog"](10**9, 10**9)
        now = time.time()
        for k in range(n):
            i = k % 10
            msg = m["Message"](
                topics[i], b"x" * 60, 1, False, publisher_id=f"p{i}", message_id=k, received=now
            )
            # times a few microseconds apart, as in a broker (not one value for the whole round)
            log.record(now + k * 5e-6, msg, entries[i], 1)
        cols = log.take()
        a = time.thread_time()
        deliveries, pubs = w._fanout_tables(cols, None)
        b = time.thread_time()
        for k, table in ((kind.DELIVERIES, deliveries), (kind.PUBLICATIONS, pubs)):
            options = getattr(w, "_OPTIONS", None)  # the bridge's options (session 11)
            opts: dict[str, Any] = (
                dict(options[k]) if options is not None else {"use_dictionary": w._DICTIONARY[k]}
            )
            if all_statistics:
                opts.pop("write_statistics", None)
            elif stats is not None:
                opts["write_statistics"] = stats[k]
            pq.write_table(table, io.BytesIO(), **opts)
        c = time.thread_time()
        if r:  # the first round is cold (allocator, caches): left out
            build, encode = min(build, b - a), min(encode, c - b)
    return build / n * 1e9, encode / n * 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--publications", type=int, default=200_000, help="per loop-side measurement")
    ap.add_argument("--round", type=int, default=55_000, help="publications per writer round")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--alternations", type=int, default=3)
    ap.add_argument("--root", default=str(ROOT), help="checkout to import siftmq from")
    ap.add_argument("--clients", type=int, default=10, help="log: interleaved publisher/subscriber pairs")
    ap.add_argument("--parts", default="loop,log,writer")
    a = ap.parse_args()
    m = _imports(Path(a.root).resolve())
    parts = a.parts.split(",")
    print(f"siftmq from {a.root}")
    for _ in range(a.alternations if "log" in parts else 0):
        logged, nop = log_side(m, a.publications * 5, a.clients)
        print(
            f"log:    {a.clients} clients interleaved: {logged - nop:5.0f} ns/publication over the "
            f"no-op loop ({logged:.0f} / {nop:.0f})"
        )
    for _ in range(a.alternations if "loop" in parts else 0):
        base = loop_side(m, a.publications, False)
        logged = loop_side(m, a.publications, True)
        print(
            f"loop:   no hook {base:6.0f} ns/publication, delivery log {logged:6.0f} "
            f"(+{logged - base:.0f} ns)"
        )
    for _ in range(a.alternations if "writer" in parts else 0):
        b1, e1 = writer_side(m, a.round, a.reps, False)
        b2, e2 = writer_side(m, a.round, a.reps, True)
        print(
            f"writer: tables {b1:5.0f} ns/publication, Parquet {e1:5.0f} (bridge's statistics) / "
            f"{e2:5.0f} (every column's statistics; tables {b2:.0f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
