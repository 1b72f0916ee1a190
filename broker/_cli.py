"""The ``siftmq`` command line: ``serve``, ``passwd``, ``pub``/``sub``, ``backup``, ``ctl``, ``version`` (this
package) and the commands of plugins (``broker.plugins``: the bridge adds ``analytics``).

Sub-commands are argparse sub-parsers; each sets ``func`` with ``set_defaults`` and
``main`` calls ``args.func(args)``. Packages above the broker add commands, ``serve``
options and serve-time hooks as plugins found through the ``siftmq.plugins`` entry point,
so the broker never imports them.

``siftmq serve`` options come from embedded defaults, then a TOML file (``--config``:
a ``[broker]`` table with :class:`~broker.BrokerConfig` fields and a ``[serve]`` table with
``data_dir``, ``log_level``, ``log_format`` (``text`` or ``json``: ``broker._logging``),
``persistence``, ``password_file``, ``acl_file``, the ``auth_http_*``/``auth_jwt_*`` keys
of :mod:`broker.authn`, and the keys of plugins, e.g. the
bridge's ``bridge`` and ``bridge_roll_interval``),
then flags.  SIGINT/SIGTERM stop it gracefully (clients disconnected, wills published,
hooks' ``stop`` awaited).  SIGHUP (``siftmq reload``, ``broker._reload``) re-reads the password,
ACL and TLS files and the live limits of ``--config``; the process id is in ``--pid-file``
(default ``<data-dir>/siftmq.pid`` with persistence).  uvloop is used when installed (``--no-uvloop``
to turn it off), except by the light broker (no store and no plugin's hooks: ``--no-bridge
--no-persistence``), which runs on asyncio's own loop unless ``--uvloop`` (:func:`_use_uvloop`).
At start the soft descriptor limit is raised to the hard limit (one descriptor per client).

Listeners (docs/security.md): ``--host``/``--port`` is the plain TCP listener; ``--tls-port``,
``--ws-port`` and ``--wss-port`` add MQTT over TLS, WebSocket and WebSocket over TLS on the
same host (TLS needs ``--tls-cert``/``--tls-key``; ``--tls-ca`` verifies client
certificates).  ``--password-file``/``--acl-file`` register :class:`broker.auth.FileAuth`;
clients without a user name are accepted on loopback listeners only unless
``--allow-anonymous`` (every listener) or ``--no-allow-anonymous`` (none).  The durable
store is ``<data-dir>/broker.db`` unless ``--no-persistence``.

Errors (docs/operations.md, "Bad input"): every command fails the same way, through
:func:`main`: one line ``siftmq COMMAND: what is wrong`` on stderr, status 2 for usage and
configuration (argparse's own errors too: :class:`Parser`) and 1 for runtime failures (a port
in use, a store it cannot use); the traceback only with ``--debug`` or log level DEBUG. A
command raises :class:`CommandError` (or ``ConfigError``, ``MissingExtra``, ``OSError``)
instead of printing. ``serve`` checks everything it can before it starts anything (the
configuration against the schema of ``broker._config``, the files it names, the data
directory, the store), and holds the plugins' set-up log until then, so that a bad input is
the only line it prints.

Optional extras (``broker._extras``): a feature whose extra is not installed
(``--cluster-listen`` without ``cluster``, ``siftmq analytics`` without ``spark``) is one line
naming the ``pip install`` command and exit status 2; ``--metrics-listen`` without ``metrics``
serves the dashboard and answers 501 at ``/metrics`` (one warning at start). ``siftmq
version`` (or ``--version``) says which hot-path modules run compiled and which extras are
installed.
"""

from __future__ import annotations

# ruff: noqa: E402  (asyncio is imported after the ssl hook is in place)
from broker._sslhook import import_asyncio_without_ssl

import_asyncio_without_ssl()  # ssl (OpenSSL, ~4.5 MB) at its first use: broker/_sslhook.py

import argparse
import asyncio
import dataclasses
import logging
import os
import re
import signal
import sys
import traceback
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

from broker._argwidth import WidthParser
from broker._config import SERVE_OPTIONS, ConfigError, Kind, Option
from broker._extras import Extra, MissingExtra, available
from broker._files import private_dir, shared_access, tighten_data_dir
from broker._logging import HeldRecords, LogFormat
from broker._logging import configure as configure_logging
from broker.plugins import Plugin, ServeContext, Subparsers, load_plugins

