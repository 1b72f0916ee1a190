"""Broker configuration: one frozen record, built from keyword arguments, flags or TOML.

``BrokerConfig`` is what :class:`broker.Broker` and ``siftmq serve`` run with.  Every field
has an embedded default; :func:`load_toml` reads a ``[broker]`` table (or top-level keys)
from a TOML file with :mod:`tomllib` and refuses unknown keys, so a typo is an error and
not a silently ignored option.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import ipaddress
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from broker.core._quota import QuotaRule, parse_quotas

__all__ = ["SLOW_CONSUMER_POLICIES", "BrokerConfig", "Listener", "check_policy", "load_toml"]

#: what happens to a slow consumer (docs/broker.md, "Flow control")
SLOW_CONSUMER_POLICIES = ("pace", "drop", "disconnect")


def check_policy(policy: str) -> None:
    """Raise ValueError unless ``policy`` is one of :data:`SLOW_CONSUMER_POLICIES`."""
    if policy not in SLOW_CONSUMER_POLICIES:
        raise ValueError(
            f"slow-consumer policy must be one of {', '.join(SLOW_CONSUMER_POLICIES)}, not {policy!r}"
        )


@dataclass(frozen=True, slots=True)
class Listener:
    """One listening socket (docs/security.md, "Listeners").

    ``kind`` is ``"tcp"`` (MQTT over TCP) or ``"ws"`` (MQTT over WebSocket, subprotocol
    ``mqtt``, served on ``ws_path``).  ``certfile``/``keyfile`` turn TLS on (``mqtts``/``wss``);
    ``cafile`` verifies client certificates (required when ``require_client_cert``).
    ``allow_anonymous`` None means: clients without a user name are accepted only on a
    loopback listener (127.0.0.0/8, ::1, ``localhost``).  ``use_identity_as_username``: the
    verified client certificate's CN is the user name (docs/security.md, "TLS").
    """

    #: ``"tcp"``: MQTT over TCP; ``"ws"``: MQTT over WebSocket (subprotocol ``mqtt``).
    kind: Literal["tcp", "ws"] = "tcp"
    #: address to bind.
    host: str = "127.0.0.1"
    #: port to bind (0: one chosen by the OS).
    port: int = 1883
    #: server certificate chain (PEM): turns TLS on (``mqtts`` / ``wss``).
    certfile: str | None = None
    #: private key (PEM) of ``certfile``.
    keyfile: str | None = None
    #: CA certificates (PEM) that verify client certificates.
    cafile: str | None = None
    #: TLS clients must present a certificate that ``cafile`` verifies.
    require_client_cert: bool = False
    #: HTTP path of a WebSocket listener.
    ws_path: str = "/mqtt"
    #: clients without a user name: true (accepted), false (refused), unset = accepted on a
    #: loopback listener only.
    allow_anonymous: bool | None = None
    #: the client certificate's subject CN replaces the CONNECT user name (mosquitto's
    #: option of the same name); needs ``require_client_cert``.
    use_identity_as_username: bool = False
    #: slow-consumer policy of the clients of this listener (``pace``, ``drop``,
    #: ``disconnect``); None = the broker's ``slow_consumer_policy`` (docs/broker.md, "Flow
    #: control"). A matching ``slow_consumer_rules`` pattern still wins.
    slow_consumer_policy: str | None = None

    def __post_init__(self) -> None:
        if self.slow_consumer_policy is not None:
            check_policy(self.slow_consumer_policy)
        if self.kind not in ("tcp", "ws"):
            raise ValueError(f"listener kind must be 'tcp' or 'ws', not {self.kind!r}")
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("listener: certfile and keyfile go together")
        if self.certfile is None and (self.cafile is not None or self.require_client_cert):
            raise ValueError("listener: client certificates need TLS (certfile)")
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

    host: str = "127.0.0.1"
    port: int = 1883
    #: CONTRACT.md "Negative entries inside the MQTT broker"; False = pure MQTT UNSUBSCRIBE.
    partial_unsubscribe: bool = True
    #: name in ``content.ENGINES`` evaluating content filters (iccounting: the fastest correct
    #: engine in docs/performance-content.md at every measured point).
    content_engine: str = "iccounting"
    #: the PUBLISH packets of one read are content-matched as one batch when the engine is a
    #: batch engine (``batch_native``: rabased, hcem) and holds at least this many selectors
    #: (below it one ``match`` per message is as cheap; docs/performance-broker.md)
    content_batch_min: int = 64
    #: QoS 1/2 messages waiting per client (beyond the in-flight window); beyond it new
    #: messages are dropped and counted (policy ``disconnect``: the client is disconnected
    #: with QUOTA_EXCEEDED instead).
    max_queued_messages: int = 1000
    #: publish quotas per client (issue 39; docs/broker.md, "Quotas"): ``[[quotas]]`` tables
    quotas: tuple[QuotaRule, ...] = ()
    #: retained messages stored at most (0: no cap); a retained PUBLISH past it is refused (0x97)
    max_retained_messages: int = 0
    #: payload bytes of the retained messages at most (0: no cap); refused past it (0x97)
    max_retained_bytes: int = 0
    #: flow control (docs/broker.md, "Flow control"): a QoS 1/2 delivery that finds this many
    #: messages queued for a connected client pauses the publishing connection (its socket is
    #: no longer read, so its next PUBACK waits) until the queue is back at
    #: ``queue_low_water``; 0 = ``max_queued_messages // 4``.
    queue_high_water: int = 0
    #: see ``queue_high_water``; 0 = half of the high-water mark.
    queue_low_water: int = 0
    #: seconds a client may stay over its high-water mark before it is a *slow consumer*:
    #: its publishers are released and its policy applies.
    slow_consumer_grace: float = 2.0
    #: seconds a client over its high-water mark may go without its socket taking a byte
    #: (write-buffer progress, checked every ``tick_interval``) before it is a *hung*
    #: consumer: a slow consumer at once, without waiting for the grace time; 0 = off.
    hung_consumer_time: float = 0.25
    #: what happens to a slow consumer: ``drop`` (QoS 0 dropped, QoS 1/2 queued up to
    #: ``max_queued_messages`` then dropped; all counted), ``disconnect`` (DISCONNECT 0x97;
    #: a persistent session keeps queuing up to its limit), ``pace`` (never slow: its
    #: publishers wait for it however long it takes).
    slow_consumer_policy: str = "drop"
    #: per client id: ``"PATTERN=POLICY"`` (fnmatch pattern, first match wins) overriding the
    #: listener's and the broker's policy, e.g. ``("dashboard-*=pace", "legacy-*=disconnect")``.
    slow_consumer_rules: tuple[str, ...] = ()
    #: bytes buffered for a client's socket above which it counts as not reading (QoS 0 to it
    #: is dropped and counted, QoS 1/2 queued); reading resumes at a quarter of it. Bounds the
    #: QoS 0 delivery latency to a reader that cannot keep up.
    write_buffer_high: int = 64 * 1024
    #: ingress load shedding (docs/broker.md, "Flow control"): when a read of a publisher's
    #: socket finds more than this many bytes still waiting in the kernel behind it, for
    #: ``ingress_shed_grace`` seconds in a row, the QoS 0 PUBLISHes (not retained) of its
    #: reads but their newest eighth of this many bytes are dropped unread and counted until
    #: the backlog is below it; 0 = never.
    #: Bounds the latency of QoS 0 when publishers send faster than the broker can route.
    ingress_shed_bytes: int = 64 * 1024
    #: SO_SNDBUF of client sockets (bytes; Linux doubles it; 0 = the kernel's autotuning, up
    #: to several MB): bounds what waits in the kernel for a client that reads slower than we
    #: write, so that such a client counts as not reading (``write_buffer_high``) before
    #: seconds of QoS 0 pile up where the broker cannot drop them. Per connection throughput
    #: is at most about twice this per round trip (EMQX: ``tcp_options.sndbuf``).
    socket_send_buffer: int = 0
    ingress_shed_grace: float = 0.1
    #: QoS 1/2 messages sent and not yet acknowledged per client (also capped by the
    #: client's Receive Maximum).
    max_inflight: int = 20
    #: our Receive Maximum: QoS 2 PUBLISHes a client may have unacknowledged towards us.
    receive_maximum: int = 1024
    #: largest packet accepted (and announced in CONNACK to v5 clients).
    max_packet_size: int = 268_435_455
    #: topic aliases a v5 client may use towards us (0 disables).
    topic_alias_maximum: int = 65535
    #: if set, the largest keep-alive a v5 client gets: clients asking for more (or for none)
    #: receive this value as Server Keep Alive (3.1.1 clients keep theirs).
    server_keep_alive: int | None = None
    #: cap on Session Expiry Interval (seconds); 0xFFFFFFFF means "never expires".
    max_session_expiry: int = 0xFFFFFFFF
    #: seconds between ``$SYS/`` statistics publications (0 disables them).
    sys_interval: float = 10.0
    #: allow clients without credentials (hooks may still refuse them).
    allow_anonymous: bool = True
    #: maximum QoS granted and accepted.
    maximum_qos: int = 2
    #: retained messages are accepted (false: Retain Available 0 in CONNACK, and a retained
    #: PUBLISH or will is refused with 0x9A Retain not supported).
    retain_available: bool = True
    #: bounded queue length of each in-process ``Broker.subscribe`` subscription.
    inprocess_queue_size: int = 10_000
    #: subscriptions one client may hold; more are refused in SUBACK (v5 0x97 Quota
    #: exceeded, 3.1.1 0x80). Counted in ``$SYS/broker/subscriptions/refused/quota``.
    max_subscriptions_per_client: int = 10_000
    #: levels of a topic name or filter (``a/b/c`` has 3): a PUBLISH with more is a v5
    #: DISCONNECT 0x90 (3.1.1: close), a SUBSCRIBE filter with more is refused (0x8F / 0x80).
    #: 201 by default: at most 200 ``/`` separators, mosquitto's TOPIC_HIERARCHY_LIMIT.
    max_topic_levels: int = 201
    #: topic filters whose SUBSCRIBE is refused (0x80 Unspecified error), e.g.
    #: ``["test/nosubscribe"]`` for the Eclipse Paho interoperability suite.
    refused_filters: tuple[str, ...] = ()
    #: timer granularity (seconds) for keep-alive, will delay and expiry checks.
    tick_interval: float = 0.25
    #: SQLite database of the durable state (docs/persistence.md): None = no persistence,
    #: ``":memory:"`` = in-memory (tests), else a file path (``siftmq serve --data-dir D``
    #: uses ``D/broker.db``).
    store_path: str | None = None
    #: store operations queued for the writer thread above which the publishers that write
    #: are paused until the next commit (the store's queue stays bounded; docs/persistence.md)
    store_max_backlog: int = 100_000
    #: seconds the store's writer waits before a commit while deliveries to persisted
    #: sessions are pending, so that their PUBACKs cancel them first (docs/persistence.md)
    store_commit_delay: float = 0.002
    #: ``HOST:PORT`` of the HTTP listener of the Prometheus metrics (``/metrics``) and the
    #: dashboard (``/``), None = off (docs/broker.md, "Metrics", docs/dashboard.md; port 0
    #: picks a free one: ``Broker.metrics_port``)
    metrics_listen: str | None = None
    #: serve the live dashboard at ``/`` of the ``metrics_listen`` listener (docs/dashboard.md)
    dashboard: bool = True
    #: users of the password file who may use the dashboard (its admin role); with a password
    #: file, or on a listener that is not loopback, nobody else gets in (403)
    dashboard_admins: tuple[str, ...] = ()
    #: seconds between two points of the dashboard's server-side history (docs/dashboard.md)
    dashboard_history_interval: float = 5.0
    #: points of that history kept (a ring per series; 180 x 5 s = the last 15 minutes)
    dashboard_history_points: int = 180
    #: HTTP listener (``metrics_listen``): open connections at most, in all (docs/security.md,
    #: "HTTP listener"); beyond it the longest-waiting unauthenticated one is closed, or 503
    http_max_connections: int = 256
    #: HTTP connections without valid credentials yet (or with their first request incomplete)
    #: at most; a new one beyond closes the longest waiting: partial heads cannot lock out /metrics
    http_max_unauthenticated: int = 64
    #: dashboard event streams (``/api/events``) open at once; one more is answered 503
    http_max_streams: int = 32
    #: seconds an HTTP request (head and body) may take from its first byte (a new connection:
    #: from its accept); beyond it 408 and close (slowloris)
    http_request_timeout: float = 10.0
    #: seconds an HTTP keep-alive connection may stay idle between requests
    http_idle_timeout: float = 30.0
    #: the listening sockets; empty = one plain TCP listener on ``host``:``port``.
    listeners: tuple[Listener, ...] = ()
    #: open network connections across all listeners (0 = unlimited); beyond it CONNECT is
    #: refused (v5 0x97 Quota exceeded, 3.1.1 3 Server unavailable).
    max_connections: int = 0
    #: new connections per second per source IP (token bucket; 0 = unlimited); beyond it
    #: CONNECT is refused (v5 0x9F Connection rate exceeded, 3.1.1 3 Server unavailable).
    connection_rate: float = 0.0
    #: bucket size of ``connection_rate``: connections a source may open at once.
    connection_burst: int = 20
    #: listen backlog of the listening sockets: connections the kernel completes and holds
    #: until the broker accepts them (capped by ``net.core.somaxconn``; a connection storm
    #: beyond it waits for SYN retransmissions: docs/operations-fleet.md).
    listen_backlog: int = 4096
    #: seconds a new network connection may take to send its CONNECT; then it is closed and
    #: counted in ``$SYS/broker/connections/connect_timeouts``.
    connect_timeout: float = 30.0
    #: failed logins (an authenticate hook said no) from one source address within
    #: ``auth_failure_window`` seconds after which its CONNECTs with a user name or password
    #: are refused at once, unchecked, for ``auth_backoff`` seconds, doubling with each further
    #: back-off up to ``auth_backoff_max`` (docs/security.md, "Failed logins"; counted in
    #: ``$SYS/broker/connections/refused/auth_backoff``); 0 = no back-off.
    auth_failures: int = 5
    #: seconds in which ``auth_failures`` failed logins start a back-off.
    auth_failure_window: float = 60.0
    #: seconds of an address's first back-off (then doubled each time).
    auth_backoff: float = 1.0
    #: longest back-off, seconds; also how long an address must stay quiet to start again
    #: from ``auth_backoff``.
    auth_backoff_max: float = 300.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "quotas", parse_quotas(self.quotas))
        if self.max_retained_messages < 0 or self.max_retained_bytes < 0:
            raise ValueError("max_retained_messages and max_retained_bytes must be >= 0")
        check_policy(self.slow_consumer_policy)
        for rule in self.slow_consumer_rules:
            pattern, sep, policy = rule.rpartition("=")
            if not sep or not pattern:
                raise ValueError(f"slow_consumer_rules: {rule!r} is not PATTERN=POLICY")
            check_policy(policy)
        if self.queue_high_water < 0 or self.queue_low_water < 0:
            raise ValueError("queue_high_water and queue_low_water must be >= 0")
        if self.slow_consumer_grace < 0:
            raise ValueError("slow_consumer_grace must be >= 0")
        if self.hung_consumer_time < 0:
            raise ValueError("hung_consumer_time must be >= 0")
        if self.socket_send_buffer < 0:
            raise ValueError("socket_send_buffer must be >= 0")
        if self.ingress_shed_bytes < 0 or self.ingress_shed_grace < 0:
            raise ValueError("ingress_shed_bytes and ingress_shed_grace must be >= 0")
        if self.listen_backlog < 1:
            raise ValueError("listen_backlog must be >= 1")
        if self.connect_timeout <= 0:
            raise ValueError("connect_timeout must be > 0")
        if self.auth_failures < 0 or self.auth_failure_window <= 0:
            raise ValueError("auth_failures must be >= 0 and auth_failure_window > 0")
        if not 0 < self.auth_backoff <= self.auth_backoff_max:
            raise ValueError("auth_backoff must be > 0 and <= auth_backoff_max")
        if not 0 <= self.store_commit_delay <= 1:
            raise ValueError("store_commit_delay must be between 0 and 1 second")
        if self.dashboard_history_interval <= 0 or self.dashboard_history_points < 1:
            raise ValueError("dashboard_history_interval must be > 0 and dashboard_history_points >= 1")

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


def load_toml(path: str | Path, base: BrokerConfig | None = None) -> BrokerConfig:
    """Read options from a TOML file (``[broker]`` table or top-level keys, dashes allowed).

    Raises ValueError naming an unknown key.
    """
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    table = data.get("broker", data)
    if not isinstance(table, dict):
        raise ValueError(f"{path}: [broker] must be a table")
    changes: dict[str, Any] = {}
    if table is not data and "listeners" in data:  # [[listeners]] next to a [broker] table
        table = {**table, "listeners": data["listeners"]}
    if table is not data and "quotas" in data:  # [[quotas]] next to a [broker] table
        table = {**table, "quotas": data["quotas"]}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name == "listeners":
            changes[name] = _listeners(path, value)
            continue
        if name not in _FIELDS:
            if isinstance(value, dict):  # another package's table at top level
                continue
            raise ValueError(f"{path}: unknown broker option {key!r}")
        changes[name] = tuple(value) if isinstance(value, list) else value
    return dataclasses.replace(base or BrokerConfig(), **changes)


def _listeners(path: str | Path, value: Any) -> tuple[Listener, ...]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"{path}: listeners must be an array of tables ([[listeners]])")
    names = {f.name for f in dataclasses.fields(Listener)}
    out = []
    for i, table in enumerate(value):
        fields = {k.replace("-", "_"): v for k, v in table.items()}
        unknown = sorted(set(fields) - names)
        if unknown:
            raise ValueError(f"{path}: listener {i + 1}: unknown option {unknown[0]!r}")
        try:
            out.append(Listener(**fields))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: listener {i + 1}: {exc}") from None
    return tuple(out)
