"""Idle footprint and start-up time (issue 42 item 1): siftmq's light and default serve, and mosquitto.

For each broker, in one run on the same machine:

1. *start-up*: the time from ``exec`` (``subprocess.Popen``) to the port accepting a TCP
   connection (polled every 5 ms);
2. *idle RSS*: ``VmRSS`` of the broker process after ``--idle`` seconds (default 10) with no
   client, and again after ``--idle-late`` seconds (default 25): siftmq publishes its ``$SYS``
   topics every ``sys_interval`` (10 s by default) and the bridge records those publications,
   so with the defaults the late reading is after the bridge's first write (which loads
   numpy and pyarrow: in the bridge's writer process by default, whose RSS, with that of any
   other child of the broker, is the last column; in the broker with ``--bridge-writer thread``,
   variant ``siftmq-thread``: docs/performance.md "Footprint");
3. *clients RSS*: ``VmRSS`` once ``--clients`` (default 1,000) MQTT 3.1.1 clients, opened by a
   separate process (raw sockets: CONNECT, CONNACK, then nothing; keep-alive 0), are all
   connected, after ``--settle`` seconds (default 2).

Brokers: ``siftmq-light`` (``siftmq serve --no-bridge --no-persistence``: asyncio's own loop
since session 17, uvloop before), ``siftmq-nouvloop`` (the same with ``--no-uvloop``: asyncio's
own loop, without uvloop and the OpenSSL it loads, also on older checkouts), ``siftmq-uvloop``
(the same with ``--uvloop``: on uvloop; not on checkouts before session 17, whose light broker
ran on it), ``siftmq-defaults``
(``siftmq serve``: the SQLite store and, with the spark extra installed, the bridge) and
``mosquitto`` (2.x, ``persistence false``). ``--sessions N`` adds ``siftmq-store``: the
defaults' start-up with N persisted sessions in the store (written through the store's API,
as ``bench_restart_storm.py --restore`` does: two subscriptions each, two queued messages for
every tenth). A siftmq broker named ``NAME@base`` runs the same variant from the checkout given
by ``--base-root`` (its own ``.venv``, e.g. main compiled in another worktree): a same-run
peer. The floor of the interpreter is printed too: ``python -c pass`` and ``python -c "import
asyncio"`` RSS, with the same interpreter, and asyncio without ssl (what ``siftmq serve``
imports: broker/_sslhook.py).

Byte code: a broker whose modules have no byte code compiles each from source at every start,
and that compilation's garbage stays in the idle process (~0.45 MB: the object allocator's
pools it freed are not given back). A wheel install has it (pip compiles at install); a
checkout has it only where Python may write it, not where ``PYTHONDONTWRITEBYTECODE`` is set
(as on the project's machine). The script prints, per checkout, how many of siftmq's modules
have current byte code; ``--bytecode`` compiles them first (``compileall``, into the
checkouts' ``__pycache__``), to measure as installed (docs/performance.md, session 18).

    flock /work/bench.lock .venv/bin/python benchmarks/bench_footprint.py --sessions 20000
    flock /work/bench.lock .venv/bin/python benchmarks/bench_footprint.py --runs 3 \
        --brokers siftmq-light siftmq-nouvloop siftmq-light@base siftmq-defaults mosquitto \
        --base-root ../wt-main-compiled [--bytecode]

Numbers and targets: docs/performance.md "Footprint".
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _storm_client import free_port, wait_port

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
#: siftmq's packages (their modules' byte code: ``--bytecode``)
PACKAGES = ("broker", "topics", "content", "composite", "bridge", "cluster", "uplink")
#: --base-root: the checkout whose interpreter runs the ``NAME@base`` brokers
BASE: list[Path] = []

# the separate client process: N connections, CONNECT / CONNACK, prints "ready", holds until
# its stdin closes
CLIENTS = r"""
import resource, socket, sys
n, port = int(sys.argv[1]), int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n + 100)), hard))
socks = []
for i in range(n):
    cid = b"idle-%d" % i
    var = b"\x00\x04MQTT\x04\x02\x00\x00"
    body = var + len(cid).to_bytes(2, "big") + cid
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(bytes([0x10, len(body)]) + body)
    got = b""
    while len(got) < 4:
        chunk = s.recv(4 - len(got))
        if not chunk:
            raise SystemExit(f"connection {i} closed before its CONNACK")
        got += chunk
    if got[0] != 0x20 or got[3] != 0:
        raise SystemExit(f"connection {i} refused: {got!r}")
    socks.append(s)
