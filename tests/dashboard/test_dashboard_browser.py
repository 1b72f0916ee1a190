"""The dashboard in a real headless Chromium (DevTools protocol; issue 28, item 2): the pages
load without a script error, a number on the page matches $SYS, the kick button disconnects
the client. One browser per module; skipped with the reason when Chromium is absent.

``SIFTMQ_DASHBOARD_SHOTS=docs/img`` also writes the screenshots of docs/dashboard.md there.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiomqtt

from broker import Broker
from tests.dashboard.cdp import Page
from tests.waiting import eventually, next_message

SHOTS = os.environ.get("SIFTMQ_DASHBOARD_SHOTS")


async def shot(page: Page, name: str, tmp_path: Path) -> None:
    path = Path(SHOTS) / name if SHOTS else tmp_path / name
    await page.screenshot(path)
    assert (await asyncio.to_thread(path.read_bytes))[:8] == b"\x89PNG\r\n\x1a\n"


async def test_dashboard_in_chromium(page: Page, tmp_path: Path) -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=3600, metrics_listen="127.0.0.1:0") as b:
        assert b.dashboard is not None and b.metrics_port is not None
        base = f"http://127.0.0.1:{b.metrics_port}/"
        await b.publish("home/kitchen/temp", b'{"temp": 21.5}', retain=True)
        await b.publish("home/hall/light", b"on", retain=True)
        async with (
            aiomqtt.Client("127.0.0.1", b.port, identifier="sys-watch") as watch,
            aiomqtt.Client(
                "127.0.0.1", b.port, identifier="kick-me", protocol=aiomqtt.ProtocolVersion.V311
            ) as victim,
        ):
            await watch.subscribe("$SYS/broker/clients/connected")
            await victim.subscribe("$filter/temp > 20/home/+/temp", qos=1)
            for i in range(20):
                await victim.publish("home/kitchen/temp", f'{{"temp": {20 + i}}}', qos=1)
            b.core.publish_sys(b.core.clock.monotonic())
            b.core.flush()
            sys_connected = bytes((await next_message(watch)).payload).decode()  # type: ignore[arg-type]
            assert sys_connected == "2"
            b.dashboard.sample()

            await page.navigate(base)
            await page.wait_for("document.body && document.body.dataset.ready === '1'")
            shown = await page.wait_for(
                "document.getElementById('clients_connected').textContent !== '–' && "
                "document.getElementById('clients_connected').textContent"
            )
            assert shown == sys_connected
            row = await page.wait_for(
                "[...document.querySelectorAll('#sys tr')].map(r => r.textContent)"
                ".find(t => t.startsWith('$SYS/broker/clients/connected'))"
            )
            assert row == "$SYS/broker/clients/connected" + sys_connected
            b.dashboard.sample()
            await page.wait_for("document.getElementById('rate_in').textContent !== '–'")
            await shot(page, "dashboard-overview.png", tmp_path)

            await page.evaluate("location.hash = '#subscriptions'")
            await page.wait_for("document.querySelectorAll('#sub_rows tr').length >= 2")
            text = await page.evaluate("document.getElementById('sub_rows').textContent")
            assert "temp > 20" in text and "$SYS/broker/clients/connected" in text
            await shot(page, "dashboard-subscriptions.png", tmp_path)

            await page.evaluate("location.hash = '#topics'")
            click = (
                "[...document.querySelectorAll('#topic_rows a')].find(a => a.textContent === '{}').click()"
            )
            await page.wait_for("document.getElementById('topic_rows').textContent.includes('home/')")
            await page.evaluate(click.format("home/"))
            await page.wait_for("document.getElementById('topic_rows').textContent.includes('kitchen')")
            await page.evaluate(click.format("kitchen/"))
            await page.wait_for("document.getElementById('topic_rows').textContent.includes('21.5')")
            await shot(page, "dashboard-topics.png", tmp_path)

            await page.evaluate("location.hash = '#clients'")
            await page.wait_for("document.querySelector('tr[data-client=\"kick-me\"] button.kick') !== null")
            await page.evaluate("document.querySelector('tr[data-client=\"kick-me\"] a').click()")
            await page.wait_for("document.getElementById('client_detail').textContent.includes('3.1.1')")
            await shot(page, "dashboard-clients.png", tmp_path)
            await page.evaluate("window.confirm = () => true")
            await page.evaluate("document.querySelector('tr[data-client=\"kick-me\"] button.kick').click()")
            await eventually(lambda: b.core.sessions.get("kick-me") is None, timeout=10)
            await page.wait_for("document.getElementById('notice').textContent === 'kicked kick-me'")
            await page.wait_for("document.querySelector('tr[data-client=\"kick-me\"]') === null")
        assert page.errors == []


async def test_first_page_load_draws_the_server_side_history(page: Page) -> None:
    """Issue 38, item 5: the charts start with the recorded history, not with an empty chart."""
    async with Broker(
        host="127.0.0.1",
        port=0,
        sys_interval=0,
        metrics_listen="127.0.0.1:0",
        dashboard_history_interval=0.05,
        dashboard_history_points=20,
    ) as b:
        assert b.dashboard is not None and b.metrics_port is not None
        recorded = b.dashboard.recorded
        async with aiomqtt.Client("127.0.0.1", b.port, identifier="hist-pub") as pub:
            async with asyncio.timeout(10):
                while len(recorded) < 20 or not any(r > 0 for r in recorded.rings["rate_in"]):
                    await pub.publish("hist/x", b"1", qos=1)
            assert not b.dashboard.sampling  # no page yet: the live sampler never ran
            await page.navigate(f"http://127.0.0.1:{b.metrics_port}/")
            await page.wait_for("document.body && document.body.dataset.ready === '1'")
            # the first history event: 20 recorded points (and the live one) drawn at once
            drawn = await page.wait_for("Number(document.getElementById('chart_rates').dataset.points) >= 20")
            assert drawn is True
            n = await page.evaluate("Number(document.getElementById('chart_conns').dataset.points)")
            assert 20 <= n <= 22
        assert page.errors == []
