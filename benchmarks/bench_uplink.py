"""Outbound bridge benchmark: siftmq's ``[[bridges]]`` vs mosquitto's own bridge, same run.

Run from the repository root (after ``make build``), under the benchmark lock:

    flock /work/bench.lock .venv/bin/python benchmarks/bench_uplink.py --messages 20000 --runs 3

One central mosquitto (persistence off) is the remote; a raw asyncio subscriber process on it
(QoS 1, benchmarks/_uplink_load.py) counts distinct arrivals on ``central/#``.  Two edges are
measured in turn against the same central, each bridging ``bench/#`` out at QoS 1 with the
remote prefix ``central/`` over MQTT 5:

* **siftmq**: ``siftmq serve --config`` with one ``[[bridges]]`` table and persistence on
  (``--data-dir``: every message is written to SQLite before its PUBACK);
* **siftmq-mem**: the same with ``--no-persistence`` (no store: the queue in memory, like
  mosquitto's edge);
* **mosquitto**: Debian's mosquitto with a ``connection`` block (persistence off: its queue is
  in memory).

The load: ``--publishers`` processes (raw asyncio MQTT 5, uvloop), each sending its share of
``--messages`` QoS 1 messages with at most ``--window`` unacknowledged.  Each run measures, in
this order, against the same central:

0. **direct**: the publishers straight to the central (no bridge): the ceiling the generator
   and the central allow, kept to show the generator is not the cap;
1. **siftmq**, **siftmq-mem**, then **mosquitto**: the edge is started, a probe message is published every
   0.3 s until one reaches the counter (the bridge is up, not measured), then the load.

Per measure: messages/s from the first PUBLISH to the last new arrival at the counter,
delivered (distinct arrivals) as % of the PUBACKs the publishers got, the edge's CPU seconds
(``/proc/<pid>/stat`` utime+stime+cutime+cstime of the edge and its live descendants), messages
per edge CPU second, the central's CPU seconds, and the generator's own CPU (all publishers,
the busiest publisher as % of one core, the counter): a generator near 100 % of a core would
measure itself.  The ratios siftmq / mosquitto (and siftmq-mem / mosquitto) of throughput and
of messages per edge CPU second are printed per run (peers measured in the same run) and as
medians.

``--drain N`` adds, per run and edge, the drain after an outage (:func:`drain_measure`): a
central of its own (mosquitto with persistence on, a persistent counter session that
reconnects while it is down), the edge bridged to it, the central stopped, ``N`` QoS 1
messages published to the edge (acknowledged by it: queued), the central started again;
printed: seconds from that start to the first and to the last arrival, the rate between
them, delivered %, the edge's CPU seconds, and the ratios siftmq / mosquitto per run.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import math
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from _uplink_load import Count, counter_main, expect, publish_slice

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {port}")


class Proc:
    def __init__(self, args: list[str], port: int, cwd: Path | None = None, metrics: int = 0) -> None:
        self.args, self.port, self.cwd = args, port, cwd
        self.metrics = metrics  # the port of its /metrics (a siftmq edge), 0: none
        self.p: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.p = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.cwd
        )
        wait_port(self.port)

    def store_counters(self) -> dict[str, float]:
        """The store's counters on its /metrics (``siftmq_store_*_total``), {} without."""
        if not self.metrics:
            return {}
        wait_port(self.metrics)
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("siftmq_store_") and "_total " in line:
                name, value = line.split()
                out[name.removeprefix("siftmq_store_").removesuffix("_total")] = float(value)
        return out

    def stop(self) -> None:
        if self.p is not None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
            self.p = None


def mosquitto(d: Path, name: str, port: int, extra: str = "", persist: bool = False) -> Proc:
    conf = d / f"{name}.conf"
    keep = f"persistence true\npersistence_location {d}/\n" if persist else "persistence false\n"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\n{keep}user {getpass.getuser()}\n"
        f"max_queued_messages 1000000\nmax_inflight_messages 1000\n{extra}"
    )
    return Proc([MOSQUITTO, "-c", str(conf)], port)


