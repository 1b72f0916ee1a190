"""Restart storm (issue 27 item 4): N persisted sessions come back after a restart and a kill -9.

For each broker (siftmq with its SQLite store; mosquitto with ``persistence true``) and each
fleet size N, in one run on the same generator (benchmarks/_storm_client.py):

1. a fresh broker; its RSS with no session (the baseline);
2. *setup*: N devices connect with clean start and Session Expiry Interval 3600, subscribe to
   ``fleet/<i>/cmd`` and ``fleet/<i>/cfg/#`` at QoS 1, and disconnect (sessions kept);
3. *queue*: one publisher sends ``--queued`` QoS 1 messages to every ``--every``-th device
   (acknowledged, so they sit in the disconnected sessions' queues);
4. *graceful* restart (SIGTERM, wait for the exit, start again on the same data) then the
   *storm*: every device reconnects with clean start off, expects session present and exactly
   its queued messages (acknowledged), disconnects; then steps 3-4 again with a ``kill -9``
   instead of SIGTERM (mosquitto: after its autosave interval, since it only saves then).

Reported: restore time (process start to the first accepted TCP connection; siftmq also
reports ``Broker.start``'s own time), broker RSS restored and per session (above the
baseline), storm completion (broker ready -> last device done), CONNACK p50/p99 in the storm,
sessions present, messages missing / duplicated, broker CPU and the generator's CPU over
the storm; siftmq also measures its housekeeping tick (``Core.tick``) with all sessions
restored, and the bytes of its restored session objects (``Session`` and its containers,
without subscriptions and messages).

    .venv/bin/python benchmarks/bench_restart_storm.py --sessions 10000 50000 100000 --doc

``--doc`` writes the plots to docs/lab/img/ and prints the Markdown section for
docs/performance-connections.md ("Restart storm"); raw results go to the JSON file named by
``--json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _storm_client import Slice, free_port, queue_phase, run_slice, wait_port

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

SIFTMQ_CHILD = r"""
import asyncio, gc, signal, statistics, sys, time
t0 = time.monotonic()
from broker import Broker
SHARED = set()

def deep(s):
    n = sys.getsizeof(s)
    for name in ("inflight", "queue", "qos2_received", "selectors"):
        n += sys.getsizeof(getattr(s, name)) if id(getattr(s, name)) not in SHARED else 0
    return n

