"""Typed configuration of outbound bridges and its parser from ``[[bridges]]`` TOML tables.

The shape follows mosquitto's ``connection`` blocks (docs/bridging-out.md): a bridge has a
name, one remote address or a failover list of them (``url`` / ``urls``), credentials, a
client id, the MQTT protocol version towards the remote, keep-alive, clean start and session
expiry, TLS options, and topic rules.  A rule is mosquitto's ``topic`` line -- ``pattern``,
``direction`` (``out``, ``in``, ``both``), ``qos``, ``local_prefix``, ``remote_prefix`` -- plus
an optional content ``filter`` (the broker's selector language, ``content.compile``): only
payloads it matches cross.

:func:`parse_bridges` checks everything at load time and raises :class:`ValueError` naming the
path of the bad value, e.g. ``config.toml: bridges[0].topics[1].pattern: ...``; ``siftmq
serve`` prints it and exits with status 2.  Parsing is O(bridges x rules).
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import content
import topics

__all__ = ["BridgeConfig", "Direction", "Remote", "TopicRule", "parse_bridges", "public_url"]

_SCHEMES = {"mqtt": (False, False), "mqtts": (True, False), "ws": (False, True), "wss": (True, True)}
QUEUE_POLICIES = ("drop_newest", "drop_oldest", "pace")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class Direction(enum.Enum):
    """Which way a rule's messages cross: local -> remote, remote -> local, or both."""

    OUT = "out"
    IN = "in"
    BOTH = "both"

    @property
    def outbound(self) -> bool:
        return self is not Direction.IN

    @property
    def inbound(self) -> bool:
        return self is not Direction.OUT


def public_url(url: str) -> str:
    """``url`` without the ``user:password@`` part a remote's address may carry (O(len))."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL urlsplit takes (a bad IPv6 host): cut what looks like a user part
        return _USERINFO.sub("//", url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


_USERINFO = re.compile(r"//[^/?#]*@")


@dataclass(frozen=True, slots=True)
class Remote:
    """One remote address parsed from ``mqtt://``, ``mqtts://``, ``ws://`` or ``wss://`` URLs."""

    url: str
    host: str
    port: int
    tls: bool
    websocket: bool
    path: str = "/mqtt"

    @property
    def shown(self) -> str:
        """:attr:`url` without the ``user:password@`` it may carry: what log lines and ``$SYS``
        show (O(len))."""
        return public_url(self.url)

    @classmethod
    def parse(cls, url: str) -> Remote:
        """Parse a URL (ValueError on an unknown scheme or a missing host)."""
        parts = urlsplit(url)
        if parts.scheme not in _SCHEMES:
            raise ValueError(f"{public_url(url)!r}: the scheme must be mqtt://, mqtts://, ws:// or wss://")
        if not parts.hostname:
            raise ValueError(f"{public_url(url)!r}: no host")
        tls, ws = _SCHEMES[parts.scheme]
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"{public_url(url)!r}: bad port") from None
        if port is None:
            port = {(False, False): 1883, (True, False): 8883, (False, True): 80, (True, True): 443}[tls, ws]
        return cls(url, parts.hostname, port, tls, ws, parts.path or "/mqtt")


