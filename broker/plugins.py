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

Finding the plugins does not import :mod:`importlib.metadata`: that module imports ``email``,
``zipfile``, ``csv`` and ``importlib.resources`` (about 3 MB of the light broker's resident
memory, issue 42 item 1) to answer what is one small text file per installed distribution.
:func:`entry_point_values` reads the ``entry_points.txt`` of the ``*.dist-info`` and
``*.egg-info`` directories on ``sys.path`` itself, with importlib.metadata's rules (the first
distribution of a normalised name wins; ``module:attr.attr``); where a distribution could be
somewhere it does not look (a zip file on ``sys.path``, an import hook that provides
distributions), it asks :mod:`importlib.metadata` instead. ``tests/broker/test_footprint.py``
checks that both give the same.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:  # an annotation only: ``siftmq pub``/``sub`` import this module without the core
    from broker.hooks import Hooks

__all__ = ["GROUP", "Plugin", "ServeContext", "entry_point_values", "load_plugins"]

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
    for name, value in sorted(entry_point_values(GROUP), key=lambda e: e[0]):
        try:
            plugin = _load(value)
        except Exception as exc:  # a broken extension must not stop the broker
            log.warning("plugin %s could not be loaded (%s: %s)", name, type(exc).__name__, exc)
            continue
        plugins.append(plugin)
    return plugins


def _load(value: str) -> Plugin:
    """The object an entry point's ``module:attr.attr`` names (``EntryPoint.load``'s rule;
    extras in brackets are ignored, as there)."""
    module, _, attrs = value.partition("[")[0].strip().partition(":")
    found: Plugin = functools.reduce(
        getattr, filter(None, attrs.strip().split(".")), importlib.import_module(module.strip())
    )
    return found


def entry_point_values(group: str) -> list[tuple[str, str]]:
    """``(name, "module:attr")`` of the entry points of ``group`` of the installed
    distributions (the module docstring). O(entries on sys.path + their directory listings)."""
    if any(hasattr(f, "find_distributions") and f is not PathFinder for f in sys.meta_path):
        return _from_metadata(group)  # an import hook that provides distributions
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    for entry in sys.path:
        where = entry or "."
        if not os.path.isdir(where):
            if os.path.exists(where):  # a zip file (importlib.metadata reads inside)
                return _from_metadata(group)
            continue
        try:
            children = os.listdir(where)
        except OSError:
            continue
        for child in children:
            stem, ext = os.path.splitext(child)
            if ext not in (".dist-info", ".egg-info"):
                continue
            dist = re.sub(r"[-_.]+", "_", stem.partition("-")[0]).lower()
            if dist in seen:
                continue
            seen.add(dist)
            found += _section(os.path.join(where, child, "entry_points.txt"), group)
    return found


def _section(path: str, group: str) -> list[tuple[str, str]]:
    """The ``name = value`` lines of ``[group]`` in an ``entry_points.txt`` (none when the
    file is absent)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return []
    section = None
    out: list[tuple[str, str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == group and "=" in line:
            name, _, value = line.partition("=")
            out.append((name.strip(), value.strip()))
    return out


def _from_metadata(group: str) -> list[tuple[str, str]]:
    from importlib.metadata import entry_points

    return [(ep.name, ep.value) for ep in entry_points(group=group)]