def siftmq_edge(d: Path, port: int, central: int, persist: bool = True, tree: Path | None = None) -> Proc:
    cfg = d / "edge.toml"
    cfg.write_text(
        "[broker]\nmax_queued_messages = 1000000\nsys_interval = 0\n\n"
        f'[[bridges]]\nname = "central"\nurl = "mqtt://127.0.0.1:{central}"\nbackoff_min = 0.2\n'
        "backoff_max = 1.0\nmax_inflight = 1000\n\n"
        '[[bridges.topics]]\npattern = "bench/#"\nremote_prefix = "central/"\n'
    )
    data = d / "siftmq-data"
    shutil.rmtree(data, ignore_errors=True)
    python = sys.executable if tree is None else str(tree / ".venv" / "bin" / "python")
    args = [python, "-m", "broker._cli", "serve", "--port", str(port), "--data-dir", str(data)]
    if not persist:
        args.append("--no-persistence")
    metrics = free_port()
    args += ["--metrics-listen", f"127.0.0.1:{metrics}", "--no-dashboard"]
    return Proc([*args, "--config", str(cfg), "--no-bridge", "--log-level", "WARNING"], port, tree, metrics)


def mosquitto_edge(d: Path, port: int, central: int) -> Proc:
    return mosquitto(
        d,
        "edge",
        port,
        f'connection central\naddress 127.0.0.1:{central}\ntopic bench/# out 1 "" central/\n'
        "bridge_protocol_version mqttv50\ncleansession false\nrestart_timeout 1\n"
        "bridge_max_packet_size 0\n",
    )


def ratio(x: float, y: float) -> float:
    """``x / y``, NaN when ``y`` is 0 (a run too short for its edge's CPU to be measured)."""
    return x / y if y else math.nan


#: ``--baseline DIR``: the checkout whose persistent edge is the line ``siftmq-base``
BASELINE: Path | None = None


def edge_of(name: str, d: Path, port: int, central: int) -> Proc:
    """The edge of one line: ``mosquitto`` (its bridge), ``siftmq`` (persistent),
    ``siftmq-mem`` (no store) or ``siftmq-base`` (persistent, from ``--baseline``)."""
    if name == "mosquitto":
        return mosquitto_edge(d, port, central)
    if name == "siftmq-base":
        return siftmq_edge(d, port, central, tree=BASELINE)
    return siftmq_edge(d, port, central, persist=name == "siftmq")


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live descendants, plus what their reaped
    children used (``cutime``/``cstime`` of /proc/<pid>/stat). O(processes in the tree)."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) / TICK  # utime stime cutime cstime
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in task.read_text().split()]
    return total