@dataclass(frozen=True, slots=True)
class TopicRule:
    """A ``topic`` line: messages on ``local_prefix + pattern`` locally are published on
    ``remote_prefix + pattern`` remotely (out) and the other way round (in)."""

    pattern: str
    direction: Direction = Direction.OUT
    qos: int = 1
    local_prefix: str = ""
    remote_prefix: str = ""
    #: a content selector (``content.compile``); None = every payload crosses
    filter: str | None = None

    def __post_init__(self) -> None:
        if self.qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, got {self.qos!r}")
        for what, prefix in (("local_prefix", self.local_prefix), ("remote_prefix", self.remote_prefix)):
            if "+" in prefix or "#" in prefix:
                raise ValueError(f"{what} {prefix!r} must not hold wildcards")
        try:
            topics.validate_filter(self.local_prefix + self.pattern)
            topics.validate_filter(self.remote_prefix + self.pattern)
        except topics.InvalidTopic as exc:
            raise ValueError(f"pattern {self.pattern!r}: {exc}") from None
        if self.filter is not None:
            try:
                content.compile(self.filter)
            except content.FilterSyntaxError as exc:
                raise ValueError(f"filter {self.filter!r}: {exc}") from None

    @property
    def local_filter(self) -> str:
        return self.local_prefix + self.pattern

    @property
    def remote_filter(self) -> str:
        return self.remote_prefix + self.pattern

    def to_remote(self, topic: str) -> str:
        """The remote topic of a local one matched by this rule (O(len(topic)))."""
        return self.remote_prefix + topic[len(self.local_prefix) :]

    def to_local(self, topic: str) -> str:
        """The local topic of a remote one matched by this rule (O(len(topic)))."""
        return self.local_prefix + topic[len(self.remote_prefix) :]


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    """One outbound bridge (a ``[[bridges]]`` table)."""

    name: str
    #: remote addresses in failover order (``url`` is the one-element form)
    urls: tuple[str, ...]
    topics: tuple[TopicRule, ...]
    username: str | None = None
    password: str | None = None
    #: the client id at the remote; default ``siftmq-<name>``
    client_id: str | None = None
    #: ``"5"`` or ``"3.1.1"``
    protocol: str = "5"
    keep_alive: int = 60
    #: false (default): the remote keeps our session (and the messages of ``in`` rules) while
    #: the link is down for ``session_expiry`` seconds (MQTT 5; 3.1.1: clean session off)
    clean_start: bool = False
    session_expiry: int = 3600
    #: TLS towards ``mqtts://`` / ``wss://`` remotes
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    insecure: bool = False
    #: jittered exponential back-off between connection attempts (seconds)
    backoff_min: float = 1.0
    backoff_max: float = 30.0
    #: seconds a connection attempt may take
    connect_timeout: float = 10.0
    #: QoS 1/2 messages in flight across the bridge each way; 0: the remote's Receive Maximum
    #: (MQTT 5), 20 to a 3.1.1 remote, and 100 announced for ``in`` messages
    max_inflight: int = 0
    #: the bound of the bridge's queue (its local session's, while the remote is away or
    #: slower than the local publishers): messages (0 = the broker's ``max_queued_messages``)
    #: and bytes of topics and payloads (0 = no bound in bytes)
    max_queued_messages: int = 0
    max_queued_bytes: int = 0
    #: at the bound: ``"drop_newest"`` (the queue keeps the oldest), ``"drop_oldest"`` (the
    #: queue keeps the most recent; every drop is counted: ``queue_dropped``) or ``"pace"``
    #: (the local publishers of messages for the bridge are paused until the queue drained to
    #: 3/4 of the bound: ``queue_paces``)
    queue_policy: str = "drop_newest"
    remotes: tuple[Remote, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"name {self.name!r}: 1-64 letters, digits, '_', '.', '-'")
        if not self.urls:
            raise ValueError("url: a remote address is needed (url or urls)")
        object.__setattr__(self, "remotes", tuple(Remote.parse(u) for u in self.urls))
        if self.protocol not in ("5", "3.1.1"):
            raise ValueError(f'protocol must be "5" or "3.1.1", got {self.protocol!r}')
        if not self.topics:
            raise ValueError("topics: at least one rule is needed")
        if not (0 < self.backoff_min <= self.backoff_max and math.isfinite(self.backoff_max)):
            raise ValueError("backoff_min must be > 0 and <= backoff_max (finite)")
        if not (self.connect_timeout > 0 and math.isfinite(self.connect_timeout)):
            raise ValueError(
                f"connect_timeout must be a finite number of seconds > 0, got {self.connect_timeout!r}"
            )
        if not (0 <= self.keep_alive <= 65535 and 0 <= self.max_inflight <= 65535):
            raise ValueError("keep_alive 0..65535 (seconds) and max_inflight 0..65535 expected")
        if not 0 <= self.session_expiry <= 0xFFFFFFFF:
            raise ValueError(f"session_expiry must be 0..4294967295 (seconds), got {self.session_expiry!r}")
        if self.max_queued_messages < 0 or self.max_queued_bytes < 0:
            raise ValueError("max_queued_messages and max_queued_bytes must be >= 0 (0: no bound of its own)")
        if self.keyfile is not None and self.certfile is None:
            raise ValueError("keyfile needs certfile (the client certificate it is the key of)")
        if self.protocol == "3.1.1" and self.password is not None and self.username is None:
            raise ValueError('password needs username with protocol "3.1.1" (MQTT 3.1.1 forbids one without)')
        if self.queue_policy not in QUEUE_POLICIES:
            raise ValueError(
                f'queue_policy must be "drop_newest", "drop_oldest" or "pace", got {self.queue_policy!r}'
            )

    @property
    def own_queue_bound(self) -> bool:
        """Whether the bridge's queue has a bound of its own (any of the three keys set)."""
        return bool(self.max_queued_messages or self.max_queued_bytes or self.queue_policy != "drop_newest")

    @property
    def remote_client_id(self) -> str:
        return self.client_id or f"siftmq-{self.name}"

    @property
    def local_client_id(self) -> str:
        """The id of the bridge's persistent session in the local broker."""
        return f"$uplink/{self.name}"


