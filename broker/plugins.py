"""The broker's registration point for packages above it (the bridge, the cluster, ...).

The broker is a lower layer: it never imports the packages that extend it (docs/reference.md:
topics/content <- broker <- bridge). A package that wants a ``siftmq`` sub-command, options of
``siftmq serve``, or hooks in a served broker declares a :class:`Plugin` under the
``siftmq.plugins`` entry-point group of its distribution (``pyproject.toml``)::

    [project.entry-points."siftmq.plugins"]
    bridge = "bridge._plugin:PLUGIN"

and ``siftmq`` loads every registered plugin when it builds its parser (:func:`load_plugins`),
the way pytest loads its plugins. A plugin that fails to load is reported by name and left
out; the broker still serves. A plugin that reads top-level tables of the ``siftmq serve
--config`` file itself (uplink's ``[[bridges]]``) names them in an optional attribute
``config_tables: frozenset[str]``: ``serve`` warns once about any other table nobody reads.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias

from broker.hooks import Hooks

__all__ = ["GROUP", "Plugin", "ServeContext", "load_plugins"]

log = logging.getLogger("siftmq")

#: the entry-point group plugins register under
GROUP = "siftmq.plugins"

if TYPE_CHECKING:
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Subparsers = argparse._SubParsersAction


@dataclass(frozen=True, slots=True)
class ServeContext:
    """What ``siftmq serve`` hands a plugin to build its hooks from."""

    #: the parsed command line of ``siftmq serve``
    args: argparse.Namespace
    #: the ``[serve]`` table of the TOML configuration (keys with ``_``)
    options: Mapping[str, object]
    #: ``--data-dir``: where plugins keep their data
    data_dir: Path


class Plugin(Protocol):
    """A package extending ``siftmq``; every method may do nothing."""

    #: short name used in messages
    name: str
    #: keys of the ``[serve]`` TOML table this plugin reads (others are refused as typos)
    serve_keys: frozenset[str]

    def add_commands(self, subparsers: Subparsers) -> None:
        """Add sub-commands; each sets ``func`` (``args.func(args)`` runs it)."""

    def add_serve_options(self, parser: argparse.ArgumentParser) -> None:
        """Add options of ``siftmq serve``."""

    def serve_hooks(self, ctx: ServeContext) -> Sequence[Hooks]:
        """Hooks to register in the broker that ``siftmq serve`` starts (may raise ValueError
        for a bad option: ``serve`` reports it and exits with status 2)."""
        ...


def load_plugins() -> list[Plugin]:
    """The plugins registered under :data:`GROUP`, in name order (O(installed plugins))."""
    plugins: list[Plugin] = []
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken extension must not stop the broker
            log.warning("plugin %s could not be loaded (%s: %s)", ep.name, type(exc).__name__, exc)
            continue
        plugins.append(plugin)
    return plugins
