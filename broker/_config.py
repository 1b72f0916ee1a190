"""Broker configuration: one frozen record, built from keyword arguments, flags or TOML.

``BrokerConfig`` is what :class:`broker.Broker` and ``siftmq serve`` run with.  Every field
has an embedded default; :func:`load_toml` reads a ``[broker]`` table (or top-level keys)
from a TOML file with :mod:`tomllib` and refuses unknown keys, so a typo is an error and
not a silently ignored option.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BrokerConfig", "load_toml"]


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
    #: QoS 1/2 messages waiting per client (beyond the in-flight window) before the client
    #: is disconnected with QUOTA_EXCEEDED (online) or new messages are dropped (offline).
    max_queued_messages: int = 1000
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
    retain_available: bool = True
    #: bounded queue length of each in-process ``Broker.subscribe`` subscription.
    inprocess_queue_size: int = 10_000
    #: topic filters whose SUBSCRIBE is refused (0x80 Unspecified error), e.g.
    #: ``["test/nosubscribe"]`` for the Eclipse Paho interoperability suite.
    refused_filters: tuple[str, ...] = ()
    #: timer granularity (seconds) for keep-alive, will delay and expiry checks.
    tick_interval: float = 0.25

    def replace(self, **changes: Any) -> BrokerConfig:
        return dataclasses.replace(self, **changes)


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
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in _FIELDS:
            if isinstance(value, dict):  # another package's table at top level
                continue
            raise ValueError(f"{path}: unknown broker option {key!r}")
        changes[name] = tuple(value) if isinstance(value, list) else value
    return dataclasses.replace(base or BrokerConfig(), **changes)
