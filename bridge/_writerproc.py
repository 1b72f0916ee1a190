"""The bridge's writer in its own process (issue 42 items 1 and 4): the broker keeps the buffers,
a child interpreter holds numpy and pyarrow and writes the files.

**Why a process.**  Encoding Parquet needs numpy and pyarrow (and pyarrow pulls in pandas at its
first conversion of a list): loaded in the broker, the first recorded ``$SYS`` publication took
an idle ``siftmq serve`` from 40 to 146 MB (docs/performance.md "Footprint"); pyarrow alone
(without pandas) would still be about 100 MB.  No library writes Parquet without them at the
speed the writer needs (the columns are turned into Arrow arrays without Python work per row).
So ``Bridge(writer="process")`` (what ``siftmq serve`` uses) leaves the broker at its idle size
and puts those libraries in a child that blocks pandas (:func:`_block_pandas`: nothing it does
needs it; ~50 MB less).  The encoding's CPU (numpy, Arrow, Snappy, fsync) also leaves the
broker's interpreter: the event loop no longer waits for the GIL while the writer converts.

**What crosses.**  One *job* per source and round (:class:`Job`: the delivery log, the
composite events, or one record kind), built by the broker's writer thread
(``Bridge._take_jobs``, with :func:`fanout_payload`) and sent by :func:`send`: a pickle
(protocol 5) whose large columns -- the delivery log's typed vectors -- travel out of band,
written to the socket from their own buffers (no copy, no Python object per value); strings
are the batch's distinct values (a few hundred, not one per row); subscription changes and
the other rare records are pickled as they are.  Frames are
``<u32 count of buffers><u64 size>... payload buffers...`` on a ``socketpair``: one
``sendmsg`` per frame on a blocking socket, read by the child into a buffer it keeps
(the framing section below says why).

**Nothing acknowledged is lost.**  The broker counts records as written (``stats().written``)
and releases their buffer space only when the child answers that every file of the job is
committed (fsync-ed and renamed).  The file names are chosen by the broker when it builds the
job, so a job sent again after the child died writes the same names, and the child skips a
file already committed under its name (a file is renamed into place only once it is whole): a
file is never written twice and a sequence number never goes backwards (the landing zone's
offsets, ``bridge/_landing.py``).  A child that dies (killed, crashed, out of memory) is
started again (at most once per round; the failure logged once per episode by the Bridge) and
the jobs not acknowledged are sent again, in order; a write that fails (full disk) is answered
as an error and the job is kept for the next round, as in the thread writer.  The child is
started with the bridge (:meth:`WriterProcess.start`) and loads its libraries at once, beside
the broker's start-up; the program it runs is ``bridge/_writerchild.py``.

**Rounds grouped into fewer commits when the rate is low** (issue 42 item 4b).  A commit has a
fixed cost whatever its rows -- two Parquet files, their ``fsync``s and renames, the two
tables' Arrow conversions: 2-3 ms of CPU on a quiet machine, 5-6 ms under load -- which at
the default round of 0.5 s and a few thousand messages a second was 10-25 % of the broker's
CPU per message (docs/performance.md, "The defaults on a loaded machine").  So the broker
still hands the delivery log over every round (a broker killed with SIGKILL loses what the
thread writer would, no more), but a round with few rows may be *held* by the child
(``Job.hold``; the Bridge decides: ``commit_rows``, ``commit_delay``): the child copies the
job's columns and commits it with the next job that is not held (or a ``"commit"`` job) as
one group, one file per kind (bridge/_writerchild.py).  A held job is *not answered* (session
17): the broker's writer thread sends it and goes on, instead of waiting for the child's
``held`` (three reads of the socket, each taking the GIL back from the event loop, and a
pickle and a send in the child, every round).  The broker keeps every job of a group,
unacknowledged, until the group's answer: a child that dies is sent the same group again (the
same names: nothing written twice), and its rows count as written only then; a child that
died holding jobs shows at the next send (``EPIPE``) or at the group's answer (end of file),
and a held job the child could not copy (a bug) fails the group's answer, as a group that
cannot become a table does.  The child commits the jobs it holds when the broker's socket
closes (a graceful stop commits first anyway).  :meth:`WriterProcess._end` kills the child
*before* closing the socket, so a child the broker gives up on never commits a partial group
that is then sent again.

Costs, broker side: per round O(columns) buffer writes to the socket and one pickle of the
distinct strings; the child does the O(rows) work of the thread writer.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.ext import LogColumns

__all__ = [
    "Arena",
    "Job",
    "JobError",
    "WriterProcess",
    "fanout_payload",
    "keep_freed_memory",
    "receive",
    "send",
]

#: the delivery log's vector columns and their NumPy dtypes (``LogColumns``)
COLUMNS = (
    ("time", "<f8"),
    ("message_id", "<i8"),
    ("publisher_id", "<i4"),
    ("topic", "<i4"),
    ("payload_size", "<i8"),
    ("flags", "u1"),
    ("received", "<f8"),
    ("routes", "<i8"),
    ("call", "<i4"),
    ("subscriber", "<i4"),
    ("topic_filter", "<i4"),
    ("selector", "<i4"),
    ("d_flags", "u1"),
)
STRINGS = ("publishers", "subscribers", "topics", "filters")
_HEAD = struct.Struct("<I")
_SIZE = struct.Struct("<Q")
#: the broker's socket buffer toward the child (the kernel caps it at net.core.wmem_max)
_SNDBUF = 4 << 20


class JobError(Exception):
    """The child could not commit a job: ``retry`` (a write failed: keep the job) or not (its
    records could not be turned into a table: discard them, as the thread writer does)."""

    def __init__(self, message: str, retry: bool, os_error: bool) -> None:
        super().__init__(message)
        self.retry = retry
        self.os_error = os_error


def fanout_payload(c: LogColumns) -> dict[str, Any]:
    """The delivery log's batch as a picklable dict whose vectors go out of band. O(columns)."""
    out: dict[str, Any] = {name: pickle.PickleBuffer(getattr(c, name)) for name, _ in COLUMNS}
    for name in STRINGS:
        out[name] = getattr(c, name).values
    out["n_publications"] = c.publications()
    return out


