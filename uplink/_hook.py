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
  :mod:`uplink._status`; ``reconnect_bridge``);
* reloads the bridges without a restart (``prepare_reload``, the broker's two-step reload:
  ``Broker.reload``, SIGHUP to ``siftmq serve``; or :meth:`Uplink.replace` directly).  The new
  list, read by ``source`` (``siftmq serve``: the ``[[bridges]]`` tables of ``--config`` read
  again), is compared by name with the running one: a bridge whose configuration is equal is
  not touched (no reconnection); a new one starts; a removed one stops, its local session
  unsubscribes (nothing more is queued for it) and **keeps** what is queued in it (in the
  store: adding the bridge again sends it, a log line says how many); a changed one (addresses,
  credentials, rules, bound, TLS files, ...) stops and starts again on the same local session,
  so its queue is kept, its counters go on, the local filters it no longer has are
  unsubscribed, and its first connection to the remote unsubscribes the remote filters of
  removed ``in`` rules.  A ``source`` that raises (a bad ``[[bridges]]`` table) fails the whole
  reload and the running bridges stay as they are.  A bridge whose stop or start raises while
  the change is applied does not stop the others: each bridge's change is applied on its own,
  one that failed is named (one error line each, ``_Plan.failed``: the broker's reload then
  counts as failed, ``broker._reload``) and its name is left as it was running (its old
  configuration, or absent for a bridge that could not be added), so the next reload sees the
  difference and tries it again.

The bridge module (its MQTT client) is imported when the first bridge starts (issue 42, the
idle footprint: an embedded ``Uplink([])`` whose ``source`` may add bridges later does not load
it).  ``siftmq serve`` registers this hook only when its file has ``[[bridges]]``, at start
or at the first reload that finds them (:mod:`uplink._plugin`, ``Broker.add_hook``): its
``authorize`` is asked on every PUBLISH and delivery.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import logging
import os
import secrets
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from broker.ext import BridgeStatus, QueueBound
from broker.hooks import Hooks
from uplink._config import BridgeConfig, public_url

if TYPE_CHECKING:
    from broker.ext import Broker, Core
    from uplink._bridge import Bridge, LocalEndpoint

__all__ = ["Uplink"]

log = logging.getLogger("siftmq.uplink")

PREFIX = "$uplink/"


@dataclass(frozen=True, slots=True)
class _Plan:
    """A reload of the bridges, checked: what :meth:`Uplink.replace` does (``apply``)."""

    uplink: Uplink
    configs: tuple[BridgeConfig, ...]
    #: bridge name -> digest of its TLS files' contents (the bridges with TLS files)
    tls: dict[str, str]
    #: what ``apply`` could not apply, one item per bridge (read by ``broker._reload``)
    failed: list[str] = field(default_factory=list)

    async def apply(self) -> list[str]:
        return await self.uplink._apply(self.configs, self.tls, self.failed)