if TYPE_CHECKING:
    from broker._config import BrokerConfig
    from broker.hooks import Hooks

__all__ = ["CommandError", "Parser", "build_parser", "main"]


class CommandError(Exception):
    """A command cannot go on: ``main`` prints ``siftmq COMMAND: MESSAGE`` (one line) and exits
    with ``status`` (2: usage or configuration, 1: a runtime failure). Raise it from a
    command's ``func`` instead of printing and returning a status."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


class Parser(WidthParser):
    """An argparse parser whose usage errors are one line, ``siftmq COMMAND: what is wrong``
    (no usage block), exit status 2. Sub-parsers (and theirs) are of this class too, so the
    plugins' commands get it without doing anything. Built without shutil (broker/_argwidth.py)."""

    def error(self, message: str) -> NoReturn:
        # argparse says "argument --port: invalid ..."; the flag alone reads better
        message = re.sub(r"^argument ([^:]+): (\1 )?", lambda m: m.group(2) or f"{m.group(1)}: ", message)
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


log = logging.getLogger("siftmq")

# BrokerConfig field (its flag is --field-name; type and range: the field's Option) and help
_OPTIONS: list[tuple[str, str]] = [
    ("max_queued_messages", "QoS 1/2 messages queued per client; beyond it they are dropped"),
    ("queue_high_water", "queued messages that pause the client's publishers (0: max-queued/4)"),
    ("queue_low_water", "queued messages at which paused publishers resume (0: half the high)"),
    ("slow_consumer_grace", "seconds over the high-water mark before a client is a slow consumer"),
    ("hung_consumer_time", "seconds over the high-water mark without socket progress: hung (0: off)"),
    ("slow_consumer_policy", "slow consumers: pace, drop (default) or disconnect"),
    ("write_buffer_high", "bytes buffered for a socket above which the client counts as not reading"),
    ("ingress_shed_bytes", "bytes waiting behind a read that make QoS 0 from it shed (0: never)"),
    ("ingress_shed_grace", "seconds a publisher stays that far ahead before its QoS 0 is shed"),
    ("socket_send_buffer", "SO_SNDBUF of client sockets in bytes (0: the kernel's autotuning)"),
    ("max_inflight", "unacknowledged QoS 1/2 messages per client"),
    ("receive_maximum", "QoS 2 messages a client may have unacknowledged towards the broker"),
    ("max_packet_size", "largest accepted packet in bytes"),
    ("topic_alias_maximum", "topic aliases accepted from v5 clients (0 disables)"),
    ("server_keep_alive", "keep-alive imposed on v5 clients (seconds)"),
    ("max_session_expiry", "cap on session expiry intervals (seconds)"),
    ("sys_interval", "seconds between $SYS statistics (0 disables)"),
    ("content_engine", "content filter engine (a name of content.ENGINES)"),
    ("content_batch_min", "selectors from which a batch engine matches one read's PUBLISHes at once"),
    ("maximum_qos", "highest QoS granted"),
    ("max_topic_levels", "levels of a topic name or filter (default 201: 200 '/', as mosquitto)"),
    ("metrics_listen", "HOST:PORT of the Prometheus endpoint /metrics (default off)"),
    ("listen_backlog", "listen backlog of the listening sockets (capped by net.core.somaxconn)"),
    ("connect_timeout", "seconds a new connection may take to send CONNECT (default 30)"),
    ("shared_subscription_strategy", "which member of a shared group gets a message (default round_robin)"),
    ("shared_subscription_seed", "seed of the random shared subscription strategy"),
    ("proxy_header_timeout", "seconds a proxy_protocol listener waits for the PROXY header"),
]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``siftmq`` parser with every command, or with ``command="serve"`` the ``serve``
    command alone: what ``main`` builds for ``siftmq serve``, whose process then never imports
    the other commands' modules (``pub``/``sub``, ``ctl``, ``backup``, ``passwd`` and the
    plugins' commands: about 1 MB of an idle broker, issue 42 item 1). O(options)."""
    parser = Parser(prog="siftmq", description="siftmq: an MQTT broker that routes by topic and by content.")
    parser.add_argument(
        "--version", action="store_true", help="print the version, compiled modules and extras, and exit"
    )
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error")
    sub = cast(Subparsers, parser.add_subparsers(dest="command"))
    serve = sub.add_parser("serve", help="run the MQTT broker", description=_serve.__doc__)
    serve.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", default=None, help="TCP port (default 1883; 0 picks one)")
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
    loops = serve.add_mutually_exclusive_group()
    loops.add_argument(
        "--uvloop",
        action="store_true",
        help="use uvloop (default with a store, a plugin's hooks or TLS; a light broker: asyncio's)",
    )
    loops.add_argument("--no-uvloop", action="store_true", help="use the default asyncio event loop")
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
    for name, text in _OPTIONS:  # parsed with the field's Option in _serve (one message for every source)
        serve.add_argument("--" + name.replace("_", "-"), default=None, help=text)
    serve.add_argument(
        "--shared-subscription-group-strategy",
        action="append",
        default=None,
        metavar="GROUP=STRATEGY",
        help="the strategy of one shared group (repeatable; overrides --shared-subscription-strategy)",
    )
    _add_security_options(serve)
    plugins = load_plugins()
    for plugin in plugins:
        plugin.add_serve_options(serve)
    serve.set_defaults(func=_serve, plugins=plugins)
    if command == "serve":
        _everywhere(parser)
        return parser
    from broker._passwd_cli import register as register_passwd

    register_passwd(sub)
    from broker._client_cli import register as register_clients

    register_clients(sub)
    from broker._backup_cli import register as register_backup

    register_backup(sub)
    from broker._ctl_cli import register as register_ctl

    register_ctl(sub)
    from broker._reload import register as register_reload

    register_reload(sub)
    version = sub.add_parser(
        "version", help="version, compiled hot-path modules, installed extras", description=_version.__doc__
    )
    version.set_defaults(func=_version)
    for plugin in plugins:
        plugin.add_commands(sub)
    _everywhere(parser)
    return parser