# ---- memory ----
#
# glibc's malloc serves a request above its mmap threshold (128 KB at start, raised by the frees
# of such blocks) with a fresh mapping, and gives a free top of the heap above its trim
# threshold back to the kernel: the delivery log's columns of a round (tens to hundreds of KB
# each, allocated by the writer thread at ``take``, grown by the event loop, freed in bulk when
# a group of rounds is committed) were mapped, grown with ``mremap`` and unmapped over and over,
# and every page of them faulted in again by the event loop.  Profiled under ``--busy 4``
# (perf, session 17): 7.6 % of the defaults' event-loop samples in mmap/mremap/munmap and page
# faults, none in the no-store broker's; 27-77 minor faults per 1,000 deliveries on the loop.
#: below this a block comes from the heap (and is reused after its free) instead of a mapping
_MMAP_THRESHOLD = 4 << 20
#: free memory at the top of the heap kept for reuse (a group of held rounds' columns fits)
_TRIM_THRESHOLD = 16 << 20
_TUNED: list[bool] = []


def keep_freed_memory() -> bool:
    """Fix glibc's mmap threshold at 4 MB and its trim threshold at 16 MB in this process (the
    broker, when its bridge starts; the writer process), so that the columns freed by one group
    of rounds are reused by the next instead of being unmapped and faulted in again (the memory
    kept is bounded by the trim threshold).  Not done (False) on another C library or when the
    operator tunes malloc (a ``malloc`` tunable in ``GLIBC_TUNABLES``, any ``MALLOC_*``
    variable); once per process. O(1)."""
    if _TUNED:
        return _TUNED[0]
    env = os.environ
    tuned = "malloc" in env.get("GLIBC_TUNABLES", "") or any(k.startswith("MALLOC_") for k in env)
    ok = False
    if not tuned and sys.platform == "linux" and _glibc():
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):
            mallopt = None
        if mallopt is not None:
            # malloc.h: M_MMAP_THRESHOLD -3, M_TRIM_THRESHOLD -1 (1: set)
            ok = mallopt(-3, _MMAP_THRESHOLD) == 1 and mallopt(-1, _TRIM_THRESHOLD) == 1
    _TUNED.append(ok)
    return ok


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):
        return False


