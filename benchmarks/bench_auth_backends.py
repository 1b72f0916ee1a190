"""The HTTP and JWT auth backends (``broker.authn``, issue 39 item 2; docs/security.md,
"Auth backends: measured").

    flock /work/bench.lock .venv/bin/python benchmarks/bench_auth_backends.py [--seconds 5]

Five parts, each with its peer measured in the same run:

1. ``decision``: ``HttpAuth.authenticate_request`` answered from its cache (one real request to
   a local service filled it), p50/p99 over ``--decisions`` calls; beside it the same for a
   hook with no cache (``Hooks.authenticate_request``'s default, no opinion): the floor.
2. ``jwt``: ``JwtAuth.authenticate_request`` for HS256, RS256 (2048) and ES256 tokens on the
   calling thread, p50/p99; beside it the round trip of a no-op through the broker's
   ``CheckPool`` (submit + await on a running loop): what running the verification off the
   loop would add.
3. ``timeout``: a broker whose service accepts and never answers (``timeout`` 1 s, 3 retries):
   the CONNECT -> CONNACK time of ``--clients`` clients, against the configured timeout.
4. ``storm``: a broker (its own process) with ``HttpAuth`` against a service that answers
   after ``--delay`` seconds; one client (this process, a blocking socket) sends PINGREQ and
   waits for PINGRESP for ``--seconds``: ``quiet`` (no storm) then ``storm`` (a second process
   opens ``--rate`` CONNECTs a second, each held for the slow service): round trips/s and
   p50/p99/max.  ``quiet`` is the peer of ``storm``; so is the same storm against a hook that
   sleeps as long without HTTP, and (``--peer-tree PATH``) the ``HttpAuth`` of another source
   tree (e.g. a worktree of an older main).  ``--repeat N`` runs part 4 N times.
5. ``loop``: what an HTTP auth request costs the event loop, without a broker: a process
   (its own interpreter) calls ``HttpAuth.authenticate_request`` ``--rate`` times a second
   for ``--seconds`` against the slow service (cache off) and times every event-loop
   callback with the thread's CPU clock (``time.thread_time``: preemption by other
   processes of a loaded machine is not counted): the loop's CPU per request and the
   callbacks' p50/p99/max.  Peers in the same run: a hook that only sleeps as long, and
   (``--peer-tree``) the ``HttpAuth`` of another tree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._pinger import paced, pinger, pings  # noqa: E402
from broker.auth import CheckPool  # noqa: E402
from broker.authn import HttpAuth, JwtAuth  # noqa: E402
from broker.hooks import AuthRequest, Hooks  # noqa: E402
from broker.packets import Connack, Connect, Decoder, encode  # noqa: E402
from tests.auth.authservice import keep_alive  # noqa: E402


def pct(xs: list[float]) -> dict[str, float]:
    """p50/p99/max in milliseconds."""
    s = sorted(xs)
    n = len(s)
    return {"p50": s[n // 2] * 1e3, "p99": s[min(n - 1, int(n * 0.99))] * 1e3, "max": s[-1] * 1e3}


# ------------------------------------------------------------ the auth service


@contextmanager
def service(delay: float = 0.0, hang: threading.Event | None = None) -> Iterator[str]:
    """An HTTP auth service on 127.0.0.1:0 answering allow after ``delay`` s (or never until
    ``hang`` is set); yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if hang is not None:
                hang.wait(60)
            elif delay:
                time.sleep(delay)
            data = b'{"result": "allow"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.request_queue_size = 1024
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/auth"
    finally:
        if hang is not None:
            hang.set()
        server.shutdown()
        server.server_close()


def request(client_id: str = "c1") -> AuthRequest:
    return AuthRequest(client_id, "alice", b"pw", "127.0.0.1", ("127.0.0.1", 5555), "127.0.0.1:1883", 1883, 5)


# ------------------------------------------------------------ 1. decision from the cache


