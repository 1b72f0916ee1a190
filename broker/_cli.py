"""The ``siftmq`` command line: ``serve``, ``passwd``, ``pub``/``sub``, ``backup``, ``version`` (this
package) and the commands of plugins (``broker.plugins``: the bridge adds ``analytics``).

Sub-commands are argparse sub-parsers; each sets ``func`` with ``set_defaults`` and
``main`` calls ``args.func(args)``. Packages above the broker add commands, ``serve``
options and serve-time hooks as plugins found through the ``siftmq.plugins`` entry point,
so the broker never imports them.

``siftmq serve`` options come from embedded defaults, then a TOML file (``--config``:
a ``[broker]`` table with :class:`~broker.BrokerConfig` fields and a ``[serve]`` table with
``data_dir``, ``log_level``, ``log_format`` (``text`` or ``json``: ``broker._logging``),
``persistence``, ``password_file``, ``acl_file``, and the keys of plugins, e.g. the
bridge's ``bridge`` and ``bridge_roll_interval``),
then flags.  SIGINT/SIGTERM stop it gracefully (clients disconnected, wills published,
hooks' ``stop`` awaited).  SIGHUP (``siftmq reload``, ``broker._reload``) re-reads the password,
ACL and TLS files and the live limits of ``--config``; the process id is in ``--pid-file``
(default ``<data-dir>/siftmq.pid`` with persistence).  uvloop is used when installed (``--no-uvloop``
to turn it off).
At start the soft descriptor limit is raised to the hard limit (one descriptor per client).

Listeners (docs/security.md): ``--host``/``--port`` is the plain TCP listener; ``--tls-port``,
``--ws-port`` and ``--wss-port`` add MQTT over TLS, WebSocket and WebSocket over TLS on the
same host (TLS needs ``--tls-cert``/``--tls-key``; ``--tls-ca`` verifies client
certificates).  ``--password-file``/``--acl-file`` register :class:`broker.auth.FileAuth`;
clients without a user name are accepted on loopback listeners only unless
``--allow-anonymous`` (every listener) or ``--no-allow-anonymous`` (none).  The durable
store is ``<data-dir>/broker.db`` unless ``--no-persistence``.

Optional extras (``broker._extras``): a feature whose extra is not installed
(``--cluster-listen`` without ``cluster``, ``siftmq analytics`` without ``spark``) is one line
naming the ``pip install`` command and exit status 2; ``--metrics-listen`` without ``metrics``
serves the dashboard and answers 501 at ``/metrics`` (one warning at start). ``siftmq
version`` (or ``--version``) says which hot-path modules run compiled and which extras are
installed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import re
import signal
import sys
import tomllib
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker._extras import Extra, MissingExtra, available
from broker._files import private_dir, shared_access, tighten_data_dir
from broker._logging import HeldRecords, LogFormat
from broker._logging import configure as configure_logging
from broker.plugins import Plugin, ServeContext, load_plugins

if TYPE_CHECKING:
    from broker._config import BrokerConfig
    from broker.hooks import Hooks

__all__ = ["build_parser", "main"]

log = logging.getLogger("siftmq")

# flag name -> BrokerConfig field, type, help
_OPTIONS: list[tuple[str, type, str]] = [
    ("max_queued_messages", int, "QoS 1/2 messages queued per client; beyond it they are dropped"),
    ("queue_high_water", int, "queued messages that pause the client's publishers (0: max-queued/4)"),
    ("queue_low_water", int, "queued messages at which paused publishers resume (0: half the high)"),
    ("slow_consumer_grace", float, "seconds over the high-water mark before a client is a slow consumer"),
    ("hung_consumer_time", float, "seconds over the high-water mark without socket progress: hung (0: off)"),
    ("slow_consumer_policy", str, "slow consumers: pace, drop (default) or disconnect"),
    ("write_buffer_high", int, "bytes buffered for a socket above which the client counts as not reading"),
    ("ingress_shed_bytes", int, "bytes waiting behind a read that make QoS 0 from it shed (0: never)"),
    ("ingress_shed_grace", float, "seconds a publisher stays that far ahead before its QoS 0 is shed"),
    ("socket_send_buffer", int, "SO_SNDBUF of client sockets in bytes (0: the kernel's autotuning)"),
    ("max_inflight", int, "unacknowledged QoS 1/2 messages per client"),
    ("receive_maximum", int, "QoS 2 messages a client may have unacknowledged towards the broker"),
    ("max_packet_size", int, "largest accepted packet in bytes"),
    ("topic_alias_maximum", int, "topic aliases accepted from v5 clients (0 disables)"),
    ("server_keep_alive", int, "keep-alive imposed on v5 clients (seconds)"),
    ("max_session_expiry", int, "cap on session expiry intervals (seconds)"),
    ("sys_interval", float, "seconds between $SYS statistics (0 disables)"),
    ("content_engine", str, "content filter engine (a name of content.ENGINES)"),
    ("content_batch_min", int, "selectors from which a batch engine matches one read's PUBLISHes at once"),
    ("maximum_qos", int, "highest QoS granted"),
    ("max_topic_levels", int, "levels of a topic name or filter (default 201: 200 '/', as mosquitto)"),
    ("metrics_listen", str, "HOST:PORT of the Prometheus endpoint /metrics (default off)"),
    ("listen_backlog", int, "listen backlog of the listening sockets (capped by net.core.somaxconn)"),
    ("connect_timeout", float, "seconds a new connection may take to send CONNECT (default 30)"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="siftmq", description="siftmq: an MQTT broker that routes by topic and by content."
    )
    parser.add_argument(
        "--version", action="store_true", help="print the version, compiled modules and extras, and exit"
    )
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="run the MQTT broker", description=_serve.__doc__)
    serve.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="TCP port (default 1883; 0 picks one)")
    serve.add_argument("--config", type=Path, default=None, help="TOML configuration file")
    serve.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="directory of the store (broker.db) and the bridge's data (default ./siftmq-data)",
    )
    serve.add_argument(
        "--partial-unsubscribe",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="negative entries on UNSUBSCRIBE (default on; --no-partial-unsubscribe = pure MQTT)",
    )
    serve.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING, ERROR")
    serve.add_argument(
        "--log-format",
        default=None,
        choices=("text", "json"),
        help="text (default) or json: one object a line",
    )
    serve.add_argument("--no-uvloop", action="store_true", help="use the default asyncio event loop")
    serve.add_argument(
        "--pid-file",
        type=Path,
        default=None,
        help="process id file for 'siftmq reload' (default <data-dir>/siftmq.pid with persistence)",
    )
    serve.add_argument(
        "--no-persistence",
        action="store_true",
        default=None,
        help="keep no durable state (default: SQLite store <data-dir>/broker.db)",
    )
    for name, typ, text in _OPTIONS:
        serve.add_argument("--" + name.replace("_", "-"), type=typ, default=None, help=text)
    _add_security_options(serve)
    plugins = load_plugins()
    for plugin in plugins:
        plugin.add_serve_options(serve)
    serve.set_defaults(func=_serve, plugins=plugins)
    from broker._passwd_cli import register as register_passwd

    register_passwd(sub)
    from broker._client_cli import register as register_clients

    register_clients(sub)
    from broker._backup_cli import register as register_backup

    register_backup(sub)
    from broker._reload import register as register_reload

    register_reload(sub)
    version = sub.add_parser(
        "version", help="version, compiled hot-path modules, installed extras", description=_version.__doc__
    )
    version.set_defaults(func=_version)
    for plugin in plugins:
        plugin.add_commands(sub)
    return parser


def _add_security_options(serve: argparse.ArgumentParser) -> None:
    g = serve.add_argument_group("listeners, TLS and authentication (docs/security.md)")
    g.add_argument("--tls-port", type=int, default=None, help="also serve MQTT over TLS on this port")
    g.add_argument("--ws-port", type=int, default=None, help="also serve MQTT over WebSocket on this port")
    g.add_argument("--wss-port", type=int, default=None, help="also serve MQTT over WebSocket + TLS here")
    g.add_argument("--ws-path", default=None, help="HTTP path of the WebSocket listeners (default /mqtt)")
    g.add_argument("--tls-cert", default=None, help="server certificate chain (PEM) of the TLS listeners")
    g.add_argument("--tls-key", default=None, help="private key (PEM) of --tls-cert")
    g.add_argument("--tls-ca", default=None, help="CA certificates (PEM) that verify client certificates")
    g.add_argument(
        "--require-client-cert",
        action="store_true",
        default=None,
        help="TLS clients must present a certificate",
    )
    g.add_argument(
        "--use-identity-as-username",
        action="store_true",
        default=None,
        help="the client certificate's CN is the user name (needs --require-client-cert)",
    )
    g.add_argument("--password-file", default=None, help="password file written by 'siftmq passwd'")
    g.add_argument("--acl-file", default=None, help="ACL file (mosquitto format)")
    g.add_argument(
        "--dashboard-admin",
        action="append",
        default=None,
        metavar="USER",
        help="password-file user allowed into the dashboard of --metrics-listen (repeatable)",
    )
    g.add_argument(
        "--dashboard",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve the live dashboard at / of --metrics-listen (default on; docs/dashboard.md)",
    )
    g.add_argument(
        "--allow-anonymous",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="clients without a user name on every listener (default: on loopback listeners only)",
    )
    g.add_argument("--max-connections", type=int, default=None, help="open connections (0 = unlimited)")
    g.add_argument(
        "--connection-rate",
        type=float,
        default=None,
        help="new connections per second per IP (0 = unlimited)",
    )
    g.add_argument(
        "--connection-burst", type=int, default=None, help="connections a source IP may open at once"
    )


def _with_listeners(cfg: BrokerConfig, args: argparse.Namespace) -> BrokerConfig:
    """``cfg`` with the listeners the flags ask for (unchanged when they ask for none)."""
    from broker._config import Listener

    extra = [("tcp", args.tls_port, True), ("ws", args.ws_port, False), ("ws", args.wss_port, True)]
    extra = [e for e in extra if e[1] is not None]
    touched = (
        args.tls_cert,
        args.tls_ca,
        args.require_client_cert,
        args.use_identity_as_username,
        args.ws_path,
    )
    if not extra and args.allow_anonymous is None and all(x is None for x in touched):
        return cfg
    if any(tls for _, _, tls in extra) and (args.tls_cert is None or args.tls_key is None):
        raise ValueError("--tls-port and --wss-port need --tls-cert and --tls-key")
    base = list(cfg.effective_listeners())
    tls = {"certfile": args.tls_cert, "keyfile": args.tls_key, "cafile": args.tls_ca}
    tls["require_client_cert"] = bool(args.require_client_cert)
    tls["use_identity_as_username"] = bool(args.use_identity_as_username)
    for kind, port, secure in extra:
        fields: dict[str, Any] = {"kind": kind, "host": cfg.host, "port": port}
        if secure:
            fields.update(tls)
        if kind == "ws" and args.ws_path is not None:
            fields["ws_path"] = args.ws_path
        base.append(Listener(**fields))
    if args.allow_anonymous is not None:
        base = [dataclasses.replace(li, allow_anonymous=args.allow_anonymous) for li in base]
        if not args.allow_anonymous:
            cfg = dataclasses.replace(cfg, allow_anonymous=False)
    return dataclasses.replace(cfg, listeners=tuple(base))


#: keys of the ``[serve]`` table (a typo is an error, as in ``[broker]``)
_SERVE_KEYS = frozenset({"data_dir", "log_level", "log_format", "persistence", "password_file", "acl_file"})


def _serve(args: argparse.Namespace) -> int:
    """Serve MQTT 3.1.1 and 5.0 over TCP until SIGINT/SIGTERM."""
    from broker._config import BrokerConfig, load_toml

    plugins: list[Plugin] = args.plugins
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
        known = _SERVE_KEYS.union(*(p.serve_keys for p in plugins))
        unknown = sorted(set(serve_opts) - known)
        if unknown:
            print(f"siftmq serve: bad configuration: unknown [serve] key {unknown[0]!r}", file=sys.stderr)
            return 2
    changes: dict[str, Any] = {}
    limits = ("max_connections", "connection_rate", "connection_burst")
    for name in ("host", "port", "partial_unsubscribe", *(o[0] for o in _OPTIONS), *limits):
        value = getattr(args, name)
        if value is not None:
            changes[name] = value
    changes.update(_dashboard_options(args))
    data_dir = Path(args.data_dir or serve_opts.get("data_dir") or "siftmq-data")
    persistence = not args.no_persistence and serve_opts.get("persistence", True)
    if persistence and cfg.store_path is None:
        changes["store_path"] = str(data_dir / "broker.db")
    try:
        cfg = _with_listeners(dataclasses.replace(cfg, **changes), args)
        auth = _file_auth(
            args.password_file or serve_opts.get("password_file"), args.acl_file or serve_opts.get("acl_file")
        )
    except (OSError, ValueError, MissingExtra) as exc:
        print(f"siftmq serve: {exc}", file=sys.stderr)
        return 2
    if not _logging_set_up(args, serve_opts):
        return 2
    if cfg.metrics_listen is not None and not available(Extra.METRICS):  # the dashboard works
        log.warning(
            "/metrics answers 501: the 'metrics' extra is not installed (pip install 'siftmq[metrics]')"
        )
    _warn_shared(
        args.password_file or serve_opts.get("password_file"), args.acl_file or serve_opts.get("acl_file")
    )
    _raise_descriptors()
    tighten_data_dir(data_dir)  # what an older siftmq left readable by others (broker/_files.py)
    hooks: list[Hooks] = []
    ctx = ServeContext(args, serve_opts, data_dir)
    try:
        for plugin in plugins:
            hooks.extend(plugin.serve_hooks(ctx))
    except (ValueError, MissingExtra) as exc:
        print(f"siftmq serve: {exc}", file=sys.stderr)
        return 2
    if auth is not None:  # after the plugins': the cluster authenticates its own links
        hooks.append(auth)
    _log_build()
    if persistence and cfg.store_path is not None and cfg.store_path != ":memory:":
        private_dir(Path(cfg.store_path).parent)  # 0700 whatever the umask (broker/_files.py)
    pid_file = args.pid_file or (data_dir / "siftmq.pid" if persistence else None)
    reconfigure = _reconfigure(args, changes)
    try:
        run = _pick_runner(args.no_uvloop)
        return int(run(_run(cfg, hooks, auth is not None, pid_file, reconfigure)))
    except KeyboardInterrupt:
        return 0


def _logging_set_up(args: argparse.Namespace, serve_opts: dict[str, Any]) -> bool:
    """Log level and format (``broker._logging``: text, or one JSON object a line, to stderr),
    then the lines held while the command line was parsed; False (said) when they are bad."""
    level = str(args.log_level or serve_opts.get("log_level") or "INFO").upper()
    try:
        configure_logging(level, LogFormat(args.log_format or serve_opts.get("log_format") or "text"))
    except ValueError as exc:
        print(f"siftmq serve: bad configuration: log_level / log_format: {exc}", file=sys.stderr)
        return False
    held: HeldRecords | None = getattr(args, "held_records", None)
    if held is not None:
        held.replay()
    return True


def _reconfigure(args: argparse.Namespace, changes: dict[str, Any]) -> Callable[[], BrokerConfig] | None:
    """What a SIGHUP applies (``broker._reload``): the ``--config`` file read again with the
    same flags over it (None without ``--config``: the files are re-read, no limits change)."""
    from broker._config import load_toml

    config_file: Path | None = args.config
    if config_file is None:
        return None

    def reconfigure() -> BrokerConfig:
        try:
            cfg = load_toml(config_file)
        except tomllib.TOMLDecodeError as exc:  # "... (at line 3, column 14)" -> "FILE:3: ..."
            text, line = str(exc), ""
            if where := re.search(r" \(at line (\d+), column \d+\)$", text):
                text, line = text.removesuffix(where[0]), f":{where[1]}"
            raise ValueError(f"{config_file}{line}: {text}") from exc
        return _with_listeners(dataclasses.replace(cfg, **changes), args)

    return reconfigure


def _dashboard_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--[no-]dashboard`` and ``--dashboard-admin`` as BrokerConfig changes."""
    changes: dict[str, Any] = {}
    if args.dashboard is not None:
        changes["dashboard"] = args.dashboard
    if args.dashboard_admin:
        changes["dashboard_admins"] = tuple(args.dashboard_admin)
    return changes