print("ready", flush=True)
sys.stdin.read()
"""


def rss(pid: int) -> int:
    """``VmRSS`` of ``pid`` in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def children_rss(pid: int) -> int:
    """``VmRSS`` of ``pid``'s descendants in bytes (the bridge's writer process, issue 42)."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").iterdir():
            kids = (task / "children").read_text().split()
            for kid in kids:
                try:
                    total += rss(int(kid))
                except (OSError, RuntimeError):
                    continue
                todo.append(int(kid))
    return total


def command(kind: str, port: int, data: Path) -> list[str]:
    if kind == "mosquitto":
        conf = data / "mosquitto.conf"
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        return [exe, "-c", str(conf)]
    base = kind.endswith("@base")
    kind = kind.removesuffix("@base")
    cmd = [
        str(BASE[0] / ".venv" / "bin" / "python") if base else PY,
        "-m",
        "broker._cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--data-dir",
        str(data),
    ]
    if kind == "siftmq-light":
        cmd += ["--no-bridge", "--no-persistence"]
    elif kind == "siftmq-nouvloop":
        cmd += ["--no-bridge", "--no-persistence", "--no-uvloop"]
    elif kind == "siftmq-uvloop":  # the light broker on uvloop (its default before session 17)
        cmd += ["--no-bridge", "--no-persistence", "--uvloop"]
    elif kind == "siftmq-thread":  # the defaults with the bridge's writer in a thread (before)
        cmd += ["--bridge-writer", "thread"]
    return cmd


def populate(data: Path, n: int) -> None:
    """``n`` persisted sessions in ``data``/broker.db (bench_restart_storm's writer)."""
    from bench_restart_storm import _populate

    _populate(data / "broker.db", n, 2, 2)


def measure(kind: str, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="siftmq-footprint-") as tmp:
        data = Path(tmp)
        if kind == "siftmq-store":
            populate(data, args.sessions)
        port = free_port()
        cmd = command(kind, port, data)
        t0 = time.monotonic()
        env = dict(os.environ)
        if kind.endswith("@base"):  # its own sources first (an editable install finds them anyway)
            env["PYTHONPATH"] = str(BASE[0])
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            up = wait_port(port, proc) - t0
            out = {"startup_s": up}
            if kind == "siftmq-store":
                return out
            time.sleep(args.idle)  # the measurement: RSS after this long idle
            out["idle_mb"] = rss(proc.pid) / 1e6
            if args.idle_late > args.idle:
                time.sleep(args.idle_late - args.idle)
                out["late_mb"] = rss(proc.pid) / 1e6
                out["late_children_mb"] = children_rss(proc.pid) / 1e6
            if args.clients:
                cl = subprocess.Popen(
                    [PY, "-c", CLIENTS, str(args.clients), str(port)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                try:
                    assert cl.stdout is not None and cl.stdin is not None
                    line = cl.stdout.readline()
                    if line.strip() != "ready":
                        raise RuntimeError(f"client process failed ({cl.wait()})")
                    time.sleep(args.settle)
                    out["clients_mb"] = rss(proc.pid) / 1e6
                    out["clients_children_mb"] = children_rss(proc.pid) / 1e6
                finally:
                    if cl.stdin is not None:
                        cl.stdin.close()
                    cl.wait(timeout=60)
            return out
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def bytecode(root: Path, python: Path, compile_first: bool) -> str:
    """``"N of M"``: siftmq's modules under ``root`` whose byte code is current (a ``.pyc``
    beside in ``__pycache__``, not older than the source), after compiling them with
    ``python -m compileall`` when ``compile_first``. O(modules)."""
    import importlib.util

    if compile_first:
        dirs = [str(root / p) for p in PACKAGES if (root / p).is_dir()]
        subprocess.run([str(python), "-m", "compileall", "-q", *dirs], check=True, stdout=subprocess.DEVNULL)
    sources = [f for p in PACKAGES for f in (root / p).rglob("*.py")]
    current = 0
    for f in sources:
        pyc = Path(importlib.util.cache_from_source(str(f)))
        if pyc.exists() and pyc.stat().st_mtime >= f.stat().st_mtime:
            current += 1
    return f"{current} of {len(sources)}"


def floor() -> dict[str, float]:
    code = "import {};print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])"
    res = {}
    nossl = "sys;sys.modules['ssl']=None;import asyncio"  # what broker/_sslhook.py does, alone
    for name, mod in (("python", "sys"), ("python + asyncio", "asyncio"), ("+ asyncio, no ssl", nossl)):
        kb = subprocess.run([PY, "-c", code.format(mod)], capture_output=True, text=True, check=True).stdout
        res[name] = int(kb) * 1024 / 1e6
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", nargs="+", default=["siftmq-light", "siftmq-defaults", "mosquitto"])
    ap.add_argument("--idle", type=float, default=10.0, help="seconds idle before the RSS is read")
    ap.add_argument("--idle-late", type=float, default=25.0, help="seconds idle of the second reading")
    ap.add_argument("--clients", type=int, default=1000, help="idle clients (0: none)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds after the last CONNACK")
    ap.add_argument("--sessions", type=int, default=0, help="also start-up with this many stored sessions")
    ap.add_argument("--runs", type=int, default=1, help="runs per broker (medians reported)")
    ap.add_argument("--base-root", default="", help="checkout whose siftmq runs the 'NAME@base' brokers")
    ap.add_argument(
        "--bytecode", action="store_true", help="compile the checkouts' byte code first (as a wheel install)"
    )
    args = ap.parse_args()
    if args.base_root:
        BASE.append(Path(args.base_root).resolve())
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.clients + 200)), hard))
    brokers = list(args.brokers)
    if args.sessions:
        brokers.append("siftmq-store")
    print(f"python {sys.version.split()[0]} ({PY}), {os.cpu_count()} cores", flush=True)
    trees = [("this checkout", ROOT, Path(PY))]
    if BASE and any(b.endswith("@base") for b in brokers):
        trees.append(("base", BASE[0], BASE[0] / ".venv" / "bin" / "python"))
    for label, root, python in trees:
        print(f"byte code ({label}, {root}): {bytecode(root, python, args.bytecode)} modules current")
    for name, mb in floor().items():
        print(f"floor  {name:<18} RSS {mb:6.1f} MB")
    late = f"idle {args.idle_late:g} s MB"
    print(
        f"{'broker':<16} {'start-up s':>10} {'idle MB':>8} {late:>14} {f'{args.clients} clients MB':>18}"
        f" {'+ children MB (late / clients)':>31}"
    )
    for kind in brokers:
        runs = [measure(kind, args) for _ in range(args.runs)]

        def med(key: str, runs: list[dict[str, float]] = runs) -> str:
            vals = [r[key] for r in runs if key in r]
            return (
                f"{statistics.median(vals):.3f}"
                if key == "startup_s" and vals
                else (f"{statistics.median(vals):.1f}" if vals else "-")
            )

        label = f"siftmq-store ({args.sessions} sessions)" if kind == "siftmq-store" else kind
        kids = f"{med('late_children_mb')} / {med('clients_children_mb')}"
        print(
            f"{label:<16} {med('startup_s'):>10} {med('idle_mb'):>8} {med('late_mb'):>14}"
            f" {med('clients_mb'):>18} {kids:>31}",
            flush=True,
        )


if __name__ == "__main__":
    main()
