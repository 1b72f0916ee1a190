"""Per-client state of the broker core: sessions, their outgoing messages, the counters.

Plain data on purpose (MQTT 5 section 4.1): a :class:`Session` holds in-flight messages with
their state, the bounded queue, QoS 2 receive ids and the packet id counter, so it can be
written through to the store (:mod:`broker.core._journal`) and rebuilt from it.  The state
transitions that change it live in :mod:`broker.core._core` (sessions: attach, detach, end,
wills, expiry; delivery, the queue, a session moved in from another node) and the packets of
one network connection (:mod:`broker.core._connection`, :mod:`broker.core._publish`); an
outgoing message's flow is the table :data:`OUTGOING_FLOW` here.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from broker.packets import Will
from broker.values import FILTER_PREFIX, NEVER, PUBLISH_SENT, PUBREL_SENT, Message, Route

if TYPE_CHECKING:
    from broker.core._connection import Connection
    from broker.core._journal import Held

__all__ = [
    "DONE",
    "NEVER",
    "OUTGOING_FLOW",
    "PUBACK",
    "PUBCOMP",
    "PUBLISH_SENT",
    "PUBREC",
    "PUBREL_SENT",
    "VIOLATION",
    "AckWaiter",
    "ConnectionState",
    "Outgoing",
    "Session",
    "Sink",
    "Stats",
    "WriteBuffer",
    "flow_row",
]


class ConnectionState(enum.Enum):
    AWAIT_CONNECT = "await_connect"
    CONNECTED = "connected"
    CLOSED = "closed"


#: the client's acknowledgements of an outgoing QoS 1/2 flow (the columns of :data:`OUTGOING_FLOW`)
PUBACK: Final = 0
PUBREC: Final = 1
PUBCOMP: Final = 2
#: what an acknowledgement leads to besides a next state: the flow ends, or the client broke it
DONE: Final = -1
VIOLATION: Final = -2


def flow_row(qos: int, state: int) -> int:
    """The row of :data:`OUTGOING_FLOW` of a message in flight at ``qos`` in ``state``. O(1)."""
    return qos * 4 + state


#: The transitions of an outgoing QoS 1/2 message in flight (MQTT 5 sections 4.3.2 and 4.3.3),
#: in one place (as h11's ``_state.py``): (QoS, ``Outgoing.state``) -> what each acknowledgement
#: of the client leads to (``broker.core._publish.acknowledged`` applies it).  A message enters
#: the table when it leaves the queue (``Core.deliver`` / ``Core.drain``: PUBLISH_SENT), or
#: with its stored or moved state (``Journal.restore``, ``Core.resume_inflight``); DONE frees
#: its packet id.  A PUBREC with an error code ends the flow too (DONE), after the same check.
OUTGOING_FLOW: Final[dict[int, tuple[int, int, int]]] = {
    #                          PUBACK     PUBREC       PUBCOMP
    flow_row(1, PUBLISH_SENT): (DONE, VIOLATION, VIOLATION),
    flow_row(2, PUBLISH_SENT): (VIOLATION, PUBREL_SENT, VIOLATION),
    flow_row(2, PUBREL_SENT): (VIOLATION, PUBREL_SENT, DONE),
}


class Outgoing:
    """A QoS 1/2 message on its way to one client (queued or in flight).

    ``state``: :data:`~broker.values.PUBLISH_SENT` (also while queued) or
    :data:`~broker.values.PUBREL_SENT`: the encoding the store and the cluster use too
    (:mod:`broker.values._flow`; ints: the compiled core compares ints).
    """

    __slots__ = ("msg", "qos", "retain", "selector", "seq", "state", "sub_ids", "topic_filter", "waiter")

    def __init__(  # noqa: PLR0917 (hot path: positional arguments)
        self,
        msg: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        topic_filter: str,
        selector: str | None,
    ) -> None:
        self.msg = msg
        self.qos = qos
        self.retain = retain
        self.sub_ids = sub_ids
        self.topic_filter = topic_filter
        self.selector = selector
        self.state = PUBLISH_SENT
        self.seq = 0  # OutgoingRecord.seq of its stored row (persisted sessions)
        # the publisher's PUBACK that may leave once this delivery is acknowledged (Journal)
        self.waiter: AckWaiter | None = None


class AckWaiter:
    """A publisher's QoS 1 acknowledgement that needs the store only for the deliveries of its
    message to persisted sessions (``remaining`` of them not yet acknowledged): when the last
    is acknowledged, nothing of the message is left to make durable, and the PUBACK may leave
    before the commit (``Journal.hold``; docs/persistence.md, "Acknowledgements").
    ``writes``: store operations its publication made, all of them such deliveries."""

    __slots__ = ("entry", "remaining", "writes")

    def __init__(self) -> None:
        self.remaining = 0
        self.writes = 0
        self.entry: Held | None = None  # the Journal's held entry of the PUBACK


Sink = Callable[[Message, Route], None]


class WriteBuffer(Protocol):
    """A connection's transport as flow control sees it (``asyncio.Transport``): the bytes
    written but not yet taken by the socket (hung-consumer detection, ``Core.tick``)."""

    def get_write_buffer_size(self) -> int: ...


class Session:
    """Per-client state that outlives a network connection (MQTT 5 section 4.1).

    ``inflight`` is ordered by send time (dict insertion order); lookups by packet id are
    O(1).  ``queue`` is bounded by ``BrokerConfig.max_queued_messages``.

    Lean containers (issue 27, item 2): a session restored from the store and every session
    the core creates at CONNECT (``Session(cid, expiry, lean=True)``) shares the empty
    containers below until something is written to one of them: 100,000 disconnected
    sessions, or 19,000 idle connected ones, do not each hold an empty ``deque`` (624 bytes),
    ``set`` (216) and two ``dict`` (64 each).  Reading a shared empty is always allowed; every
    write goes through :meth:`own_queue`, :meth:`own_inflight`, :meth:`own_ids` or
    :meth:`own_selectors` (or :meth:`materialize`, all four), which swap in a container of
    the session's own on first use.  ``_check`` asserts the shared ones stay empty.
    ``lean=False`` (the default: embedders' and tests' sessions) owns all four from the start.
    Clearing a shared empty container is a no-op, so ``end_session`` needs no guard.
    """

    __slots__ = (
        "authenticated",
        "client_id",
        "conn",
        "expires_at",
        "expiry_interval",
        "inflight",
        "next_pid",
        "persisted",
        "qos2_received",
        "queue",
        "selectors",
        "sink",
        "username",
        "version",
        "will",
        "will_due",
    )

    def __init__(self, client_id: str, expiry_interval: int = 0, lean: bool = False) -> None:
        self.client_id = client_id
        self.expiry_interval = expiry_interval
        self.conn: Connection | None = None
        self.inflight: dict[int, Outgoing] = _NO_INFLIGHT if lean else {}
        self.queue: deque[Outgoing] = _NO_QUEUE if lean else deque()
        self.qos2_received: set[int] = _NO_IDS if lean else set()
        self.next_pid = 1
        self.will: Will | None = None
        self.will_due: float | None = None
        self.expires_at: float | None = None
        self.username: str | None = None
        #: an authenticate hook said True to the CONNECT's user name (or the listener took it
        #: from a verified certificate): only then do the authorize hooks get ``username``
        self.authenticated = False
        # topic filter -> selector of that subscription
        self.selectors: dict[str, str] = _NO_SELECTORS if lean else {}
        self.sink: Sink | None = None
        self.persisted = False  # its rows are in the store (docs/persistence.md)
        self.version = 4  # protocol level of the latest CONNECT

    @property
    def verified_username(self) -> str | None:
        """``username`` if it was authenticated, else None (a claimed name has no rights): the
        name the authorize and message hooks and the store get. O(1)."""
        return self.username if self.authenticated else None

    def materialize(self) -> None:
        """Own containers instead of the shared empty ones (before anything writes to them). O(1)."""
        if self.inflight is _NO_INFLIGHT:
            self.inflight = {}
        if self.queue is _NO_QUEUE:
            self.queue = deque()
        if self.qos2_received is _NO_IDS:
            self.qos2_received = set()
        if self.selectors is _NO_SELECTORS:
            self.selectors = {}

    def own_queue(self) -> deque[Outgoing]:
        """The session's queue, its own (a message is about to be queued). O(1)."""
        q = self.queue
        if q is _NO_QUEUE:
            q = self.queue = deque()
        return q

    def own_inflight(self) -> dict[int, Outgoing]:
        """The session's in-flight window, its own (a message is about to be sent). O(1)."""
        d = self.inflight
        if d is _NO_INFLIGHT:
            d = self.inflight = {}
        return d

    def own_ids(self) -> set[int]:
        """The session's received QoS 2 ids, its own (one is about to be added). O(1)."""
        ids = self.qos2_received
        if ids is _NO_IDS:
            ids = self.qos2_received = set()
        return ids

    def own_selectors(self) -> dict[str, str]:
        """The session's filter -> selector map, its own (one may be added). O(1)."""
        d = self.selectors
        if d is _NO_SELECTORS:
            d = self.selectors = {}
        return d

    def take_selectors(self) -> dict[str, str]:
        """The session's filter -> selector map, handed over (its session ended: the router
        releases them later, ``Router.depart``); the session is left the shared empty one. O(1)."""
        d = self.selectors
        self.selectors = _NO_SELECTORS
        return d

    def selectors_for(self, topic_filter: str, packet_selector: str | None) -> dict[str, str]:
        """The map ``Router.subscribe`` gets for one request: the session's own when the request
        carries a content filter (``$filter/`` prefix or the packet's ``filter`` property) and
        may add one, else the current one (a request without a selector only removes). O(1)."""
        if packet_selector is not None or topic_filter.startswith(FILTER_PREFIX):
            return self.own_selectors()
        return self.selectors

    def allocate_pid(self) -> int:
        """A packet id not in flight (O(1) amortised; the window is far below 65535)."""
        pid = self.next_pid
        inflight = self.inflight
        while pid in inflight:
            pid = pid % 65535 + 1
        self.next_pid = pid % 65535 + 1
        return pid

    def _check(self) -> None:
        assert len(self.inflight) <= 65535
        assert all(1 <= pid <= 65535 for pid in self.inflight)
        assert self.conn is None or self.conn.session is self
        assert all(o.qos > 0 for o in self.queue)
        assert not (_NO_INFLIGHT or _NO_QUEUE or _NO_IDS or _NO_SELECTORS), "a shared container was written"


