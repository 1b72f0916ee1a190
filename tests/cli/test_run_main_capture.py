"""``run_main`` (tests/cli/_pubsub.py) captures only the output of the thread that runs it.

tests/admin/test_ctl.py runs ``siftmq ctl`` through ``broker._cli.main`` in a worker thread
beside the broker on the test's loop.  ``run_main`` used ``contextlib.redirect_stdout``, which
replaces ``sys.stdout`` for the whole process: what the loop's thread wrote meanwhile landed in
ctl's output (and a ctl output parsed as JSON could fail by what the broker printed).  Here an
HTTP service on the loop writes to ``sys.stdout`` and ``sys.stderr`` while it answers ctl's
request, that is while ``run_main`` captures: ctl's output is its JSON alone, and the loop's
lines reach the test's own streams.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from tests.cli._pubsub import run_main

ANSWER = b'{"users": []}'


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")  # a GET: no body
    print("BESIDE-OUT")  # the loop's thread, while ctl waits for this answer
    print("BESIDE-ERR", file=sys.stderr)
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER)
    )
    await writer.drain()
    writer.close()


async def test_what_the_loop_writes_during_a_run_main_call_is_not_captured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = await asyncio.start_server(_answer, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        code, out, err = await asyncio.to_thread(run_main, "ctl", "--url", url, "users", "list")
    finally:
        server.close()
        await server.wait_closed()
    assert code == 0, err
    assert json.loads(out) == {"users": []}  # on main: BESIDE-OUT in it too
    assert "BESIDE" not in out and "BESIDE" not in err
    mine = capsys.readouterr()
    assert "BESIDE-OUT" in mine.out and "BESIDE-ERR" in mine.err  # where the loop's lines belong
    assert sys.stdout is not None and type(sys.stdout).__name__ != "_ThreadCapture"  # put back
