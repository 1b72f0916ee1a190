"""The screenshots of docs/dashboard.md: a broker with some traffic, photographed in Chromium.

An embedded broker (``metrics_listen``) gets 12 MQTT clients (v3.1.1 and v5, subscriptions
with content selectors, a shared and a composite subscription, a partial unsubscribe), a tree
of retained messages, and publishers whose rate swings for ``--seconds``; then headless
Chromium (DevTools protocol, tests/dashboard/cdp.py) photographs each tab into ``--out``.

    .venv/bin/python scripts/dashboard_screenshots.py [--seconds 40] [--out docs/img]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path

import aiomqtt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker import Broker
from tests.dashboard.cdp import Chromium, Page, find_chromium


async def traffic(b: Broker, seconds: float) -> None:
    start = time.monotonic()
    i = 0
    async with aiomqtt.Client(
        "127.0.0.1", b.port, identifier="plant-gateway", protocol=aiomqtt.ProtocolVersion.V5
    ) as pub:
        while (t := time.monotonic() - start) < seconds:
            rate = 150 + 120 * math.sin(t / 6) + (80 if int(t) % 15 < 3 else 0)
            for _ in range(max(1, int(rate / 10))):
                i += 1
                room = ("kitchen", "hall", "lab", "store")[i % 4]
                body = json.dumps({"temp": 15 + (i * 7) % 20, "hum": 40 + i % 30, "room": room})
                await pub.publish(f"plant/{room}/temp", body, qos=i % 2)
            await asyncio.sleep(0.1)


async def main(seconds: float, out: Path) -> None:
    binary = find_chromium()
    if binary is None:
        raise SystemExit("Chromium is not installed (make system-packages)")
    async with Broker(host="127.0.0.1", port=0, sys_interval=2, metrics_listen="127.0.0.1:0") as b:
        for room in ("kitchen", "hall", "lab", "store"):
            await b.publish(f"plant/{room}/config", json.dumps({"interval": 5, "unit": "C"}), retain=True)
            await b.publish(f"plant/{room}/status", "online", retain=True)
        await b.publish("plant/firmware", b"\x7fELF\x02\x01\x01" + bytes(range(40)), retain=True)
        v5, v3 = aiomqtt.ProtocolVersion.V5, aiomqtt.ProtocolVersion.V311
        clients = []
        specs = [
            ("dashboard-wall", v5, [("plant/+/temp", 0)]),
            ("hot-alarm", v3, [("$filter/temp > 30/plant/+/temp", 1)]),
            ("humidity-log", v5, [("$filter/hum BETWEEN 60 AND 70/plant/#", 1)]),
            ("lab-monitor", v5, [("plant/lab/#", 2)]),
            ("archiver-1", v5, [("$share/archive/plant/#", 1)]),
            ("archiver-2", v5, [("$share/archive/plant/#", 1)]),
            ("kitchen-display", v3, [("plant/kitchen/+", 0)]),
            ("ops-console", v5, [("plant/#", 0)]),
            ("status-board", v3, [("plant/+/status", 1)]),
            ("firmware-agent", v5, [("plant/firmware", 1)]),
            ("store-sensor", v3, []),
        ]
        async with asyncio.TaskGroup() as tg:
            for ident, proto, subs in specs:
                c = aiomqtt.Client("127.0.0.1", b.port, identifier=ident, protocol=proto)
                await c.__aenter__()
                clients.append(c)
                for f, q in subs:
                    await c.subscribe(f, qos=q)
                tg.create_task(_drain(c, seconds + 30))
            await clients[7].unsubscribe("plant/store/#")  # a partial unsubscribe: negative entry
            async with b.subscribe_composite("plant/kitchen/temp & plant/lab/temp", name="kitchen-and-lab"):
                flow = asyncio.create_task(traffic(b, seconds + 60))
                await asyncio.sleep(seconds)
                await _shoot(binary, b, out)  # while the traffic flows
                flow.cancel()
                await asyncio.gather(flow, return_exceptions=True)
            for c in clients:
                await c.__aexit__(None, None, None)


async def _drain(c: aiomqtt.Client, seconds: float) -> None:
    try:
        async with asyncio.timeout(seconds):
            async for _ in c.messages:
                pass
    except (TimeoutError, aiomqtt.MqttError):
        pass


async def _shoot(binary: str, b: Broker, out: Path) -> None:
    chrome = await asyncio.to_thread(Chromium, binary)
    try:
        page = await Page.open(await asyncio.to_thread(chrome.page_url))
        base = f"http://127.0.0.1:{b.metrics_port}/"
        await page.navigate(base + "#overview")
        await page.wait_for("document.body && document.body.dataset.ready === '1'")
        await asyncio.sleep(2.5)  # an SSE event or two after the history
        await page.screenshot(out / "dashboard-overview.png")
        await page.evaluate("location.hash = '#clients'")
        await page.wait_for("document.querySelectorAll('#client_rows tr').length > 5")
        await page.evaluate("document.querySelector('tr[data-client=\"hot-alarm\"] a').click()")
        await page.wait_for("document.getElementById('client_detail').textContent.includes('temp > 30')")
        await page.screenshot(out / "dashboard-clients.png")
        await page.evaluate("location.hash = '#subscriptions'")
        await page.wait_for("document.querySelectorAll('#composite_rows tr').length === 1")
        await page.screenshot(out / "dashboard-subscriptions.png")
        await page.evaluate("location.hash = '#topics'")
        click = "[...document.querySelectorAll('#topic_rows a')].find(a => a.textContent === '{}').click()"
        await page.wait_for("document.getElementById('topic_rows').textContent.includes('plant/')")
        await page.evaluate(click.format("plant/"))
        await page.wait_for("document.getElementById('topic_rows').textContent.includes('kitchen')")
        await page.evaluate(click.format("kitchen/"))
        await page.wait_for("document.getElementById('topic_rows').textContent.includes('interval')")
        await page.screenshot(out / "dashboard-topics.png")
        assert not page.errors, page.errors
        await page.close()
    finally:
        await asyncio.to_thread(chrome.close)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    a = ap.parse_args()
    asyncio.run(main(a.seconds, a.out))