class Uplink(Hooks):
    """Runs outbound bridges in the broker it is registered in."""

    def __init__(
        self,
        bridges: Sequence[BridgeConfig],
        *,
        source: Callable[[], Sequence[BridgeConfig]] | None = None,
    ) -> None:
        """``source``: where a reload of the broker reads the bridges again (``siftmq serve``:
        the ``[[bridges]]`` of its ``--config`` file; raises ValueError for a bad table);
        None: a reload leaves the bridges alone (:meth:`replace` changes them)."""
        self.configs = tuple(bridges)
        self.source = source
        #: the bridges' names, known before they start: a restored ``$uplink/<name>`` session
        #: gets its messages even while the listeners are open and ``ready`` has not run yet
        self.names = frozenset(cfg.name for cfg in self.configs)
        self.bridges: dict[str, Bridge] = {}
        self._password = secrets.token_hex(16)
        self._broker: Broker | None = None
        self._endpoint: LocalEndpoint | None = None
        #: bridges an admin's reconnect is restarting; set once the broker stops (no restart)
        self._reconnecting: set[str] = set()
        self._closing = False
        #: one lifecycle change at a time (a reload, an admin's reconnect)
        self._lifecycle = asyncio.Lock()
        #: ``ready`` ran: bridges run (before, a reload only swaps the list)
        self._ready = False
        #: bridge name -> digest of its TLS files as the running bridge read them (a reload
        #: restarts a bridge whose certificate, key or CA file changed under the same path)
        self._tls = {c.name: _tls_digest(c) for c in self.configs}
        #: bridges whose last change failed half-way: the next reload changes them again
        #: even when their configuration is the one they have
        self._unsure: set[str] = set()

    def attach(self, broker: Broker) -> None:
        self._broker = broker
        broker.core.sys_sources.append(self.sys_values)
        broker.core.metric_sources.append(self.metric_values)

    async def ready(self) -> None:
        self._ready = True
        for cfg in self.configs:  # after the store's restore: a restored queue's bytes count
            self._set_bound(cfg)
        for cfg in self.configs:
            self._start(cfg)

    def _local(self) -> LocalEndpoint:
        """Where the bridges reach this broker (found once; RuntimeError without a plain TCP
        listener)."""
        if self._endpoint is None:
            from uplink._bridge import LocalEndpoint

            broker = self._broker
            assert broker is not None
            host, port = _plain_listener(broker)
            self._endpoint = LocalEndpoint(host, port, self._password)
        return self._endpoint

    def _start(self, cfg: BridgeConfig, state_of: Bridge | None = None) -> None:
        """Start the bridge ``cfg``; not once the broker stops (a reload that was stopping a
        bridge when the broker began to stop must not start one after ``stopping`` ran)."""
        if self._closing:
            return
        from uplink._bridge import Bridge

        bridge = Bridge(cfg, self._local(), self._widen)
        if state_of is not None:  # a changed bridge: its counters go on
            bridge.state = state_of.state
            bridge.state.connected = False
            bridge.state.connected_since = None
        self.bridges[cfg.name] = bridge
        try:
            bridge.start()
        except BaseException:
            self.bridges.pop(cfg.name, None)  # not left behind in the status and $SYS
            raise

    def _set_bound(self, cfg: BridgeConfig) -> None:
        """Register, retune or remove the queue bound of the bridge's local session (O(1);
        O(queue) for a new bound over a queue that exists: its bytes are counted)."""
        core = self._core()
        if core is None:
            return
        cid = cfg.local_client_id
        bound = core.queue_bounds.get(cid)
        if not cfg.own_queue_bound:
            if bound is not None:
                del core.queue_bounds[cid]
                bound.release(core)
            return
        messages = cfg.max_queued_messages or core.config.max_queued_messages
        if bound is None:
            bound = QueueBound(messages)
            bound.sync(core.sessions.get(cid))
            core.queue_bounds[cid] = bound
        bound.messages = messages
        bound.max_bytes = cfg.max_queued_bytes
        bound.drop_oldest = cfg.queue_policy == "drop_oldest"
        bound.pace = cfg.queue_policy == "pace"
        if not bound.pace and bound.paced:
            bound.release(core)

    def _core(self) -> Core | None:
        return None if self._broker is None else self._broker.core

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
        for bridge in list(self.bridges.values()):
            await bridge.stop()

    async def stop(self) -> None:
        self._closing = True
        for bridge in list(self.bridges.values()):
            await bridge.stop()

    # ---- reload -------------------------------------------------------------------------

    def prepare_reload(self) -> _Plan | None:
        """The broker's reload, first step (``broker._reload``): the bridges read again from
        ``source`` and checked, nothing changed yet; None without a source.  Raises ValueError
        for a bad table (the whole reload fails, the running bridges stay)."""
        if self.source is None:
            return None
        return self.plan(tuple(self.source()))

    def plan(self, configs: tuple[BridgeConfig, ...], broker: Broker | None = None) -> _Plan:
        """``configs`` checked against the running bridges, nothing changed: the plan that
        runs them (:meth:`_Plan.apply`).  ``broker``: the broker this hook is about to be
        added to (``uplink._plugin.BridgesWatch``), whose plain TCP listener is checked as a
        running hook's is.  Raises ValueError (two bridges of one name, no plain listener, a
        TLS file that does not load). O(bridges) plus their TLS files."""
        names = [c.name for c in configs]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ValueError(f"bridges: the name {dup!r} is used twice")
        if configs and (self._ready or broker is not None):
            try:
                self._local() if broker is None else _plain_listener(broker)
            except RuntimeError as exc:
                raise ValueError(str(exc)) from None
        tls = {c.name: _tls_digest(c) for c in configs}
        running = {c.name: c for c in self.configs}
        for c in configs:  # what is new or changed must load (what runs as it is may be broken)
            if tls[c.name] and (running.get(c.name) != c or self._tls.get(c.name) != tls[c.name]):
                _check_tls(c)
        return _Plan(self, configs, tls)

    async def replace(self, configs: Sequence[BridgeConfig]) -> list[str]:
        """Run ``configs`` instead of the bridges running now (what a reload does with the
        ``source``'s list; see the module docstring); the changes, one item per bridge, then
        one item per bridge whose change failed (``bridge <name>: restarting failed: ...
        (retried at the next reload)``; the other bridges' changes are applied).
        Raises ValueError (nothing changed) for two bridges of one name or, with bridges,
        a broker without a plain TCP listener."""
        plan = self.plan(tuple(configs))
        changed = await plan.apply()
        return changed + plan.failed

    async def _apply(
        self, configs: tuple[BridgeConfig, ...], tls: dict[str, str], failed: list[str]
    ) -> list[str]:
        """Apply ``configs``, each bridge's change on its own: one that raises is appended to
        ``failed`` (and logged) and the others go on (module docstring). O(bridges) plus
        their stops and starts."""
        async with self._lifecycle:
            if self._closing:
                return []
            old = {c.name: c for c in self.configs}
            new = {c.name: c for c in configs}
            started = self._ready
            tls_before, self._tls = self._tls, dict(tls)
            self.configs = configs
            self.names = frozenset(old) | frozenset(new)  # the removed ones' sessions still log in
            changed: list[str] = []
            # a bridge whose change failed -> the configuration left under its name (None: none)
            left: dict[str, BridgeConfig | None] = {}
            unsure, self._unsure = self._unsure, set()
            for name, cfg in old.items():
                if name not in new:
                    try:
                        changed.append(await self._remove(cfg, started))
                    except Exception as exc:
                        left[name] = cfg
                        failed.append(_failure(name, "removing", exc))
            for name, cfg in new.items():
                before = old.get(name)
                if before == cfg and tls_before.get(name) == tls.get(name) and name not in unsure:
                    continue
                try:
                    if before is None:
                        if started:
                            self._set_bound(cfg)
                            self._start(cfg)
                        changed.append(f"bridge {name} added")
                    else:
                        changed.append(await self._change(before, cfg, started, name in unsure))
                except Exception as exc:
                    left[name] = before
                    failed.append(_failure(name, "adding" if before is None else "restarting", exc))
            if left:  # what runs (or ran) under a failed name: the next reload tries it again
                self._unsure = set(left)
                kept: dict[str, BridgeConfig | None] = {**new, **left}
                self.configs = tuple(c for c in kept.values() if c is not None)
                for name, was in left.items():
                    self._tls.pop(name, None)
                    if was is not None and name in tls_before:
                        self._tls[name] = tls_before[name]
            self.names = frozenset(c.name for c in self.configs)
            return changed

    async def _remove(self, cfg: BridgeConfig, started: bool) -> str:
        name = cfg.name
        bridge = self.bridges.get(name)
        if bridge is not None:
            await bridge.stop()  # (kept in ``bridges`` should it raise: stopped again next time)
            self.bridges.pop(name, None)
        if not started or self._closing:  # the broker stops meanwhile: nothing more to do
            return f"bridge {name} removed"
        if bridge is not None and self._broker is not None:  # its retained $SYS values go
            for topic in self._sys_of(name, bridge):
                await self._broker.publish(topic, b"", retain=True)
        kept = self._queued(cfg.local_client_id)
        await self._unsubscribe(cfg, _out_filters(cfg))
        core = self._core()
        if core is not None:
            bound = core.queue_bounds.pop(cfg.local_client_id, None)
            if bound is not None:
                bound.release(core)
        log.warning(
            "bridge %s removed: %d message(s) kept queued in its local session %s (in the store); "
            "add the bridge again to send them",
            name,
            kept,
            cfg.local_client_id,
        )
        return f"bridge {name} removed ({kept} queued message(s) kept in {cfg.local_client_id})"

    async def _change(
        self, before: BridgeConfig, cfg: BridgeConfig, started: bool, retry: bool = False
    ) -> str:
        name = cfg.name
        bridge = self.bridges.get(name)
        if bridge is not None:
            await bridge.stop()  # (kept in ``bridges`` should it raise: stopped again next time)
            self.bridges.pop(name, None)
        if not started or self._closing:  # the broker stops meanwhile: not started again
            return f"bridge {name} changed"
        gone = tuple(f for f in _out_filters(before) if f not in _out_filters(cfg))
        if gone:
            await self._unsubscribe(before, gone)
        self._set_bound(cfg)
        self._start(cfg, bridge)
        # the remote filters to unsubscribe at its next connection: those of the ``in`` rules
        # removed now and those an earlier reload removed that no connection unsubscribed yet
        # (the remote refused or was down since: the stopped bridge still held them), but not
        # a filter this configuration has again
        pending = bridge._retired if bridge is not None else ()
        wanted = _in_filters(cfg)
        stale = tuple(f for f in dict.fromkeys(pending + _in_filters(before)) if f not in wanted)
        if stale and name in self.bridges:  # (not started: the broker began to stop meanwhile)
            self.bridges[name].retire_remote(stale)
        what = ", ".join(f for f in _FIELDS if getattr(before, f) != getattr(cfg, f))
        why = f"{what} changed" if what else "after a failed change" if retry else "TLS files changed"
        queued = self._queued(cfg.local_client_id)
        return f"bridge {name} restarted ({why}; {queued} queued message(s) kept)"

    async def _unsubscribe(self, cfg: BridgeConfig, filters: tuple[str, ...]) -> None:
        """Unsubscribe ``filters`` of the bridge's local session (its queue stays); logged,
        not raised, when the local broker does not answer."""
        if not filters:
            return
        from uplink._bridge import unsubscribe_local

        try:
            await unsubscribe_local(self._local(), cfg, filters)
        except (OSError, TimeoutError, RuntimeError) as exc:
            log.error(
                "bridge %s: could not unsubscribe %s of its local session (%s): messages may still "
                "be queued for it",
                cfg.name,
                ", ".join(filters),
                exc,
            )

    # ---- the broker's hooks -------------------------------------------------------------

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

    def queue_paces(self, name: str) -> int:
        """Times a local publisher was paused at the bridge ``name``'s bound (``queue_policy =
        "pace"``; 0 without a bound of its own)."""
        bound = self._bound(f"{PREFIX}{name}")
        return 0 if bound is None else bound.paces

    def queued_bytes(self, name: str) -> int:
        """Bytes (topics and payloads) queued for the bridge ``name`` when it has a bound of its
        own (the broker counts no bytes otherwise: 0)."""
        bound = self._bound(f"{PREFIX}{name}")
        return 0 if bound is None else bound.queued_bytes

    def bridge_status(self) -> list[BridgeStatus]:
        """Each bridge's snapshot for the admin API and the dashboard (``broker.ext.BridgeSource``;
        uplink._status). O(bridges)."""
        from uplink._status import status

        return [
            status(b, self._queued(b.config.local_client_id), self._bound(b.config.local_client_id))
            for b in self.bridges.values()
        ]

    async def reconnect_bridge(self, name: str) -> bool:
        """Drop the bridge ``name``'s connections and connect again now (False: no such bridge)."""
        if name not in self.bridges:
            return False
        if name in self._reconnecting or self._closing:  # one restart at a time; none at shutdown
            return True
        self._reconnecting.add(name)
        try:
            async with self._lifecycle:  # not while a reload replaces the bridges
                bridge = self.bridges.get(name)
                if bridge is None or self._closing:
                    return bridge is not None
                await bridge.reconnect()
        finally:
            self._reconnecting.discard(name)
        return True

    def sys_values(self) -> dict[str, str]:
        """``$SYS/uplink/<name>/{connected,remote,queued,queued_bytes,sent,received,filtered,
        dropped,queue_dropped,queue_paces,connects,failures,last_error}`` and ``dropped/{too_large,no_rule,
        refused}`` (``dropped`` is their sum) (O(bridges))."""
        out: dict[str, str] = {}
        for name, b in self.bridges.items():
            out.update(self._sys_of(name, b))
        return out

    def _sys_of(self, name: str, b: Bridge) -> dict[str, str]:
        """The ``$SYS`` values of one bridge (O(1))."""
        out: dict[str, str] = {}
        st = b.state
        base = f"$SYS/uplink/{name}/"
        out[base + "connected"] = "1" if st.connected else "0"
        out[base + "remote"] = public_url(st.remote)  # $SYS is readable: no user:password@
        out[base + "queued"] = str(self._queued(b.config.local_client_id))
        out[base + "sent"] = str(st.sent)
        out[base + "received"] = str(st.received)
        out[base + "filtered"] = str(st.filtered)
        out[base + "dropped"] = str(st.dropped)
        out[base + "dropped/too_large"] = str(st.too_large)
        out[base + "dropped/no_rule"] = str(st.no_rule)
        out[base + "dropped/refused"] = str(st.refused)
        out[base + "queue_dropped"] = str(self.queue_dropped(name))
        out[base + "queue_paces"] = str(self.queue_paces(name))
        out[base + "queued_bytes"] = str(self.queued_bytes(name))
        out[base + "connects"] = str(st.connects)
        out[base + "failures"] = str(sum(st.failures.values()))
        out[base + "last_error"] = st.last_error
        return out

    def metric_values(self) -> dict[str, dict[str, int]]:
        """Per counter, the bridge name -> value (``siftmq_uplink_sent_total{reason="edge"}``);
        ``uplink_connected`` is 1 or 0, ``uplink_failures_<reason>`` counts failed attempts,
        ``uplink_dropped`` is the sum of ``uplink_dropped_{too_large,no_rule,refused}``."""
        out: dict[str, dict[str, int]] = {
            k: {}
            for k in (
                "uplink_connected",
                "uplink_queued",
                "uplink_sent",
                "uplink_received",
                "uplink_filtered",
                "uplink_dropped",
                "uplink_dropped_too_large",
                "uplink_dropped_no_rule",
                "uplink_dropped_refused",
                "uplink_queue_dropped",
                "uplink_queue_paces",
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
            out["uplink_dropped_too_large"][name] = st.too_large
            out["uplink_dropped_no_rule"][name] = st.no_rule
            out["uplink_dropped_refused"][name] = st.refused
            out["uplink_queue_dropped"][name] = self.queue_dropped(name)
            out["uplink_queue_paces"][name] = self.queue_paces(name)
            out["uplink_queued_bytes"][name] = self.queued_bytes(name)
            for reason, n in list(st.failures.items()):
                out.setdefault(f"uplink_failures_{reason}", {})[name] = n
        return out


#: the fields a reload's log line names when a bridge changed
_FIELDS = tuple(f.name for f in dataclasses.fields(BridgeConfig) if f.name != "remotes")


def _failure(name: str, doing: str, exc: Exception) -> str:
    """The item (and the one error line) of a bridge whose change failed while applied."""
    what = f"bridge {name}: {doing} failed: {type(exc).__name__}: {exc} (retried at the next reload)"
    log.error("%s", what)
    return what


def _tls_digest(cfg: BridgeConfig) -> str:
    """A digest of the contents of the bridge's TLS files ("" without any; a file that cannot
    be read counts as its error). O(size of the files)."""
    files = [f for f in (cfg.cafile, cfg.certfile, cfg.keyfile) if f is not None]
    if not files:
        return ""
    digest = hashlib.sha256()
    for f in files:
        try:
            digest.update(Path(f).read_bytes())
        except OSError as exc:
            digest.update(f"{f}: {exc}".encode())
    return digest.hexdigest()


def _check_tls(cfg: BridgeConfig) -> None:
    """ValueError when the bridge's TLS files cannot be read or, with a TLS remote, do not make
    a TLS context (a reload that brings them fails; the running bridge keeps its own)."""
    for f in (cfg.cafile, cfg.certfile, cfg.keyfile):
        if f is not None and not os.access(f, os.R_OK):
            raise ValueError(f"bridge {cfg.name}: {f}: cannot be read")
    if any(r.tls for r in cfg.remotes):
        try:
            ctx = ssl.create_default_context(cafile=cfg.cafile)
            if cfg.certfile is not None:
                ctx.load_cert_chain(cfg.certfile, cfg.keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"bridge {cfg.name}: TLS files: {exc}") from None


def _out_filters(cfg: BridgeConfig) -> tuple[str, ...]:
    """The local filters of the bridge's ``out`` rules, each once (O(rules))."""
    return tuple(dict.fromkeys(r.local_filter for r in cfg.topics if r.direction.outbound))


def _in_filters(cfg: BridgeConfig) -> tuple[str, ...]:
    """The remote filters of the bridge's ``in`` rules, each once (O(rules))."""
    return tuple(dict.fromkeys(r.remote_filter for r in cfg.topics if r.direction.inbound))


def _plain_listener(broker: Broker) -> tuple[str, int]:
    """A plain TCP listener of the broker to reach it over loopback (O(listeners))."""
    for opened in broker._listeners or []:
        li = opened.listener
        if li.kind == "tcp" and not li.tls:
            host = li.host if li.host not in ("0.0.0.0", "", "::") else "127.0.0.1"
            return host, opened.port
    raise RuntimeError("outbound bridges need a plain TCP listener of this broker (loopback is enough)")
