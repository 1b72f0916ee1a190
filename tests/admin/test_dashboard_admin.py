"""The dashboard's admin buttons in a real headless Chromium (issue 39, item 5): "delete" on a
retained message of the topic browser and "ban" in a client's detail call the admin API
(``/api/v1/``, with the CSRF token) and take effect in the broker. Skipped with the reason
when Chromium is absent (tests/dashboard/test_dashboard_browser.py)."""

from __future__ import annotations

import aiomqtt

from broker import Broker
from broker.packets import ReasonCode
from tests.dashboard.browser import chromium, page
from tests.dashboard.cdp import Page
from tests.rawclient import RawClient
from tests.waiting import eventually

__all__ = ["chromium", "page"]  # the fixtures, shared with the dashboard's browser test


async def test_delete_retained_and_ban_from_the_dashboard(page: Page) -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0, metrics_listen="127.0.0.1:0") as b:
        base = f"http://127.0.0.1:{b.metrics_port}/"
        await b.publish("plant/valve", b"open", retain=True)
        async with aiomqtt.Client("127.0.0.1", b.port, identifier="ban-me"):
            await page.navigate(base + "#topics")
            await page.wait_for("document.body && document.body.dataset.ready === '1'")
            await page.evaluate("window.confirm = () => true")
            click = (
                "[...document.querySelectorAll('#topic_rows a')]"
                ".find(a => a.textContent === 'plant/').click()"
            )
            await page.wait_for("document.getElementById('topic_rows').textContent.includes('plant/')")
            await page.evaluate(click)
            await page.wait_for("document.getElementById('topic_rows').textContent.includes('open')")
            await page.evaluate("document.querySelector('#topic_rows button.kick').click()")
            await eventually(lambda: b.core.router.retained.get("plant/valve") is None, timeout=10)
            await page.wait_for("document.getElementById('notice').textContent === 'deleted plant/valve'")

            await page.evaluate("location.hash = '#clients'")
            await page.wait_for("document.querySelector('tr[data-client=\"ban-me\"] a') !== null")
            await page.evaluate("document.querySelector('tr[data-client=\"ban-me\"] a').click()")
            ban = "[...document.querySelectorAll('#client_detail button')].find(x => x.textContent === 'ban')"
            await page.wait_for(ban + " !== undefined")
            await page.evaluate(ban + ".click()")
            await eventually(lambda: "ban-me" not in b.core.sessions, timeout=10)
        _, ack = await RawClient.connect(b.port, "ban-me", 5)
        assert ack.reason_code is ReasonCode.BANNED
        await RawClient.close_all()
        assert page.errors == []
