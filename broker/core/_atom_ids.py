"""Atoms identified across the nodes of a cluster, and composite events merged at most once
(issue 30; docs/composite.md "In a cluster: exactly-once merging", docs/cluster.md).

In a cluster the core of a composite subscription's CSSU merges atoms published at other
nodes; a core change (kill, restart, partition) can make an atom reach a core twice (a QoS 1
redelivery over a link, the backlog a restarted node's link sessions kept) or reach two cores.
Three pieces make merging idempotent:

* **Origin id.** A QoS 1/2 publication of a local client that is forwarded over a link gets a
  stamp where it was published, ``<node id prefix>.<boot>.<message number>`` (the node's ID,
  the process's start time in microseconds, the broker's per-process message counter: unique
  across the cluster and across restarts of the node), carried by the link copies as the MQTT 5
  user property :data:`ORIGIN_PROPERTY` (local subscribers never see it: the origin delivers
  the unstamped message to them and a receiving node strips the property before its own
  deliveries, :func:`split_origin`).  A publication that crosses no link is identified by its
  node's stamp computed on the spot: nobody else can see it.
* **Atom dedup at the core.** :class:`Recent` holds the origin ids a node has offered to its
  composite engine lately; an atom offered again is not offered (counted,
  ``$SYS/broker/composite/duplicate_atoms``).
* **Event dedup at the access node.** Every component of a composite event carries its origin
  id in the event's JSON (``"origin"``), so an event is identified by its expression and the
  sorted origin ids of its components (:func:`event_key`); an access node drops a remote
  event whose key it delivered lately (``$SYS/broker/composite/duplicate_events``).  Two
  cores that merge the same atoms into the same pairs (the doubled events of issue 30: an
  interim core, then the restarted core with its backlog) therefore deliver once.

Both sets are bounded by count (:data:`RECENT_MAX`, FIFO eviction, O(1) per operation): a
duplicate arriving after ``RECENT_MAX`` newer ids is not recognised.  The atom set is not
persisted (a restarted core gets its replicas' state, ``cluster._replicas``); the keys of
events delivered to durable (persisted sessions') subscriptions are, with those sessions
(``broker.core._composite_log``, ``DELIVERED`` rows and the snapshot), so a restarted access
node still drops an event a new core sends again.
"""

from __future__ import annotations

import time
from typing import Final

from broker.packets import Properties

__all__ = [
    "ORIGIN_PROPERTY",
    "RECENT_MAX",
    "RECENT_PER_ATOM",
    "Atom",
    "Recent",
    "boot_tag",
    "event_key",
    "origin_in",
    "split_origin",
]

#: the MQTT 5 user property carrying a publication's origin id over a link
ORIGIN_PROPERTY: Final = "siftmq-origin"
#: ids each bounded set keeps (per node: about 100 bytes each, 6.5 MB at most)
RECENT_MAX: Final = 65_536
#: origin ids kept per atom for a replica's synchronisation (cluster._placement)
RECENT_PER_ATOM: Final = 1_024


def boot_tag(node: str) -> str:
    """The prefix of this process's origin ids: 16 hex digits of the node ID and the start
    time (microseconds, base 36)."""
    return f"{node[:16]}.{_base36(time.time_ns() // 1000)}"


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = []
    while n:
        n, r = divmod(n, 36)
        out.append(digits[r])
    return "".join(reversed(out)) or "0"


class Atom:
    """What a node in a cluster offers its engine: the publication's topic, payload and QoS
    (``composite.ComponentLike``) and its origin id (in the event's JSON)."""

    __slots__ = ("origin", "payload", "qos", "topic")

    def __init__(self, topic: str, payload: bytes, qos: int, origin: str) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.origin = origin


class Recent:
    """A set of the last ``cap`` keys added (insertion order, oldest evicted)."""

    __slots__ = ("_keys", "cap")

    def __init__(self, cap: int = RECENT_MAX) -> None:
        self.cap = cap
        self._keys: dict[str, None] = {}

    def add(self, key: str) -> bool:
        """Add ``key``; False if it was already there."""
        keys = self._keys
        if key in keys:
            return False
        keys[key] = None
        if len(keys) > self.cap:
            del keys[next(iter(keys))]
        return True

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def keys(self) -> list[str]:
        """The keys, oldest first.  O(n)."""
        return list(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def split_origin(props: Properties) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """(the origin id, the user properties without it) of a link copy's properties."""
    users = props.user_properties
    origin = None
    for k, v in users:
        if k == ORIGIN_PROPERTY:
            origin = v
    if origin is None:
        return None, users
    return origin, tuple(kv for kv in users if kv[0] != ORIGIN_PROPERTY)


def origin_in(props: Properties) -> str | None:
    """The origin id in ``props`` (a stamped message at its origin), if any."""
    for k, v in props.user_properties:
        if k == ORIGIN_PROPERTY:
            return v
    return None


def event_key(expression: str, body: bytes) -> str | None:
    """The identity of a composite event: its expression and its components' sorted origin
    ids; None if a component has none (a core without origin ids) or the body is not an
    event."""
    import orjson  # here: a broker without composite events does not load it (issue 42 item 1)

    try:
        doc = orjson.loads(body)
        origins = sorted(str(c["origin"]) for c in doc["components"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return expression + "\n" + " ".join(origins)