def _raise_descriptors() -> None:
    """The soft descriptor limit up to the hard limit: one descriptor per connection, and the
    soft limit of many systems (1,024) is far below the hard one (docs/operations-fleet.md).
    ``Broker.start`` logs the connection capacity that results."""
    from broker.net._accept import raise_descriptor_limit

    before, after = raise_descriptor_limit()
    if after != before:
        log.info("descriptor limit raised from %d to %d (the hard limit)", before, after)


def _log_build() -> None:
    """Say whether the hot path runs compiled (mypyc) and warn about stale extensions."""
    from broker._build import HOT_MODULES, compiled_modules, stale_modules

    compiled = compiled_modules()
    log.info("hot path: %d of %d modules compiled with mypyc", len(compiled), len(HOT_MODULES))
    stale = stale_modules()
    if stale:
        log.warning("compiled modules older than their source (run `make build`): %s", ", ".join(stale))


def _version(args: argparse.Namespace) -> int:
    """Print the version, which hot-path modules run compiled (mypyc) and the installed extras."""
    del args
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from broker._build import HOT_MODULES, compiled_modules, stale_modules

    try:
        release = version("siftmq")
    except PackageNotFoundError:
        release = "(not installed)"
    compiled = compiled_modules()
    print(f"siftmq {release} (Python {platform.python_version()}, {sys.platform} {platform.machine()})")
    print(f"hot path: {len(compiled)} of {len(HOT_MODULES)} modules compiled with mypyc")
    pure = [m for m in HOT_MODULES if m not in compiled]
    if pure:
        print("pure Python: " + ", ".join(pure))
    stale = stale_modules()
    if stale:
        print("stale (older than their source): " + ", ".join(stale))
    extras = [f"{e.value} {'yes' if available(e) else 'no'}" for e in Extra]
    print("extras: " + ", ".join(extras))
    return 0


