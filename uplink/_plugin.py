"""Outbound bridges as a ``siftmq`` plugin (``broker.plugins``; entry point ``siftmq.plugins``).

``siftmq serve --config FILE`` reads the ``[[bridges]]`` tables of FILE (docs/bridging-out.md)
and registers one :class:`~uplink._hook.Uplink` hook running them; a bad table is a
``ValueError`` naming the value (``FILE: bridges[0].topics[1].pattern: ...``), which ``serve``
prints before exiting with status 2.  The hook reads FILE again at each reload (SIGHUP,
``siftmq reload``) and applies the changes (:mod:`uplink._hook`); a bad table then fails the
reload (one error line, the running bridges stay).  A FILE without ``[[bridges]]`` gets no
Uplink hook (it would be asked to authorize every PUBLISH and delivery) but a
:class:`BridgesWatch`: bridges added to it later are checked at each reload and need a
restart to start (the reload's line names them).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.ext import Option
from broker.hooks import Hooks
from broker.plugins import ServeContext, Subparsers

if TYPE_CHECKING:  # uplink._config is imported by the first [[bridges]] read (issue 42 item 1)
    from uplink._config import BridgeConfig

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
    """A broker started without ``[[bridges]]``: a reload checks the tables that appeared
    (a bad one fails the reload like any bad table) and reports that starting them needs a
    restart (``ReloadResult.restart``), since the hook that runs bridges is not registered."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path

    def prepare_reload(self) -> _NeedsRestart | None:
        names = tuple(b.name for b in read_bridges(self.path))
        return _NeedsRestart(tuple(f"[[bridges]] {n}" for n in names)) if names else None


@dataclass(frozen=True, slots=True)
class _NeedsRestart:
    #: what the reload names as "changed but not applied, need a restart"
    restart: tuple[str, ...]

    async def apply(self) -> list[str]:
        return []


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
