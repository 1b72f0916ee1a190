"""Every Python and shell example of the user's guide runs (issue 41 item 6).

The user's guide is the list of pages under "User's guide" in docs/README.md. Their fenced
blocks tagged ``python``, ``sh`` or ``console`` (a terminal transcript: each ``$ command``
runs, and what it prints, stdout and stderr, must be the lines under it) are the examples
(blocks with another tag or none are output, diagrams or configuration). An HTML comment on
the line before a block marks it:

* ``<!-- example: serve -->``: a long-running ``siftmq serve``; the test starts it with its
  ports changed to 0, waits until it logs that it listens, and the page's later shell blocks
  talk to it (their ``siftmq pub``/``sub`` get ``-p PORT``, ``127.0.0.1:9464`` becomes the
  metrics port it logged);
* ``<!-- example: spark -->``: needs a Spark session; run by tests/bridge/test_docs_spark.py
  with the suite's shared session;
* ``<!-- example: not run (why) -->``: cannot run here (installs software, needs a remote
  broker or root, or is a fragment of a larger program); its syntax is checked
  (``compile`` for Python, ``bash -n`` for shell).

Unmarked blocks run as written; when the sentence after a block says what it "prints `...`",
the output (stdout and stderr, spaces collapsed) must be those lines. Python: ``python
example.py`` in an empty temporary directory (each embeds its own broker on port 0), all
started at once, four at a time, while the shell pages run. Shell:
bash (``-e -o pipefail``) in a temporary directory per page holding a ``.venv`` link to this
environment, the page's blocks in order, against the page's ``serve`` block or, when it has
none, one broker shared by the module (pages whose ``serve`` lines are the same share one
process). No Spark here, and the broker network's example is two nodes in one process: about
18 CPU seconds in all (measured with ``/usr/bin/time``: 18.0 s of CPU and 22 s of wall time at
load 3, 28-31 s at load 7-10), most of them the start of a Python process per example and per ``siftmq``
command. A block or a broker that hangs is killed after 60 s and fails the test.

Configuration examples (``toml`` blocks) are checked as ``siftmq serve --config`` checks a
file before it starts, and the ``siftmq_`` metric names of reference.md and troubleshooting.md
must be served at ``/metrics``.
"""

from __future__ import annotations

import ast
import asyncio
import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
VENV = Path(sys.executable).parent.parent
MARK = re.compile(r"<!--\s*example:\s*(serve|spark|not run)\b[^>]*-->")
FENCE = re.compile(r"^```(python|sh|console)\n(.*?)^```$", re.S | re.M)


@dataclass(frozen=True, slots=True)
class Example:
    page: str
    line: int
    language: str  # "python" | "sh" | "console" (a transcript: ``$ command`` and its output)
    code: str
    mark: str  # "" (runs) | "serve" | "spark" | "not run"
    prints: list[str] | None = None  # the lines the page says it prints

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
        said = re.match(r"\s*prints ((?:`[^`]*`|[^`:.])*)", text[m.end() :])
        prints = [" ".join(p.split()) for p in re.findall(r"`([^`]*)`", said[1])] if said else None
        line = text.count("\n", 0, m.start()) + 1
        found.append(Example(page.name, line, m[1], m[2], mark[1] if mark else "", prints))
    return found


ALL = [e for page in guide() for e in examples(page)]


def test_the_guide_has_examples_that_run() -> None:
    assert {p.name for p in guide()} >= {"getting-started.md", "embedding.md", "bridge.md"}
    running = [e for e in ALL if e.mark in ("", "serve", "spark")]
    assert len(running) >= 12, [e.id for e in ALL]


PYTHON = [e for e in ALL if e.language == "python" and not e.mark]


@pytest.mark.parametrize("example", [e for e in ALL if e.mark == "not run"], ids=lambda e: e.id)
def test_example_not_run_is_at_least_valid_syntax(example: Example) -> None:
    if example.language == "python":  # a fragment may await at top level (inside your coroutine)
        compile(example.code, example.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    else:
        script = example.code
        if example.language == "console":
            script = "\n".join(c for c in re.findall(r"^\$ (.*)$", script, re.M))
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)


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
    try:
        async with asyncio.timeout(60):
            while not (mqtt and metrics):
                line = (await proc.stderr.readline()).decode()
                assert line, f"{command!r} ended: {log}"
                log += line
                if m := re.search(r"listening on 127\.0\.0\.1:(\d+) \(tcp\)", line):
                    mqtt = int(m[1])
                if m := re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line):
                    metrics = int(m[1])
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    asyncio.get_running_loop().create_task(drain(proc))
    return Served(mqtt, metrics, proc)


