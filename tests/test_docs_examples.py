"""Every Python and shell example of the user's guide runs (issue 41 item 6).

The user's guide is the list of pages under "User's guide" in docs/README.md. Their fenced
blocks tagged ``python`` or ``sh`` are the examples (blocks with another tag or none are
output, diagrams or configuration). An HTML comment on the line before a block marks it:

* ``<!-- example: serve -->``: a long-running ``siftmq serve``; the test starts it with its
  ports changed to 0, waits until it logs that it listens, and the page's later shell blocks
  talk to it (their ``siftmq pub``/``sub`` get ``-p PORT``, ``127.0.0.1:9464`` becomes the
  metrics port it logged);
* ``<!-- example: spark -->``: needs a Spark session; run by tests/bridge/test_docs_spark.py
  with the suite's shared session;
* ``<!-- example: not run (why) -->``: cannot run here (installs software, needs a remote
  broker or root, or is a fragment of a larger program); its syntax is checked
  (``compile`` for Python, ``bash -n`` for shell).

Unmarked blocks run as written: Python in this process (a fresh namespace, ``__name__ ==
"__main__"``, in a temporary directory: each embeds its own broker on port 0), shell with bash
(``-e -o pipefail``) in a temporary directory holding a ``.venv`` link to this environment, one
after another per page, against the page's ``serve`` block or, when it has none, one broker
shared by the module. A few seconds in all: no Spark, one broker per page at most.
"""

from __future__ import annotations

import ast
import asyncio
import os
import re
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
VENV = Path(sys.executable).parent.parent
MARK = re.compile(r"<!--\s*example:\s*(serve|spark|not run)\b[^>]*-->")
FENCE = re.compile(r"^```(python|sh)\n(.*?)^```$", re.S | re.M)


@dataclass(frozen=True, slots=True)
class Example:
    page: str
    line: int
    language: str  # "python" | "sh"
    code: str
    mark: str  # "" (runs) | "serve" | "spark" | "not run"

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def guide() -> list[Path]:
    """The user's guide: the pages docs/README.md lists under "User's guide", in order."""
    toc = (DOCS / "README.md").read_text()
    part = toc[toc.index("## User's guide") : toc.index("\n## ", toc.index("## User's guide") + 1)]
    pages = [DOCS / t.split("#")[0] for t in re.findall(r"\]\(([^)]+\.md)(?:#[^)]*)?\)", part)]
    return list(dict.fromkeys(pages))


def examples(page: Path) -> list[Example]:
    """The examples of one page, in order; O(page size)."""
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(before)
        found.append(
            Example(page.name, text.count("\n", 0, m.start()) + 1, m[1], m[2], mark[1] if mark else "")
        )
    return found


ALL = [e for page in guide() for e in examples(page)]


def test_the_guide_has_examples_and_most_run() -> None:
    assert {p.name for p in guide()} >= {"getting-started.md", "embedding.md", "bridge.md"}
    running = [e for e in ALL if e.mark in ("", "serve", "spark")]
    assert len(running) >= 12, [e.id for e in ALL]


PYTHON = [e for e in ALL if e.language == "python" and not e.mark]


@pytest.mark.parametrize("example", PYTHON, ids=lambda e: e.id)
def test_python_example_runs(example: Example, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(example.code, example.id, "exec"), {"__name__": "__main__"})


@pytest.mark.parametrize("example", [e for e in ALL if e.mark == "not run"], ids=lambda e: e.id)
def test_example_not_run_is_at_least_valid_syntax(example: Example) -> None:
    if example.language == "python":  # a fragment may await at top level (inside your coroutine)
        compile(example.code, example.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    else:
        subprocess.run(["bash", "-n"], input=example.code, text=True, check=True)


@dataclass
class Served:
    mqtt: int
    metrics: int
    proc: asyncio.subprocess.Process


async def serve(command: str, cwd: Path) -> Served:
    """Start a ``siftmq serve`` command line with its ports made 0; wait until it listens."""
    args = shlex.split(command, comments=True)
    if args[0] == "siftmq":
        args[0] = str(VENV / "bin" / "siftmq")
    args = [a.replace("127.0.0.1:9464", "127.0.0.1:0") for a in args]
    if "--port" not in args:
        args += ["--port", "0"]
    if not any(a.startswith("--metrics-listen") for a in args):
        args += ["--metrics-listen", "127.0.0.1:0"]
    proc = await asyncio.create_subprocess_exec(
        *args, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    log, mqtt, metrics = "", 0, 0
    async with asyncio.timeout(60):
        while not (mqtt and metrics):
            line = (await proc.stderr.readline()).decode()
            assert line, f"{command!r} ended: {log}"
            log += line
            if m := re.search(r"listening on 127\.0\.0\.1:(\d+) \(tcp\)", line):
                mqtt = int(m[1])
            if m := re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line):
                metrics = int(m[1])
    asyncio.get_running_loop().create_task(drain(proc))
    return Served(mqtt, metrics, proc)


async def drain(proc: asyncio.subprocess.Process) -> None:
    assert proc.stderr is not None
    while await proc.stderr.readline():
        pass


async def stop(served: Served) -> None:
    served.proc.terminate()
    await asyncio.wait_for(served.proc.wait(), 30)


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("docs-shell")
    (d / ".venv").symlink_to(VENV)
    yield d


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared_broker(shared_dir: Path) -> AsyncIterator[Served]:
    """One broker for every page that has shell examples but no ``serve`` block of its own."""
    served = await serve(".venv/bin/siftmq serve --no-bridge --data-dir shared-data", shared_dir)
    yield served
    await stop(served)


def localise(code: str, served: Served) -> str:
    """A shell block pointed at ``served`` instead of the user's ports (1883, 9464)."""
    code = re.sub(r"(siftmq (?:pub|sub)) ", rf"\1 -p {served.mqtt} ", code)
    code = re.sub(r"(siftmq ctl) ", rf"\1 --url http://127.0.0.1:{served.metrics} ", code)
    return code.replace("127.0.0.1:9464", f"127.0.0.1:{served.metrics}")


SHELL_PAGES = sorted({e.page for e in ALL if e.language == "sh" and e.mark in ("", "serve")})


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("page", SHELL_PAGES)
async def test_shell_examples_run_in_order(page: str, shared_dir: Path, shared_broker: Served) -> None:
    blocks = [e for e in ALL if e.page == page and e.language == "sh" and e.mark in ("", "serve")]
    started: list[Served] = []
    served = shared_broker
    cwd = shared_dir / page.removesuffix(".md")
    cwd.mkdir()
    (cwd / ".venv").symlink_to(VENV)
    env = {**os.environ, "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    try:
        for block in blocks:
            if block.mark == "serve":
                served = await serve(block.code.strip(), cwd)
                started.append(served)
                continue
            proc = await asyncio.create_subprocess_exec(
                "bash", "-e", "-o", "pipefail", "-c", localise(block.code, served), cwd=cwd, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, f"{block.id}:\n{block.code}\n{out.decode()}\n{err.decode()}"
            assert out or not block.code.strip().startswith(("curl", ".venv/bin/siftmq sub")), block.id
    finally:
        for s in started:
            await stop(s)