async def decision(n: int) -> dict[str, Any]:
    with service() as url:
        auth = HttpAuth(url, cache_ttl=3600)
        r = request()
        first = auth.authenticate_request(r)
        assert not isinstance(first, bool) and first is not None
        assert await first is True  # type: ignore[misc]
        floor = Hooks()
        out: dict[str, Any] = {}
        for name, hook in (("no-cache hook (floor)", floor), ("HttpAuth cache hit", auth)):
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                hook.authenticate_request(r)
                times.append(time.perf_counter() - t0)
            out[name] = pct(times)
        assert auth.hits == n and auth.requests == 1
        await auth.stop()
    return out


# ------------------------------------------------------------ 2. JWT verification


async def jwt_costs(n: int, tmp: Path) -> dict[str, Any]:
    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    exp = int(time.time()) + 3600
    claims = {"username": "alice", "exp": exp, "acl": {"pub": ["out/%u/#"], "sub": ["in/%c/#"]}}
    secret = os.urandom(64)
    (tmp / "hs").write_bytes(secret)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    cases: list[tuple[str, JwtAuth, str]] = [
        ("HS256", JwtAuth(tmp / "hs", algorithms=["HS256"]), jwt.encode(claims, secret, "HS256"))
    ]
    for alg, key in (("RS256", rsa_key), ("ES256", ec_key)):
        pem = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        (tmp / alg).write_bytes(pem)
        cases.append((alg, JwtAuth(tmp / alg, algorithms=[alg]), jwt.encode(claims, key, alg)))
    out: dict[str, Any] = {}
    for alg, auth, token in cases:
        r = AuthRequest("c1", "alice", token.encode(), "127.0.0.1", None, "", None, 5)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            ok = auth.authenticate_request(r)
            times.append(time.perf_counter() - t0)
        assert ok is True
        out[f"JwtAuth {alg} on the loop"] = pct(times)
    pool = CheckPool()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await pool.submit(int)
        times.append(time.perf_counter() - t0)
    pool.close()
    out["CheckPool round trip of a no-op (peer)"] = pct(times)
    return out


# ------------------------------------------------------------ 3./4. a broker process

