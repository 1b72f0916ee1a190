"""A persisted broker in a child process that a test may ``kill -9`` (the crash tests' one
way to start it), or stop with SIGTERM (``Broker.stop``, as ``siftmq serve`` does): the child
prints its port, the test reads it and gets the process."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 20.0

_SCRIPT = """
import ast, asyncio, signal, sys
from broker import Broker

async def main() -> None:
    options = ast.literal_eval(sys.argv[2])
    b = Broker(host="127.0.0.1", port=0, sys_interval=0, store_path=sys.argv[1], **options)
    await b.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("PORT", b.port, flush=True)
    await stop.wait()
    await b.stop()

asyncio.run(main())
"""


async def start_broker(db: Path, **options: object) -> tuple[asyncio.subprocess.Process, int]:
    """A broker storing in ``db`` with ``options`` (``Broker`` keyword arguments, literals
    only), listening on a port of its choosing: the process and that port."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _SCRIPT, str(db), repr(options), cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), TIMEOUT)
    assert line.startswith(b"PORT "), line
    return proc, int(line.split()[1])
