"""Reload without restart (issue 38, item 4): ``await broker.reload()``, SIGHUP to ``siftmq
serve``, ``siftmq reload``.

What one reload reads again, all or nothing:

* the key or JWKS file of every :class:`broker.authn.JwtAuth` hook (``JwtAuth.reload``: the
  next token is verified with the new keys; a file that does not parse fails the reload);
* the password and ACL files of every :class:`broker.auth.FileAuth` hook
  (``FileAuth.reload``, which swaps both in only when both parse).  The ACL is asked on every
  PUBLISH and SUBSCRIBE and on every delivery (``"receive"``, ``Core.may_receive``), so a
  rule added or removed applies to the next operation of connections already open; a
  changed password applies at the next CONNECT (open connections stay: they authenticated);
* the certificate, key and CA files of every TLS listener (MQTT over TLS, WSS): new
  contexts are built and, once all are read, replace the old ones for the next handshakes
  (``broker.net._listeners.prepare_tls_reload``); open TLS connections keep theirs;
* the limits of :data:`LIVE_FIELDS`, when a new :class:`~broker.BrokerConfig` is given
  (``siftmq serve`` reads its ``--config`` file again and applies the flags over it).  The
  other fields need a restart: a reload that finds them changed keeps the old values and
  names them in its log line;
* whatever a hook of a package above the broker reloads in two steps (:class:`Reloadable`,
  found by its method ``prepare_reload``: the outbound bridges' ``uplink.Uplink`` reads the
  ``[[bridges]]`` tables again, starts the new bridges, stops the removed ones and restarts the
  changed ones).  ``prepare_reload`` reads and checks and changes nothing (a ``ValueError``
  fails the whole reload); the :class:`PreparedReload` it returns is applied once everything
  else is, and says what it changed.

The order makes it atomic: TLS contexts are built first (nothing swapped), then the hooks'
two-step reloads are prepared (nothing swapped), then the auth files are re-read (swapped by
``FileAuth.reload`` only when both parse; with several hooks a failure after the first would
leave it swapped, so hooks are reloaded last of the checks), then the TLS contexts, the limits
and the prepared reloads go in.  A failure keeps every old setting, logs ONE
error line naming the file and line (``reload: /etc/siftmq/acl.conf:7: ...``) and counts
``$SYS/broker/reloads/failed``; a success logs one info line of what changed and counts
``$SYS/broker/reloads/done`` (``/metrics``: ``siftmq_reloads_total{reason="done"|"failed"}``).
A prepared reload that fails while applying (it raises, or names what it could not apply in
``failed``: one bridge of several) comes after everything else went in: that reload applies
what it can, the other hooks' too, and is a failure (one error line naming it and what was
applied, counted failed, ``ReloadResult.ok`` false); ``Broker.reload`` does not raise, the
broker serves on and the next reload tries again.

``siftmq serve`` writes its process id to a pid file (``--pid-file``; by default
``<data-dir>/siftmq.pid`` when persistence is on) and reloads on SIGHUP; ``siftmq reload``
sends that SIGHUP (``--pid PID``, ``--pid-file PATH`` or ``--data-dir DIR``).

Cost: a reload is O(size of the files + listeners + config fields), on the event loop
(the files are small), plus what the prepared hooks do (a bridge stopped or started: its
connections); nothing is added to the PUBLISH path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import inspect
import logging
import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from broker._files import private_dir, write_private
from broker._logging import fields
from broker.net import prepare_tls_reload

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from broker._broker import Broker
    from broker._config import BrokerConfig
    from broker.auth import FileAuth
    from broker.authn import JwtAuth
    from broker.net import TlsReload

__all__ = [
    "LIVE_FIELDS",
    "PID_FILE_NAME",
    "PreparedReload",
    "ReloadCounters",
    "ReloadResult",
    "Reloadable",
    "SighupReloads",
    "read_pid_file",
    "register",
    "reload_broker",
    "remove_pid_file",
    "write_pid_file",
]

log = logging.getLogger("broker")

#: ``BrokerConfig`` fields a reload changes on the running broker, and from when they apply.
#: Any other changed field needs a restart (docs/operations.md, "Reload").
LIVE_FIELDS: dict[str, str] = {
    "max_inflight": "new connections",
    "max_packet_size": "new connections",
    "connect_timeout": "new connections",
    "socket_send_buffer": "new connections",
    "max_session_expiry": "next CONNECT",
    "allow_anonymous": "next CONNECT",
    "slow_consumer_policy": "new connections",
    "slow_consumer_rules": "next CONNECT",
    "max_queued_messages": "at once",
    "queue_high_water": "at once",
    "queue_low_water": "at once",
    "slow_consumer_grace": "at once",
    "hung_consumer_time": "at once",
    "write_buffer_high": "at once",
    "ingress_shed_bytes": "at once",
    "ingress_shed_grace": "at once",
    "max_connections": "at once",
    "connection_rate": "at once",
    "connection_burst": "at once",
    "auth_failures": "at once",
    "auth_failure_window": "at once",
    "auth_backoff": "at once",
    "auth_backoff_max": "at once",
}

#: the pid file ``siftmq serve`` writes in its data directory
PID_FILE_NAME = "siftmq.pid"

# "PATH, line N: what" (broker._acl / broker._passwd errors) -> "PATH:N: what"
_WHERE = re.compile(r"^(?P<path>.*?), line (?P<line>\d+): ")


class PreparedReload(Protocol):
    """What a :class:`Reloadable` hook read and checked, to apply (:meth:`apply`).  It may
    also have a ``restart`` attribute: the items it found changed but cannot apply (named in
    ``ReloadResult.restart`` and the log line)."""

    async def apply(self) -> Sequence[str]:
        """Put it in place; the human-readable items it changed (for the log line).  Runs
        after everything else of the reload went in; it should not fail: it applies what it
        can and names what it could not in a ``failed`` attribute (``"bridge b: restarting
        failed: ..."``).  Either that or an exception it raises fails the reload *after* the
        rest went in (``ReloadResult.ok`` false, ``error`` naming it, ``changed`` what did go
        in; counted failed, one error line): ``Broker.reload`` does not raise it."""
        ...


@runtime_checkable
class Reloadable(Protocol):
    """A hook reloaded in two steps (duck-typed: a package above the broker, e.g.
    ``uplink.Uplink``, has the method without importing this module)."""

    def prepare_reload(self) -> PreparedReload | None:
        """Read and check what to reload, changing nothing: None when there is nothing to do;
        raise ``ValueError`` (or ``OSError``) to fail the whole reload."""
        ...


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """What one reload did: ``ok``; ``changed`` (human-readable items: files read, limits
    changed); ``restart`` (config fields that changed but need a restart, not applied);
    ``error`` (the failure, ``file:line: what``, when not ``ok``)."""

    ok: bool
    changed: tuple[str, ...] = ()
    restart: tuple[str, ...] = ()
    error: str | None = None


@dataclass(slots=True)
class ReloadCounters:
    """Reloads done and failed, for ``$SYS`` (``Core.sys_sources``) and ``/metrics``
    (``Core.metric_sources``)."""

    done: int = 0
    failed: int = 0

    def sys_values(self) -> dict[str, str]:
        return {"$SYS/broker/reloads/done": str(self.done), "$SYS/broker/reloads/failed": str(self.failed)}

    def metric_values(self) -> dict[str, dict[str, int]]:
        return {"reloads": {"done": self.done, "failed": self.failed}}


def _where(exc: BaseException) -> str:
    """The error as ``file:line: what`` (the parsers say ``file, line N: what``)."""
    text = str(exc)
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or text}"
    return _WHERE.sub(lambda m: f"{m['path']}:{m['line']}: ", text, count=1)


def _failed(counters: ReloadCounters, error: str) -> None:
    """A failed reload: counted, and its one error line (event ``reload.failed``)."""
    counters.failed += 1
    log.error("reload: %s (old settings kept)", error, extra=fields("reload.failed", reason=error))


def _same_kind(before: object, after: object) -> bool:
    """Whether ``after`` may replace ``before`` (the running value of a live field): the same
    type (an int for a float too).  ``BrokerConfig`` does not check the types of what a TOML
    file gives it, and a string where the broker computes with a number would break every new
    connection, not the reload."""
    if isinstance(before, bool) or isinstance(after, bool):
        return type(before) is type(after)
    if isinstance(before, float):
        return isinstance(after, int | float)
    return type(before) is type(after)


def _config_changes(old: BrokerConfig, new: BrokerConfig) -> tuple[dict[str, object], list[str]]:
    """The live fields that differ (name -> new value) and the others that differ (names);
    ValueError for a live field of the wrong type.  O(fields)."""
    live: dict[str, object] = {}
    restart: list[str] = []
    for f in dataclasses.fields(old):
        before, after = getattr(old, f.name), getattr(new, f.name)
        if before == after:
            continue
        if f.name in LIVE_FIELDS:
            if not _same_kind(before, after):
                raise ValueError(f"{f.name}: expected {type(before).__name__}, found {after!r}")
            live[f.name] = after
        else:
            restart.append(f.name)
    return live, restart


def _auth_summary(hook: FileAuth) -> list[str]:
    out: list[str] = []
    if hook.password_file is not None and hook.passwords is not None:
        out.append(f"password file {hook.password_file} ({len(hook.passwords.entries)} users)")
    if hook.acl_file is not None and hook.acl is not None:
        acl = hook.acl
        rules = len(acl.anonymous) + len(acl.patterns) + sum(len(r) for r in acl.users.values())
        out.append(f"ACL file {hook.acl_file} ({rules} rules)")
    return out


def _apply_config(broker: Broker, cfg: BrokerConfig) -> None:
    """Put ``cfg`` in place of the running config (only live fields differ). O(listeners)."""
    broker.config = cfg
    core = broker.core
    core.config = cfg
    core.high_water = cfg.high_water
    core.low_water = cfg.low_water
    backoff = (cfg.auth_failures, cfg.auth_failure_window, cfg.auth_backoff, cfg.auth_backoff_max)
    core.login_backoff.retune(*backoff)
    seen: set[int] = set()
    for o in (broker._listeners or []) + broker._extra:
        for a in o.acceptors:
            limits = a.limits
            if id(limits) in seen:
                continue
            seen.add(id(limits))
            limits.max_connections = cfg.max_connections
            limits.rate = cfg.connection_rate
            limits.burst = float(max(1, cfg.connection_burst))


def _apply_checked(
    broker: Broker, tls: TlsReload, final: BrokerConfig | None, live: dict[str, object]
) -> list[str]:
    """Swap in what ``reload_broker`` read and checked: the listeners' TLS contexts and the
    configuration's live fields; what changed. O(listeners + fields)."""
    changed = []
    tls.apply()
    if tls.contexts:
        changed.append(f"TLS files of {len(tls.contexts)} listener(s)")
    if final is not None:
        _apply_config(broker, final)
        changed += [f"{name}={value!r} ({LIVE_FIELDS[name]})" for name, value in live.items()]
    return changed


async def reload_broker(broker: Broker, config: BrokerConfig | None = None) -> ReloadResult:
    """Re-read the auth files and TLS files, and apply ``config``'s live fields (see the
    module docstring).  Never raises for a bad file: the result says what failed, the old
    settings stay, one error line is logged.  Nor for a hook whose prepared reload fails to
    apply (:meth:`PreparedReload.apply` raises, or names what it could not apply in its
    ``failed``): the rest stays applied, the other hooks' reloads are applied too, and the
    result is ``ok`` false with ``error`` naming the failure (counted failed, one error
    line)."""
    counters = broker.reload_counters
    try:
        tls = prepare_tls_reload(broker._listeners or [])
        live: dict[str, object] = {}
        restart: list[str] = []
        final = None
        if config is not None:
            live, restart = _config_changes(broker.config, config)
            # what needs a restart keeps its running value (validated here, before any swap)
            final = dataclasses.replace(config, **{name: getattr(broker.config, name) for name in restart})
        # the hooks' two-step reloads: read and checked now, applied last (nothing swapped yet)
        prepared = [(h, p) for h in broker.hooks if isinstance(h, Reloadable) and (p := h.prepare_reload())]
        changed: list[str] = []
        # broker.auth (hashlib, OpenSSL) is imported by whoever makes a FileAuth: not imported,
        # no hook is one (issue 42 item 1)
        auth = sys.modules.get("broker.auth")
        file_auth: type[FileAuth] | None = None if auth is None else auth.FileAuth
        # the same for broker.authn (imported when [serve] configures an auth_* backend)
        authn = sys.modules.get("broker.authn")
        jwt_auth: type[JwtAuth] | None = None if authn is None else authn.JwtAuth
        for hook in broker.hooks:
            if file_auth is not None and isinstance(hook, file_auth):
                read_again: Callable[[], object] = hook.reload
                done = read_again()
                if inspect.isawaitable(done):  # should FileAuth.reload become a coroutine
                    await done
                changed += _auth_summary(hook)
            elif jwt_auth is not None and isinstance(hook, jwt_auth):
                hook.reload()
                changed.append(f"JWT keys {hook.path} ({hook.keys()} key(s))")
    except Exception as exc:
        error = _where(exc) if isinstance(exc, OSError | ValueError) else f"{type(exc).__name__}: {exc}"
        _failed(counters, error)
        return ReloadResult(False, error=error)
    failed: list[str] = []
    try:
        changed += _apply_checked(broker, tls, final, live)
    except Exception as exc:  # the hooks' plans are still applied: the broker serves on
        failed.append(f"applying the configuration failed: {type(exc).__name__}: {exc}")
    for hook, plan in prepared:
        try:
            changed += await plan.apply()
        except Exception as exc:  # the rest is in place: the broker serves on, the reload failed
            failed.append(f"applying {type(hook).__name__}'s reload failed: {type(exc).__name__}: {exc}")
        else:
            failed += getattr(plan, "failed", ())  # what the hook could not apply (it went on)
        restart += getattr(plan, "restart", ())  # what the hook found changed but cannot apply
    if failed:
        error = "; ".join(failed)
        counters.failed += 1
        applied = "; ".join(changed) or "nothing else"
        if restart:
            applied += "; changed but not applied, need a restart: " + ", ".join(restart)
        log.error("reload: %s (applied: %s)", error, applied, extra=fields("reload.failed", reason=error))
        return ReloadResult(False, tuple(changed), tuple(restart), error)
    counters.done += 1
    text = "; ".join(changed) or "nothing to read"
    if restart:
        text += "; changed but not applied, need a restart: " + ", ".join(restart)
    log.info("reload: %s", text, extra=fields("reload.done"))
    return ReloadResult(True, tuple(changed), tuple(restart))


# ------------------------------------------------------------------ pid file, `siftmq reload`


def write_pid_file(path: Path) -> None:
    """Write this process's id to ``path``: atomically, mode 0600 in a 0700 directory when it
    makes one, as every file of the data directory (``broker._files``)."""
    private_dir(path.parent)
    write_private(path, f"{os.getpid()}\n".encode("ascii"))


def remove_pid_file(path: Path) -> None:
    """Remove ``path`` if it still names this process (a newer broker's is left alone)."""
    with contextlib.suppress(OSError, ValueError):
        if read_pid_file(path) == os.getpid():
            path.unlink()


def read_pid_file(path: Path) -> int:
    """The process id in ``path``; raises OSError or ValueError."""
    text = path.read_text(encoding="ascii").strip()
    pid = int(text)
    if pid <= 0:
        raise ValueError(f"{path}: not a process id: {text!r}")
    return pid


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``siftmq reload`` to the command line."""
    p = sub.add_parser(
        "reload",
        help="make a running 'siftmq serve' re-read its password, ACL and TLS files and limits",
        description=_reload_command.__doc__,
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--pid", type=_pid, default=None, help="process id of the broker")
    g.add_argument("--pid-file", type=Path, default=None, help="pid file written by 'siftmq serve'")
    g.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"the broker's data directory: its {PID_FILE_NAME} (default ./siftmq-data)",
    )
    p.set_defaults(func=_reload_command)


def _pid(text: str) -> int:
    """A ``--pid``: positive (0 and -1 would signal a process group or every process)."""
    pid = int(text)
    if pid <= 0:
        raise ValueError(text)
    return pid


_pid.__name__ = "process id"  # argparse: "invalid process id value: '-1'"


def _reload_command(args: argparse.Namespace) -> int:
    """Send SIGHUP to a running 'siftmq serve': it re-reads the password file, the ACL file,
    the TLS certificates and keys, and the live limits of its --config file (docs/operations.md,
    "Reload"). The outcome is in the broker's log and in $SYS/broker/reloads/."""
    pid: int = args.pid
    if pid is None:
        path: Path = args.pid_file or (args.data_dir or Path("siftmq-data")) / PID_FILE_NAME
        try:
            pid = read_pid_file(path)
            written = path.stat().st_mtime
        except (OSError, ValueError) as exc:
            print(f"siftmq reload: no broker pid: {exc}", file=sys.stderr)
            return 2
        started = _start_time(pid)
        if started is not None and started > written + 2:  # btime has whole seconds
            # the broker that wrote the file is gone and its pid went to a newer process,
            # which SIGHUP could end
            print(
                f"siftmq reload: process {pid} started after {path} was written (stale pid file?)",
                file=sys.stderr,
            )
            return 1
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        print(f"siftmq reload: no process {pid} (stale pid file?)", file=sys.stderr)
        return 1
    except PermissionError:
        print(f"siftmq reload: not allowed to signal process {pid}", file=sys.stderr)
        return 1
    print(f"siftmq reload: SIGHUP sent to {pid}")
    return 0


def _start_time(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), from ``/proc``; None where
    there is no ``/proc`` or no such process (Linux only)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text(encoding="ascii").splitlines()
            if line.startswith("btime ")
        )
        ticks = int(stat.rpartition(")")[2].split()[19])  # field 22, starttime
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class SighupReloads:
    """SIGHUP -> :meth:`Broker.reload` for ``siftmq serve``, and its pid file.

    :meth:`install` right away, before the broker starts (SIGHUP's default action ends the
    process, and a store restore can take a while: a ``systemctl reload`` then must not kill
    it; one arriving before :meth:`start` is done just after it); :meth:`start` once the
    broker serves (writes the pid file); :meth:`close` at stop (removes it; the handler stays,
    so a late SIGHUP during the graceful stop is ignored).  ``reconfigure`` returns the config
    to apply (the ``--config`` file read again) or raises (ValueError, OSError, ...), which
    fails that reload like a bad file.  Signals during a reload coalesce into one more.
    """

    def __init__(self, reconfigure: Callable[[], BrokerConfig] | None, pid_file: Path | None) -> None:
        self.reconfigure = reconfigure
        self.pid_file = pid_file
        self.wanted = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def install(self) -> None:
        with contextlib.suppress(NotImplementedError, AttributeError, RuntimeError):  # no SIGHUP
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.wanted.set)

    def start(self, broker: Broker) -> None:
        self.task = asyncio.create_task(self._serve(broker))
        if self.pid_file is not None:
            try:
                write_pid_file(self.pid_file)
            except OSError as exc:
                log.warning("cannot write the pid file (siftmq reload needs --pid then): %s", exc)
                self.pid_file = None

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None
        if self.pid_file is not None:
            remove_pid_file(self.pid_file)

    async def _serve(self, broker: Broker) -> None:
        while True:
            await self.wanted.wait()
            self.wanted.clear()
            config = None
            if self.reconfigure is not None:
                try:
                    config = self.reconfigure()
                except Exception as exc:
                    _failed(broker.reload_counters, _where(exc))
                    continue
            try:
                await broker.reload(config)
            except Exception as exc:  # applying failed: logged, and the next SIGHUP still reloads
                why = f"applying failed: {type(exc).__name__}: {exc}"
                log.error("reload: %s", why, extra=fields("reload.failed", reason=why))
                broker.reload_counters.failed += 1
