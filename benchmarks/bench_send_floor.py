"""The kernel's floor under a fan-out: one non-blocking ``send`` per receiving connection.

Issue 42 item 2 asks for a p99 <= 20 ms for content-filtered delivery at 100k filtered
subscriptions, where the stream's heaviest message has 5,188 deliveries, one to each of
5,188 distinct subscriber connections (docs/performance-content.md, "p99 at 10k and 100k").
Whatever a single-threaded broker does in user space, each of those deliveries costs at least
one ``send`` system call on its own TCP socket. This measures that floor on the machine at
hand, with no broker at all:

* the sender (this process; CPU 0 unless ``--no-pin``, where bench_content_fleet.py pins the
  broker) accepts ``--connections`` loopback TCP connections, non-blocking with TCP_NODELAY
  (the broker's settings, ``broker.net._accept``), whose other ends sit in one reader process
  (CPU 1, where the fleet's subscribers run);
* a round sends one 230-byte MQTT 5 QoS 0 PUBLISH (the fleet stream's size on the wire) to
  every connection, **from Python** (a loop of ``socket.send``, what ``LeanProtocol.write``
  calls per delivery) and, as the same-run peer, **from C** (a loop of ``send(2)`` with
  ``MSG_DONTWAIT``, compiled here with the system's ``cc`` and called once per round through
  ctypes: the floor without the interpreter), the two alternating round by round;
* the reader either **reads** (an epoll loop over every socket, as the fleet's subscribers:
  each send finds a reader to wake) or **does not** (the sockets are only held: nothing to
  wake, the bytes wait in the receive queues); reading, the sender waits between rounds until
  the reader has read the round's bytes.

Per reader mode and sender: microseconds per ``send`` (wall time of the round / connections,
median and best round), the sender's CPU per ``send`` (``getrusage``: user + system, and the
system part), and the round's wall time (first -> last send) for ``--connections`` deliveries:
the lowest possible first -> last write time of a fan-out that large on this machine.

``--mosquitto`` adds a broker peer: the same number of readers subscribed to mosquitto
(Debian's, ``persistence false``, TCP_NODELAY), one publisher in the reader process sending
``--messages`` QoS 0 PUBLISHes of the same size, each after every reader got the one before;
mosquitto's user and system CPU per delivery (from /proc, 10-ms ticks over the whole run).

    flock /work/bench.lock .venv/bin/python benchmarks/bench_send_floor.py \\
        --connections 1000,5188 --rounds 20 --mosquitto

Results: docs/performance-content.md, "The floor of a 5,188-delivery fan-out".
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import multiprocessing as mp
import os
import resource
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

TOPIC = b"fleet/telemetry"
SIZE = 230  # bytes of one delivery on the wire (the fleet stream's ~205-byte payload, MQTT 5)

C_SOURCE = r"""
#include <sys/socket.h>
#include <time.h>
long long send_all(const int *fds, int n, const char *buf, int len, int *shorts) {
    struct timespec a, b;
    int s = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; i++) {
        if (send(fds[i], buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) != len) s++;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    *shorts = s;
    return (b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
}
"""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        n, b = n >> 7, n & 0x7F
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def publish_packet(size: int = SIZE, v5: bool = True) -> bytes:
    """A QoS 0 PUBLISH to ``fleet/telemetry`` of exactly ``size`` bytes (MQTT 5: a zero
    property length; 3.1.1 without), with a JSON-looking payload."""
    head = len(TOPIC).to_bytes(2, "big") + TOPIC + (b"\x00" if v5 else b"")
    body_len = size - 1 - len(_varint(size)) - len(head)  # the varint is 2 bytes at this size
    payload = (b'{"seq": 0, "pad": "' + b"x" * size)[: body_len - 2] + b'"}'
    packet = b"\x30" + _varint(len(head) + len(payload)) + head + payload
    assert len(packet) == size, len(packet)
    return packet


def _c_sender(tmp: Path) -> Any | None:
    """The C loop (``send_all``), compiled with ``cc``; None without a compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src = tmp / "floor.c"
    lib = tmp / "floor.so"
    src.write_text(C_SOURCE)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    fn = ctypes.CDLL(str(lib)).send_all
    fn.restype = ctypes.c_longlong
    fn.argtypes = [
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_int),
    ]
    return fn