def start_py_spy(binary: str, pid: int, out: Path, native: bool = False) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` and its children at 200 Hz into ``out`` (collapsed stacks) until SIGINT
    (``native``: with the C frames, the mypyc-compiled modules' functions among them; the edge is
    paused at each sample then, so its rate drops)."""
    args = ["record", "--pid", str(pid), "--rate", "200", "--subprocesses", "--threads"]
    args += ["--native"] if native else ["--nonblocking"]  # py-spy unwinds C stacks only paused
    return subprocess.Popen(
        [binary, *args, "--format", "raw", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@dataclass(frozen=True, slots=True)
class Row:
    """One measure: the generator's numbers and the brokers' CPU seconds."""

    acked: int
    delivered: int
    duplicates: int
    seconds: float  # first PUBLISH (any publisher) to the last new arrival at the counter
    edge_cpu: float  # 0 for the direct line
    central_cpu: float
    pub_cpu: float  # all publisher processes
    pub_busiest: float  # the busiest publisher process, % of one core over its own run
    counter_cpu: float
    window: int

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else 0.0

    @property
    def per_edge_cpu(self) -> float:
        return self.delivered / self.edge_cpu if self.edge_cpu > 0 else 0.0

    def show(self, name: str) -> str:
        edge = (
            f"edge CPU {self.edge_cpu:5.2f} s ({100 * self.edge_cpu / self.seconds:3.0f} %, "
            f"{self.per_edge_cpu:7.0f} msg/CPU s)  "
            if self.edge_cpu
            else " " * 44
        )
        return (
            f"{name:10s} {self.rate:7.0f} msg/s delivered {100 * self.delivered / max(1, self.acked):5.1f} % "
            f"of {self.acked} acked ({self.duplicates} dup)  {edge}central CPU {self.central_cpu:5.2f} s "
            f"({100 * self.central_cpu / self.seconds:3.0f} %)  publishers {self.pub_cpu:5.2f} s "
            f"(busiest {self.pub_busiest:3.0f} %)  counter {self.counter_cpu:5.2f} s "
            f"({100 * self.counter_cpu / self.seconds:3.0f} %)  window {self.window}"
        )


@dataclass(frozen=True, slots=True)
class Drain:
    """One drain measure: ``acked`` messages queued at the edge while its remote was down,
    then the remote restarted (``--drain``)."""

    acked: int
    queue_rate: float  # messages/s acknowledged by the edge while the remote was down
    delivered: int
    duplicates: int
    first: float  # seconds from the remote's restart to the first arrival
    seconds: float  # seconds from the remote's restart to the last new arrival
    edge_cpu: float  # the edge's CPU seconds from the restart to the end

    @property
    def rate(self) -> float:
        """Messages/s from the first arrival to the last (the drain itself, without the
        reconnection's wait)."""
        span = self.seconds - self.first
        return self.delivered / span if span > 0 else 0.0

    def show(self, name: str) -> str:
        return (
            f"{name:10s} drain {self.seconds:6.2f} s (first arrival {self.first:5.2f} s, "
            f"{self.rate:7.0f} msg/s after it) delivered {100 * self.delivered / max(1, self.acked):5.1f} % "
            f"of {self.acked} queued ({self.duplicates} dup)  edge CPU {self.edge_cpu:5.2f} s  "
            f"queued at {self.queue_rate:7.0f} msg/s"
        )


def drain_measure(d: Path, name: str, run: int, n: int, publishers: int, window: int) -> Drain:
    """The drain after an outage for the edge ``name``: a central of its own (mosquitto,
    persistence on, so the counter's persistent session and what reaches it survive its
    restart), the edge bridged to it and a probe across, the central stopped, ``n`` messages
    published to the edge, the central started again; timed from that start."""
    dd = d / f"drain-{name}-{run}"
    dd.mkdir()
    port = free_port()
    central = mosquitto(dd, "central", port, persist=True)
    central.start()
    load = Load(port, publishers, window, persistent=True)
    try:
        eport = free_port()
        edge = edge_of(name, dd, eport, port)
        edge.start()
        assert edge.p is not None
        try:
            load.wait_route(eport, "bench/", f"d{run}-warm-{name}/")
            central.stop()
            return load.drain(eport, f"d{run}-{name}/", n, edge.p.pid, central.start)
        finally:
            edge.stop()
    finally:
        load.close()
        central.stop()


class Load:
    """The publisher processes and the counting subscriber at the central (benchmarks/_uplink_load.py)."""

    def __init__(self, central: int, publishers: int, window: int, persistent: bool = False) -> None:
        self.publishers, self.window = publishers, window
        self.pool = ProcessPoolExecutor(publishers)
        self.pipe, child = multiprocessing.Pipe()
        self.counter = multiprocessing.Process(
            target=counter_main, args=(central, child, persistent), daemon=True
        )
        self.counter.start()
        if not self.pipe.poll(30) or self.pipe.recv() != "ready":
            raise RuntimeError("the counter did not subscribe")

    def wait_route(self, port: int, prefix: str, tag: str, timeout: float = 30) -> None:
        """Publish one message to ``port`` every 0.3 s until the counter sees one (the bridge is up)."""
        expect(self.pipe, tag, 1, timeout)
        deadline = time.monotonic() + timeout
        while not self.pipe.poll(0.3):
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing published to {port} reached the central")
            publish_slice(port, f"bench-probe-{tag}", prefix, tag, 1, 1)
        count: Count = self.pipe.recv()
        if not count.distinct:
            raise RuntimeError(f"nothing published to {port} reached the central")

    def measure(self, port: int, prefix: str, tag: str, n: int, edge: int, central: int) -> Row:
        share = [n // self.publishers + (k < n % self.publishers) for k in range(self.publishers)]
        e0, c0 = (cpu_seconds(edge) if edge else 0.0), cpu_seconds(central)
        expect(self.pipe, tag, n, 10.0)
        futures = [
            self.pool.submit(publish_slice, port, f"bench-pub-{tag}{k}", prefix, f"{tag}{k}", m, self.window)
            for k, m in enumerate(share)
        ]
        sent = [f.result() for f in futures]
        count: Count = self.pipe.recv()
        e1, c1 = (cpu_seconds(edge) if edge else 0.0), cpu_seconds(central)
        first = min(s.first for s in sent)
        return Row(
            acked=sum(s.acked for s in sent),
            delivered=count.distinct,
            duplicates=count.duplicates,
            seconds=(count.last - first) if count.last else 0.0,
            edge_cpu=e1 - e0,
            central_cpu=c1 - c0,
            pub_cpu=sum(s.cpu for s in sent),
            pub_busiest=max(100 * s.cpu / max(1e-9, s.last - s.first) for s in sent),
            counter_cpu=count.cpu,
            window=sent[0].window,
        )

    def drain(self, port: int, tag: str, n: int, edge: int, restart: Callable[[], None]) -> Drain:
        """Publish ``n`` messages to the edge on ``port`` while its remote is down (each
        acknowledged by the edge: queued), then ``restart()`` the remote and wait until the
        counter has them all (or nothing new came for 30 s)."""
        share = [n // self.publishers + (k < n % self.publishers) for k in range(self.publishers)]
        expect(self.pipe, tag, n, 30.0)
        futures = [
            self.pool.submit(
                publish_slice, port, f"bench-drain-{tag}{k}", "bench/", f"{tag}{k}", m, self.window
            )
            for k, m in enumerate(share)
        ]
        sent = [f.result() for f in futures]
        e0 = cpu_seconds(edge)
        t0 = time.monotonic()
        restart()
        count: Count = self.pipe.recv()
        return Drain(
            acked=sum(s.acked for s in sent),
            queue_rate=sum(s.acked for s in sent)
            / max(1e-9, max(s.last for s in sent) - min(s.first for s in sent)),
            delivered=count.distinct,
            duplicates=count.duplicates,
            first=(count.first - t0) if count.first else 0.0,
            seconds=(count.last - t0) if count.last else 0.0,
            edge_cpu=cpu_seconds(edge) - e0,
        )

    def close(self) -> None:
        self.pipe.send(("stop",))
        self.counter.join(10)
        self.pool.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--publishers", type=int, default=2, help="publisher processes")
    ap.add_argument("--window", type=int, default=200, help="QoS 1 messages in flight per publisher")
    ap.add_argument(
        "--py-spy", default="", help="py-spy binary: profile the siftmq edges during their measures"
    )
    ap.add_argument("--profile-dir", default=".", help="where the --py-spy profiles go (collapsed stacks)")
    ap.add_argument("--native", action="store_true", help="--py-spy with native (C, mypyc) frames")
    ap.add_argument(
        "--baseline",
        default="",
        help="a checkout (with its .venv, built) whose persistent edge is measured too, as siftmq-base",
    )
    ap.add_argument(
        "--drain",
        type=int,
        default=0,
        help="also measure the drain after an outage with this many queued messages per edge and run",
    )
    a = ap.parse_args()
    global BASELINE  # noqa: PLW0603 (set once, from the command line)
    edges = ["siftmq", "siftmq-mem", "mosquitto"]
    if a.baseline:
        BASELINE = Path(a.baseline).resolve()
        edges.insert(1, "siftmq-base")
    drains: dict[str, list[Drain]] = {name: [] for name in edges}
    rows: dict[str, list[Row]] = {"direct": [], **{name: [] for name in edges}}
    counts: dict[str, list[tuple[float, float]]] = {name: [] for name in edges}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        cport = free_port()
        central = mosquitto(d, "central", cport)
        central.start()
        assert central.p is not None
        load = Load(cport, a.publishers, a.window)
        try:
            for run in range(1, a.runs + 1):
                load.wait_route(cport, "central/", f"r{run}-warm-direct/")
                rows["direct"].append(
                    load.measure(cport, "central/", f"r{run}-direct/", a.messages, 0, central.p.pid)
                )
                print(f"run {run}", rows["direct"][-1].show("direct"), flush=True)
                for name in edges:
                    eport = free_port()
                    edge = edge_of(name, d, eport, cport)
                    edge.start()
                    assert edge.p is not None
                    try:
                        load.wait_route(eport, "bench/", f"r{run}-warm-{name}/")
                        spy = None
                        if a.py_spy and name != "mosquitto":
                            out = Path(a.profile_dir) / f"uplink-{name}-run{run}.txt"
                            spy = start_py_spy(a.py_spy, edge.p.pid, out, a.native)
                            time.sleep(1.0)  # py-spy attaches (before the measure, not part of it)
                        before = edge.store_counters()
                        row = load.measure(
                            eport, "bench/", f"r{run}-{name}/", a.messages, edge.p.pid, central.p.pid
                        )
                        after = edge.store_counters()
                        if spy is not None:
                            spy.send_signal(signal.SIGINT)
                            spy.wait(30)
                    finally:
                        edge.stop()
                    rows[name].append(row)
                    print(f"run {run}", row.show(name), flush=True)
                    if "inserts" in after:  # the store's counters over the measure
                        written = after["inserts"] - before["inserts"]
                        cancelled = after["inserts_cancelled"] - before["inserts_cancelled"]
                        counts[name].append((written, cancelled))
                        print(
                            f"run {run} {name} store: {written:.0f} deliveries written, {cancelled:.0f} "
                            f"cancelled ({100 * written / max(1, written + cancelled):.0f} % written), "
                            f"{after['commits'] - before['commits']:.0f} commits",
                            flush=True,
                        )
                if a.drain:
                    for name, ds in drains.items():
                        ds.append(drain_measure(d, name, run, a.drain, a.publishers, a.window))
                        print(f"run {run}", ds[-1].show(name), flush=True)
                m = rows["mosquitto"][-1]
                for name in edges[:-1]:
                    s = rows[name][-1]
                    print(
                        f"run {run} ratio {name}/mosquitto: throughput {ratio(s.rate, m.rate):.2f}x, "
                        f"messages per edge CPU second {ratio(s.per_edge_cpu, m.per_edge_cpu):.2f}x",
                        flush=True,
                    )
        finally:
            load.close()
            central.stop()
    print(
        f"\n{a.messages} QoS 1 messages per measure, {a.publishers} publisher processes x window "
        f"{a.window}, {a.runs} runs (medians)"
    )
    for name, rs in rows.items():
        med = statistics.median
        line = f"{name:10s} {med(r.rate for r in rs):7.0f} msg/s"
        line += f"  delivered {min(100 * r.delivered / max(1, r.acked) for r in rs):5.1f} % (worst)"
        if name != "direct":
            line += f"  edge {med(r.edge_cpu for r in rs):5.2f} CPU s"
            line += f"  {med(r.per_edge_cpu for r in rs):7.0f} msg/CPU s"
        line += f"  central {med(r.central_cpu for r in rs):5.2f} CPU s"
        print(line)
    for name in edges[:-1]:
        pairs = list(zip(rows[name], rows["mosquitto"], strict=True))
        tp = [ratio(s.rate, m.rate) for s, m in pairs]
        pc = [ratio(s.per_edge_cpu, m.per_edge_cpu) for s, m in pairs]
        print(
            f"ratio {name}/mosquitto per run: throughput "
            + ", ".join(f"{r:.2f}x" for r in tp)
            + f" (median {statistics.median(tp):.2f}x); messages per edge CPU second "
            + ", ".join(f"{r:.2f}x" for r in pc)
            + f" (median {statistics.median(pc):.2f}x)"
        )
    if a.baseline:
        pairs = list(zip(rows["siftmq"], rows["siftmq-base"], strict=True))
        tp = [ratio(s.rate, b.rate) for s, b in pairs]
        pc = [ratio(s.per_edge_cpu, b.per_edge_cpu) for s, b in pairs]
        print(
            "ratio siftmq/siftmq-base per run: throughput "
            + ", ".join(f"{r:.2f}x" for r in tp)
            + f" (median {statistics.median(tp):.2f}x); messages per edge CPU second "
            + ", ".join(f"{r:.2f}x" for r in pc)
            + f" (median {statistics.median(pc):.2f}x)"
        )
    for name, cs in counts.items():
        if cs:
            share = [100 * w / max(1, w + c) for w, c in cs]
            print(
                f"{name} store: deliveries written (then deleted) per run "
                + ", ".join(f"{x:.0f} %" for x in share)
                + f" (median {statistics.median(share):.0f} %)"
            )

    if not a.drain:
        return
    print(f"\ndrain after an outage: {a.drain} QoS 1 messages queued per edge, {a.runs} runs (medians)")
    for name, ds in drains.items():
        med = statistics.median
        print(
            f"{name:10s} drain {med(x.seconds for x in ds):6.2f} s  "
            f"first arrival {med(x.first for x in ds):5.2f} s  "
            f"{med(x.rate for x in ds):7.0f} msg/s after it  delivered "
            f"{min(100 * x.delivered / max(1, x.acked) for x in ds):5.1f} % (worst)  "
            f"edge {med(x.edge_cpu for x in ds):5.2f} CPU s"
        )
    for name in edges[:-1]:
        dpairs = list(zip(drains[name], drains["mosquitto"], strict=True))
        dt = [x.seconds / y.seconds for x, y in dpairs if y.seconds]
        dr = [x.rate / y.rate for x, y in dpairs if y.rate]
        print(
            f"drain {name}/mosquitto per run: time "
            + ", ".join(f"{r:.2f}x" for r in dt)
            + f" (median {statistics.median(dt):.2f}x, lower is faster); rate after the first arrival "
            + ", ".join(f"{r:.2f}x" for r in dr)
            + f" (median {statistics.median(dr):.2f}x)"
        )


if __name__ == "__main__":
    main()
