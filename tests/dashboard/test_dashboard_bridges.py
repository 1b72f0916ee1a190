"""The dashboard's Bridges tab in a real headless Chromium (issue 40, item 4): an edge broker
bridged to a second embedded broker; the tab shows the bridge connected with the count of
messages it sent (the same number as the bridge's own counter), and its reconnect button makes
the bridge connect again. Skipped with the reason when Chromium is absent."""

from __future__ import annotations

import asyncio

import aiomqtt

from broker import Broker
from tests.dashboard.cdp import Page
from tests.waiting import eventually
from uplink import BridgeConfig, Direction, TopicRule, Uplink

ROW = "document.querySelector('tr[data-bridge=\"central\"]')"


async def test_the_bridges_tab_shows_a_bridge_and_reconnects_it(page: Page) -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        cfg = BridgeConfig(
            name="central",
            urls=(f"mqtt://127.0.0.1:{central.port}",),
            topics=(TopicRule("sensors/#", Direction.OUT, 1),),
            backoff_min=0.05,
            backoff_max=0.2,
        )
        uplink = Uplink([cfg])
        async with Broker(
            host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0", hooks=[uplink]
        ) as b:
            bridge = uplink.bridges["central"]
            await asyncio.wait_for(bridge.wait_connected(), 10)
            async with aiomqtt.Client("127.0.0.1", b.port, identifier="pub") as c:
                for i in range(7):
                    await c.publish(f"sensors/{i}", b"1", qos=1)
            await eventually(lambda: bridge.state.sent == 7, 10)

            await page.navigate(f"http://127.0.0.1:{b.metrics_port}/#bridges")
            await page.wait_for("document.body && document.body.dataset.ready === '1'")
            await page.wait_for(f"{ROW} !== null")
            cells = await page.evaluate(f"[...{ROW}.children].map(td => td.textContent)")
            assert cells[0] == "central" and cells[1] == "connected"
            assert cells[2] == f"mqtt://127.0.0.1:{central.port}" and cells[3] == "5"
            assert cells[5] == str(bridge.state.sent) == "7"
            assert await page.evaluate("document.getElementById('bridges_none').hidden") is True

            await page.evaluate("window.confirm = () => true")
            await page.evaluate(f"{ROW}.querySelector('button.reconnect').click()")
            await page.wait_for("document.getElementById('notice').textContent === 'reconnecting central'")
            await eventually(lambda: bridge.state.connections == 2 and bridge.state.connected, 10)
            # live: the tab refreshes by itself (every 2 s) and shows the reconnection
            await page.wait_for(f"{ROW} && {ROW}.children[8].textContent === '1'", timeout=15)
        assert page.errors == []