# ------------------------------------------------------------ the reader process
def _raise_nofile() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _connect_all(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(s)
    return socks


def _read_until(ep: select.epoll, by_fd: dict[int, socket.socket], want: int, got: int) -> int:
    """Read every ready socket until ``got`` reaches ``want`` bytes; returns the new count."""
    while got < want:
        for fd, _ev in ep.poll(1.0):
            try:
                data = by_fd[fd].recv(65536)
            except BlockingIOError:
                continue
            if not data:
                raise RuntimeError("a connection closed")
            got += len(data)
    return got


def reader_main(pipe: Connection, port: int, n: int, mode: str, pin: int | None) -> None:
    """``mode``: ``read`` (epoll over every socket, the sender told after each round's bytes),
    ``hold`` (sockets held, nothing read), ``mosquitto`` (MQTT subscribers plus a publisher,
    ``port`` is mosquitto's)."""
    if pin is not None:
        os.sched_setaffinity(0, {pin})
    _raise_nofile()
    if mode == "mosquitto":
        _mosquitto_readers(pipe, port, n)
        return
    socks = _connect_all(port, n)
    pipe.send("connected")
    if mode == "hold":
        pipe.recv()  # "stop"
        for s in socks:
            s.close()
        return
    ep, by_fd = _epoll_of(socks)
    got = 0
    while True:
        msg = pipe.recv()
        if msg == "stop":
            break
        got = _read_until(ep, by_fd, msg, got)  # msg: the bytes expected so far
        pipe.send(got)
    for s in socks:
        s.close()


def _epoll_of(socks: list[socket.socket]) -> tuple[select.epoll, dict[int, socket.socket]]:
    """The sockets made non-blocking and registered for reading; the epoll and them by fd."""
    ep = select.epoll()
    by_fd = {}
    for s in socks:
        s.setblocking(False)
        ep.register(s.fileno(), select.EPOLLIN)
        by_fd[s.fileno()] = s
    return ep, by_fd


def _mqtt(fixed: int, body: bytes) -> bytes:
    return bytes([fixed]) + _varint(len(body)) + body


def _mosquitto_readers(pipe: Connection, port: int, n: int) -> None:
    """``n`` MQTT 3.1.1 subscribers of ``fleet/telemetry`` at QoS 0 and one publisher; per
    message, the publisher's PUBLISH then every subscriber's copy read."""
    socks = _connect_all(port, n + 1)
    pub, subs = socks[0], socks[1:]
    for i, s in enumerate(socks):
        cid = f"floor{i}".encode()
        s.sendall(_mqtt(0x10, b"\x00\x04MQTT\x04\x02\x00\x00" + len(cid).to_bytes(2, "big") + cid))
    for s in socks:
        assert s.recv(4)[:1] == b"\x20"
    for s in subs:
        s.sendall(_mqtt(0x82, b"\x00\x01" + len(TOPIC).to_bytes(2, "big") + TOPIC + b"\x00"))
    for s in subs:
        assert s.recv(5)[:1] == b"\x90"
    packet = publish_packet(SIZE, v5=False)
    ep, by_fd = _epoll_of(subs)
    pipe.send("connected")
    messages = pipe.recv()
    got = 0
    for m in range(messages):
        pub.sendall(packet)
        got = _read_until(ep, by_fd, (m + 1) * n * len(packet), got)
    pipe.send(got)
    pipe.recv()  # "stop"
    for s in socks:
        s.close()


# ------------------------------------------------------------ the sender (this process)
def _cpu() -> tuple[float, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime


def measure(n: int, mode: str, rounds: int, send_c: Any | None, pin: bool) -> list[dict[str, Any]]:
    """Both senders against one reader process in ``mode`` (``read`` or ``hold``)."""
    ctx = mp.get_context("spawn")
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(4096)
    port = lst.getsockname()[1]
    a, b = ctx.Pipe()
    proc = ctx.Process(target=reader_main, args=(b, port, n, mode, 1 if pin else None), daemon=True)
    proc.start()
    socks = []
    for _ in range(n):
        s, _addr = lst.accept()
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        socks.append(s)
    assert a.recv() == "connected"
    packet = publish_packet()
    fds = (ctypes.c_int * n)(*[s.fileno() for s in socks])
    shorts = ctypes.c_int(0)
    senders = ["python"] + (["c"] if send_c is not None else [])
    wall: dict[str, list[float]] = {k: [] for k in senders}
    cpu: dict[str, list[float]] = {k: [0.0, 0.0] for k in senders}
    short: dict[str, int] = dict.fromkeys(senders, 0)
    expected = 0
    for r in range(rounds + 1):  # round 0 of each sender: a warm-up, not counted
        for who in senders:
            u0, s0 = _cpu()
            if who == "python":
                t0 = time.perf_counter_ns()
                for s in socks:
                    if s.send(packet) != len(packet):
                        short[who] += 1
                ns = time.perf_counter_ns() - t0
            else:
                ns = send_c(fds, n, packet, len(packet), ctypes.byref(shorts))
                short[who] += shorts.value
            u1, s1 = _cpu()
            if r:
                wall[who].append(ns / 1e9)
                cpu[who][0] += u1 - u0
                cpu[who][1] += s1 - s0
            expected += n * len(packet)
            if mode == "read":
                a.send(expected)
                a.recv()  # read: the next round finds every reader idle again
            else:
                time.sleep(0.01)
    a.send("stop")
    proc.join(30)
    for s in socks:
        s.close()
    lst.close()
    out = []
    for who in senders:
        sends = n * rounds
        out.append(
            {
                "connections": n,
                "reader": "reading" if mode == "read" else "not reading",
                "sender": who,
                "us_per_send_median": round(statistics.median(wall[who]) * 1e6 / n, 2),
                "us_per_send_best": round(min(wall[who]) * 1e6 / n, 2),
                "cpu_us_per_send": round((cpu[who][0] + cpu[who][1]) * 1e6 / sends, 2),
                "sys_us_per_send": round(cpu[who][1] * 1e6 / sends, 2),
                "round_ms_median": round(statistics.median(wall[who]) * 1e3, 2),
                "round_ms_best": round(min(wall[who]) * 1e3, 2),
                "short_sends": short[who],
            }
        )
    return out


def _ticks(pid: int) -> tuple[int, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])  # utime, stime (clock ticks)


def measure_mosquitto(n: int, messages: int, pin: bool) -> dict[str, Any]:
    """mosquitto's user and system CPU per delivery, ``messages`` messages to ``n`` readers."""
    import bench_fleet

    bench_fleet.PIN = pin
    proc, port, tmp = bench_fleet.start("mosquitto", False, [])
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    reader = ctx.Process(target=reader_main, args=(b, port, n, "mosquitto", 1 if pin else None), daemon=True)
    try:
        reader.start()
        assert a.recv() == "connected"
        hz = os.sysconf("SC_CLK_TCK")
        u0, s0 = _ticks(proc.pid)
        t0 = time.perf_counter()
        a.send(messages)
        a.recv()
        wall = time.perf_counter() - t0
        u1, s1 = _ticks(proc.pid)
        a.send("stop")
        reader.join(30)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    deliveries = n * messages
    return {
        "connections": n,
        "reader": "reading",
        "sender": "mosquitto",
        "messages": messages,
        "cpu_us_per_send": round((u1 - u0 + s1 - s0) / hz * 1e6 / deliveries, 2),
        "sys_us_per_send": round((s1 - s0) / hz * 1e6 / deliveries, 2),
        "wall_ms_per_message": round(wall * 1e3 / messages, 2),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| connections | reader | sender | us per send, median / best round | sender CPU per send"
        " (system) | first -> last send, median / best round |",
        "|---:|---|---|---|---|---|",
    ]
    for r in rows:
        if r["sender"] == "mosquitto":
            lines.append(
                f"| {r['connections']:,} | {r['reader']} | mosquitto ({r['messages']} messages) | - |"
                f" {r['cpu_us_per_send']} us ({r['sys_us_per_send']}) | -"
                f" ({r['wall_ms_per_message']} ms per message, reader-bound) |"
            )
            continue
        lines.append(
            f"| {r['connections']:,} | {r['reader']} | {r['sender']} |"
            f" {r['us_per_send_median']} / {r['us_per_send_best']} us |"
            f" {r['cpu_us_per_send']} us ({r['sys_us_per_send']}) |"
            f" {r['round_ms_median']} / {r['round_ms_best']} ms |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--connections", default="1000,5188", help="comma-separated counts (1-15,000)")
    ap.add_argument("--rounds", type=int, default=20, help="rounds per sender and reader mode")
    ap.add_argument("--modes", default="read,hold", help="reader modes: read, hold")
    ap.add_argument("--mosquitto", action="store_true", help="mosquitto's CPU per delivery too")
    ap.add_argument("--messages", type=int, default=20, help="messages of the mosquitto run")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="leave the processes unpinned")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = ap.parse_args(argv)
    try:
        counts = [int(x) for x in args.connections.split(",")]
    except ValueError:
        ap.error(f"--connections: not a list of integers: {args.connections!r}")
    if not all(1 <= c <= 15_000 for c in counts):
        ap.error("--connections: each count between 1 and 15,000")
    modes = args.modes.split(",")
    if not set(modes) <= {"read", "hold"}:
        ap.error(f"--modes: read and/or hold, not {args.modes!r}")
    if args.rounds < 1 or args.messages < 1:
        ap.error("--rounds and --messages: at least 1")
    _raise_nofile()
    if args.pin:
        os.sched_setaffinity(0, {0})
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        send_c = _c_sender(Path(tmp))
        if send_c is None:
            print("no C compiler (cc): the Python sender only", file=sys.stderr)
        for n in counts:
            for mode in modes:
                rows += measure(n, mode, args.rounds, send_c, args.pin)
            if args.mosquitto:
                with contextlib.suppress(FileNotFoundError):
                    rows.append(measure_mosquitto(n, args.messages, args.pin))
    print(json.dumps(rows, indent=1) if args.json else markdown(rows))
    return rows


if __name__ == "__main__":
    main()