def _everywhere(parser: argparse.ArgumentParser, prog: str = "siftmq") -> None:
    """Every (sub-)command: ``--debug`` (also after the command's name) and its name in
    ``args.prog`` (what ``main`` prefixes its messages with). O(commands)."""
    parser.set_defaults(prog=prog)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if "--debug" not in sub._option_string_actions:
                    sub.add_argument(
                        "--debug",
                        action="store_true",
                        default=argparse.SUPPRESS,
                        help="print the traceback of an error (also: log level DEBUG)",
                    )
                _everywhere(sub, sub.prog)


def _add_security_options(serve: argparse.ArgumentParser) -> None:
    g = serve.add_argument_group("listeners, TLS and authentication (docs/security.md)")
    g.add_argument("--tls-port", default=None, help="also serve MQTT over TLS on this port")
    g.add_argument("--ws-port", default=None, help="also serve MQTT over WebSocket on this port")
    g.add_argument("--wss-port", default=None, help="also serve MQTT over WebSocket + TLS here")
    g.add_argument("--ws-path", default=None, help="HTTP path of the WebSocket listeners (default /mqtt)")
    g.add_argument("--tls-cert", default=None, help="server certificate chain (PEM) of the TLS listeners")
    g.add_argument("--tls-key", default=None, help="private key (PEM) of --tls-cert")
    g.add_argument("--tls-ca", default=None, help="CA certificates (PEM) that verify client certificates")
    g.add_argument("--tls-crl", default=None, help="certificate revocation list (PEM) of --tls-ca's CA")
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
    g.add_argument("--max-connections", default=None, help="open connections (0 = unlimited)")
    g.add_argument(
        "--connection-rate",
        default=None,
        help="new connections per second per IP (0 = unlimited)",
    )
    g.add_argument("--connection-burst", default=None, help="connections a source IP may open at once")