def _file_auth(password_file: str | None, acl_file: str | None) -> Hooks | None:
    """A FileAuth hook for the given files (None if neither); anonymous clients are left to
    the listeners' rule (``Listener.anonymous``), so the hook accepts them."""
    if password_file is None and acl_file is None:
        return None
    from broker.auth import FileAuth

    return FileAuth(password_file=password_file, acl_file=acl_file, allow_anonymous=True)


def _warn_shared(password_file: str | None, acl_file: str | None) -> None:
    """One warning per password or ACL file that group or others may read (a warning, not an
    error: docs/security.md, "Files on disk")."""
    for path, what in ((password_file, "password file"), (acl_file, "ACL file")):
        shared = None if path is None else shared_access(path)
        if shared is not None:
            log.warning("%s %s", what, shared)


def _pick_runner(no_uvloop: bool) -> Callable[[Coroutine[Any, Any, int]], int]:
    if not no_uvloop:
        try:
            import uvloop

            log.debug("using uvloop")
            return uvloop.run
        except ImportError:
            pass
    return asyncio.run


async def _run(
    cfg: BrokerConfig,
    hooks: list[Hooks],
    authenticated: bool,
    pid_file: Path | None = None,
    reconfigure: Callable[[], BrokerConfig] | None = None,
) -> int:
    from broker._broker import Broker
    from broker._reload import SighupReloads

    if not authenticated:
        exposed = [li.url for li in cfg.effective_listeners() if not li.loopback]
        if exposed:
            log.warning(
                "no --password-file: any user name is accepted without a check on %s", ", ".join(exposed)
            )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    reloads = SighupReloads(reconfigure, pid_file)  # SIGHUP: broker.reload() (siftmq reload)
    reloads.install()
    try:
        async with Broker(config=cfg, hooks=hooks) as broker:
            reloads.start(broker)
            try:
                await stop.wait()
                log.info("signal received, stopping")
            finally:
                reloads.close()
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", cfg.host, cfg.port, exc)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    held = HeldRecords()  # plugins' warnings wait for serve's --log-format (broker._logging)
    logging.getLogger().addHandler(held)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    finally:
        logging.getLogger().removeHandler(held)
    args.held_records = held
    try:
        if args.version:
            return _version(args)
        if args.command is None:
            parser.error("a command is required (serve, pub, sub, passwd, version, ...)")
        result = args.func(args)
    finally:
        held.replay()  # if serve did not (another command, or it stopped before logging)
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
