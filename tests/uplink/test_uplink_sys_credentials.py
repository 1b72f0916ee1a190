"""A remote's address written with credentials (``mqtt://user:secret@host``) does not publish
them (review rev15): ``$SYS/uplink/<name>/remote`` shows the address without the
``user:password@`` part, as the admin API and the dashboard do (uplink._config.public_url);
``$SYS`` is readable by every client the ACL lets subscribe to it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from broker import Broker
from uplink import BridgeConfig, TopicRule, Uplink, parse_bridges


async def test_sys_remote_does_not_show_the_urls_credentials() -> None:
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        cfg = BridgeConfig(
            name="up",
            urls=(f"mqtt://user:secret@127.0.0.1:{central.port}",),
            topics=(TopicRule("t/#"),),
            backoff_min=0.05,
            backoff_max=0.2,
        )
        uplink = Uplink([cfg])
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]):
            await asyncio.wait_for(uplink.bridges["up"].wait_connected(), 10)
            sys = uplink.sys_values()
            assert sys["$SYS/uplink/up/remote"] == f"mqtt://127.0.0.1:{central.port}"
            assert not [k for k, v in sys.items() if "secret" in v]
            (status,) = uplink.bridge_status()
            assert "secret" not in repr(status.to_json())


async def test_log_lines_do_not_show_the_urls_credentials(
    caplog: pytest.LogCaptureFixture, dead_port: int
) -> None:
    """The bridge's lines (connected, failed, lost) name the remote without its credentials."""
    caplog.set_level(logging.INFO, logger="siftmq.uplink")
    async with Broker(host="127.0.0.1", port=0, sys_interval=0) as central:
        cfg = BridgeConfig(
            name="up",
            urls=(
                f"mqtt://user:secret@127.0.0.1:{dead_port}",
                f"mqtt://user:secret@127.0.0.1:{central.port}",
            ),
            topics=(TopicRule("t/#"),),
            backoff_min=0.05,
            backoff_max=0.2,
        )
        uplink = Uplink([cfg])
        async with Broker(host="127.0.0.1", port=0, sys_interval=0, hooks=[uplink]):
            await asyncio.wait_for(uplink.bridges["up"].wait_connected(), 10)
    said = [r.getMessage() for r in caplog.records if r.name.startswith("siftmq.uplink")]
    assert any("connected to mqtt://127.0.0.1:" in m for m in said), said
    assert any("Connection refused" in m or "refused" in m for m in said), said
    assert not [m for m in said if "secret" in m]


@pytest.mark.parametrize(
    "url",
    [
        "mqtt://user:secret@127.0.0.1:notaport",  # bad port
        "ftp://user:secret@127.0.0.1:1883",  # bad scheme
        "mqtt://user:secret@:1883",  # no host
    ],
)
def test_a_bad_remote_urls_error_does_not_show_its_credentials(url: str) -> None:
    """The error of a remote address that does not parse (printed by ``siftmq serve`` at load,
    and by a refused reload) names the address without its ``user:password@`` part."""
    with pytest.raises(ValueError) as err:
        parse_bridges([{"name": "up", "url": url, "topics": [{"pattern": "t/#"}]}])
    msg = str(err.value)
    assert "secret" not in msg and "user" not in msg, msg
    assert url.replace("user:secret@", "") in msg, msg  # the address is still named