def _with_listeners(cfg: BrokerConfig, args: argparse.Namespace) -> BrokerConfig:
    """``cfg`` with the listeners the flags ask for (unchanged when they ask for none)."""
    from broker._config import Listener, option_of

    port_option = option_of(Listener, "port")
    flags = [
        ("tcp", "--tls-port", args.tls_port, True),
        ("ws", "--ws-port", args.ws_port, False),
        ("ws", "--wss-port", args.wss_port, True),
    ]
    extra = [
        (kind, port_option.parse(flag, text), tls) for kind, flag, text, tls in flags if text is not None
    ]
    touched = (
        args.tls_cert,
        args.tls_ca,
        args.tls_crl,
        args.require_client_cert,
        args.use_identity_as_username,
        args.ws_path,
    )
    if not extra and args.allow_anonymous is None and all(x is None for x in touched):
        return cfg
    if any(tls for _, _, tls in extra) and (args.tls_cert is None or args.tls_key is None):
        raise ValueError("--tls-port and --wss-port need --tls-cert and --tls-key")
    base = list(cfg.effective_listeners())
    tls = {"certfile": args.tls_cert, "keyfile": args.tls_key, "cafile": args.tls_ca, "crlfile": args.tls_crl}
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


#: keys of the ``[serve]`` table of the CLI itself (a typo is an error, as in ``[broker]``)
_SERVE_KEYS = frozenset(SERVE_OPTIONS)


def serve_schema(plugins: list[Plugin]) -> dict[str, Option]:
    """The ``[serve]`` keys: the CLI's and every plugin's (``serve_options``, else its
    ``serve_keys`` with any value), each with its :class:`~broker._config.Option`."""
    schema = dict(SERVE_OPTIONS)
    for plugin in plugins:
        declared: Mapping[str, Option] | None = getattr(plugin, "serve_options", None)
        if declared is None:
            declared = dict.fromkeys(plugin.serve_keys, Option(Kind.ANY))
        schema.update(declared)
    return schema


#: the top-level tables of the configuration file the broker reads itself (plugins add theirs:
#: ``config_tables``, e.g. uplink's ``bridges``)
CONFIG_TABLES = frozenset({"broker", "serve", "listeners", "quotas"})


def config_tables(plugins: list[Plugin]) -> frozenset[str]:
    """The top-level tables someone reads: :data:`CONFIG_TABLES` and each plugin's
    ``config_tables`` (an optional attribute: the tables it reads from ``--config`` itself)."""
    tables = set(CONFIG_TABLES)
    for plugin in plugins:
        tables |= set(getattr(plugin, "config_tables", ()))
    return frozenset(tables)


def unknown_tables(data: Mapping[str, Any], plugins: list[Plugin]) -> list[str]:
    """The top-level tables (``[x]``, ``[[x]]``) of a parsed configuration file that nobody
    reads: a misspelt ``[brokr]`` or ``[[bridge]]`` would otherwise be ignored in silence.
    Without a ``[broker]`` table, a table named like a ``[broker]`` option is that option
    (``shared_subscription_group_strategy``). O(top-level keys)."""
    from broker._config import BrokerConfig, is_table

    known = config_tables(plugins)
    fields = set() if "broker" in data else {f.name for f in dataclasses.fields(BrokerConfig)}
    out = []
    for key, value in data.items():
        name = key.replace("-", "_")
        if is_table(value) and name not in known and name not in fields:
            out.append(key)
    return out


def _load_config(path: Path, plugins: list[Plugin]) -> tuple[BrokerConfig, dict[str, Any]]:
    """The ``[broker]`` options and the ``[serve]`` table of ``path``, both checked against
    the schema (ValueError: one line naming the file, the key, the value, what is expected).
    A top-level table nobody reads is a warning, once per table (:func:`unknown_tables`); so
    is a top-level key next to a ``[broker]`` table (``[broker]`` is read, not the top level)."""
    from broker._config import check_table, config_from_toml, is_table, read_toml

    data = read_toml(path)
    cfg = config_from_toml(data, path)
    unknown = unknown_tables(data, plugins)
    if unknown:
        known = ", ".join(f"[{t}]" for t in sorted(config_tables(plugins)))
        for key in unknown:
            log.warning("%s: unknown table [%s] ignored (the tables read are %s)", path, key, known)
    if "broker" in data:  # then the keys before the first table are nobody's either
        tables = config_tables(plugins)
        for key, value in data.items():
            # (an empty or odd array of a table someone reads, "bridges = []", is theirs)
            if not is_table(value) and key.replace("-", "_") not in tables:
                log.warning("%s: top-level key %r ignored: with a [broker] table, put it there", path, key)
    table = data.get("serve", {})
    if not isinstance(table, dict):
        raise ValueError(f"{path}: [serve] must be a table")
    return cfg, check_table(table, serve_schema(plugins), "[serve]", str(path))


