"""``Broker.reload`` called directly, with a hook whose prepared reload raises while applying.

Before, the exception came out of ``Broker.reload`` (only SIGHUP's loop caught it): not
counted as a failed reload, no error line of the reload's own, and the hooks after it not
applied.  Now the reload applies what it can (the new limits, the other hooks' reloads),
returns ``ReloadResult(ok=False)`` whose ``error`` names the failure, counts it failed and logs
one error line; the broker serves on (a real client publishes and receives) and the next
reload, the fault gone, succeeds.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import aiomqtt
import pytest

from broker import Broker
from broker.hooks import Hooks
from tests.waiting import next_message


class _Plan:
    def __init__(self, hook: _TwoStep) -> None:
        self.hook = hook

    async def apply(self) -> Sequence[str]:
        self.hook.applies += 1
        if self.hook.fail:
            raise ValueError("cannot convert float NaN to integer")
        return [f"{self.hook.name} applied"]


class _TwoStep(Hooks):
    """A hook reloaded in two steps (``broker._reload.Reloadable``, duck-typed)."""

    def __init__(self, name: str, fail: bool) -> None:
        self.name = name
        self.fail = fail
        self.applies = 0

    def prepare_reload(self) -> _Plan:
        return _Plan(self)


async def test_a_hook_failing_to_apply_fails_the_reload_not_the_broker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad, good = _TwoStep("bad", fail=True), _TwoStep("good", fail=False)
    async with Broker(host="127.0.0.1", port=0, hooks=[bad, good], sys_interval=0) as b:
        new = b.config.replace(max_connections=77)
        with caplog.at_level(logging.ERROR, logger="broker"):
            result = await b.reload(new)  # does not raise
        assert not result.ok
        want = "applying _TwoStep's reload failed: ValueError: cannot convert float NaN to integer"
        assert result.error == want
        assert b.reload_counters.failed == 1 and b.reload_counters.done == 0
        assert good.applies == 1 and "good applied" in result.changed  # the hook after it too
        assert b.config.max_connections == 77 and any("max_connections=77" in c for c in result.changed)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR and "reload" in r.getMessage()]
        assert len(errors) == 1, errors
        assert want in errors[0].getMessage()

        async with aiomqtt.Client("127.0.0.1", b.port, identifier="after") as c:  # serving on
            await c.subscribe("t", qos=1)
            await c.publish("t", b"still here", qos=1)
            assert (await next_message(c)).payload == b"still here"

        bad.fail = False
        result = await b.reload()
        assert result.ok and result.error is None
        assert b.reload_counters.failed == 1 and b.reload_counters.done == 1


async def test_a_configuration_failing_to_apply_fails_the_reload_and_the_hooks_still_apply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Swapping the live fields in raising (injected: no real input makes it) came out of
    ``Broker.reload`` before, and no hook's prepared reload was applied; now the reload fails,
    counted, and the hooks' reloads are applied."""
    import broker._reload as reload_module

    def apply_fails(broker: Broker, final: object) -> None:
        raise RuntimeError("swap failed")

    good = _TwoStep("good", fail=False)
    async with Broker(host="127.0.0.1", port=0, hooks=[good], sys_interval=0) as b:
        monkeypatch.setattr(reload_module, "_apply_config", apply_fails)
        result = await b.reload(b.config.replace(max_connections=77))
        assert not result.ok
        assert result.error == "applying the configuration failed: RuntimeError: swap failed"
        assert b.reload_counters.failed == 1 and b.reload_counters.done == 0
        assert good.applies == 1 and "good applied" in result.changed