# ---- framing ----
#
# Both ends use blocking sockets (the broker's with kernel time-outs, SO_SNDTIMEO/SO_RCVTIMEO,
# not Python's: a Python time-out makes the socket non-blocking, and ``sendall`` then polls and
# sends one socket buffer at a time, releasing and taking back the broker's GIL twice per
# buffer -- each time taking it from the event loop; issue 42 item 4).  A frame goes out in one
# ``sendmsg`` (the header and every buffer, no copy; the rest by ``sendall`` if the kernel took
# part of it) and is read in two ``recv_into(MSG_WAITALL)`` calls: the header, then every part
# at once into one buffer, which the child reuses from round to round (:class:`Arena`: no
# fresh zeroed memory, no page faults, per round).


def send(sock: socket.socket, obj: object) -> None:
    """Write ``obj`` as one frame (its large buffers out of band). O(size) copies by the kernel."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    views = [memoryview(data), *(b.raw() for b in buffers)]
    head = _HEAD.pack(len(views)) + b"".join(_SIZE.pack(v.nbytes) for v in views)
    parts = [memoryview(head), *(v for v in views if v.nbytes)]
    sent = sock.sendmsg(parts)
    for part in parts:  # a partial send (time-out, signal, small buffer): the rest in order
        if sent >= part.nbytes:
            sent -= part.nbytes
            continue
        sock.sendall(part[sent:])
        sent = 0


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    while view:
        got = sock.recv_into(view, len(view), socket.MSG_WAITALL)
        if not got:
            raise EOFError("the other end closed the socket")
        view = view[got:]


class Arena:
    """The child's receive buffer, kept from frame to frame (a frame's objects are dropped
    before the next frame is read: the child answers each job before it reads the next)."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def get(self, n: int) -> memoryview:
        """``n`` bytes of the buffer; a new buffer when it is too small, or more than 4 times
        too large past 16 MB (after a burst: its memory goes back). O(1), O(n) when it grows."""
        if n > len(self.buf) or (len(self.buf) > 16 << 20 and len(self.buf) > 4 * n):
            self.buf = bytearray(n)
        return memoryview(self.buf)[:n]


def receive(sock: socket.socket, arena: Arena | None = None) -> Any:
    """The next frame's object; its buffers are views of ``arena`` (valid until the next call
    with it) or of a new buffer."""
    head = bytearray(_HEAD.size)
    _recv_into(sock, memoryview(head))
    (count,) = _HEAD.unpack(head)
    sizes_buf = bytearray(_SIZE.size * count)
    _recv_into(sock, memoryview(sizes_buf))
    sizes = struct.unpack(f"<{count}Q", sizes_buf)
    total = sum(sizes)
    body = arena.get(total) if arena is not None else memoryview(bytearray(total))
    _recv_into(sock, body)
    parts = []
    at = 0
    for n in sizes:
        parts.append(body[at : at + n])
        at += n
    return pickle.loads(parts[0], buffers=parts[1:])


# ---- the broker's side ----


@dataclass(frozen=True, slots=True)
class Job:
    """One round's records of one source: ``what`` is ``"fanout"`` (deliveries and publications
    of the delivery log), ``"events"`` (composite events), ``"commit"`` (no records: commit the
    fan-out jobs the child holds) or a record kind's value; ``names``: the file names of each
    kind's parts, in order, chosen when the job was built."""

    what: str
    payload: Any
    node: str | None
    roll_rows: int
    names: tuple[tuple[str, tuple[str, ...]], ...]
    rows: tuple[tuple[str, int], ...]  # records per kind (stats().pending)
    credit: int  # rows to release from the delivery log once committed
    #: fan-out jobs: held by the child for a later commit (True), committed now with the jobs
    #: it holds (False), not decided yet (None: the Bridge decides when it first sends it)
    hold: bool | None = None
    at: float = 0.0  # time.monotonic() when the job was built (a group's age)


