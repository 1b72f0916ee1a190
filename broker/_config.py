"""Broker configuration: one frozen record, built from keyword arguments, flags or TOML, and the
one schema every option is checked against.

``BrokerConfig`` is what :class:`broker.Broker` and ``siftmq serve`` run with.  Every field
has an embedded default; :func:`load_toml` reads a ``[broker]`` table (or top-level keys)
from a TOML file with :mod:`tomllib` and refuses unknown keys, so a typo is an error and
not a silently ignored option.

**The schema.** Each field is declared once, with its :class:`Option` (type, range, allowed
values, unit)::

    max_inflight: int = option(20, Kind.INT, lo=1, hi=65535, unit="messages")

``__post_init__`` checks every field against its Option (O(fields), at construction only: the
hot path reads plain slots), so a bad value from any source -- a TOML key, a flag of ``siftmq
serve`` (:meth:`Option.parse`), a keyword argument of ``Broker(...)`` -- is the same
:class:`ConfigError` (a ValueError): ``FILE: key = value: expected WHAT``. The ``[serve]``
keys of the CLI are :data:`SERVE_OPTIONS`, a plugin declares its own as ``serve_options``
(name -> Option), and docs/config-reference.md is generated from all of them
(scripts/config_reference.py). Adding an option is one line here (and a flag in
``broker._cli._OPTIONS`` if it has one); the reference is then regenerated.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import ipaddress
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from broker.core import ACTIONS as QUOTA_ACTIONS
from broker.core import QuotaRule, Strategy, group_strategies, parse_quotas

__all__ = [
    "QUOTA_OPTIONS",
    "SERVE_OPTIONS",
    "SHARED_STRATEGIES",
    "SLOW_CONSUMER_POLICIES",
    "BrokerConfig",
    "ConfigError",
    "Kind",
    "Listener",
    "Option",
    "check_policy",
    "flag_type",
    "is_table",
    "load_toml",
    "option",
    "option_of",
    "read_toml",
    "shared_group_strategies",
    "split_hostport",
]

_T = TypeVar("_T")

#: what happens to a slow consumer (docs/broker.md, "Flow control")
SLOW_CONSUMER_POLICIES = ("pace", "drop", "disconnect")


def check_policy(policy: str) -> None:
    """Raise ValueError unless ``policy`` is one of :data:`SLOW_CONSUMER_POLICIES`."""
    if policy not in SLOW_CONSUMER_POLICIES:
        raise ValueError(
            f"slow-consumer policy must be one of {', '.join(SLOW_CONSUMER_POLICIES)}, not {policy!r}"
        )


#: the strategies of shared subscription groups (docs/broker.md, "Shared subscriptions"):
#: the values of ``broker.core._shared.Strategy``, their one home
SHARED_STRATEGIES = tuple(s.value for s in Strategy)


def shared_group_strategies(rules: tuple[str, ...]) -> dict[str, str]:
    """``("g1=sticky", ...)`` as ``{"g1": "sticky"}``; :class:`ConfigError` on a malformed
    rule (``broker.core._shared.group_strategies`` reads them). O(rules)."""
    out: dict[str, str] = {}
    for rule in rules:
        try:
            out.update((g, s.value) for g, s in group_strategies((rule,)).items())
        except ValueError:
            strategies = "|".join(SHARED_STRATEGIES)
            raise ConfigError("shared_subscription_group_strategy", rule, f"GROUP={strategies}") from None
    return out


class Kind(Enum):
    """The type of a configuration option (:class:`Option`); the value says what is expected."""

    INT = "an integer"
    FLOAT = "a number"
    BOOL = "true or false"
    STR = "a string"
    STRS = "a list of strings"
    CHOICE = "one of"
    HOSTPORT = "HOST:PORT"
    #: a list of HOST:PORT, or one string of them separated by commas
    HOSTPORTS = "HOST:PORT[,HOST:PORT...]"
    PATH = "a path"
    #: ``[[listeners]]`` tables (:class:`Listener` records)
    LISTENERS = "an array of [[listeners]] tables"
    #: ``[[quotas]]`` tables (``QuotaRule`` records, :func:`broker.core._quota.parse_quotas`)
    QUOTAS = "an array of [[quotas]] tables"
    #: anything (a plugin's key that declares no :class:`Option`)
    ANY = "any value"


class ConfigError(ValueError):
    """An option with a value its :class:`Option` refuses; ``str()`` is the one line to print:
    ``SOURCE: KEY = VALUE: expected WHAT`` (``SOURCE`` is the file, when there is one)."""

    def __init__(self, key: str, value: object, expected: str, source: str = "") -> None:
        self.key = key
        self.value = value
        self.expected = expected
        self.source = source
        where = f"{source}: " if source else ""
        if key.startswith("-"):  # a flag: as typed on the command line
            super().__init__(f"{where}{key} {value}: expected {expected}")
        else:
            super().__init__(f"{where}{key} = {toml_repr(value)}: expected {expected}")

    def located(self, source: str) -> ConfigError:
        """The same error said of ``source`` (a file name)."""
        return ConfigError(self.key, self.value, self.expected, source)


def toml_repr(value: object) -> str:
    """``value`` as it is written in TOML (strings in double quotes, booleans in lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_repr(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{...}"
    return repr(value)


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass(frozen=True, slots=True)
class Option:
    """One option of the configuration schema: its type, range, allowed values and unit.

    Every ``BrokerConfig`` / ``Listener`` field declares one (:func:`option`), the ``[serve]``
    keys of the CLI are :data:`SERVE_OPTIONS` and a plugin declares its ``[serve]`` keys as a
    mapping of them (``Plugin.serve_options``). :meth:`check` validates a value from any
    source (TOML, keyword argument), :meth:`parse` the text of a flag; both are O(1) but for
    lists (O(length)) and run at load, never on the hot path.
    """

    kind: Kind
    #: smallest allowed value (INT, FLOAT); ``lo_open``: the bound itself is not allowed
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    #: allowed values of a CHOICE (``choices_of``: computed when checked, e.g. content engines)
    choices: tuple[str, ...] = ()
    choices_of: Callable[[], Iterable[str]] | None = None
    #: None is allowed (the option is off / unset)
    optional: bool = False
    #: what the number counts ("seconds", "bytes", ...), said in the error and the reference
    unit: str = ""
    #: a CHOICE compares in upper case (``log_level``)
    upper: bool = False

    def allowed(self) -> tuple[str, ...]:
        return tuple(self.choices_of()) if self.choices_of is not None else self.choices

    @property
    def expected(self) -> str:
        """What a valid value is, in words (``an integer 1..65535``, ``one of a, b``)."""
        match self.kind:
            case Kind.CHOICE:
                text = "one of " + ", ".join(self.allowed())
            case Kind.INT | Kind.FLOAT:
                text = self.kind.value
                lo, hi = self.lo, self.hi
                if lo is not None and hi is not None and not self.lo_open:
                    text += f" {_number(lo)}..{_number(hi)}"
                elif lo is not None:
                    text += f" {'>' if self.lo_open else '>='} {_number(lo)}"
                    if hi is not None:
                        text += f" and <= {_number(hi)}"
                elif hi is not None:
                    text += f" <= {_number(hi)}"
            case Kind.HOSTPORT:
                text = "HOST:PORT with a port 0..65535"
            case Kind.HOSTPORTS:
                text = "HOST:PORT[,HOST:PORT...] with ports 0..65535"
            case _:
                text = self.kind.value
        if self.unit:
            text += f" ({self.unit})"
        return text

    def check(self, key: str, value: object) -> object:
        """``value`` normalized (an int for a FLOAT is a float, a list a tuple, a CHOICE with
        ``upper`` in upper case); raises :class:`ConfigError` naming ``key``."""
        if value is None and self.optional:
            return None
        ok, out = self._convert(value)
        if not ok:
            raise ConfigError(key, value, self.expected)
        return out

    def _convert(self, value: object) -> tuple[bool, object]:
        match self.kind:
            case Kind.INT | Kind.FLOAT:
                return self._convert_number(value)
            case Kind.BOOL:
                return isinstance(value, bool), value
            case Kind.STR:
                return isinstance(value, str), value
            case Kind.PATH:
                if isinstance(value, Path):
                    return True, str(value)
                return isinstance(value, str) and value != "", value
            case Kind.STRS | Kind.HOSTPORTS | Kind.LISTENERS | Kind.QUOTAS:
                return self._convert_list(value)
            case Kind.CHOICE:
                if not isinstance(value, str):
                    return False, None
                text = value.upper() if self.upper else value
                return text in self.allowed(), text
            case Kind.HOSTPORT:
                return isinstance(value, str) and split_hostport(value) is not None, value
            case Kind.ANY:
                return True, value
        return False, None  # pragma: no cover (every kind is matched)

    def _convert_list(self, value: object) -> tuple[bool, object]:
        items = [value] if isinstance(value, str) else value  # one string is a list of one
        if not isinstance(items, list | tuple):
            return False, None
        if self.kind is Kind.LISTENERS:
            return all(isinstance(v, Listener) for v in items), tuple(items)
        if self.kind is Kind.QUOTAS:  # rules, or tables as in TOML (a bad one: its own error)
            return True, parse_quotas(items)
        if not all(isinstance(v, str) for v in items):
            return False, None
        if self.kind is Kind.STRS:
            return True, tuple(items)
        parts = tuple(p.strip() for item in items for p in item.split(",") if p.strip())
        return all(split_hostport(p) is not None for p in parts), parts

    def _convert_number(self, value: object) -> tuple[bool, object]:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False, None
        if self.kind is Kind.INT:
            return isinstance(value, int) and self._in_range(value), value
        if math.isnan(value):
            return False, None
        return self._in_range(value), float(value)

    def _in_range(self, value: float) -> bool:
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or value <= self.hi

    def parse(self, flag: str, text: str) -> object:
        """The value of a flag's ``text`` (raises :class:`ConfigError` naming ``flag``)."""
        value: object = text
        try:
            match self.kind:
                case Kind.INT:
                    value = int(text, 0) if text.lower().startswith(("0x", "0o", "0b")) else int(text)
                case Kind.FLOAT:
                    value = float(text)
                case Kind.BOOL:
                    lowered = text.lower()
                    if lowered not in {"true", "false", "yes", "no", "on", "off", "1", "0"}:
                        raise ValueError(text)
                    value = lowered in {"true", "yes", "on", "1"}
                case Kind.STRS:
                    value = [t.strip() for t in text.split(",") if t.strip()]
        except ValueError:
            raise ConfigError(flag, text, self.expected) from None
        try:
            return self.check(flag, value)
        except ConfigError:
            raise ConfigError(flag, text, self.expected) from None


def flag_type(flag: str, opt: Option) -> Callable[[str], Any]:
    """An argparse ``type=`` for ``flag`` that parses with ``opt``: a bad value is argparse's
    usage error (status 2) saying ``FLAG VALUE: expected WHAT`` (``broker._cli.Parser``)."""

    def parse(text: str) -> Any:
        try:
            return opt.parse(flag, text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = opt.kind.name.lower()
    return parse


def split_hostport(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port), None when malformed or the port is
    not 0..65535."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 <= int(port) <= 65535:
        return None
    return host.strip("[]"), int(port)


def option(default: _T, kind: Kind, /, **limits: Any) -> _T:
    """A dataclass field with ``default`` whose :class:`Option` is ``Option(kind, **limits)``
    (kept in the field's metadata: one declaration per key)."""
    return dataclasses.field(default=default, metadata={"option": Option(kind, **limits)})


def option_of(cls: type[Any], name: str) -> Option:
    """The :class:`Option` of field ``name`` of a dataclass declared with :func:`option`."""
    return cast(Option, cls.__dataclass_fields__[name].metadata["option"])


def _check_fields(record: Any) -> None:
    """Validate (and normalize) every field of ``record`` against its :class:`Option`.
    O(fields); called by ``__post_init__`` of the frozen records."""
    for f in dataclasses.fields(record):
        opt: Option | None = f.metadata.get("option")
        if opt is None:
            continue
        value = getattr(record, f.name)
        out = opt.check(f.name, value)
        if out is not value:
            object.__setattr__(record, f.name, out)


def _engines() -> Iterable[str]:
    import content

    return sorted(content.ENGINES)


#: ports (listeners, the cluster's): 0 asks the OS for a free one
PORT = {"lo": 0, "hi": 65535}


@dataclass(frozen=True, slots=True)
class Listener:
    """One listening socket (docs/security.md, "Listeners").

    ``kind`` is ``"tcp"`` (MQTT over TCP) or ``"ws"`` (MQTT over WebSocket, subprotocol
    ``mqtt``, served on ``ws_path``).  ``certfile``/``keyfile`` turn TLS on (``mqtts``/``wss``);
    ``cafile`` verifies client certificates (required when ``require_client_cert``), and
    ``crlfile`` lists the revoked ones.
    ``allow_anonymous`` None means: clients without a user name are accepted only on a
    loopback listener (127.0.0.0/8, ::1, ``localhost``).  ``use_identity_as_username``: the
    verified client certificate's CN is the user name (docs/security.md, "TLS").
    """

    #: ``"tcp"``: MQTT over TCP; ``"ws"``: MQTT over WebSocket (subprotocol ``mqtt``).
    kind: Literal["tcp", "ws"] = option("tcp", Kind.CHOICE, choices=("tcp", "ws"))
    #: address to bind.
    host: str = option("127.0.0.1", Kind.STR)
    #: port to bind (0: one chosen by the OS).
    port: int = option(1883, Kind.INT, **PORT)
    #: server certificate chain (PEM): turns TLS on (``mqtts`` / ``wss``).
    certfile: str | None = option(None, Kind.PATH, optional=True)
    #: private key (PEM) of ``certfile``.
    keyfile: str | None = option(None, Kind.PATH, optional=True)
    #: CA certificates (PEM) that verify client certificates.
    cafile: str | None = option(None, Kind.PATH, optional=True)
    #: certificate revocation list(s) (PEM) of ``cafile``'s CA: a revoked client certificate is
    #: refused at the handshake (the leaf is checked; an expired CRL refuses every client
    #: certificate, as OpenSSL does: renew it before its next update). Needs ``cafile``.
    crlfile: str | None = option(None, Kind.PATH, optional=True)
    #: TLS clients must present a certificate that ``cafile`` verifies.
    require_client_cert: bool = option(False, Kind.BOOL)
    #: HTTP path of a WebSocket listener.
    ws_path: str = option("/mqtt", Kind.STR)
    #: clients without a user name: true (accepted), false (refused), unset = accepted on a
    #: loopback listener only.
    allow_anonymous: bool | None = option(None, Kind.BOOL, optional=True)
    #: the client certificate's subject CN replaces the CONNECT user name (mosquitto's
    #: option of the same name); needs ``require_client_cert``.
    use_identity_as_username: bool = option(False, Kind.BOOL)
    #: slow-consumer policy of the clients of this listener (``pace``, ``drop``,
    #: ``disconnect``); None = the broker's ``slow_consumer_policy`` (docs/broker.md, "Flow
    #: control"). A matching ``slow_consumer_rules`` pattern still wins.
    slow_consumer_policy: str | None = option(
        None, Kind.CHOICE, choices=SLOW_CONSUMER_POLICIES, optional=True
    )
    #: every connection starts with a PROXY protocol header (v1 or v2) from a load balancer,
    #: whose client address is then the connection's address everywhere (logs, dashboard,
    #: rate limits); a connection without one is closed. Trusts whoever can connect here:
    #: bind it where only the balancer reaches it (docs/security.md, "PROXY protocol").
    proxy_protocol: bool = option(False, Kind.BOOL)
    #: a name for this listener, by which ``[[quotas]]`` tables select its clients
    #: (``listener = "NAME"``; docs/broker.md, "Quotas"); unset: no name. Unique.
    name: str | None = option(None, Kind.STR, optional=True)
    #: serve cluster peer links only: a CONNECT whose client id is not ``$cluster/<node>``
    #: is refused (CONNACK 0x87 / 5), counted and logged; the cluster's token check refuses
    #: the rest (the cluster's link listener; docs/cluster.md, "Security").
    peers_only: bool = option(False, Kind.BOOL)

    def __post_init__(self) -> None:
        _check_fields(self)
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("listener: certfile and keyfile go together")
        if self.certfile is None and (self.cafile is not None or self.require_client_cert):
            raise ValueError("listener: client certificates need TLS (certfile)")
        if self.proxy_protocol and self.certfile is not None:
            raise ValueError(
                "listener: proxy_protocol on a TLS listener is not supported (terminate TLS at the "
                "load balancer and send PROXY on a plain listener)"
            )
        if self.crlfile is not None and self.cafile is None:
            raise ValueError("listener: crlfile needs cafile (the CA whose revocations it lists)")
        if self.require_client_cert and self.cafile is None:
            raise ValueError("listener: require_client_cert needs cafile")
        if self.use_identity_as_username and not self.require_client_cert:
            raise ValueError("listener: use_identity_as_username needs require_client_cert")
        if not self.ws_path.startswith("/"):
            raise ValueError(f"listener: ws_path must start with '/', not {self.ws_path!r}")

    @property
    def tls(self) -> bool:
        return self.certfile is not None

    @property
    def loopback(self) -> bool:
        """True if the listener binds a loopback address only."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def anonymous(self) -> bool:
        """Whether clients without a user name may connect here (None resolved)."""
        return self.loopback if self.allow_anonymous is None else self.allow_anonymous

    @property
    def url(self) -> str:
        scheme = {("tcp", False): "mqtt", ("tcp", True): "mqtts", ("ws", False): "ws", ("ws", True): "wss"}
        path = self.ws_path if self.kind == "ws" else ""
        return f"{scheme[self.kind, self.tls]}://{self.host}:{self.port}{path}"


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Options of one broker (see docs/broker.md, "Options")."""

    host: str = option("127.0.0.1", Kind.STR)
    port: int = option(1883, Kind.INT, **PORT)
    #: docs/reference.md "Negative entries inside the MQTT broker"; False = pure MQTT UNSUBSCRIBE.
    partial_unsubscribe: bool = option(True, Kind.BOOL)
    #: name in ``content.ENGINES`` evaluating content filters (iccounting: the fastest correct
    #: engine in docs/performance-content.md at every measured point).
    content_engine: str = option("iccounting", Kind.CHOICE, choices_of=_engines)
    #: the PUBLISH packets of one read are content-matched as one batch when the engine is a
    #: batch engine (``batch_native``: rabased, hcem) and holds at least this many selectors
    #: (below it one ``match`` per message is as cheap; docs/performance-broker.md)
    content_batch_min: int = option(64, Kind.INT, lo=0, unit="selectors")
    #: QoS 1/2 messages waiting per client (beyond the in-flight window); beyond it new
    #: messages are dropped and counted (policy ``disconnect``: the client is disconnected
    #: with QUOTA_EXCEEDED instead).
    max_queued_messages: int = option(1000, Kind.INT, lo=0, unit="messages")
    #: publish quotas per client (issue 39; docs/broker.md, "Quotas"): ``[[quotas]]`` tables
    #: (:class:`broker.core._quota.QuotaRule` records; keys below, "``[[quotas]]``")
    quotas: tuple[QuotaRule, ...] = option((), Kind.QUOTAS)
    #: retained messages stored at most (0: no cap); a retained PUBLISH past it is refused (0x97)
    max_retained_messages: int = option(0, Kind.INT, lo=0, unit="messages")
    #: payload bytes of the retained messages at most (0: no cap); refused past it (0x97)
    max_retained_bytes: int = option(0, Kind.INT, lo=0, unit="bytes")
    #: flow control (docs/broker.md, "Flow control"): a QoS 1/2 delivery that finds this many
    #: messages queued for a connected client pauses the publishing connection (its socket is
    #: no longer read, so its next PUBACK waits) until the queue is back at
    #: ``queue_low_water``; 0 = ``max_queued_messages // 4``.
    queue_high_water: int = option(0, Kind.INT, lo=0, unit="messages")
    #: see ``queue_high_water``; 0 = half of the high-water mark.
    queue_low_water: int = option(0, Kind.INT, lo=0, unit="messages")
    #: seconds a client may stay over its high-water mark before it is a *slow consumer*:
    #: its publishers are released and its policy applies.
    slow_consumer_grace: float = option(2.0, Kind.FLOAT, lo=0, unit="seconds")
    #: seconds a client over its high-water mark may go without its socket taking a byte
    #: (write-buffer progress, checked every ``tick_interval``) before it is a *hung*
    #: consumer: a slow consumer at once, without waiting for the grace time; 0 = off.
    hung_consumer_time: float = option(0.25, Kind.FLOAT, lo=0, unit="seconds")
    #: what happens to a slow consumer: ``drop`` (QoS 0 dropped, QoS 1/2 queued up to
    #: ``max_queued_messages`` then dropped; all counted), ``disconnect`` (DISCONNECT 0x97;
    #: a persistent session keeps queuing up to its limit), ``pace`` (never slow: its
    #: publishers wait for it however long it takes).
    slow_consumer_policy: str = option("drop", Kind.CHOICE, choices=SLOW_CONSUMER_POLICIES)
    #: per client id: ``"PATTERN=POLICY"`` (fnmatch pattern, first match wins) overriding the
    #: listener's and the broker's policy, e.g. ``("dashboard-*=pace", "legacy-*=disconnect")``.
    slow_consumer_rules: tuple[str, ...] = option((), Kind.STRS)
    #: bytes buffered for a client's socket above which it counts as not reading (QoS 0 to it
    #: is dropped and counted, QoS 1/2 queued); reading resumes at a quarter of it. Bounds the
    #: QoS 0 delivery latency to a reader that cannot keep up.
    write_buffer_high: int = option(64 * 1024, Kind.INT, lo=1, unit="bytes")
    #: ingress load shedding (docs/broker.md, "Flow control"): when a read of a publisher's
    #: socket finds more than this many bytes still waiting in the kernel behind it, for
    #: ``ingress_shed_grace`` seconds in a row, the QoS 0 PUBLISHes (not retained) of its
    #: reads but their newest eighth of this many bytes are dropped unread and counted until
    #: the backlog is below it; 0 = never.
    #: Bounds the latency of QoS 0 when publishers send faster than the broker can route.
    ingress_shed_bytes: int = option(64 * 1024, Kind.INT, lo=0, unit="bytes")
    #: SO_SNDBUF of client sockets (bytes; Linux doubles it; 0 = the kernel's autotuning, up
    #: to several MB): bounds what waits in the kernel for a client that reads slower than we
    #: write, so that such a client counts as not reading (``write_buffer_high``) before
    #: seconds of QoS 0 pile up where the broker cannot drop them. Per connection throughput
    #: is at most about twice this per round trip (EMQX: ``tcp_options.sndbuf``).
    socket_send_buffer: int = option(0, Kind.INT, lo=0, hi=2**31 - 1, unit="bytes")
    ingress_shed_grace: float = option(0.1, Kind.FLOAT, lo=0, unit="seconds")
    #: QoS 1/2 messages sent and not yet acknowledged per client (also capped by the
    #: client's Receive Maximum).
    max_inflight: int = option(20, Kind.INT, lo=1, hi=65535, unit="messages")
    #: our Receive Maximum: QoS 2 PUBLISHes a client may have unacknowledged towards us.
    receive_maximum: int = option(1024, Kind.INT, lo=1, hi=65535, unit="messages")
    #: largest packet accepted (and announced in CONNACK to v5 clients).
    max_packet_size: int = option(268_435_455, Kind.INT, lo=2, hi=268_435_455, unit="bytes")
    #: topic aliases a v5 client may use towards us (0 disables).
    topic_alias_maximum: int = option(65535, Kind.INT, lo=0, hi=65535)
    #: if set, the largest keep-alive a v5 client gets: clients asking for more (or for none)
    #: receive this value as Server Keep Alive (3.1.1 clients keep theirs).
    server_keep_alive: int | None = option(None, Kind.INT, lo=0, hi=65535, optional=True, unit="seconds")
    #: cap on Session Expiry Interval (seconds); 0xFFFFFFFF means "never expires".
    max_session_expiry: int = option(0xFFFFFFFF, Kind.INT, lo=0, hi=0xFFFFFFFF, unit="seconds")
    #: seconds between ``$SYS/`` statistics publications (0 disables them).
    sys_interval: float = option(10.0, Kind.FLOAT, lo=0, unit="seconds")
    #: allow clients without credentials (hooks may still refuse them).
    allow_anonymous: bool = option(True, Kind.BOOL)
    #: maximum QoS granted and accepted.
    maximum_qos: int = option(2, Kind.INT, lo=0, hi=2)
    #: retained messages are accepted (false: Retain Available 0 in CONNACK, and a retained
    #: PUBLISH or will is refused with 0x9A Retain not supported).
    retain_available: bool = option(True, Kind.BOOL)
    #: bounded queue length of each in-process ``Broker.subscribe`` subscription.
    inprocess_queue_size: int = option(10_000, Kind.INT, lo=0, unit="messages")
    #: subscriptions one client may hold; more are refused in SUBACK (v5 0x97 Quota
    #: exceeded, 3.1.1 0x80). Counted in ``$SYS/broker/subscriptions/refused/quota``.
    max_subscriptions_per_client: int = option(10_000, Kind.INT, lo=0)
    #: levels of a topic name or filter (``a/b/c`` has 3): a PUBLISH with more is a v5
    #: DISCONNECT 0x90 (3.1.1: close), a SUBSCRIBE filter with more is refused (0x8F / 0x80).
    #: 201 by default: at most 200 ``/`` separators, mosquitto's TOPIC_HIERARCHY_LIMIT.
    max_topic_levels: int = option(201, Kind.INT, lo=1)
    #: topic filters whose SUBSCRIBE is refused (0x80 Unspecified error), e.g.
    #: ``["test/nosubscribe"]`` for the Eclipse Paho interoperability suite.
    refused_filters: tuple[str, ...] = option((), Kind.STRS)
    #: timer granularity (seconds) for keep-alive, will delay and expiry checks.
    tick_interval: float = option(0.25, Kind.FLOAT, lo=0, lo_open=True, hi=60, unit="seconds")
    #: SQLite database of the durable state (docs/persistence.md): None = no persistence,
    #: ``":memory:"`` = in-memory (tests), else a file path (``siftmq serve --data-dir D``
    #: uses ``D/broker.db``).
    store_path: str | None = option(None, Kind.PATH, optional=True)
    #: JSON file of the admin API's bans when there is no store (docs/admin.md, "Bans";
    #: ``siftmq serve --no-persistence`` uses ``D/bans.json``); None and no store: in memory
    bans_file: str | None = option(None, Kind.PATH, optional=True)
    #: store operations queued for the writer thread above which the publishers that write
    #: are paused until the next commit (the store's queue stays bounded; docs/persistence.md)
    store_max_backlog: int = option(100_000, Kind.INT, lo=0, unit="operations")
    #: seconds the store's writer waits before a commit while deliveries to persisted
    #: sessions are pending, so that their PUBACKs cancel them first (docs/persistence.md)
    store_commit_delay: float = option(0.002, Kind.FLOAT, lo=0, hi=1, unit="seconds")
    #: ``HOST:PORT`` of the HTTP listener of the Prometheus metrics (``/metrics``) and the
    #: dashboard (``/``), None = off (docs/broker.md, "Metrics", docs/dashboard.md; port 0
    #: picks a free one: ``Broker.metrics_port``)
    metrics_listen: str | None = option(None, Kind.HOSTPORT, optional=True)
    #: serve the live dashboard at ``/`` of the ``metrics_listen`` listener (docs/dashboard.md)
    dashboard: bool = option(True, Kind.BOOL)
    #: users of the password file who may use the dashboard (its admin role); with a password
    #: file, or on a listener that is not loopback, nobody else gets in (403)
    dashboard_admins: tuple[str, ...] = option((), Kind.STRS)
    #: seconds between two points of the dashboard's server-side history (docs/dashboard.md)
    dashboard_history_interval: float = option(5.0, Kind.FLOAT, lo=0, lo_open=True, unit="seconds")
    #: points of that history kept (a ring per series; 180 x 5 s = the last 15 minutes)
    dashboard_history_points: int = option(180, Kind.INT, lo=1, unit="points")
    #: HTTP listener (``metrics_listen``): open connections at most, in all (docs/security.md,
    #: "HTTP listener"); beyond it the longest-waiting unauthenticated one is closed, or 503
    http_max_connections: int = option(256, Kind.INT, lo=1, unit="connections")
    #: HTTP connections without valid credentials yet (or with their first request incomplete)
    #: at most; a new one beyond closes the longest waiting: partial heads cannot lock out /metrics
    http_max_unauthenticated: int = option(64, Kind.INT, lo=1, unit="connections")
    #: dashboard event streams (``/api/events``) open at once; one more is answered 503
    http_max_streams: int = option(32, Kind.INT, lo=0, unit="streams")
    #: seconds an HTTP request (head and body) may take from its first byte (a new connection:
    #: from its accept); beyond it 408 and close (slowloris)
    http_request_timeout: float = option(10.0, Kind.FLOAT, lo=0, lo_open=True, unit="seconds")
    #: seconds an HTTP keep-alive connection may stay idle between requests
    http_idle_timeout: float = option(30.0, Kind.FLOAT, lo=0, lo_open=True, unit="seconds")
    #: the listening sockets; empty = one plain TCP listener on ``host``:``port``.
    listeners: tuple[Listener, ...] = option((), Kind.LISTENERS)
    #: open network connections across all listeners (0 = unlimited); beyond it CONNECT is
    #: refused (v5 0x97 Quota exceeded, 3.1.1 3 Server unavailable).
    max_connections: int = option(0, Kind.INT, lo=0, unit="connections")
    #: new connections per second per source IP (token bucket; 0 = unlimited); beyond it
    #: CONNECT is refused (v5 0x9F Connection rate exceeded, 3.1.1 3 Server unavailable).
    connection_rate: float = option(0.0, Kind.FLOAT, lo=0, unit="connections per second")
    #: bucket size of ``connection_rate``: connections a source may open at once.
    connection_burst: int = option(20, Kind.INT, lo=1, unit="connections")
    #: listen backlog of the listening sockets: connections the kernel completes and holds
    #: until the broker accepts them (capped by ``net.core.somaxconn``; a connection storm
    #: beyond it waits for SYN retransmissions: docs/operations-fleet.md).
    listen_backlog: int = option(4096, Kind.INT, lo=1, hi=2**31 - 1, unit="connections")
    #: seconds a new network connection may take to send its CONNECT; then it is closed and
    #: counted in ``$SYS/broker/connections/connect_timeouts``.
    connect_timeout: float = option(30.0, Kind.FLOAT, lo=0, lo_open=True, unit="seconds")
    #: failed logins (an authenticate hook said no) from one source address within
    #: ``auth_failure_window`` seconds after which its CONNECTs with a user name or password
    #: are refused at once, unchecked, for ``auth_backoff`` seconds, doubling with each further
    #: back-off up to ``auth_backoff_max`` (docs/security.md, "Failed logins"; counted in
    #: ``$SYS/broker/connections/refused/auth_backoff``); 0 = no back-off.
    auth_failures: int = option(5, Kind.INT, lo=0, unit="logins")
    #: seconds in which ``auth_failures`` failed logins start a back-off.
    auth_failure_window: float = option(60.0, Kind.FLOAT, lo=0, lo_open=True, unit="seconds")
    #: seconds of an address's first back-off (then doubled each time).
    auth_backoff: float = option(1.0, Kind.FLOAT, lo=0, lo_open=True, unit="seconds")
    #: longest back-off, seconds; also how long an address must stay quiet to start again
    #: from ``auth_backoff``.
    auth_backoff_max: float = option(300.0, Kind.FLOAT, lo=0, lo_open=True, unit="seconds")
    #: which member of a shared subscription group (``$share/<group>/<filter>``) gets a
    #: message: ``round_robin``, ``random``, ``sticky``, ``hash_clientid``, ``hash_topic`` or
    #: ``local`` (cluster: members on this node first); docs/broker.md, "Shared subscriptions".
    shared_subscription_strategy: str = option("round_robin", Kind.CHOICE, choices=SHARED_STRATEGIES)
    #: per group ``"GROUP=STRATEGY"``, overriding ``shared_subscription_strategy`` (in TOML also a
    #: table: ``shared_subscription_group_strategy = { g1 = "sticky" }``).
    shared_subscription_group_strategy: tuple[str, ...] = option((), Kind.STRS)
    #: seed of the ``random`` strategy (None: a fresh one per start; set it to reproduce).
    shared_subscription_seed: int | None = option(None, Kind.INT, optional=True)
    #: seconds a connection on a ``proxy_protocol`` listener may take to send its PROXY
    #: header; then it is closed and counted (``$SYS/broker/connections/refused/proxy_header``).
    proxy_header_timeout: float = option(5.0, Kind.FLOAT, lo=0, lo_open=True, unit="seconds")

    def __post_init__(self) -> None:
        _check_fields(self)
        shared_group_strategies(self.shared_subscription_group_strategy)
        for rule in self.slow_consumer_rules:
            pattern, sep, policy = rule.rpartition("=")
            if not sep or not pattern or policy not in SLOW_CONSUMER_POLICIES:
                policies = "|".join(SLOW_CONSUMER_POLICIES)
                raise ConfigError("slow_consumer_rules", rule, f"PATTERN={policies}")
        if self.auth_backoff > self.auth_backoff_max:  # each field's range: its Option
            raise ValueError("auth_backoff must be <= auth_backoff_max")
        names = [li.name for li in self.listeners if li.name is not None]
        if len(set(names)) != len(names):
            raise ValueError(f"listener names must be unique: {names}")
        for i, quota in enumerate(self.quotas):
            if quota.listener is not None and quota.listener not in names:
                raise ValueError(
                    f"quota {i + 1}: listener {quota.listener!r} is not the name of a [[listeners]] "
                    f"table (named: {', '.join(map(repr, names)) or 'none'})"
                )

    @property
    def high_water(self) -> int:
        """The effective ``queue_high_water`` (>= 1)."""
        return self.queue_high_water or max(1, self.max_queued_messages // 4)

    @property
    def low_water(self) -> int:
        """The effective ``queue_low_water`` (below the high-water mark)."""
        high = self.high_water
        return min(self.queue_low_water or high // 2, high - 1)

    def slow_policy(self, client_id: str, listener_policy: str | None) -> str:
        """The slow-consumer policy of ``client_id``: first matching rule, else the
        listener's, else the broker's (O(rules))."""
        for rule in self.slow_consumer_rules:
            pattern, _, policy = rule.rpartition("=")
            if fnmatch.fnmatchcase(client_id, pattern):
                return policy
        return listener_policy or self.slow_consumer_policy

    def replace(self, **changes: Any) -> BrokerConfig:
        return dataclasses.replace(self, **changes)

    def effective_listeners(self) -> tuple[Listener, ...]:
        """``listeners``, or the plain TCP listener on ``host``:``port`` when there are none."""
        return self.listeners or (Listener("tcp", self.host, self.port),)


_FIELDS = {f.name for f in dataclasses.fields(BrokerConfig)}

#: the ``[serve]`` keys of ``siftmq serve`` itself (plugins add theirs: ``Plugin.serve_options``)
SERVE_OPTIONS: Mapping[str, Option] = {
    "data_dir": Option(Kind.PATH),
    "log_level": Option(Kind.CHOICE, choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), upper=True),
    "log_format": Option(Kind.CHOICE, choices=("text", "json")),
    "persistence": Option(Kind.BOOL),
    "password_file": Option(Kind.PATH),
    "acl_file": Option(Kind.PATH),
    # the HTTP and JWT auth backends (broker.authn; meanings in authn.SERVE_KEY_HELP)
    "auth_http_url": Option(Kind.STR),
    "auth_http_authz_url": Option(Kind.STR),
    "auth_http_timeout": Option(Kind.FLOAT, lo=0, lo_open=True, unit="seconds"),
    "auth_http_retries": Option(Kind.INT, lo=0, hi=10),
    "auth_http_cache_ttl": Option(Kind.FLOAT, lo=0, unit="seconds"),
    "auth_http_negative_ttl": Option(Kind.FLOAT, lo=0, unit="seconds"),
    "auth_http_cache_size": Option(Kind.INT, lo=0),
    "auth_http_headers": Option(Kind.ANY),
    "auth_jwt_key_file": Option(Kind.PATH),
    "auth_jwt_jwks_file": Option(Kind.PATH),
    "auth_jwt_algorithms": Option(Kind.STRS),
    "auth_jwt_audience": Option(Kind.STR),
    "auth_jwt_issuer": Option(Kind.STR),
    "auth_jwt_username_claim": Option(Kind.STR),
    "auth_jwt_acl_claim": Option(Kind.STR),
    "auth_jwt_leeway": Option(Kind.FLOAT, lo=0, unit="seconds"),
    "auth_jwt_watch_interval": Option(Kind.FLOAT, lo=0, unit="seconds"),
}


def read_toml(path: str | Path) -> dict[str, Any]:
    """The tables of a TOML file; ValueError with one line: the file and what is wrong with
    it (missing, unreadable, a syntax error with its line and column)."""
    import tomllib  # with --config only (issue 42 item 1)

    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a TOML file") from None
    except PermissionError:
        raise ValueError(f"{path}: cannot read it (permission denied)") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:  # "... (at line 3, column 14)" -> "FILE:3: ... (column 14)"
        text = str(exc)
        where = re.search(r" \(at line (\d+), column (\d+)\)$", text)
        if where is None:
            raise ValueError(f"{path}: not valid TOML: {text}") from None
        text = text.removesuffix(where[0])
        raise ValueError(f"{path}:{where[1]}: {text} (column {where[2]}: not valid TOML)") from None


def check_table(
    table: Mapping[str, Any],
    schema: Mapping[str, Option],
    where: str,
    source: str,
    *,
    say_where: bool = False,
) -> dict[str, Any]:
    """The keys of ``table`` (dashes allowed) validated against ``schema``: name -> normalized
    value. Unknown keys and bad values raise :class:`ConfigError` / ValueError naming
    ``source`` and the key. O(keys)."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        opt = schema.get(name)
        if opt is None:
            import difflib

            close = difflib.get_close_matches(name, schema, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{source}: {where}: unknown option {key!r}{hint}")
        try:
            out[name] = opt.check(key, value)
        except ConfigError as exc:
            raise exc.located(f"{source}: {where}" if say_where else source) from None
    return out


def load_toml(path: str | Path, base: BrokerConfig | None = None) -> BrokerConfig:
    """Read options from a TOML file (``[broker]`` table or top-level keys, dashes allowed).

    Every key is checked against its :class:`Option` (type, range, allowed values); raises
    ValueError (:class:`ConfigError` for a bad value) with one line naming the file and the
    key.
    """
    data = read_toml(path)
    return config_from_toml(data, path, base)


def config_from_toml(
    data: Mapping[str, Any], path: str | Path, base: BrokerConfig | None = None
) -> BrokerConfig:
    """:func:`load_toml` of the already parsed ``data``."""
    source = str(path)
    table = data.get("broker", data)
    if not isinstance(table, dict):
        raise ValueError(f"{source}: [broker] must be a table")
    if table is not data and "listeners" in data:  # [[listeners]] next to a [broker] table
        table = {**table, "listeners": data["listeners"]}
    if table is not data and "quotas" in data:  # [[quotas]] next to a [broker] table
        table = {**table, "quotas": data["quotas"]}
    schema = {f.name: option_of(BrokerConfig, f.name) for f in dataclasses.fields(BrokerConfig)}
    plain: dict[str, Any] = {}
    changes: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name == "listeners":
            changes[name] = _listeners(source, value)
        elif name == "quotas":
            changes[name] = _quotas(source, value)
        elif name == "shared_subscription_group_strategy" and isinstance(value, dict):  # a table
            plain[key] = [f"{k}={v}" for k, v in value.items()]
        elif name not in _FIELDS and table is data and (is_table(value) or name == "bridges"):
            # another package's table(s) at top level ([x] or [[x]]; [[bridges]]: uplink/;
            # siftmq serve warns about those nobody reads); inside [broker] ([broker.x], a
            # dotted key x.y = 1) it is an unknown option like any other
            continue
        else:
            plain[key] = value
    changes.update(check_table(plain, schema, "[broker]", source))
    try:
        return dataclasses.replace(base or BrokerConfig(), **changes)
    except ConfigError as exc:  # a rule across fields or within a list
        raise exc.located(source) from None
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def is_table(value: object) -> bool:
    """A TOML table (``[x]``) or a non-empty array of tables (``[[x]]``). O(len(value))."""
    return isinstance(value, dict) or (
        isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)
    )


#: the keys of a ``[[quotas]]`` table (``QuotaRule``'s fields; docs/broker.md, "Quotas")
QUOTA_OPTIONS: Mapping[str, Option] = {
    "client_id": Option(Kind.STR, optional=True),
    "username": Option(Kind.STR, optional=True),
    "listener": Option(Kind.STR, optional=True),
    "messages_per_second": Option(Kind.FLOAT, lo=0, unit="messages per second"),
    "bytes_per_second": Option(Kind.FLOAT, lo=0, unit="payload bytes per second"),
    "burst_seconds": Option(Kind.FLOAT, lo=0, lo_open=True, unit="seconds"),
    "action": Option(Kind.CHOICE, choices=QUOTA_ACTIONS),
}


def _quotas(source: str, value: Any) -> tuple[QuotaRule, ...]:
    """``[[quotas]]`` tables: each key checked by :data:`QUOTA_OPTIONS` (a bad one is one line
    naming the file, the table and the key), then the rule itself (a rate is needed). O(keys)."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"{source}: quotas must be an array of tables ([[quotas]])")
    out = []
    for i, table in enumerate(value):
        fields = check_table(table, QUOTA_OPTIONS, f"quota {i + 1}", source, say_where=True)
        try:
            out.append(QuotaRule(**fields))
        except ValueError as exc:
            raise ValueError(f"{source}: quota {i + 1}: {exc}") from None
    return tuple(out)


def _listeners(source: str, value: Any) -> tuple[Listener, ...]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"{source}: listeners must be an array of tables ([[listeners]])")
    schema = {f.name: option_of(Listener, f.name) for f in dataclasses.fields(Listener)}
    out = []
    for i, table in enumerate(value):
        fields = check_table(table, schema, f"listener {i + 1}", source, say_where=True)
        try:
            out.append(Listener(**fields))
        except ValueError as exc:
            raise ValueError(f"{source}: listener {i + 1}: {str(exc).removeprefix('listener: ')}") from None
    return tuple(out)