async def main():
    global SHARED
    b = Broker(host="127.0.0.1", port=int(sys.argv[2]), sys_interval=0, store_path=sys.argv[1] or None)
    t1 = time.monotonic()
    c1 = time.process_time()
    await b.start()
    t2 = time.monotonic()
    cpu = round(time.process_time() - c1, 3)
    core = b.core
    n = len(core.sessions)
    gc.collect()
    from broker.core import _session
    SHARED = {id(getattr(_session, k)) for k in ("_NO_INFLIGHT", "_NO_QUEUE", "_NO_IDS", "_NO_SELECTORS")}
    per = statistics.mean(deep(s) for s in core.sessions.values()) if n else 0
    ticks = []
    for _ in range(20):
        a = time.perf_counter()
        core.tick(core.clock.monotonic())
        ticks.append(time.perf_counter() - a)
    tick = round(statistics.median(ticks) * 1e6, 1)
    print("READY", n, round(t2 - t1, 3), round(t2 - t0, 3), round(per), tick, cpu, flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await b.stop()

try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
"""

MOSQUITTO_CONF = """listener {port} 127.0.0.1
allow_anonymous true
persistence {persist}
persistence_location {dir}/
autosave_interval {autosave}
max_queued_messages 1000
max_inflight_messages 20
{user}
"""


def _mosquitto() -> str | None:
    for p in ("/usr/sbin/mosquitto", "/usr/bin/mosquitto"):
        if os.access(p, os.X_OK):
            return p
    return None


def _rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in bytes."""
    rss = hwm = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    return rss, hwm


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Broker:
    """One broker process on a fixed data directory, restartable."""

    def __init__(self, kind: str, data: Path, store: bool = True) -> None:
        self.kind = kind
        self.store = store
        self.data = data
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.info: dict[str, float] = {}

    def start(self) -> float:
        """Start; returns seconds from spawn to the first accepted connection."""
        self.port = free_port()
        t0 = time.monotonic()
        if self.kind == "siftmq":
            self.proc = subprocess.Popen(
                [PY, "-c", SIFTMQ_CHILD, str(self.data / "broker.db") if self.store else "", str(self.port)],
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline().split()
            if not line or line[0] != "READY":
                raise RuntimeError(f"siftmq did not start: {line}")
            n, start_s, proc_s, per, tick_us, start_cpu = line[1:]
            self.info = {
                "sessions": int(n),
                "start_s": float(start_s),
                "process_s": float(proc_s),
                "session_object_bytes": float(per),
                "tick_us": float(tick_us),
                "start_cpu_s": float(start_cpu),
            }
        else:
            conf = self.data / "mosquitto.conf"
            user = "user root" if os.getuid() == 0 else ""
            persist = "true" if self.store else "false"
            conf.write_text(
                MOSQUITTO_CONF.format(port=self.port, dir=self.data, autosave=5, user=user, persist=persist)
            )
            exe = _mosquitto()
            assert exe is not None
            self.proc = subprocess.Popen(
                [exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
            )
        ready = wait_port(self.port, self.proc, timeout=300)
        return ready - t0

    def stop(self, kill: bool) -> None:
        assert self.proc is not None
        if kill:
            self.proc.kill()
        else:
            self.proc.send_signal(signal.SIGTERM if self.kind == "siftmq" else signal.SIGINT)
        self.proc.wait(timeout=300)
        self.proc = None


def _phase(
    pool: concurrent.futures.Executor, phase: str, b: Broker, n: int, args: argparse.Namespace
) -> list[Slice]:
    procs = args.procs
    slices = [
        Slice(
            phase,
            list(range(p, n, procs)),
            "127.0.0.1",
            b.port,
            args.window,
            args.addresses,
            args.every,
            args.queued,
            args.deadline,
            args.handshakes,
        )
        for p in range(procs)
    ]
    return list(pool.map(run_slice, slices))


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _storm(
    pool: concurrent.futures.Executor, b: Broker, n: int, args: argparse.Namespace, mode: str
) -> dict[str, Any]:
    b.stop(kill=mode == "kill9")
    restore_s = b.start()
    assert b.proc is not None
    pid = b.proc.pid
    t_ready = time.time()
    rss_restored, _ = _rss(pid)
    cpu0 = _cpu(pid)
    out = _phase(pool, "storm", b, n, args)
    cpu = _cpu(pid) - cpu0
    _, hwm = _rss(pid)
    lat = [x for s in out for x in s.connack_ms]
    res = {
        "mode": mode,
        "restore_s": round(restore_s, 3),
        **b.info,
        "rss_restored": rss_restored,
        "rss_peak": hwm,
        "complete_s": round(max(s.finished for s in out) - t_ready, 3),
        "done": sum(s.done for s in out),
        "failed": sum(s.failed for s in out),
        "present": sum(s.present for s in out),
        "not_present": sum(s.not_present for s in out),
        "messages": sum(s.messages for s in out),
        "expected": sum(args.queued for i in range(n) if i % args.every == 0),
        "missing": sum(s.missing for s in out),
        "duplicates": sum(s.duplicates for s in out),
        "unexpected": sum(s.unexpected for s in out),
        "connack_p50_ms": round(_pct(lat, 0.5), 1),
        "connack_p99_ms": round(_pct(lat, 0.99), 1),
        "broker_cpu_s": round(cpu, 2),
        "generator_cpu_s": round(sum(s.cpu for s in out), 2),
        "first_error": next((s.first_error for s in out if s.first_error), ""),
    }
    print(json.dumps(res), flush=True)
    return res


def run_one(pool: concurrent.futures.Executor, kind: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"storm-{kind}-") as tmp:
        b = Broker(kind, Path(tmp))
        try:
            return _run_one(pool, b, n, args)
        finally:
            if b.proc is not None:
                b.proc.kill()
                b.proc.wait()


def _run_one(
    pool: concurrent.futures.Executor, b: Broker, n: int, args: argparse.Namespace
) -> dict[str, Any]:
    kind = b.kind
    b.start()
    assert b.proc is not None
    rss_empty, _ = _rss(b.proc.pid)
    t = time.time()
    setup = _phase(pool, "setup", b, n, args)
    setup_s = time.time() - t
    failed = sum(s.failed for s in setup)
    print(
        f"{kind} n={n}: setup {setup_s:.1f}s, failed {failed} {setup[0].first_error} rss_empty {rss_empty}",
        flush=True,
    )
    res: dict[str, Any] = {
        "broker": kind,
        "sessions": n,
        "rss_empty": rss_empty,
        "setup_s": round(setup_s, 1),
    }
    for mode in args.modes:
        acked = queue_phase("127.0.0.1", b.port, n, args.every, args.queued)
        if kind == "mosquitto" and mode == "kill9":
            time.sleep(6)  # mosquitto saves only every autosave_interval (5 s)
        r = _storm(pool, b, n, args, mode)
        r["acked"] = acked
        r["rss_per_session"] = round((r["rss_restored"] - rss_empty) / n)
        res[mode] = r
    b.stop(kill=False)
    return res


def _median_us(fn: Any, runs: int = 50) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[runs // 2] * 1e6


def tick_only(sizes: list[int]) -> None:
    """``--tick``: the expiry part of ``Core.tick`` with N detached sessions, nothing due: the
    scan it replaced (every session looked at, as before issue 27) against the heap."""
    from broker.core._deadlines import Deadlines
    from broker.core._session import Session

    now = 500.0
    for n in sizes:
        sessions = []
        heap = Deadlines(lambda s: s.expires_at)
        for i in range(n):
            s = Session(f"s{i}", 3600, True)
            s.expires_at = 1000.0 + i
            sessions.append(s)
            heap.add(s)
        as_set = set(sessions)
        scan = _median_us(lambda a=as_set: [s for s in a if s.expires_at is not None and s.expires_at <= now])
        due = _median_us(lambda h=heap: h.due(now))
        print(f"tick expiry n={n:,}: scan {scan:,.1f} us, heap {due:,.2f} us", flush=True)


def _populate(path: Path, n: int, subs: int, queued: int) -> None:
    """``n`` disconnected sessions written through the store's own API (the rows the broker
    writes): ``subs`` subscriptions each, ``queued`` QoS 1 messages for every tenth."""
    from broker.store import EntryRecord, MessageRecord, MessageState, OutgoingRecord, SessionRecord, Store
    from broker.values import SubOptions

    wall = time.time()
    with Store(path, synchronous="NORMAL") as st:
        for i in range(n):
            cid = f"s{i}"
            st.put_session(SessionRecord(cid, 5, 3600, wall))
            filters = [f"fleet/{i}/cmd", f"fleet/{i}/cfg/#"][:subs]
            st.put_entries(cid, [EntryRecord(f, SubOptions(1, topic_filter=f)) for f in filters])
            for k in range(queued if i % 10 == 0 else 0):
                msg = MessageRecord(f"fleet/{i}/cmd", f"{i}:{k}".encode(), 1, False, publisher_id="pub")
                st.add_outgoing(
                    OutgoingRecord(
                        cid, st.next_seq(), MessageState.QUEUED, None, msg, 1, False, (), filters[0]
                    )
                )


def memory_only(sizes: list[int]) -> None:
    """``--memory``: bytes per restored, disconnected session (tracemalloc around
    ``Journal.restore`` of a reopened store, the records it came from freed): bare sessions,
    then with two subscriptions, then with 2 queued messages for every tenth session."""
    import tracemalloc

    from broker import BrokerConfig
    from broker.core._core import Core
    from broker.store import Store

    for n in sizes:
        for subs, queued in ((0, 0), (2, 0), (2, 2)):
            with tempfile.TemporaryDirectory() as tmp:
                db = Path(tmp) / "broker.db"
                _populate(db, n, subs, queued)
                with Store(db) as st:
                    state = st.load()
                    core = Core(BrokerConfig())
                    core.journal.store = st
                    tracemalloc.start()
                    base = tracemalloc.get_traced_memory()[0]
                    core.journal.restore(state, time.monotonic(), time.time())
                    del state
                    used = tracemalloc.get_traced_memory()[0] - base
                    tracemalloc.stop()
                    core.journal.store = None
            print(
                f"memory n={n:,} subscriptions={subs} queued(every 10th)={queued}: "
                f"{used / n:,.0f} B per session",
                flush=True,
            )


def restore_only(sizes: list[int]) -> None:
    """``--restore``: N sessions written through the store's API (two subscriptions each, 2
    queued messages for every tenth), then the broker started on them: wall and CPU time of
    ``Broker.start``, the restored sessions' RSS and the tick."""
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            _populate(Path(tmp) / "broker.db", n, 2, 2)
            b = Broker("siftmq", Path(tmp))
            try:
                b.start()
                assert b.proc is not None
                rss, _ = _rss(b.proc.pid)
                info = b.info
                print(
                    f"restore n={n:,}: start {info['start_s']:.2f} s (CPU {info['start_cpu_s']:.2f} s), "
                    f"process start to ready {info['process_s']:.2f} s, RSS {rss / 2**20:,.0f} MiB, "
                    f"tick {info['tick_us']:.1f} us",
                    flush=True,
                )
            finally:
                b.stop(kill=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, nargs="+", default=[10_000])
    ap.add_argument("--brokers", nargs="+", default=["siftmq", "mosquitto"])
    ap.add_argument("--modes", nargs="+", default=["graceful", "kill9"])
    ap.add_argument("--every", type=int, default=10, help="every k-th session gets queued messages")
    ap.add_argument("--queued", type=int, default=2, help="QoS 1 messages queued per such session")
    ap.add_argument("--procs", type=int, default=4, help="generator processes")
    ap.add_argument("--window", type=int, default=4000, help="open connections per generator process")
    ap.add_argument("--addresses", type=int, default=64, help="loopback source addresses")
    ap.add_argument("--deadline", type=float, default=120.0)
    ap.add_argument("--handshakes", type=int, default=24, help="CONNACKs awaited at once per process")
    ap.add_argument("--json", default="")
    ap.add_argument("--doc", action="store_true")
    ap.add_argument("--tick", action="store_true", help="only the expiry tick (scan vs heap)")
    ap.add_argument("--memory", action="store_true", help="only bytes per restored session")
    ap.add_argument("--restore", action="store_true", help="only the restore (sessions from the store API)")
    args = ap.parse_args()
    if args.restore:
        restore_only(args.sessions)
        return
    if args.memory:
        memory_only(args.sessions)
        return
    if args.tick:
        tick_only(args.sessions)
        return
    if "mosquitto" in args.brokers and _mosquitto() is None:
        print("mosquitto not installed: skipped", flush=True)
        args.brokers.remove("mosquitto")
    ctx = multiprocessing.get_context("fork")
    results = []
    with concurrent.futures.ProcessPoolExecutor(args.procs, mp_context=ctx) as pool:
        for n in args.sessions:
            for kind in args.brokers:
                results.append(run_one(pool, kind, n, args))
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    run = {"stamp": stamp, "args": vars(args), "results": results, "load": os.getloadavg()}
    if args.json:
        Path(args.json).write_text(json.dumps(run, indent=1))
    if args.doc:
        from _storm_report import render

        print(render(run, ROOT / "docs" / "lab" / "img"))


if __name__ == "__main__":
    main()