#: the shared empty containers of lean sessions (never written: ``Session._check``)
_NO_INFLIGHT: Final[dict[int, Outgoing]] = {}
_NO_QUEUE: Final[deque[Outgoing]] = deque()
_NO_IDS: Final[set[int]] = set()
_NO_SELECTORS: Final[dict[str, str]] = {}


@dataclass(slots=True)
class Stats:
    """Broker counters (published under ``$SYS/broker/``)."""

    messages_received: int = 0  # PUBLISHes of clients (and their wills, Broker.publish, peers' copies)
    messages_sent: int = 0
    messages_internal: int = 0  # the broker's own: $SYS rounds, cluster control (not received)
    publish_dropped: int = 0  # QoS 0 dropped for slow consumers / oversize / expiry
    queue_overflow: int = 0  # QoS 1/2 dropped or clients disconnected for a full queue
    bytes_received: int = 0
    bytes_sent: int = 0
    connections_total: int = 0
    malformed: int = 0
    hook_errors: int = 0
    # listener limits (broker.net._listeners): connections refused at CONNECT
    refused_max_connections: int = 0
    refused_connection_rate: int = 0
    refused_anonymous: int = 0
    # logins (docs/security.md, "Failed logins"): CONNECTs an authenticate hook refused,
    # refused at once by the per-address back-off (no hook asked), refused 0x88 because the
    # password checks were saturated (hooks.AuthUnavailable), and checks awaited right now
    auth_failures: int = 0
    refused_auth_backoff: int = 0
    refused_auth_busy: int = 0
    auth_pending: int = 0  # gauge
    # PROXY protocol listeners: connections closed for a missing, malformed or late header
    refused_proxy_header: int = 0
    # descriptors (issue 27; broker.net._accept): connections closed unanswered at accept
    # because the process is out of descriptors, and the pauses of accepting that followed
    refused_descriptors: int = 0
    accept_pauses: int = 0
    # connections closed by the broker's timers: no CONNECT in time, keep-alive expired
    connect_timeouts: int = 0
    keepalive_timeouts: int = 0
    # deliveries an authorize hook refused ("receive": live messages and retained on SUBSCRIBE)
    receive_denied: int = 0
    # session limits (docs/broker.md, "Limits")
    refused_subscription_quota: int = 0  # SUBACK 0x97/0x80: max_subscriptions_per_client
    refused_topic_levels: int = 0  # PUBLISH or SUBSCRIBE beyond max_topic_levels
    refused_selector: int = 0  # content filters refused in SUBACK (syntax or complexity)
    # flow control (docs/broker.md, "Flow control")
    publisher_pauses: int = 0  # times a publishing connection was paused for its subscribers
    publishers_paused: int = 0  # connections paused right now (gauge)
    slow_consumer_events: int = 0  # clients declared slow consumers after the grace time
    slow_consumers: int = 0  # slow consumers right now (gauge)
    slow_disconnected: int = 0  # slow consumers disconnected (policy "disconnect")
    hung_consumer_events: int = 0  # slow consumers found hung (socket took nothing) before the grace
    dropped_qos0_slow: int = 0  # QoS 0 dropped because the receiver does not read fast enough
    dropped_queue_full: int = 0  # QoS 1/2 dropped at a full queue (max_queued_messages)
    dropped_peer_queue_full: int = 0  # of which for a cluster link session (peer_queue_limit)
    dropped_qos0_ingress: int = 0  # QoS 0 shed as read from a publisher far ahead of the broker
    store_waits: int = 0  # publishers paused until the store's writer caught up
    refused_reserved_publish: int = 0  # client PUBLISHes to $SYS/..., $share/..., $cluster/... (issue 21, 37)
    # message hooks (issue 39; broker.core._msghooks): publications dropped by an on_publish
    # hook (or by its failure), rewritten topics refused, derived messages published
    hook_dropped: int = 0
    hook_rewrite_refused: int = 0
    hook_derived: int = 0
    # quotas (issue 39; broker.core._quota): publishers paused / disconnected by their publish
    # quota, retained publications refused by max_retained_messages / max_retained_bytes
    quota_pauses: int = 0
    quota_disconnects: int = 0
    refused_retained_quota: int = 0
    refused_reserved_subscribe: int = 0  # SUBSCRIBEs to the internal $cluster/... by non-peers (issue 37)
    refused_non_peer: int = 0  # CONNECTs refused as not a verified cluster peer link (issue 37)
    refused_reserved_client_id: int = 0  # CONNECTs taking an internal client id ($local/...) (issue 37)
    # a cluster's peers (cluster._node; issue 37): values refused (a retained stamp too far
    # ahead), messages that could not be parsed (dropped, the link goes on), link restarts
    cluster_peer_values_refused: int = 0
    cluster_peer_unparseable: int = 0
    cluster_link_restarts: int = 0
