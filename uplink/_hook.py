"""The bridges of a broker as one :class:`~broker.hooks.Hooks` object (the embedding API).

``Broker(hooks=[Uplink([BridgeConfig(...)])])`` runs the bridges in an embedded broker;
``siftmq serve --config`` builds the same hook from the ``[[bridges]]`` tables
(:mod:`uplink._plugin`).  The hook

* starts each :class:`~uplink._bridge.Bridge` once the listeners are open (``ready``) and
  stops them first at shutdown (``stopping``);
* lets the bridges' local sessions in (``authenticate``/``authorize``: client id
  ``$uplink/<name>`` with a password made at random per process; anyone else using such a
  client id is refused), whatever the password file and ACL say for other clients;
* reports each bridge in ``$SYS/uplink/<name>/...`` and in ``/metrics`` as
  ``siftmq_uplink_<counter>_total{reason="<bridge name>"}`` (O(bridges) per publication), and
  to the admin API and the dashboard as a ``broker.ext.BridgeSource`` (``bridge_status``:
  :mod:`uplink._status`; ``reconnect_bridge``).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING

from broker.ext import BridgeStatus, QueueBound
from broker.hooks import Hooks
from uplink._bridge import Bridge, LocalEndpoint
from uplink._config import BridgeConfig
from uplink._status import status

if TYPE_CHECKING:
    from broker.ext import Broker

__all__ = ["Uplink"]

PREFIX = "$uplink/"


class Uplink(Hooks):
    """Runs outbound bridges in the broker it is registered in."""

    def __init__(self, bridges: Sequence[BridgeConfig]) -> None:
        self.configs = tuple(bridges)
        #: the bridges' names, known before they start: a restored ``$uplink/<name>`` session
        #: gets its messages even while the listeners are open and ``ready`` has not run yet
        self.names = frozenset(cfg.name for cfg in self.configs)
        self.bridges: dict[str, Bridge] = {}
        self._password = secrets.token_hex(16)
        self._broker: Broker | None = None
        #: bridges an admin's reconnect is restarting; set once the broker stops (no restart)
        self._reconnecting: set[str] = set()
        self._closing = False

    def attach(self, broker: Broker) -> None:
        self._broker = broker
        broker.core.sys_sources.append(self.sys_values)
        broker.core.metric_sources.append(self.metric_values)

    async def ready(self) -> None:
        broker = self._broker
        assert broker is not None
        host, port = _plain_listener(broker)
        core = broker.core
        for cfg in self.configs:  # after the store's restore: a restored queue's bytes count
            if cfg.own_queue_bound:
                bound = QueueBound(
                    cfg.max_queued_messages or core.config.max_queued_messages,
                    cfg.max_queued_bytes,
                    cfg.queue_policy == "drop_oldest",
                )
                bound.sync(core.sessions.get(cfg.local_client_id))
                core.queue_bounds[cfg.local_client_id] = bound
        endpoint = LocalEndpoint(host, port, self._password)
        for cfg in self.configs:
            bridge = Bridge(cfg, endpoint, self._widen)
            self.bridges[cfg.name] = bridge
            bridge.start()

    def _widen(self, client_id: str, window: int) -> None:
        """Let the broker keep ``window`` messages in flight to the bridge's local session (the
        CONNECT asked for it as its Receive Maximum; the broker's ``max_inflight``, meant for
        ordinary clients, would cap it at 20 by default: a bridge to a distant remote needs
        more in flight to fill the link). O(1); the next drain of the session uses it."""
        if self._broker is None:
            return
        s = self._broker.core.sessions.get(client_id)
        if s is not None and s.conn is not None and window > s.conn.window:
            s.conn.window = window

    async def stopping(self) -> None:
        self._closing = True
        for bridge in self.bridges.values():
            await bridge.stop()

    async def stop(self) -> None:
        self._closing = True
        for bridge in self.bridges.values():
            await bridge.stop()

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> bool | None:
        if client_id.startswith(PREFIX):
            return (
                client_id[len(PREFIX) :] in self.names
                and password is not None
                and hmac.compare_digest(password, self._password.encode())
            )
        return None

    def authorize(self, client_id: str, username: str | None, action: str, topic: str) -> bool | None:
        if client_id.startswith(PREFIX) and client_id[len(PREFIX) :] in self.names:
            return True
        return None

    def _queued(self, client_id: str) -> int:
        if self._broker is None:
            return 0
        s = self._broker.core.sessions.get(client_id)
        return 0 if s is None else len(s.queue) + len(s.inflight)

    def _bound(self, client_id: str) -> QueueBound | None:
        return None if self._broker is None else self._broker.core.queue_bounds.get(client_id)

    def queue_dropped(self, name: str) -> int:
        """Messages the bridge ``name``'s own queue bound dropped (0 without one)."""
        bound = self._bound(f"{PREFIX}{name}")
        return 0 if bound is None else bound.dropped

    def queued_bytes(self, name: str) -> int:
        """Bytes (topics and payloads) queued for the bridge ``name`` when it has a bound of its
        own (the broker counts no bytes otherwise: 0)."""
        bound = self._bound(f"{PREFIX}{name}")
        return 0 if bound is None else bound.queued_bytes

    def bridge_status(self) -> list[BridgeStatus]:
        """Each bridge's snapshot for the admin API and the dashboard (``broker.ext.BridgeSource``;
        uplink._status). O(bridges)."""
        return [
            status(b, self._queued(b.config.local_client_id), self._bound(b.config.local_client_id))
            for b in self.bridges.values()
        ]

    async def reconnect_bridge(self, name: str) -> bool:
        """Drop the bridge ``name``'s connections and connect again now (False: no such bridge)."""
        bridge = self.bridges.get(name)
        if bridge is None:
            return False
        if name in self._reconnecting or self._closing:  # one restart at a time; none at shutdown
            return True
        self._reconnecting.add(name)
        try:
            await bridge.reconnect()
        finally:
            self._reconnecting.discard(name)
        return True

    def sys_values(self) -> dict[str, str]:
        """``$SYS/uplink/<name>/{connected,remote,queued,queued_bytes,sent,received,filtered,
        dropped,queue_dropped,connects,failures,last_error}`` (O(bridges))."""
        out: dict[str, str] = {}
        for name, b in self.bridges.items():
            st = b.state
            base = f"$SYS/uplink/{name}/"
            out[base + "connected"] = "1" if st.connected else "0"
            out[base + "remote"] = st.remote
            out[base + "queued"] = str(self._queued(b.config.local_client_id))
            out[base + "sent"] = str(st.sent)
            out[base + "received"] = str(st.received)
            out[base + "filtered"] = str(st.filtered)
            out[base + "dropped"] = str(st.dropped)
            out[base + "queue_dropped"] = str(self.queue_dropped(name))
            out[base + "queued_bytes"] = str(self.queued_bytes(name))
            out[base + "connects"] = str(st.connects)
            out[base + "failures"] = str(sum(st.failures.values()))
            out[base + "last_error"] = st.last_error
        return out

    def metric_values(self) -> dict[str, dict[str, int]]:
        """Per counter, the bridge name -> value (``siftmq_uplink_sent_total{reason="edge"}``);
        ``uplink_connected`` is 1 or 0, ``uplink_failures_<reason>`` counts failed attempts."""
        out: dict[str, dict[str, int]] = {
            k: {}
            for k in (
                "uplink_connected",
                "uplink_queued",
                "uplink_sent",
                "uplink_received",
                "uplink_filtered",
                "uplink_dropped",
                "uplink_queue_dropped",
                "uplink_queued_bytes",
            )
        }
        for name, b in self.bridges.items():
            st = b.state
            out["uplink_connected"][name] = int(st.connected)
            out["uplink_queued"][name] = self._queued(b.config.local_client_id)
            out["uplink_sent"][name] = st.sent
            out["uplink_received"][name] = st.received
            out["uplink_filtered"][name] = st.filtered
            out["uplink_dropped"][name] = st.dropped
            out["uplink_queue_dropped"][name] = self.queue_dropped(name)
            out["uplink_queued_bytes"][name] = self.queued_bytes(name)
            for reason, n in list(st.failures.items()):
                out.setdefault(f"uplink_failures_{reason}", {})[name] = n
        return out


def _plain_listener(broker: Broker) -> tuple[str, int]:
    """A plain TCP listener of the broker to reach it over loopback (O(listeners))."""
    for opened in broker._listeners or []:
        li = opened.listener
        if li.kind == "tcp" and not li.tls:
            host = li.host if li.host not in ("0.0.0.0", "", "::") else "127.0.0.1"
            return host, opened.port
    raise RuntimeError("outbound bridges need a plain TCP listener of this broker (loopback is enough)")
