"""The bridge as a ``siftmq`` plugin (``broker.plugins``; entry point ``siftmq.plugins``).

The broker never imports the bridge: ``siftmq`` finds this plugin through the entry point the
distribution declares, and the plugin adds ``siftmq analytics`` and the ``serve`` options
``--bridge`` / ``--no-bridge`` / ``--bridge-roll-interval`` / ``--bridge-messages`` /
``--bridge-writer`` (``[serve]`` keys ``bridge``, ``bridge_roll_interval``, ``bridge_messages``,
``bridge_writer``), and registers a :class:`~bridge.Bridge` hook in the served broker.

The served bridge writes from its own process by default (``--bridge-writer process``,
``bridge/_writerproc.py``): numpy and pyarrow then never enter the broker's process, which
stays at its idle footprint after the first write (issue 42: 40 against 146 MB,
docs/performance.md "Footprint"); ``--bridge-writer thread`` writes from a thread of the
broker, as before.

The bridge needs the ``spark`` extra (pyarrow, ...). This module imports none of it, so the
plugin loads in a broker-only install: there ``serve`` runs without the bridge and says so in
one info line, unless the bridge was asked for explicitly (``--bridge``, ``bridge = true``,
``--bridge-roll-interval``, ``--bridge-messages``), which is the ``MissingExtra`` error (exit
status 2).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from typing import cast

from broker.ext import Extra, Kind, MissingExtra, Option, missing_module
from broker.hooks import Hooks
from broker.plugins import ServeContext, Subparsers

__all__ = ["PLUGIN", "BridgePlugin"]

log = logging.getLogger("siftmq")


class BridgePlugin:
    """``siftmq analytics`` and the bridge hook of ``siftmq serve``."""

    name = "bridge"
    #: the ``[serve]`` keys, checked at load like every option (``broker.ext.Option``)
    serve_options: Mapping[str, Option] = {
        "bridge": Option(Kind.BOOL),
        "bridge_roll_interval": Option(Kind.FLOAT, lo=0, lo_open=True, hi=3600, unit="seconds"),
        "bridge_messages": Option(Kind.STRS),
        "bridge_writer": Option(Kind.CHOICE, choices=("process", "thread")),
    }
    serve_keys = frozenset(serve_options)

    def add_commands(self, subparsers: Subparsers) -> None:
        from bridge._cli import register

        register(subparsers)

    def add_serve_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--bridge",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="stream to the bridge (default: on when the 'spark' extra is installed)",
        )
        parser.add_argument(
            "--bridge-roll-interval",
            default=None,
            help="seconds between the bridge's landing-zone rounds (default 0.5; the writer process "
            "commits rounds of few rows together, within 4x this; lower = fresher Spark results, more files)",
        )
        parser.add_argument(
            "--bridge-messages",
            action="append",
            default=None,
            metavar="TOPIC_FILTER",
            help="land whole messages (payload included) of topics matching this filter in the "
            "landing zone's messages/ (repeatable; what format('siftmq') kind 'messages' reads)",
        )

        parser.add_argument(
            "--bridge-writer",
            choices=("process", "thread"),
            default=None,
            help="where the bridge encodes and writes its files: a child process (default; numpy "
            "and pyarrow stay out of the broker) or a thread of the broker",
        )

    def serve_hooks(self, ctx: ServeContext) -> Sequence[Hooks]:
        args, opts = ctx.args, ctx.options
        # flags and keys checked against serve_options by ``siftmq serve``
        roll = args.bridge_roll_interval or opts.get("bridge_roll_interval") or 0.5
        assert isinstance(roll, float)
        wanted = args.bridge if args.bridge is not None else opts.get("bridge")
        if wanted is not None and not wanted:
            return ()
        module = missing_module(Extra.SPARK)
        if module is not None:
            explicit = (
                wanted is True
                or args.bridge_roll_interval is not None
                or "bridge_roll_interval" in opts
                or bool(args.bridge_messages or opts.get("bridge_messages"))
                or args.bridge_writer is not None
                or "bridge_writer" in opts
            )
            if explicit:
                raise MissingExtra(Extra.SPARK, "the bridge", module)
            log.info("bridge off: the 'spark' extra is not installed (pip install 'siftmq[spark]')")
            return ()
        from bridge._writer import Bridge

        messages = list(cast("Sequence[str]", args.bridge_messages or opts.get("bridge_messages") or ()))
        _system_arrow_pool()
        landing = ctx.data_dir / "landing"
        writer = str(args.bridge_writer or opts.get("bridge_writer") or "process")
        log.info("bridge on: landing zone %s, roll interval %g s, writer %s", landing, roll, writer)
        if messages:
            log.info("bridge: landing whole messages of %s", ", ".join(messages))
        return (Bridge(landing, roll_interval=float(roll), messages=messages, writer=writer),)


def _system_arrow_pool() -> None:
    """Arrow's buffers from the C library's allocator, not from mimalloc (pyarrow's default),
    in the served broker unless ``ARROW_DEFAULT_MEMORY_POOL`` says otherwise.

    The bridge's writer builds a few MB of Arrow buffers every round (0.5 s) and frees them;
    mimalloc gives that memory back to the kernel between rounds and takes it again as fresh
    huge pages, which the kernel zeroes: under publisher-paced QoS 1 (issue 27 item 7) 20 % of
    the writer thread's CPU was ``clear_page_erms`` below mimalloc, on the broker's one core.
    With the system pool the writer took 28 % less CPU per message in the same run (jemalloc:
    13 % less).  Only ``siftmq serve`` sets it (its process is the broker's); an embedding
    application keeps whatever pool it chose.

    Through Arrow's own setting (``ARROW_DEFAULT_MEMORY_POOL=system``, read when pyarrow makes
    its first pool), not ``pyarrow.set_memory_pool``: pyarrow is loaded only by the writer's
    first table (issue 42, the idle broker's footprint), not here."""
    import os

    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


PLUGIN = BridgePlugin()