def _flag_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The ``BrokerConfig`` fields the flags set, each parsed with its Option."""
    from broker._config import BrokerConfig, option_of

    changes: dict[str, Any] = {}
    limits = ("max_connections", "connection_rate", "connection_burst")
    for name in ("host", "port", *(o[0] for o in _OPTIONS), *limits):
        text = getattr(args, name)
        if text is not None:
            changes[name] = option_of(BrokerConfig, name).parse("--" + name.replace("_", "-"), text)
    if args.partial_unsubscribe is not None:
        changes["partial_unsubscribe"] = args.partial_unsubscribe
    return changes


def _serve(args: argparse.Namespace) -> int:
    """Serve MQTT 3.1.1 and 5.0 over TCP until SIGINT/SIGTERM."""
    from broker._config import BrokerConfig

    plugins: list[Plugin] = args.plugins
    serve_opts: dict[str, Any] = {}
    cfg = BrokerConfig()
    held: HeldRecords = getattr(args, "held_records", None) or HeldRecords()
    try:
        if args.config is not None:
            root = logging.getLogger()
            root.addHandler(held)  # its warnings come out in the --log-format (replayed below)
            try:
                cfg, serve_opts = _load_config(args.config, plugins)
            finally:
                root.removeHandler(held)
        changes = _flag_changes(args)
        changes.update(_dashboard_options(args))
        data_dir = Path(args.data_dir or serve_opts.get("data_dir") or "siftmq-data")
        persistence = not args.no_persistence and serve_opts.get("persistence", True)
        changes.update(_data_files(cfg, data_dir, persistence))
        cfg = _with_listeners(dataclasses.replace(cfg, **changes), args)
        password_file = args.password_file or serve_opts.get("password_file")
        acl_file = args.acl_file or serve_opts.get("acl_file")
        _check_files(cfg, password_file=password_file, acl_file=acl_file)
        auth = _file_auth(password_file, acl_file)
        backends = _auth_backends(serve_opts)  # auth_http_* / auth_jwt_* (broker.authn)
        level = SERVE_OPTIONS["log_level"].parse(
            "--log-level", args.log_level or serve_opts.get("log_level") or "INFO"
        )
        log_format = SERVE_OPTIONS["log_format"].parse(
            "--log-format", args.log_format or serve_opts.get("log_format") or "text"
        )
        _plugin_flags(args, plugins)
    except OSError as exc:
        raise CommandError(_os_error(exc)) from exc
    except ValueError as exc:  # ConfigError and the records' rules across fields
        raise CommandError(str(exc)) from exc
    args.log_level = level  # main prints tracebacks at DEBUG
    if persistence and cfg.store_path is not None and cfg.store_path != ":memory:":
        _check_store(Path(cfg.store_path), data_dir if args.data_dir or "data_dir" in serve_opts else None)
    else:
        _check_directory(data_dir, "--data-dir")
    hooks = _plugin_hooks(plugins, ServeContext(args, serve_opts, data_dir), str(level), held)
    # no store, no bridge, no cluster, no uplink, no TLS listener: _use_uvloop
    light = not persistence and not hooks and not _serves_tls(cfg)
    configure_logging(str(level), LogFormat(str(log_format)))
    held.replay()  # the lines held while the command line was parsed and the plugins set up
    if cfg.metrics_listen is not None and not available(Extra.METRICS):  # the dashboard works
        log.warning(
            "/metrics answers 501: the 'metrics' extra is not installed (pip install 'siftmq[metrics]')"
        )
    _warn_shared(
        args.password_file or serve_opts.get("password_file"), args.acl_file or serve_opts.get("acl_file")
    )
    _raise_descriptors()
    hooks.extend(backends)  # after the plugins': the cluster authenticates its own links
    if auth is not None:
        hooks.append(auth)
    _log_build()
    if persistence and cfg.store_path is not None and cfg.store_path != ":memory:":
        private_dir(Path(cfg.store_path).parent)  # 0700 whatever the umask (broker/_files.py)
    pid_file = args.pid_file or (data_dir / "siftmq.pid" if persistence else None)
    reconfigure = _reconfigure(args, changes)
    try:
        run = _pick_runner(not _use_uvloop(args.uvloop, args.no_uvloop, light))
        return int(run(_run(cfg, hooks, auth is not None or bool(backends), pid_file, reconfigure)))
    except KeyboardInterrupt:
        return 0


def _auth_backends(serve_opts: Mapping[str, Any]) -> list[Hooks]:
    """The HTTP / JWT authentication hooks of the ``auth_*`` keys of ``[serve]``: broker.authn
    (with its ACL module) imported only when one is given (issue 42 item 1). O(keys)."""
    if not any(key.startswith("auth_") for key in serve_opts):
        return []
    from broker.authn import hooks_from_serve_options

    return hooks_from_serve_options(serve_opts)


def _plugin_flags(args: argparse.Namespace, plugins: list[Plugin]) -> None:
    """The plugins' flags of their ``[serve]`` keys (``--cluster-listen`` for
    ``cluster_listen``), parsed with the key's Option in place: a plugin finds them checked."""
    for plugin in plugins:
        for key, opt in (getattr(plugin, "serve_options", None) or {}).items():
            value = getattr(args, key, None)
            if isinstance(value, str):
                setattr(args, key, opt.parse("--" + key.replace("_", "-"), value))


