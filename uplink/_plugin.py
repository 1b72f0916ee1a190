"""Outbound bridges as a ``siftmq`` plugin (``broker.plugins``; entry point ``siftmq.plugins``).

``siftmq serve --config FILE`` reads the ``[[bridges]]`` tables of FILE (docs/bridging-out.md)
and registers one :class:`~uplink._hook.Uplink` hook running them; a bad table is a
``ValueError`` naming the value (``FILE: bridges[0].topics[1].pattern: ...``), which ``serve``
prints before exiting with status 2.  The hook reads FILE again at each reload (SIGHUP,
``siftmq reload``) and applies the changes (:mod:`uplink._hook`); a bad table then fails the
reload (one error line, the running bridges stay).  A FILE without ``[[bridges]]`` gets no
Uplink hook (it would be asked to authorize every PUBLISH and delivery) but a
:class:`BridgesWatch`: the first reload that finds ``[[bridges]]`` in FILE (checked as any
reload's tables: a bad one fails the reload) registers the Uplink hook in the running broker
(``Broker.add_hook``, in the watch's place among the hooks: before the password file and auth
backends, as at start) and starts the bridges; from then on the Uplink reloads them (down to
none) and the watch does nothing more.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.ext import Option
from broker.hooks import Hooks
from broker.plugins import ServeContext, Subparsers

if TYPE_CHECKING:  # uplink._config is imported by the first [[bridges]] read (issue 42 item 1)
    from broker.ext import Broker
    from uplink._config import BridgeConfig
    from uplink._hook import Uplink, _Plan

__all__ = ["PLUGIN", "BridgesWatch", "UplinkPlugin", "read_bridges"]


class UplinkPlugin:
    """Reads ``[[bridges]]`` from the configuration file of ``siftmq serve``."""

    name = "uplink"
    #: no ``[serve]`` keys: the bridges are ``[[bridges]]`` tables of their own, checked by
    #: :func:`uplink._config.parse_bridges` when ``serve`` starts
    serve_options: Mapping[str, Option] = {}
    serve_keys: frozenset[str] = frozenset()
    #: the top-level tables of ``--config`` this plugin reads (``siftmq serve`` warns about
    #: any other table nobody reads)
    config_tables: frozenset[str] = frozenset({"bridges"})

    def add_commands(self, subparsers: Subparsers) -> None:
        del subparsers

    def add_serve_options(self, parser: argparse.ArgumentParser) -> None:
        del parser

    def serve_hooks(self, ctx: ServeContext) -> Sequence[Hooks]:
        path = getattr(ctx.args, "config", None)
        if path is None:
            return ()
        bridges = read_bridges(path)
        if not bridges:
            # no Uplink hook: its authorization of the bridges' sessions would be asked on
            # every PUBLISH and delivery of a broker that has no bridge
            return (BridgesWatch(path),)
        from uplink._hook import Uplink

        return (Uplink(bridges, source=lambda: read_bridges(path)),)


class BridgesWatch(Hooks):
    """A broker started without ``[[bridges]]``: the first reload that finds tables in the
    file (checked: a bad one fails the reload like any bad table) registers the
    :class:`~uplink._hook.Uplink` hook running them (see the module docstring); until then
    the broker has no hook asked on every PUBLISH and delivery."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path
        self._broker: Broker | None = None
        #: the hook registered by the first reload with bridges (it reloads them from then on)
        self.uplink: Uplink | None = None

    def attach(self, broker: Broker) -> None:
        self._broker = broker

    def prepare_reload(self) -> _FirstBridges | None:
        """The reload's first step: the tables read and checked, nothing changed; None
        without tables or once the Uplink runs them.  Raises ValueError for a bad table (or
        a broker without a plain TCP listener for the bridges to reach it)."""
        if self.uplink is not None or self._broker is None:
            return None
        configs = read_bridges(self.path)
        if not configs:
            return None
        from uplink._hook import Uplink

        uplink = Uplink((), source=lambda: read_bridges(self.path))
        return _FirstBridges(self, uplink, uplink.plan(configs, self._broker))

    async def _add(self, uplink: Uplink) -> None:
        broker = self._broker
        assert broker is not None
        self.uplink = uplink
        await broker.add_hook(uplink, before=self)  # asked where the watch is: before auth


@dataclass(frozen=True, slots=True)
class _FirstBridges:
    """The first bridges' reload (``BridgesWatch``): the Uplink registered, then its plan
    applied as any later reload's (``failed``: the bridges whose start failed, named)."""

    watch: BridgesWatch
    uplink: Uplink
    plan: _Plan
    failed: list[str] = field(default_factory=list)

    async def apply(self) -> list[str]:
        await self.watch._add(self.uplink)
        changed = await self.plan.apply()
        self.failed.extend(self.plan.failed)
        return changed


def read_bridges(path: str | os.PathLike[str]) -> tuple[BridgeConfig, ...]:
    """The ``[[bridges]]`` of the TOML file ``path`` (none without the table); ValueError
    naming the file and the value (``FILE: bridges[0].url: ...``; ``FILE:3: ...`` for TOML
    that does not parse). O(size of the file)."""
    import tomllib  # with --config only (issue 42 item 1: serve without one never imports it)

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if "bridges" not in data:
        return ()
    from uplink._config import parse_bridges

    return parse_bridges(data["bridges"], str(path))


PLUGIN = UplinkPlugin()
