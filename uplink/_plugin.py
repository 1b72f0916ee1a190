"""Outbound bridges as a ``siftmq`` plugin (``broker.plugins``; entry point ``siftmq.plugins``).

``siftmq serve --config FILE`` reads the ``[[bridges]]`` tables of FILE (docs/bridging-out.md)
and registers one :class:`~uplink._hook.Uplink` hook running them; a bad table is a
``ValueError`` naming the value (``FILE: bridges[0].topics[1].pattern: ...``), which ``serve``
prints before exiting with status 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from broker.ext import Option
from broker.hooks import Hooks
from broker.plugins import ServeContext, Subparsers
from uplink._config import parse_bridges

__all__ = ["PLUGIN", "UplinkPlugin"]


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
        import tomllib  # with --config only

        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        if "bridges" not in data:
            return ()
        from uplink._hook import Uplink

        return (Uplink(parse_bridges(data["bridges"], str(path))),)


PLUGIN = UplinkPlugin()