def _plugin_hooks(plugins: list[Plugin], ctx: ServeContext, level: str, held: HeldRecords) -> list[Hooks]:
    """Every plugin's hooks, their set-up log held in ``held`` until the log is configured
    (dropped when the set-up fails, so that its error is the only line); a bad option is a
    CommandError (status 2), a missing extra ``MissingExtra``. What an older siftmq left
    readable by others in the data directory is tightened first (broker/_files.py)."""
    root = logging.getLogger()
    before = root.level
    root.addHandler(held)
    root.setLevel(level)
    hooks: list[Hooks] = []
    try:
        tighten_data_dir(ctx.data_dir)
        for plugin in plugins:
            hooks.extend(plugin.serve_hooks(ctx))
    except ValueError as exc:
        held.records.clear()
        raise CommandError(str(exc)) from exc
    except BaseException:
        held.records.clear()
        raise
    finally:
        root.removeHandler(held)
        root.setLevel(before)
    return hooks


def _os_error(exc: OSError) -> str:
    """One line for an OSError: the file it is about and the reason, without ``[Errno N]``."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


def _check_files(cfg: BrokerConfig, **files: str | None) -> None:
    """Each file the configuration names is a readable file (ValueError naming the option)."""
    named: list[tuple[str, str | None]] = list(files.items())
    for li in cfg.listeners:
        named += [("certfile", li.certfile), ("keyfile", li.keyfile), ("cafile", li.cafile)]
    for key, name in named:
        if name is None:
            continue
        path = Path(name)
        if not path.exists():
            raise ValueError(f"{key} {name}: no such file")
        if not path.is_file():
            raise ValueError(f"{key} {name}: not a file")
        if not os.access(path, os.R_OK):
            raise ValueError(f"{key} {name}: cannot read it (permission denied)")
    for li in cfg.listeners:
        _check_tls(li.certfile, li.keyfile, li.cafile)


def _check_tls(certfile: str | None, keyfile: str | None, cafile: str | None) -> None:
    """The PEM files of a TLS listener load (ValueError naming them otherwise), so that a bad
    certificate is a configuration error before anything starts, not a failed listener."""
    import ssl

    if certfile is None:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:
        what = "not a PEM certificate chain and its key"
        raise ValueError(f"certfile {certfile}, keyfile {keyfile}: {what}{_reason(exc)}") from exc
    if cafile is not None:
        try:
            context.load_verify_locations(cafile)
        except ssl.SSLError as exc:
            raise ValueError(f"cafile {cafile}: not PEM CA certificates{_reason(exc)}") from exc


def _reason(exc: Exception) -> str:
    """`` (REASON)`` of an ssl.SSLError that has a readable one (not OpenSSL's library name)."""
    reason = getattr(exc, "reason", None)
    return f" ({reason.replace('_', ' ').lower()})" if reason and reason != "PEM_LIB" else ""


def _check_directory(directory: Path, where: str) -> None:
    """``directory`` is one or can be made (CommandError naming ``where`` otherwise)."""
    if where == "--data-dir":
        where = f"--data-dir {directory}"
    if directory.exists() and not directory.is_dir():
        raise CommandError(f"{where}: {directory} is a file, not a directory")
    try:
        private_dir(directory)  # 0700 whatever the umask, its missing parents too (broker/_files.py)
    except OSError as exc:
        raise CommandError(f"{where}: cannot create {directory}: {exc.strerror or exc}") from exc


def _check_store(path: Path, data_dir: Path | None) -> None:
    """The store's directory exists or can be made, and a store already there is a database
    this process may write (CommandError: one line naming the file and what to do)."""
    where = f"--data-dir {data_dir}" if data_dir is not None else f"store {path}"
    directory = path.parent
    _check_directory(directory, where)
    if not path.exists():
        if not os.access(directory, os.W_OK | os.X_OK):
            raise CommandError(f"{where}: cannot write in {directory} (permission denied)")
        return
    if not path.is_file():
        raise CommandError(f"store {path}: not a file")
    if not os.access(path, os.R_OK | os.W_OK) or not os.access(directory, os.W_OK | os.X_OK):
        raise CommandError(
            f"store {path}: read-only (the broker writes it and its -wal file beside it): "
            "give the broker's user write access to the file and its directory",
            1,
        )
    import sqlite3  # with a store only (issue 42 item 1)

    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise CommandError(
            f"store {path}: {exc}: not a siftmq store (corrupt?); restore a backup "
            '(docs/operations.md, "Backup and restore") or move it away',
            1,
        ) from exc


def _data_files(cfg: BrokerConfig, data_dir: Path, persistence: bool) -> dict[str, Any]:
    """The store (``D/broker.db``) or, with ``--no-persistence``, the admin API's bans file
    (``D/bans.json``, docs/admin.md) as BrokerConfig changes."""
    if persistence and cfg.store_path is None:
        return {"store_path": str(data_dir / "broker.db")}
    if not persistence and cfg.bans_file is None:
        return {"bans_file": str(data_dir / "bans.json")}
    return {}


def _reconfigure(args: argparse.Namespace, changes: dict[str, Any]) -> Callable[[], BrokerConfig] | None:
    """What a SIGHUP applies (``broker._reload``): the ``--config`` file read again with the
    same flags over it (None without ``--config``: the files are re-read, no limits change)."""
    from broker._config import load_toml

    config_file: Path | None = args.config
    if config_file is None:
        return None

    def reconfigure() -> BrokerConfig:  # the schema's one-line ValueError, "FILE:3: ..." for TOML
        cfg = load_toml(config_file)
        return _with_listeners(dataclasses.replace(cfg, **changes), args)

    return reconfigure


def _dashboard_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--[no-]dashboard``, ``--dashboard-admin`` and ``--shared-subscription-group-strategy``
    (the repeatable flags) as BrokerConfig changes."""
    changes: dict[str, Any] = {}
    if args.shared_subscription_group_strategy:
        changes["shared_subscription_group_strategy"] = tuple(args.shared_subscription_group_strategy)
    if args.dashboard is not None:
        changes["dashboard"] = args.dashboard
    if args.dashboard_admin:
        changes["dashboard_admins"] = tuple(args.dashboard_admin)
    return changes


def _raise_descriptors() -> None:
    """The soft descriptor limit up to the hard limit: one descriptor per connection, and the
    soft limit of many systems (1,024) is far below the hard one (docs/operations-fleet.md).
    ``Broker.start`` logs the connection capacity that results."""
    from broker.net import raise_descriptor_limit

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


def _use_uvloop(uvloop: bool, no_uvloop: bool, light: bool) -> bool:
    """Whether ``serve`` runs on uvloop: ``--uvloop`` / ``--no-uvloop`` decide; without either,
    uvloop unless the broker is light (no store, no plugin's hooks and no TLS listener:
    ``--no-bridge --no-persistence``), which runs on asyncio's own loop. uvloop's module imports ``ssl``, so
    OpenSSL and uvloop cost the light broker 6.5-7 MB of its 31 (the 25 MB target, issue 42
    item 1), while its plain-TCP connections are served by its own epoll poller
    (``broker.net._lean``) on either loop, at the same messages per CPU second in the same
    runs (docs/performance.md "The light broker on uvloop"). O(1)."""
    if uvloop or no_uvloop:
        return uvloop
    return not light


def _serves_tls(cfg: BrokerConfig) -> bool:
    """Whether a listener of ``cfg`` speaks TLS (``mqtts`` / ``wss``): such a broker loads
    OpenSSL anyway, so uvloop costs it only its own 2.6 MB, and its TLS connections get
    0.92x (MQTT over TLS) / 0.83x (WSS) of uvloop's messages per second on asyncio's loop
    (``benchmarks/bench_listeners.py``, docs/performance.md). O(listeners)."""
    return any(listener.certfile is not None for listener in cfg.effective_listeners())


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
            _trim_heap()
            try:
                await stop.wait()
                log.info("signal received, stopping")
            finally:
                reloads.close()
    except _sqlite_errors() as exc:
        raise CommandError(f"store {cfg.store_path}: {exc}", 1) from exc
    except OSError as exc:
        if exc.filename is not None:  # names what failed (the metrics listener, a file)
            raise CommandError(_os_error(exc), 1) from exc
        urls = ", ".join(li.url for li in cfg.effective_listeners())
        raise CommandError(f"cannot listen on {urls}: {exc.strerror or exc}", 1) from exc
    return 0


def _trim_heap() -> None:
    """Give the C heap's free pages back to the system once the broker serves: start-up
    (parsing, imports, the plugins' set-up) leaves ~1 MB of them resident (issue 42 item 1,
    docs/performance.md "Footprint"). glibc's ``malloc_trim(0)`` through ctypes (~0.3 MB
    itself, less than it returns); nothing where it is missing. One call, a few ms."""
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (ImportError, OSError, AttributeError):  # not glibc
        return
    trim(0)


def _sqlite_errors() -> tuple[type[Exception], ...]:
    """``sqlite3.Error`` when sqlite3 is imported, else nothing: a command without a store
    never imports it (issue 42 item 1), and then no exception can be one. O(1)."""
    sqlite3 = sys.modules.get("sqlite3")
    return () if sqlite3 is None else (sqlite3.Error,)


def main(argv: list[str] | None = None) -> int:
    """Run ``siftmq`` with ``argv``; returns the exit status.

    Every command fails the same way: one line ``siftmq COMMAND: what is wrong`` on stderr and
    status 2 (usage, configuration: argparse's errors too, through :class:`Parser`) or 1 (a
    runtime failure); the traceback only with ``--debug`` or log level DEBUG.
    """
    held = HeldRecords()  # plugins' warnings wait for serve's --log-format (broker._logging)
    logging.getLogger().addHandler(held)
    try:
        parser = build_parser(_command(sys.argv[1:] if argv is None else argv))
        args, extra = parser.parse_known_args(argv)
    finally:
        logging.getLogger().removeHandler(held)
    args.held_records = held
    prog: str = getattr(args, "prog", "siftmq")
    try:
        if extra:  # said by the command they were given to (argparse names the top level)
            parser.exit(2, f"{prog}: unrecognized arguments: {' '.join(extra)} (see {prog} --help)\n")
        if args.version:
            return _version(args)
        if args.command is None:
            parser.error("a command is required (serve, pub, sub, passwd, version, ...)")
        del parser  # every command's options: garbage once parsed (serve runs for days)
        return _run_command(args, prog)
    finally:
        held.replay()  # if serve did not (another command, or it stopped before logging)


def _command(argv: list[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (the top level's
    options, ``--version`` and ``--debug``, take no value). O(len(argv))."""
    return next((a for a in argv if not a.startswith("-")), None)


def _run_command(args: argparse.Namespace, prog: str) -> int:
    """``args.func(args)``, its failure said in one line (:func:`main`)."""
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except CommandError as exc:
        return _fail(args, prog, str(exc), exc.status)
    except MissingExtra as exc:
        return _fail(args, prog, str(exc), 2)
    except ConfigError as exc:
        return _fail(args, prog, str(exc), 2)
    except OSError as exc:
        return _fail(args, prog, _os_error(exc), 1)
    except _sqlite_errors() as exc:
        return _fail(args, prog, f"database: {exc}", 1)
    except Exception as exc:  # a bug: still one line, the traceback with --debug
        text = f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)"
        return _fail(args, prog, text, 1)


def _fail(args: argparse.Namespace, prog: str, message: str, status: int) -> int:
    """Print ``PROG: MESSAGE`` (the traceback first with ``--debug``/DEBUG); ``status``."""
    if getattr(args, "debug", False) or str(getattr(args, "log_level", "")).upper() == "DEBUG":
        traceback.print_exc()
    print(f"{prog}: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
