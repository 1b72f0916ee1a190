"""The ``siftmq`` command line: ``serve`` (this package) and ``analytics`` (the bridge).

Sub-commands are argparse sub-parsers; each sets ``func`` with ``set_defaults`` and
``main`` calls ``args.func(args)``, so other packages add commands with a
``register(subparsers)`` function (the bridge's ``bridge._cli.register``).

``siftmq serve`` options come from embedded defaults, then a TOML file (``--config``:
a ``[broker]`` table with :class:`~broker.BrokerConfig` fields and a ``[serve]`` table with
``data_dir``, ``bridge``, ``log_level``), then flags.  SIGINT/SIGTERM stop it gracefully
(clients disconnected, wills published, hooks' ``stop`` awaited).  uvloop is used when
installed (``--no-uvloop`` to turn it off).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import logging
import signal
import sys
import tomllib
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "main"]

log = logging.getLogger("siftmq")

# flag name -> BrokerConfig field, type, help
_OPTIONS: list[tuple[str, type, str]] = [
    ("max_queued_messages", int, "QoS 1/2 messages queued per client before it is disconnected"),
    ("max_inflight", int, "unacknowledged QoS 1/2 messages per client"),
    ("receive_maximum", int, "QoS 2 messages a client may have unacknowledged towards the broker"),
    ("max_packet_size", int, "largest accepted packet in bytes"),
    ("topic_alias_maximum", int, "topic aliases accepted from v5 clients (0 disables)"),
    ("server_keep_alive", int, "keep-alive imposed on v5 clients (seconds)"),
    ("max_session_expiry", int, "cap on session expiry intervals (seconds)"),
    ("sys_interval", float, "seconds between $SYS statistics (0 disables)"),
    ("content_engine", str, "content filter engine (a name of content.ENGINES)"),
    ("maximum_qos", int, "highest QoS granted"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="siftmq", description="siftmq: an MQTT broker that routes by topic and by content."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the MQTT broker", description=_serve.__doc__)
    serve.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="TCP port (default 1883; 0 picks one)")
    serve.add_argument("--config", type=Path, default=None, help="TOML configuration file")
    serve.add_argument(
        "--data-dir", type=Path, default=None, help="directory for the bridge's data (default ./siftmq-data)"
    )
    serve.add_argument("--no-bridge", action="store_true", default=None, help="do not stream to the bridge")
    serve.add_argument(
        "--partial-unsubscribe",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="negative entries on UNSUBSCRIBE (default on; --no-partial-unsubscribe = pure MQTT)",
    )
    serve.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING, ERROR")
    serve.add_argument("--no-uvloop", action="store_true", help="use the default asyncio event loop")
    for name, typ, text in _OPTIONS:
        serve.add_argument("--" + name.replace("_", "-"), type=typ, default=None, help=text)
    serve.set_defaults(func=_serve)
    try:
        importlib.import_module("bridge._cli").register(sub)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        analytics = sub.add_parser(
            "analytics", help="Spark analytics (unavailable: the bridge failed to load)"
        )
        analytics.set_defaults(func=lambda _args: _missing("analytics", reason))
    return parser


def _missing(command: str, reason: str) -> int:
    print(f"siftmq {command}: not available ({reason})", file=sys.stderr)
    return 2


def _serve(args: argparse.Namespace) -> int:
    """Serve MQTT 3.1.1 and 5.0 over TCP until SIGINT/SIGTERM."""
    from broker._config import BrokerConfig, load_toml

    serve_opts: dict[str, Any] = {}
    cfg = BrokerConfig()
    if args.config is not None:
        try:
            cfg = load_toml(args.config)
            with open(args.config, "rb") as fh:
                table = tomllib.load(fh).get("serve", {})
        except (OSError, ValueError, TypeError) as exc:
            print(f"siftmq serve: bad configuration: {exc}", file=sys.stderr)
            return 2
        serve_opts = {k.replace("-", "_"): v for k, v in table.items()}
    changes: dict[str, Any] = {}
    for name in ("host", "port", "partial_unsubscribe", *(o[0] for o in _OPTIONS)):
        value = getattr(args, name)
        if value is not None:
            changes[name] = value
    cfg = dataclasses.replace(cfg, **changes)
    level = (args.log_level or serve_opts.get("log_level") or "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    data_dir = Path(args.data_dir or serve_opts.get("data_dir") or "siftmq-data")
    bridge_on = not args.no_bridge and serve_opts.get("bridge", True)
    try:
        run = _pick_runner(args.no_uvloop)
        return int(run(_run(cfg, data_dir, bool(bridge_on))))
    except KeyboardInterrupt:
        return 0


def _pick_runner(no_uvloop: bool) -> Any:
    if not no_uvloop:
        try:
            import uvloop

            log.debug("using uvloop")
            return uvloop.run
        except ImportError:
            pass
    return asyncio.run


async def _run(cfg: Any, data_dir: Path, bridge_on: bool) -> int:
    from broker._broker import Broker
    from broker.hooks import Hooks

    hooks: list[Hooks] = []
    if bridge_on:
        try:
            bridge_cls = importlib.import_module("bridge").Bridge
            hooks.append(bridge_cls(data_dir / "landing"))
            log.info("bridge on: landing zone %s", data_dir / "landing")
        except Exception as exc:
            log.warning("bridge unavailable (%s: %s); serving without it", type(exc).__name__, exc)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with Broker(config=cfg, hooks=hooks):
            await stop.wait()
            log.info("signal received, stopping")
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", cfg.host, cfg.port, exc)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
