"""Each bridge's state as the broker's admin API, dashboard and ``siftmq ctl`` show it.

:func:`status` turns a running :class:`~uplink._bridge.Bridge` (its :class:`BridgeState`
counters, read as they are: nothing here counts anything) and the broker's view of its local
session (queue length, the bytes of its own queue bound) into the broker's
:class:`broker.ext.BridgeStatus`; :class:`~uplink._hook.Uplink` hands these to the broker as a
:class:`broker.ext.BridgeSource` (``bridge_status``, ``reconnect_bridge``). The same numbers
are in ``$SYS/uplink/<name>/...`` and ``/metrics`` (docs/bridging-out.md, "State").

O(1) per bridge: counters and two dictionary lookups, no walk of the queue.
"""

from __future__ import annotations

from broker.ext import BridgeStatus, QueueBound
from uplink._bridge import Bridge
from uplink._config import public_url

__all__ = ["public_url", "status"]


def status(bridge: Bridge, queued: int, bound: QueueBound | None) -> BridgeStatus:
    """The snapshot of ``bridge``: ``queued`` messages in its local session (queue and in
    flight), ``bound`` its own queue bound if it has one (bytes and drops are counted there)."""
    st = bridge.state
    cfg = bridge.config
    return BridgeStatus(
        name=cfg.name,
        connected=st.connected,
        remote=public_url(st.remote),
        remotes=tuple(public_url(u) for u in cfg.urls),
        protocol=cfg.protocol,
        queued_messages=queued,
        queued_bytes=None if bound is None else bound.queued_bytes,
        sent=st.sent,
        received=st.received,
        dropped={
            "filtered": st.filtered,
            "queue_bound": 0 if bound is None else bound.dropped,
            # the bridge's undeliverable messages by reason (their sum is BridgeState.dropped)
            "too_large": st.too_large,
            "no_rule": st.no_rule,
            "refused": st.refused,
        },
        connects=st.connects,
        failures=dict(st.failures),
        reconnects=max(0, st.connections - 1),
        last_error=st.last_error,
        last_error_at=st.last_error_at if st.last_error else None,
        connected_since=st.connected_since if st.connected else None,
    )
