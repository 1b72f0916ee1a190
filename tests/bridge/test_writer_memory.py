"""The bridge keeps the memory its rounds free for the next ones (bridge/_writerproc.py,
"memory"; issue 42 item 4b, session 17).

glibc served the delivery log's columns (tens to hundreds of KB a round) with fresh mappings
above its 128 KB mmap threshold and gave freed heap back to the kernel above its trim threshold,
so the event loop faulted every page of every round's columns in again (perf under load: 7.6 %
of the defaults' loop samples).  A bridge that starts fixes the thresholds (4 MB, 16 MB) unless
the operator set them.  Checked in a fresh interpreter (its thresholds are glibc's own at
start): after ``start_writer`` a 1 MB block comes from the heap, not from a mapping of its own;
with ``MALLOC_MMAP_THRESHOLD_`` set by the operator, the bridge leaves malloc alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import ctypes, sys
from bridge import Bridge
b = Bridge(sys.argv[1], writer="thread")
b.start_writer()
try:
    block = bytearray(1 << 20)  # above glibc's own mmap threshold, below the bridge's
    at = ctypes.addressof((ctypes.c_char * len(block)).from_buffer(block))
    heap = [line.split()[0] for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]")]
    lo, hi = (int(x, 16) for x in heap[0].split("-")) if heap else (0, 0)
    from bridge import _writerproc
    print(getattr(_writerproc, "_TUNED", [None]) == [True], lo <= at < hi)
finally:
    b.close()
"""


def _probe(tmp_path: Path, env: dict[str, str]) -> tuple[str, str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path / "landing")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    return out[0], out[1]


@pytest.mark.skipif(
    sys.platform != "linux" or not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"),
    reason="glibc's malloc",
)
def test_a_started_bridge_serves_its_rounds_blocks_from_the_heap(tmp_path: Path) -> None:
    if any(k.startswith("MALLOC_") or k == "GLIBC_TUNABLES" for k in os.environ):
        pytest.skip("this environment sets malloc's thresholds itself")
    tuned, in_heap = _probe(tmp_path, {})
    assert (tuned, in_heap) == ("True", "True")  # main: a mapping of its own, faulted in anew
    # the operator's own setting wins: the bridge does not touch malloc
    tuned, in_heap = _probe(tmp_path, {"MALLOC_MMAP_THRESHOLD_": str(128 << 10)})
    assert (tuned, in_heap) == ("False", "False")
