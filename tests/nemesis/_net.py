"""The nemesis's network (issue 30): one Linux network namespace per broker node on a bridge
this module creates, and partitions made with nftables inside the node namespaces.

Layout, for a run tagged ``k`` (0-249, from the process id, so that two runs can coexist):
bridge ``sqjb<k>``, namespaces ``sqj<k>n<i>`` each with a veth ``eth0`` whose host end
``sqj<k>v<i>`` is a port of the bridge, addresses ``10.213.<k>.<i+1>/24``.  The host has no
address on the bridge: test traffic stays among the namespaces.  Partitions are drop rules
of an ``inet nemesis`` table in the node namespaces (``tc netem`` is not available here):
``cut(a, b)`` drops both directions between two nodes, ``drop_one_way(a, b)`` what ``a``
sends to ``b`` only.  A client runs inside a node's namespace through :func:`in_namespace`
(``setns`` of a thread: the threads it starts, paho's loop among them, stay in it).

Cleanup: :meth:`Network.close` kills what runs in the namespaces, deletes them (their veths go
with them) and the bridge; it runs from ``finally`` and from ``atexit``; at start a run
removes what an earlier run of its tag left (:func:`remove_stale`) and the namespaces of any
tag whose owner process (``/run/siftmq-nemesis/<tag>``) is gone (:func:`remove_abandoned`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

PREFIX = "sqj"
_CLONE_NEWNET = 0x40000000
R = TypeVar("R")


def why_not() -> str | None:
    """Why this machine cannot run the nemesis (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, a bridge, nftables)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"needs {tool} (make installs iproute2 and nftables when it can)"
    probe = f"{PREFIX}probe{os.getpid() % 1000}"
    try:
        _run(["ip", "netns", "add", probe])
        _run(["ip", "netns", "exec", probe, "nft", "add", "table", "inet", "probe"])
    except subprocess.CalledProcessError as exc:
        return f"network namespaces or nftables unavailable: {exc.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _run(cmd: list[str], stdin: str | None = None) -> str:
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=True).stdout


def remove_stale(tag: int | None = None) -> None:
    """Namespaces and bridges of earlier runs (by name prefix; only ``tag``'s when given),
    with the processes left in those namespaces."""
    mine = f"{PREFIX}{tag}n" if tag is not None else PREFIX
    for line in _run(["ip", "netns", "list"]).splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(mine):
            _kill_in(name)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    bridge = f"{PREFIX}{tag}b" if tag is not None else None
    for line in _run(["ip", "-o", "link", "show", "type", "bridge"]).splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if (bridge is not None and name == bridge) or (
            bridge is None and name.startswith(PREFIX) and name[len(PREFIX) :].rstrip("b").isdigit()
        ):
            subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)


#: which process made the namespaces of a tag (``<tag>`` -> its pid)
_OWNERS = Path("/run/siftmq-nemesis")


def remove_abandoned() -> None:
    """The namespaces and bridges of tags whose run is gone (killed before its cleanup: its
    nodes may still run in them), found by name prefix and owner file."""
    tags: set[int] = set()
    for line in _run(["ip", "netns", "list"]).splitlines():
        name = line.split()[0] if line.split() else ""
        head = name[len(PREFIX) :].split("n")[0]
        if name.startswith(PREFIX) and head.isdigit():
            tags.add(int(head))
    for tag in tags:
        try:
            owner = int((_OWNERS / str(tag)).read_text())
            os.kill(owner, 0)  # alive: not ours to remove
        except (OSError, ValueError):
            remove_stale(tag)


def _kill_in(ns: str) -> None:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False).stdout
    for pid in out.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGCONT)
            os.kill(int(pid), signal.SIGKILL)