BROKER = """
import asyncio, sys
from broker import Broker
from broker.authn import HttpAuth
from broker.hooks import Hooks

class Sleepy(Hooks):  # the peer: the same wait, no HTTP
    def __init__(self, delay):
        self.delay = delay

    def authenticate(self, client_id, username, password):
        return self.answer()

    async def answer(self):
        await asyncio.sleep(self.delay)
        return True

async def main():
    timeout, retries = float(sys.argv[2]), int(sys.argv[3])
    if sys.argv[1].startswith("sleep:"):
        auth = Sleepy(float(sys.argv[1][6:]))
    else:
        auth = HttpAuth(sys.argv[1], timeout=timeout, retries=retries, cache_ttl=0, negative_ttl=0)
    async with Broker(host="127.0.0.1", port=0, hooks=[auth], sys_interval=0, auth_failures=0) as b:
        print(b.port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


@contextmanager
def broker(url: str, timeout: float, retries: int, tree: Path = ROOT) -> Iterator[tuple[int, psutil.Process]]:
    """A broker process with ``HttpAuth(url)`` (or the sleeping peer), from the source ``tree``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", BROKER, url, str(timeout), str(retries)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tree,
        env=dict(os.environ, PYTHONPATH=str(tree)),
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        yield int(proc.stdout.readline()), psutil.Process(proc.pid)
    finally:
        proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def connack_time(port: int, client_id: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(60)
    s.sendall(encode(Connect(client_id, 5, username="alice", password=b"pw"), 5))
    dec = Decoder(5, server=False)
    got: list[Any] = []
    while not got:
        got = dec.feed(s.recv(4096))
    s.close()
    assert isinstance(got[0], Connack)
    return time.perf_counter() - t0, int(got[0].reason_code)


def timeouts(clients: int) -> dict[str, Any]:
    timeout = 1.0
    with service(hang=threading.Event()) as url, broker(url, timeout, 3) as (port, _):
        results: list[tuple[float, int]] = []
        threads = [
            threading.Thread(target=lambda i=i: results.append(connack_time(port, f"t-{i}")))
            for i in range(clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    times = [t for t, _ in results]
    return {
        "configured timeout ms": timeout * 1e3,
        "CONNACK after ms": {"min": min(times) * 1e3, **pct(times)},
        "codes": dict(Counter(f"0x{c:02x}" for _, c in results)),
    }


async def storm_main(port: int, rate: float, seconds: float) -> None:
    """The storm (its own process): ``rate`` CONNECTs a second, each waiting for its CONNACK."""
    outcomes: Counter[str] = Counter()

    async def attempt(i: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(encode(Connect(f"storm-{i}", 5, username="alice", password=b"pw"), 5))
            dec = Decoder(5, server=False)
            packets: list[Any] = []
            while not packets:
                data = await asyncio.wait_for(reader.read(4096), 60)
                if not data:
                    outcomes["closed"] += 1
                    return
                packets = dec.feed(data)
            outcomes[f"0x{int(packets[0].reason_code):02x}"] += 1
        finally:
            writer.close()

    i = await paced(rate, seconds, attempt, tolerate=True)
    print(json.dumps({"sent": i, "outcomes": dict(outcomes)}), flush=True)


def service_main(delay: float) -> None:
    """The slow service in its own process: asyncio, HTTP/1.1 keep-alive, each answer after
    ``delay`` s (an ``asyncio.sleep``: thousands wait at once without a thread each)."""

    async def allow(_: bytes) -> bytes:
        await asyncio.sleep(delay)
        return b'{"result": "allow"}'

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await keep_alive(reader, writer, allow)

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
        print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/auth", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(main())


@contextmanager
def service_process(delay: float) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--service-delay", str(delay)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.stdin.close()
        proc.wait(30)


def storm(seconds: float, rate: float, delay: float, peer_tree: Path | None) -> dict[str, Any]:
    """HttpAuth against the slow service (and the HttpAuth of ``peer_tree``), then the peer: a
    hook that waits as long, no HTTP."""
    with service_process(delay) as url:
        report = {"HttpAuth, slow service": storm_one(url, seconds, rate, delay)}
        if peer_tree is not None:
            report[f"HttpAuth of {peer_tree}"] = storm_one(url, seconds, rate, delay, peer_tree)
    report["peer: a hook sleeping as long (no HTTP)"] = storm_one(f"sleep:{delay}", seconds, rate, delay)
    return report


def storm_one(url: str, seconds: float, rate: float, delay: float, tree: Path = ROOT) -> dict[str, Any]:
    out: dict[str, Any] = {"service delay ms": delay * 1e3, "storm CONNECTs/s": rate}
    with broker(url, 5.0, 1, tree) as (port, ps):
        ping = pinger(port)
        cpu0 = sum(ps.cpu_times()[:2])
        quiet = pings(ping, seconds)
        cpu1 = sum(ps.cpu_times()[:2])
        out["quiet"] = {"round trips/s": len(quiet) / seconds, **pct(quiet)}
        load = subprocess.Popen(
            [sys.executable, __file__, "--storm-port", str(port), "--rate", str(rate),
             "--seconds", str(seconds)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(0.5)  # the storm under way (a benchmark's ramp, not a test's wait)
        cpu2 = sum(ps.cpu_times()[:2])
        loud = pings(ping, seconds)
        cpu3 = sum(ps.cpu_times()[:2])
        ping.close()
        stdout, _ = load.communicate(timeout=120)
        out["storm"] = {"round trips/s": len(loud) / seconds, **pct(loud)}
        out["broker CPU % of a core"] = {
            "quiet": 100 * (cpu1 - cpu0) / seconds,
            "storm": 100 * (cpu3 - cpu2) / seconds,
        }
        out["storm outcomes"] = json.loads(stdout.strip().splitlines()[-1])
    out["p99 ratio storm/quiet"] = out["storm"]["p99"] / out["quiet"]["p99"]
    return out


LOOP_CHILD = """
import asyncio, asyncio.events, json, sys, time
from broker.authn import HttpAuth
from broker.hooks import AuthRequest

url, rate, delay, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
cpu = []
run = asyncio.events.Handle._run

def timed(self):
    t = time.thread_time()
    run(self)
    cpu.append(time.thread_time() - t)

asyncio.events.Handle._run = timed

async def sleepy():
    await asyncio.sleep(delay)
    return True

async def main():
    loop = asyncio.get_running_loop()
    auth = None if url == "sleep" else HttpAuth(url, timeout=5.0, cache_ttl=0, negative_ttl=0)
    await asyncio.sleep(0.1)
    cpu.clear()
    t0 = time.thread_time()
    start, tasks, i = loop.time(), [], 0
    while (due := start + i / rate) < start + seconds:
        await asyncio.sleep(max(0.0, due - loop.time()))
        r = AuthRequest(f"c{i}", "alice", b"pw", "127.0.0.1", None, "", None, 5)
        tasks.append(asyncio.ensure_future(sleepy()) if auth is None else auth.authenticate_request(r))
        i += 1
    res = await asyncio.gather(*tasks, return_exceptions=True)
    total = time.thread_time() - t0
    xs = sorted(cpu)
    n = len(xs)
    print(json.dumps({"requests": i, "allowed": sum(1 for x in res if x is True),
                      "loop CPU ms per request": total / i * 1e3, "callbacks": n,
                      "callback CPU ms": {"p50": xs[n // 2] * 1e3, "p99": xs[int(n * 0.99)] * 1e3,
                                          "max": xs[-1] * 1e3}}))
    if auth is not None:
        await auth.stop()

asyncio.run(main())
"""


def loop_cost(seconds: float, rate: float, delay: float, peer_tree: Path | None) -> dict[str, Any]:
    """Part 5: the event loop's CPU per HTTP auth request (see the module docstring)."""
    out: dict[str, Any] = {"rate": rate, "service delay ms": delay * 1e3}
    with service_process(delay) as url:
        runs = [("HttpAuth", url, ROOT), ("peer: a hook sleeping as long", "sleep", ROOT)]
        if peer_tree is not None:
            runs.insert(1, (f"HttpAuth of {peer_tree}", url, peer_tree))
        for name, target, tree in runs:
            text = subprocess.run(
                [sys.executable, "-c", LOOP_CHILD, target, str(rate), str(delay), str(seconds)],
                capture_output=True, text=True, check=True, cwd=tree, timeout=120,
                env=dict(os.environ, PYTHONPATH=str(tree)),
            ).stdout  # fmt: skip
            out[name] = json.loads(text.strip().splitlines()[-1])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--decisions", type=int, default=20000)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--delay", type=float, default=0.5)
    ap.add_argument("--storm-port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--service-delay", type=float, default=-1.0, help=argparse.SUPPRESS)
    ap.add_argument("--only", choices=("decision", "jwt", "timeout", "storm", "loop"), default=None)
    ap.add_argument(
        "--peer-tree",
        type=Path,
        default=None,
        help="storm: also run the HttpAuth of this source tree (e.g. a worktree of main)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="storm: run it this many times")
    args = ap.parse_args()
    if args.service_delay >= 0:
        service_main(args.service_delay)
        return 0
    if args.storm_port:
        asyncio.run(storm_main(args.storm_port, args.rate, args.seconds))
        return 0
    report: dict[str, Any] = {"python": sys.version.split()[0]}
    if args.only in (None, "decision"):
        report["1. decision from cache (ms)"] = asyncio.run(decision(args.decisions))
    if args.only in (None, "jwt"):
        with tempfile.TemporaryDirectory() as tmp:
            report["2. JWT verification (ms)"] = asyncio.run(jwt_costs(args.decisions // 4, Path(tmp)))
    if args.only in (None, "timeout"):
        report["3. hanging service"] = timeouts(args.clients)
    if args.only in (None, "storm"):
        for n in range(args.repeat):
            report[f"4. PINGREQ during a CONNECT storm, slow service (run {n + 1})"] = storm(
                args.seconds, args.rate, args.delay, args.peer_tree
            )
    if args.only in (None, "loop"):
        for n in range(args.repeat):
            report[f"5. the event loop's CPU per HTTP auth request (run {n + 1})"] = loop_cost(
                args.seconds, args.rate, args.delay, args.peer_tree
            )
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