#: the child's program (bridge/_writerchild.py; not ``-m``: that module would be loaded twice,
#: as ``__main__`` and again by pickle).  It must run the broker's own ``bridge`` package (the
#: two ends' protocol is one): started with ``-P`` (``-c`` would put the working directory first
#: on ``sys.path``, and a broker started from a directory holding another ``bridge`` package, such
#: as another checkout, ran *that* package's child -- session 18: the two protocols differed and
#: both ends waited for each other until the time-out), and given the directory the broker's
#: ``bridge`` was imported from (``_ROOT``), put first on its path unless it is there already (an
#: installed broker: site-packages; not put first then, so nothing there shadows the standard
#: library), so that a broker run from a checkout without an install, or with ``PYTHONPATH``
#: choosing a tree, starts the same tree's child.
_CHILD = (
    "import os, sys; root = os.path.realpath(sys.argv[3]); "
    "root in map(os.path.realpath, sys.path) or sys.path.insert(0, root); "
    "from bridge._writerchild import main; sys.exit(main(sys.argv[1:3]))"
)
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class WriterProcess:
    """The child writer seen from the broker's writer thread: :meth:`run` sends a job and waits
    for its answer, starting the child first if there is none (or it died).  One thread only.

    ``landing``: the landing zone (a path or URI), passed to the child's sink."""

    def __init__(self, landing: str, timeout: float = 300.0) -> None:
        self.landing = landing
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self.starts = 0  # children started (restarts = starts - 1)
        self.last_exit: int | None = None  # exit status of the last child that ended on a failure

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-c", _CHILD, str(theirs.fileno()), self.landing, _ROOT],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        # blocking, with the kernel's time-outs (the framing's comment says why); a socket
        # buffer that holds a round's columns in one or two sends (capped by net.core.wmem_max)
        seconds = int(self.timeout)
        tv = struct.pack("ll", seconds, int((self.timeout - seconds) * 1e6))
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SNDBUF)
        self._sock = ours
        self.starts += 1
        return ours

    def start(self) -> None:
        """Start the child now (it loads numpy and pyarrow at once, beside the broker's own
        start-up) rather than at the first job; idempotent."""
        if self._sock is None:
            self._start()

    def run(self, job: Job) -> list[tuple[str, int, int]] | None:
        """Commit ``job`` in the child; its files as (kind, rows, bytes), those of the held jobs it
        committed with it included; None: the child holds it (``job.hold``: sent, not waited
        for; a child that died holding it shows at a later job).  Raises :class:`JobError`
        (the child answered a failure) or ``OSError``/``EOFError`` (the child is gone or stuck:
        it is ended and the next call starts a new one)."""
        sock = self._sock or self._start()
        try:
            send(sock, job)
            if job.what == "fanout" and job.hold:
                return None  # not answered: acknowledged with its group (module docstring)
            answer = receive(sock)
        except (OSError, EOFError, pickle.UnpicklingError):
            self._end()
            raise
        match answer:
            case ("ok", files):
                return list(files)
            case ("error", message, retry, os_error):
                raise JobError(message, retry, os_error)
        self._end()
        raise EOFError(f"unexpected answer from the writer process: {answer!r}")

    def _end(self) -> None:
        # killed before its socket closes: a child that saw the socket close would commit the
        # jobs it holds, and the Bridge sends them again (module docstring)
        sock, proc = self._sock, self.proc
        self._sock = self.proc = None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            self.last_exit = proc.wait()  # the Bridge logs it, once per episode
        if sock is not None:
            sock.close()

    def close(self) -> None:
        """End the child: it sees the socket close and exits (killed if it does not in 10 s)."""
        sock, proc = self._sock, self.proc
        self._sock = self.proc = None
        if sock is not None:
            sock.close()
        if proc is not None:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