class Network:
    """``n`` node namespaces on one bridge (see the module docstring)."""

    def __init__(self, n: int, tag: int | None = None) -> None:
        self.tag = os.getpid() % 250 if tag is None else tag
        self.bridge = f"{PREFIX}{self.tag}b"
        self.namespaces: list[str] = []
        self.addresses: list[str] = []
        self._closed = False
        remove_abandoned()
        remove_stale(self.tag)
        _OWNERS.mkdir(parents=True, exist_ok=True)
        (_OWNERS / str(self.tag)).write_text(str(os.getpid()))
        atexit.register(self.close)
        try:
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "link", "set", self.bridge, "up"])
            for _ in range(n):
                self.add_node()
        except BaseException:
            self.close()
            raise

    def add_node(self) -> int:
        """One more namespace on the bridge; its index."""
        i = len(self.namespaces)
        ns, veth, addr = f"{PREFIX}{self.tag}n{i}", f"{PREFIX}{self.tag}v{i}", f"10.213.{self.tag}.{i + 1}"
        _run(["ip", "netns", "add", ns])
        self.namespaces.append(ns)
        self.addresses.append(addr)
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        _run(["ip", "link", "set", veth, "master", self.bridge, "up"])
        for cmd in (
            ["ip", "addr", "add", f"{addr}/24", "dev", "eth0"],
            ["ip", "link", "set", "eth0", "up"],
            ["ip", "link", "set", "lo", "up"],
        ):
            _run(["ip", "netns", "exec", ns, *cmd])
        _run(
            ["ip", "netns", "exec", ns, "nft", "-f", "-"],
            "table inet nemesis {\n"
            " chain input { type filter hook input priority 0; policy accept; }\n"
            " chain output { type filter hook output priority 0; policy accept; }\n}\n",
        )
        return i

    # ------------------------------------------------------------ faults
    def _nft(self, i: int, script: str) -> None:
        _run(["ip", "netns", "exec", self.namespaces[i], "nft", "-f", "-"], script)

    def drop_one_way(self, a: int, b: int) -> None:
        """What node ``a`` sends to node ``b`` is dropped (both ends drop it)."""
        self._nft(a, f"add rule inet nemesis output ip daddr {self.addresses[b]} drop\n")
        self._nft(b, f"add rule inet nemesis input ip saddr {self.addresses[a]} drop\n")

    def cut(self, a: int, b: int) -> None:
        """Nodes ``a`` and ``b`` cannot reach each other."""
        self.drop_one_way(a, b)
        self.drop_one_way(b, a)

    def split(self, side: list[int]) -> None:
        """``side`` and the other nodes cannot reach each other."""
        others = [j for j in range(len(self.namespaces)) if j not in side]
        for a in side:
            for b in others:
                self.cut(a, b)

    def heal(self) -> None:
        """Every drop rule removed."""
        for i in range(len(self.namespaces)):
            self._nft(i, "flush chain inet nemesis input\nflush chain inet nemesis output\n")

    # ------------------------------------------------------------ processes
    def popen(self, i: int, cmd: list[str], **kw: object) -> subprocess.Popen[str]:
        """``cmd`` started inside node ``i``'s namespace (``ip netns exec`` execs it: the
        process id is the command's)."""
        return subprocess.Popen(["ip", "netns", "exec", self.namespaces[i], *cmd], text=True, **kw)  # type: ignore[call-overload,no-any-return]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ns in self.namespaces:
            _kill_in(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            (_OWNERS / str(self.tag)).unlink()
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)


_libc = ctypes.CDLL(None, use_errno=True)


def in_namespace(ns: str, fn: Callable[[], R]) -> R:
    """``fn()`` run by a thread that entered network namespace ``ns`` (threads it starts stay
    there, sockets it makes belong there)."""
    out: list[R] = []
    err: list[BaseException] = []

    def body() -> None:
        try:
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {ns}")
            finally:
                os.close(fd)
            out.append(fn())
        except BaseException as exc:
            err.append(exc)

    t = threading.Thread(target=body, name=f"in {ns}")
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]
