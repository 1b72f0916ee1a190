"""Headless Chromium driven over the DevTools protocol (``websockets``), for the browser tests.

:class:`Chromium` starts ``chromium --headless --remote-debugging-port=0`` (the port it picked
is read from its "DevTools listening on ws://..." line) and stops it; :class:`Page` is one tab:
``navigate``, ``evaluate`` (a JavaScript expression, awaited if it is a promise),
``wait_for`` (polls an expression until it is truthy, with a deadline), ``screenshot``.
JavaScript exceptions and error log entries of the page (CSP violations, failed loads) are
collected in ``Page.errors``.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import websockets

__all__ = ["Chromium", "Page", "find_chromium"]


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Chromium:
    def __init__(self, binary: str) -> None:
        # Chromium's helper processes may still write the profile while it is removed
        self.profile = tempfile.TemporaryDirectory(prefix="siftmq-chromium-", ignore_cleanup_errors=True)
        self.proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-extensions",
                "--no-first-run",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={self.profile.name}",
                "--window-size=1280,900",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        self.port = 0
        for line in self.proc.stderr:  # bounded by the caller's timeout on the fixture
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if m:
                self.port = int(m.group(1))
                break
        if not self.port:
            self.close()
            raise RuntimeError("chromium did not start its DevTools endpoint")
        self.proc.stderr.close()

    def page_url(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as r:
            targets = json.load(r)
        for t in targets:
            if t.get("type") == "page":
                return str(t["webSocketDebuggerUrl"])
        with urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{self.port}/json/new?about:blank", method="PUT"),
            timeout=10,
        ) as r:
            return str(json.load(r)["webSocketDebuggerUrl"])

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.profile.cleanup()


class Page:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.errors: list[str] = []
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, url: str) -> Page:
        ws = await websockets.connect(url, max_size=64 * 1024 * 1024)
        page = cls(ws)
        await page.send("Page.enable")
        await page.send("Runtime.enable")
        await page.send("Log.enable")
        return page

    async def _read(self) -> None:
        try:
            await self._dispatch()
        except websockets.ConnectionClosed:
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(RuntimeError("the browser closed the DevTools connection"))

    async def _dispatch(self) -> None:
        async for raw in self.ws:
            msg = json.loads(raw)
            if "id" in msg:
                fut = self.pending.pop(msg["id"], None)
                if fut is not None and not fut.done():
                    if "error" in msg:
                        fut.set_exception(RuntimeError(str(msg["error"])))
                    else:
                        fut.set_result(msg.get("result", {}))
            elif msg.get("method") == "Runtime.exceptionThrown":
                self.errors.append(str(msg["params"]["exceptionDetails"]))
            elif msg.get("method") == "Log.entryAdded" and msg["params"]["entry"]["level"] == "error":
                self.errors.append(str(msg["params"]["entry"]))  # CSP violations, failed loads

    async def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 20.0) -> Any:
        i = next(self.ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[i] = fut
        await self.ws.send(json.dumps({"id": i, "method": method, "params": params or {}}))
        return await asyncio.wait_for(fut, timeout)

    async def evaluate(self, expression: str) -> Any:
        r = await self.send(
            "Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True}
        )
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        async with asyncio.timeout(timeout):
            while True:
                value = await self.evaluate(expression)
                if value:
                    return value
                await asyncio.sleep(0.05)

    async def navigate(self, url: str) -> None:
        await self.send("Page.navigate", {"url": url})

    async def screenshot(self, path: Path) -> None:
        r = await self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        await asyncio.to_thread(path.write_bytes, base64.b64decode(r["data"]))

    async def close(self) -> None:
        await self.ws.close()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)