async def drain(proc: asyncio.subprocess.Process) -> None:
    assert proc.stderr is not None
    while await proc.stderr.readline():
        pass


async def stop(served: Served) -> None:
    served.proc.terminate()
    await asyncio.wait_for(served.proc.wait(), 30)


class Servers:
    """The brokers of the shell examples, one per distinct ``serve`` command line (pages that
    serve the same way share it), started on first use, stopped with the module."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.started: dict[str, Served] = {}

    async def get(self, command: str, cwd: Path | None = None) -> Served:
        """The broker of ``command``, started in ``cwd`` (the page's directory: its files)
        the first time."""
        words = shlex.split(command, comments=True)
        key = " ".join(["siftmq" if w.endswith("/siftmq") else w for w in words])  # .venv/bin/siftmq
        if key not in self.started:
            self.started[key] = await serve(command, cwd or self.cwd)
        return self.started[key]

    async def stop(self) -> None:
        for served in self.started.values():
            await stop(served)


#: the broker of a page that talks to one but has no ``serve`` block of its own
SHARED = ".venv/bin/siftmq serve --no-bridge --data-dir shared-data"


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("docs-shell")
    (d / ".venv").symlink_to(VENV)
    return d


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def servers(shared_dir: Path) -> AsyncIterator[Servers]:
    s = Servers(shared_dir)
    yield s
    await s.stop()


def localise(code: str, served: Served) -> str:
    """A shell block pointed at ``served`` instead of the user's ports (1883, 9464)."""
    code = re.sub(r"(siftmq (?:pub|sub)) ", rf"\1 -p {served.mqtt} ", code)
    code = re.sub(r"(siftmq ctl) ", rf"\1 --url http://127.0.0.1:{served.metrics} ", code)
    return code.replace("127.0.0.1:9464", f"127.0.0.1:{served.metrics}")


async def bash(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """bash with ``args`` in ``cwd``: (status, stdout and stderr); killed after 60 s (a
    subscriber waiting for a message that never comes fails the test, it does not hang it)."""
    proc = await asyncio.create_subprocess_exec(
        "bash", *args, cwd=cwd, env=env, start_new_session=True,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)  # bash and what it started
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


SHELL_PAGES = sorted({e.page for e in ALL if e.language in ("sh", "console") and e.mark in ("", "serve")})


def transcript(code: str) -> list[tuple[str, list[str]]]:
    """A console block's (command, expected output lines) pairs."""
    pairs: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        else:
            assert pairs, f"output before the first command: {line!r}"
            pairs[-1][1].append(line.rstrip())
    return pairs


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("page", SHELL_PAGES)
async def test_shell_examples_run_in_order(
    page: str,
    shared_dir: Path,
    servers: Servers,
    python_runs: dict[str, asyncio.Task[tuple[int, str, str]]],  # started: they run meanwhile
) -> None:
    blocks = [
        e for e in ALL if e.page == page and e.language in ("sh", "console") and e.mark in ("", "serve")
    ]
    served: Served | None = None
    cwd = shared_dir / page.removesuffix(".md")
    cwd.mkdir()
    (cwd / ".venv").symlink_to(VENV)
    env = {**os.environ, "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    for block in blocks:
        if block.mark == "serve":
            served = await servers.get(block.code.strip(), cwd)
            continue
        code = block.code
        if re.search(r"siftmq (?:pub|sub|ctl) |curl ", code):
            code = localise(code, served or await servers.get(SHARED))
        if block.language == "console":
            for command, expected in transcript(code):
                _, out = await bash(["-c", command], cwd, env)
                lines = [line.rstrip() for line in out.splitlines()]
                assert lines == expected, f"{block.id}: $ {command}"
            continue
        status, out = await bash(["-e", "-o", "pipefail", "-c", code], cwd, env)
        assert status == 0, f"{block.id}:\n{block.code}\n{out}"
        assert out or not block.code.strip().startswith(("curl", ".venv/bin/siftmq sub")), block.id
        if block.prints is not None:  # what the page says it prints (stdout and stderr)
            assert [" ".join(line.split()) for line in out.splitlines()] == block.prints, block.id


async def run_python(example: Example, cwd: Path, slots: asyncio.Semaphore) -> tuple[int, str, str]:
    """``python example.py`` in ``cwd``: (status, stdout, stderr); killed if cancelled."""
    async with slots:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "example.py", cwd=cwd,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 120)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def python_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[dict[str, asyncio.Task[tuple[int, str, str]]]]:
    """The selected Python examples, started at once, four at a time (each is mostly waiting:
    a broker's start and stop, a process's imports), while the shell pages run: the tests
    below read their results."""
    selected = {
        item.callspec.id
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.originalname == "test_python_example_runs"
    }
    root = tmp_path_factory.mktemp("docs-python")
    slots = asyncio.Semaphore(4)
    runs = {}
    for e in PYTHON:
        if e.id in selected:
            cwd = root / f"{e.page}-{e.line}"
            cwd.mkdir()
            (cwd / "example.py").write_text(e.code)
            runs[e.id] = asyncio.create_task(run_python(e, cwd, slots))
    yield runs
    for task in runs.values():
        task.cancel()
    await asyncio.gather(*runs.values(), return_exceptions=True)


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("example", PYTHON, ids=lambda e: e.id)
async def test_python_example_runs(
    example: Example, python_runs: dict[str, asyncio.Task[tuple[int, str, str]]]
) -> None:
    """As a user runs it: ``python example.py`` in an empty directory; what it prints is
    what the page says it prints (the sentence "prints `...`" after the block), if it says."""
    status, out, err = await python_runs[example.id]
    assert status == 0, f"{example.id}:\n{err}"
    if example.prints is not None:
        assert out.splitlines() == example.prints, example.id


TOML = re.compile(r"^([ \t]*)```toml\n(.*?)^\1```$", re.S | re.M)


def toml_examples() -> list[tuple[str, str]]:
    """(page:line, text) of every TOML block of the guide (indentation of a list item removed)."""
    found = []
    for page in guide():
        text = page.read_text()
        for m in TOML.finditer(text):
            code = "\n".join(line.removeprefix(m[1]) for line in m[2].splitlines())
            found.append((f"{page.name}:{text.count(chr(10), 0, m.start()) + 1}", code))
    return found


@pytest.mark.parametrize(("where", "code"), toml_examples(), ids=[w for w, _ in toml_examples()])
def test_configuration_example_is_accepted(where: str, code: str, tmp_path: Path) -> None:
    """A configuration file as the guide shows it passes the checks ``siftmq serve --config``
    makes before it starts: ``[broker]`` and ``[[listeners]]`` (``broker._config``), ``[serve]``
    against every installed plugin's keys, ``[[bridges]]`` (``uplink``)."""
    from broker._cli import _load_config
    from broker.plugins import load_plugins
    from uplink import parse_bridges

    path = tmp_path / "siftmq.toml"
    path.write_text(code)
    _load_config(path, load_plugins())
    data = tomllib.loads(code)
    if "bridges" in data:
        assert parse_bridges(data["bridges"], where)


@pytest.mark.asyncio(loop_scope="module")
async def test_the_metric_names_the_guide_gives_exist(servers: Servers) -> None:
    """Every ``siftmq_...`` name of reference.md and troubleshooting.md is served at
    ``/metrics`` (the shared broker has a store, so the store's metrics are there too)."""
    served = await servers.get(SHARED)
    names = {
        name
        for page in ("reference.md", "troubleshooting.md")
        for name in re.findall(r"\bsiftmq_[a-z_]+[a-z]\b", (DOCS / page).read_text())
    }
    assert len(names) >= 12, names
    reader, writer = await asyncio.open_connection("127.0.0.1", served.metrics)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    body = (await asyncio.wait_for(reader.read(), 30)).decode()
    writer.close()
    served_names = set(re.findall(r"^(siftmq_\w+?)(?:\{| )", body, re.M))
    assert names - served_names == set()