_RULE_KEYS = {"pattern", "direction", "qos", "local_prefix", "remote_prefix", "filter"}
_BRIDGE_KEYS = {
    "name",
    "url",
    "urls",
    "topics",
    "username",
    "password",
    "client_id",
    "protocol",
    "keep_alive",
    "clean_start",
    "session_expiry",
    "cafile",
    "certfile",
    "keyfile",
    "insecure",
    "backoff_min",
    "backoff_max",
    "connect_timeout",
    "max_inflight",
    "max_queued_messages",
    "max_queued_bytes",
    "queue_policy",
}
_TYPES: Mapping[str, type | tuple[type, ...]] = {
    "name": str,
    "url": str,
    "username": str,
    "password": str,
    "client_id": str,
    "protocol": str,
    "keep_alive": int,
    "clean_start": bool,
    "session_expiry": int,
    "cafile": str,
    "certfile": str,
    "keyfile": str,
    "insecure": bool,
    "backoff_min": (int, float),
    "backoff_max": (int, float),
    "connect_timeout": (int, float),
    "max_inflight": int,
    "max_queued_messages": int,
    "max_queued_bytes": int,
    "queue_policy": str,
    "pattern": str,
    "direction": str,
    "qos": int,
    "local_prefix": str,
    "remote_prefix": str,
    "filter": str,
}


def _check(where: str, key: str, value: object) -> None:
    want = _TYPES.get(key)
    if want is not None and (
        not isinstance(value, want)
        or (isinstance(value, bool) and bool not in (want if isinstance(want, tuple) else (want,)))
    ):
        raise ValueError(f"{where}.{key}: {type(value).__name__} {value!r} is not {_type_name(want)}")


def _type_name(want: type | tuple[type, ...]) -> str:
    return (
        "a number"
        if isinstance(want, tuple)
        else {"str": "a string", "int": "an integer", "bool": "a boolean"}[want.__name__]
    )


def _table(where: str, table: object, keys: set[str], required: str, example: str = "") -> dict[str, Any]:
    """``table`` as a TOML table of ``keys`` only, each of its type, with ``required``."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}: a table expected{example}")
    for key in table:
        if key not in keys:
            raise ValueError(f"{where}: unknown key {key!r}")
        _check(where, key, table[key])
    if required not in table:
        raise ValueError(f"{where}.{required}: missing")
    return table


def _rule(where: str, raw: object) -> TopicRule:
    table = _table(where, raw, _RULE_KEYS, "pattern", " ({pattern = ..., direction = ...})")
    try:
        direction = Direction(table.get("direction", "out"))
    except ValueError:
        raise ValueError(
            f'{where}.direction: "out", "in" or "both" expected, got {table["direction"]!r}'
        ) from None
    try:
        topics.validate_filter(table["pattern"])
    except topics.InvalidTopic as exc:
        raise ValueError(f"{where}.pattern: {table['pattern']!r}: {exc}") from None
    if "filter" in table:
        try:
            content.compile(table["filter"])
        except content.FilterSyntaxError as exc:
            raise ValueError(f"{where}.filter: {table['filter']!r}: {exc}") from None
    try:
        return TopicRule(
            table["pattern"],
            direction,
            table.get("qos", 1),
            table.get("local_prefix", ""),
            table.get("remote_prefix", ""),
            table.get("filter"),
        )
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _bridge(where: str, raw: object) -> BridgeConfig:
    table = _table(where, raw, _BRIDGE_KEYS, "name")
    urls: list[Any] = []
    if "url" in table:
        urls.append(table["url"])
    if "urls" in table:
        if not isinstance(table["urls"], list) or not all(isinstance(u, str) for u in table["urls"]):
            raise ValueError(f"{where}.urls: a list of URL strings expected")
        urls.extend(table["urls"])
    for i, u in enumerate(urls):
        try:
            Remote.parse(u)
        except ValueError as exc:
            raise ValueError(f"{where}.{'url' if 'url' in table and i == 0 else 'urls'}: {exc}") from None
    rules = table.get("topics")
    if not isinstance(rules, list) or not rules:
        raise ValueError(f"{where}.topics: a non-empty list of tables expected ([[bridges.topics]])")
    parsed = tuple(_rule(f"{where}.topics[{i}]", r) for i, r in enumerate(rules))
    opts = {k: v for k, v in table.items() if k not in ("url", "urls", "topics")}
    try:
        return BridgeConfig(urls=tuple(urls), topics=parsed, **opts)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def parse_bridges(value: object, source: str = "bridges") -> tuple[BridgeConfig, ...]:
    """The ``bridges`` array of a TOML document as typed configs (O(bridges x rules)).

    ``source`` prefixes error messages (the file name); raises ValueError naming the value.
    """
    if not isinstance(value, list):
        raise ValueError(f"{source}: bridges must be an array of tables ([[bridges]])")
    out = tuple(_bridge(f"{source}: bridges[{i}]", t) for i, t in enumerate(value))
    names = [b.name for b in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ValueError(f"{source}: bridges: the name {dup!r} is used twice")
    return out
