"""A wrong-password storm against ``siftmq serve --password-file`` while another client pings
(issue 37, item 4; docs/security.md, "Measured").

    make build   # the broker's hot modules compiled, as deployed
    flock /work/bench.lock .venv/bin/python benchmarks/bench_auth_storm.py [--seconds 5] [--rate 50]

Two ``siftmq serve`` processes in one run, each with a password file at the production scrypt
cost (``Scrypt()``: n 2**14, r 8, p 1) and the default check pool (2 threads, 32 pending):

* ``back-off off`` (``auth_failures = 0``): every wrong password is hashed or, past the
  pool's bound, refused 0x88 -- what the thread pool alone achieves;
* ``back-off on`` (the defaults: 5 failures in 60 s, then 1 s doubling to 300 s): after the
  fifth failure the storm's address is refused unchecked.

For each broker, two phases of ``--seconds``: (a) ``quiet``, no storm; (b) ``storm``: a
separate process opens ``--rate`` connections a second, each sending a CONNECT with a wrong
password for an existing user and waiting for its CONNACK.  Meanwhile one client (this
process, a blocking socket, an anonymous MQTT 5 session) sends PINGREQ and waits for PINGRESP
in a loop: printed are its round trips per second and the p50/p99/max round trip, the broker
process's CPU (psutil, % of one core) and the load generator's CPU beside it, and what the
storm's CONNECTs got back.  ``quiet`` is the same-run peer of ``storm``.

``--peer-tree PATH`` adds a third broker run from another source tree (e.g. a worktree of
an older main, whose scrypt ran on the event loop), with the same password file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._pinger import paced, pinger, pings  # noqa: E402
from broker._passwd import PasswordFile  # noqa: E402
from broker.packets import Connack, Connect, Decoder, encode  # noqa: E402
from tests.serving import Serve  # noqa: E402

USER, PASSWORD = "alice", "correct horse"


# ------------------------------------------------------------ the broker


class Served:
    """``siftmq serve --port 0`` of source ``tree`` in a subprocess (tests/serving.py)."""

    def __init__(self, passwd: Path, config: Path, tree: Path = ROOT) -> None:
        self.serve = Serve(
            *("--no-bridge", "--no-persistence", "--password-file", str(passwd), "--config", str(config)),
            env={"PYTHONPATH": str(tree)},
            cwd=tree,
        )
        try:
            self.port = self.serve.port(timeout=60)
        except BaseException:
            self.serve.close()
            raise
        self.ps = psutil.Process(self.serve.proc.pid)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        """SIGTERM, 30 s to end, then SIGKILL."""
        try:
            self.serve.stop(30)
        except subprocess.TimeoutExpired:
            pass
        finally:
            self.serve.close()


# ------------------------------------------------------------ the pinging client


def ping_for(port: int, seconds: float) -> list[float]:
    """PINGREQ -> PINGRESP round trips (seconds each) for ``seconds``, one at a time."""
    with pinger(port) as s:
        return pings(s, seconds)


# ------------------------------------------------------------ the storm (its own process)


async def storm(port: int, rate: float, seconds: float) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    bad = Connect("", 5, username=USER, password=b"wrong password")

    async def attempt(i: int) -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            outcomes["connect failed"] += 1
            return
        try:
            writer.write(encode(Connect(f"storm-{i}", 5, username=bad.username, password=bad.password), 5))
            dec = Decoder(5, server=False)
            packets: list[Any] = []
            while not packets:
                data = await asyncio.wait_for(reader.read(4096), 60)
                if not data:
                    outcomes["closed"] += 1
                    return
                packets = dec.feed(data)
            ack = packets[0]
            if not isinstance(ack, Connack):
                outcomes["other"] += 1
            elif ack.reason_code == 0x88:
                outcomes["0x88 busy"] += 1
            elif ack.properties.reason_string and "failed logins" in ack.properties.reason_string:
                outcomes["0x87 back-off"] += 1
            else:
                outcomes[f"0x{int(ack.reason_code):02x} checked"] += 1
        except TimeoutError:
            outcomes["timeout"] += 1
        finally:
            writer.close()

    loop = asyncio.get_running_loop()
    start = loop.time()
    i = await paced(rate, seconds, attempt)
    use = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "sent": i,
        "outcomes": dict(outcomes),
        "cpu": use.ru_utime + use.ru_stime,
        "wall": loop.time() - start,
    }


# ------------------------------------------------------------ the run


def stats(rtts: list[float], seconds: float) -> dict[str, float]:
    xs = sorted(rtts)
    n = len(xs)
    return {
        "rate": n / seconds,
        "p50": xs[n // 2] * 1e3,
        "p99": xs[min(n - 1, int(n * 0.99))] * 1e3,
        "max": xs[-1] * 1e3,
    }


def phase(b: Served, seconds: float, rate: float) -> dict[str, Any]:
    load: subprocess.Popen[str] | None = None
    if rate:
        load = subprocess.Popen(
            [sys.executable, __file__, "--storm-child", str(b.port), str(rate), str(seconds)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(0.3)  # the child's interpreter starts; its first CONNECTs are on their way
    c0 = b.cpu()
    rtts = ping_for(b.port, seconds)
    used = b.cpu() - c0
    out: dict[str, Any] = {**stats(rtts, seconds), "broker_cpu": 100 * used / seconds}
    if load is not None:
        text, _ = load.communicate(timeout=120)
        child = json.loads(text.strip().splitlines()[-1])
        out["load_cpu"] = 100 * child["cpu"] / child["wall"]
        out["sent"] = child["sent"]
        out["outcomes"] = child["outcomes"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=50.0, help="wrong-password CONNECTs per second")
    ap.add_argument("--peer-tree", type=Path, help="also run the broker of this source tree")
    ap.add_argument("--storm-child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.storm_child:
        port, rate, seconds = args.storm_child
        print(json.dumps(asyncio.run(storm(int(port), float(rate), float(seconds)))), flush=True)
        return
    from broker._build import HOT_MODULES, compiled_modules, stale_modules

    compiled = compiled_modules()
    print(f"hot modules compiled: {len(compiled)} of {len(HOT_MODULES)}; stale: {stale_modules() or 'none'}")
    print(f"machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        pf = PasswordFile()  # the production cost
        pf.set(USER, PASSWORD)
        pf.save(d / "passwd")
        t = time.perf_counter()
        pf.verify(USER, b"x")
        print(f"one scrypt check here: {(time.perf_counter() - t) * 1e3:.0f} ms")
        (d / "off.toml").write_text("[broker]\nauth_failures = 0\nsys_interval = 0\n")
        (d / "on.toml").write_text("[broker]\nsys_interval = 0\n")
        runs: list[tuple[str, Path, Path]] = [
            ("back-off off", d / "off.toml", ROOT),
            ("back-off on", d / "on.toml", ROOT),
        ]
        if args.peer_tree:
            (d / "peer.toml").write_text("[broker]\nsys_interval = 0\n")
            runs.append((f"peer {args.peer_tree.name}", d / "peer.toml", args.peer_tree.resolve()))
        print()
        print(
            "| broker | phase | PINGREQ round trips/s | p50 ms | p99 ms | max ms | broker CPU | "
            "load generator CPU | storm CONNECTs | their CONNACKs |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for label, config, tree in runs:
            b = Served(d / "passwd", config, tree)
            try:
                for name, rate in (("quiet", 0.0), ("storm", args.rate)):
                    r = phase(b, args.seconds, rate)
                    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r.get("outcomes", {}).items()))
                    load = f"{r['load_cpu']:.0f} %" if "load_cpu" in r else "-"
                    print(
                        f"| {label} | {name} | {r['rate']:,.0f} | {r['p50']:.2f} | {r['p99']:.2f} | "
                        f"{r['max']:.1f} | {r['broker_cpu']:.0f} % | "
                        f"{load} | "
                        f"{r.get('sent', '-')} | {outcomes or '-'} |",
                        flush=True,
                    )
            finally:
                b.stop()


if __name__ == "__main__":
    main()
