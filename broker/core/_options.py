"""What the core reads of the broker's options: :class:`CoreConfig`.

The options themselves, with their defaults, ranges, TOML keys and flags, are
``broker._config.BrokerConfig`` (app level: files and command lines); the core types its
``config`` with this protocol, which ``BrokerConfig`` satisfies, so it imports nothing of the
app level (docs/architecture.md, "Layers").  Attribute reads are what they were: ``BrokerConfig``
is an interpreted dataclass either way.  The network adapters (``broker.net``) read a few
options through ``Core.config`` too (marked).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.core._quota import QuotaRule

__all__ = ["CoreConfig"]


class CoreConfig(Protocol):
    """The options the core (and ``broker.net`` through it) reads; read-only."""

    @property
    def allow_anonymous(self) -> bool: ...

    @property
    def auth_backoff(self) -> float: ...

    @property
    def auth_backoff_max(self) -> float: ...

    @property
    def auth_failure_window(self) -> float: ...

    @property
    def auth_failures(self) -> int: ...

    @property
    def connect_timeout(self) -> float: ...

    @property
    def content_batch_min(self) -> int: ...

    @property
    def content_engine(self) -> str: ...

    @property
    def hung_consumer_time(self) -> float: ...

    @property
    def ingress_shed_bytes(self) -> int: ...  # broker.net

    @property
    def ingress_shed_grace(self) -> float: ...  # broker.net

    @property
    def listen_backlog(self) -> int: ...  # broker.net

    @property
    def max_inflight(self) -> int: ...

    @property
    def max_packet_size(self) -> int: ...

    @property
    def max_queued_messages(self) -> int: ...

    @property
    def max_retained_bytes(self) -> int: ...

    @property
    def max_retained_messages(self) -> int: ...

    @property
    def max_session_expiry(self) -> int: ...

    @property
    def max_subscriptions_per_client(self) -> int: ...

    @property
    def max_topic_levels(self) -> int: ...

    @property
    def maximum_qos(self) -> int: ...

    @property
    def partial_unsubscribe(self) -> bool: ...

    @property
    def proxy_header_timeout(self) -> float: ...  # broker.net

    @property
    def quotas(self) -> tuple[QuotaRule, ...]: ...

    @property
    def receive_maximum(self) -> int: ...

    @property
    def refused_filters(self) -> tuple[str, ...]: ...

    @property
    def retain_available(self) -> bool: ...

    @property
    def server_keep_alive(self) -> int | None: ...

    @property
    def shared_subscription_group_strategy(self) -> tuple[str, ...]: ...

    @property
    def shared_subscription_seed(self) -> int | None: ...

    @property
    def shared_subscription_strategy(self) -> str: ...

    @property
    def slow_consumer_grace(self) -> float: ...

    @property
    def slow_consumer_policy(self) -> str: ...

    @property
    def slow_consumer_rules(self) -> tuple[str, ...]: ...

    @property
    def socket_send_buffer(self) -> int: ...  # broker.net

    @property
    def sys_interval(self) -> float: ...

    @property
    def tick_interval(self) -> float: ...

    @property
    def topic_alias_maximum(self) -> int: ...

    @property
    def write_buffer_high(self) -> int: ...  # broker.net

    @property
    def high_water(self) -> int: ...
    @property
    def low_water(self) -> int: ...
    def slow_policy(self, client_id: str, listener_policy: str | None) -> str: ...
