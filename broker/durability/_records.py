"""The durable state as plain records: what the store writes and :meth:`Store.load` returns.

Sessions, entry lists (subscriptions and negative entries), outgoing QoS 1/2 messages with
their state, retained messages, and the MQTT 5 properties codec of the store
(docs/persistence.md).  Pure values: the SQLite writer is :mod:`broker.durability._store`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import topics
from broker.packets import NO_PROPERTIES, Properties, Will
from broker.values import NEVER, Message, MessageState, SubOptions

__all__ = [
    "DB_NAME",
    "EntryRecord",
    "LoadedState",
    "MessageRecord",
    "MessageState",  # broker.values._flow: the flow state's one encoding
    "OutgoingRecord",
    "SessionRecord",
    "StoreClosed",
    "StoreError",
    "StoreVersionError",
    "decode_properties",
    "encode_properties",
    "message_record",
    "outgoing_of_row",
    "replay_entries",
    "session_of_row",
]

#: file name of the database inside ``--data-dir``.
DB_NAME = "broker.db"


class StoreError(Exception):
    """A persistence failure (the writer thread's exception is chained)."""


class StoreVersionError(StoreError):
    """The database was written by a newer siftmq (schema version above :data:`SCHEMA_VERSION`)."""


class StoreClosed(StoreError):
    """An operation was submitted after :meth:`Store.close`."""


# ---------------------------------------------------------------------------- properties
_BYTES_FIELDS = frozenset({"correlation_data", "authentication_data"})
_PROP_FIELDS = {f.name: f.default for f in fields(Properties)}


def encode_properties(p: Properties) -> bytes | None:
    """Compact JSON of the non-default properties (None for no properties).

    Bytes values are hex strings, tuples lists.  O(number of property fields).
    """
    if p == NO_PROPERTIES:
        return None
    out: dict[str, Any] = {}
    for name, default in _PROP_FIELDS.items():
        v = getattr(p, name)
        if v == default:
            continue
        out[name] = v.hex() if name in _BYTES_FIELDS else v
    import orjson  # at the first message with properties (issue 42 item 1: the light broker)

    return orjson.dumps(out)


def decode_properties(blob: bytes | None) -> Properties:
    """Inverse of :func:`encode_properties`."""
    if blob is None:
        return NO_PROPERTIES
    import orjson

    raw: dict[str, Any] = orjson.loads(blob)
    kw: dict[str, Any] = {}
    for name, v in raw.items():
        if name in _BYTES_FIELDS:
            kw[name] = bytes.fromhex(v)
        elif name == "user_properties":
            kw[name] = tuple((k, val) for k, val in v)
        elif name == "subscription_identifiers":
            kw[name] = tuple(v)
        else:
            kw[name] = v
    return Properties(**kw)


# ---------------------------------------------------------------------------- records
@dataclass(frozen=True, slots=True)
class MessageRecord:
    """An application message as stored (``expires_at`` is wall-clock, or None)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: Properties = NO_PROPERTIES
    publisher_id: str | None = None
    expires_at: float | None = None

    def to_message(self, now: float, wall: float | None = None) -> Message:
        """A broker :class:`Message` (new message id) whose deadline matches ``expires_at``.

        ``now`` is ``time.monotonic()``; ``wall`` is ``time.time()`` taken at the same moment.
        The Message Expiry Interval becomes the whole seconds left (MQTT 5 section 3.3.2.3.3).
        """
        props = self.properties
        if self.expires_at is not None:
            left = max(0, int(self.expires_at - (time.time() if wall is None else wall)))
            props = dataclasses.replace(props, message_expiry_interval=left)
        return Message.create(self.topic, self.payload, self.qos, self.retain, props, self.publisher_id, now)


def message_record(msg: Message, now: float, wall: float | None = None) -> MessageRecord:
    """The stored form of a broker :class:`Message` (``now`` = ``time.monotonic()``)."""
    exp = msg.expires_at
    if exp is not None:
        exp = (time.time() if wall is None else wall) + (exp - now)
    return MessageRecord(msg.topic, msg.payload, msg.qos, msg.retain, msg.properties, msg.publisher_id, exp)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A session's own fields (entries, messages and QoS 2 ids are separate records).

    ``disconnected_at``: wall-clock end of the network connection, None while connected.
    ``will_due``: wall-clock time a delayed will is due (None: not scheduled yet).
    """

    client_id: str
    protocol_level: int
    expiry_interval: int
    disconnected_at: float | None = None
    username: str | None = None
    next_pid: int = 1
    will: Will | None = None
    will_due: float | None = None

    def expires_at(self) -> float | None:
        """Wall-clock expiry (None: connected, or expiry interval 0xFFFFFFFF = never)."""
        if self.disconnected_at is None or self.expiry_interval == NEVER:
            return None
        return self.disconnected_at + self.expiry_interval


@dataclass(frozen=True, slots=True)
class EntryRecord:
    """One entry of a client's list: a subscription (``options`` set) or a negative entry.

    ``topic_filter`` is the full filter the index is keyed by (``$share/g/f`` included).
    """

    topic_filter: str
    options: SubOptions | None

    @property
    def positive(self) -> bool:
        return self.options is not None


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    """A QoS 1/2 message queued for or in flight to ``client_id`` (a broker ``Outgoing``).

    ``seq`` orders the client's messages (allocate with :meth:`Store.next_seq`);
    ``packet_id`` is None exactly when ``state`` is ``QUEUED``.
    """

    client_id: str
    seq: int
    state: MessageState
    packet_id: int | None
    message: MessageRecord
    qos: int  # delivery QoS (min of message and subscription)
    retain: bool  # RETAIN flag of the outgoing PUBLISH
    sub_ids: tuple[int, ...] = ()
    topic_filter: str = ""
    selector: str | None = None


@dataclass(slots=True)
class LoadedState:
    """Everything :meth:`Store.load` found (sessions by client id, lists in stored order)."""

    sessions: dict[str, SessionRecord]
    entries: dict[str, list[EntryRecord]]
    outgoing: dict[str, list[OutgoingRecord]]
    qos2_in: dict[str, set[int]]
    retained: dict[str, MessageRecord]
    expired: list[SessionRecord]  # sessions deleted by this load (their wills, if any, are due)
    #: sessions that were connected when the process died: their network connection ended
    #: without DISCONNECT, so their wills follow the will delay from now (as ``Core.detach``).
    crashed: set[str] = dataclasses.field(default_factory=set)


def replay_entries(
    index: topics.SubscriptionIndex[SubOptions], client_id: str, entries: Sequence[EntryRecord]
) -> None:
    """Rebuild a client's entries in ``index`` from :meth:`Store.load` (oldest first).

    A subscription is re-subscribed, a negative entry re-unsubscribed, in stored order.
    The result routes exactly like the saved list: a negative entry that no longer
    overlaps an older subscription (its subscription was removed since) decides nothing
    and is not recreated, so ``entries()`` may be shorter by such dead entries.
    O(entries x levels) (:meth:`topics.SubscriptionIndex.replay`).  Content filter
    selectors must be registered by the caller (``Router.add_selector``), as SUBSCRIBE does.
    """
    index.replay(client_id, entries)  # one call per entry, faster for a new client


def session_of_row(row: tuple[Any, ...]) -> SessionRecord:
    """The :class:`SessionRecord` of a ``sessions`` row."""
    (cid, level, expiry, disc, user, next_pid, wt, wp, wq, wr, wprops, wdue) = row
    will = None if wt is None else Will(wt, wp, wq, bool(wr), decode_properties(wprops))
    return SessionRecord(cid, level, expiry, disc, user, next_pid, will, wdue)


def outgoing_of_row(row: tuple[Any, ...]) -> OutgoingRecord:
    """The :class:`OutgoingRecord` of an ``outgoing`` row."""
    (
        cid,
        seq,
        _direction,
        state,
        pid,
        topic,
        payload,
        mqos,
        mretain,
        props,
        pub,
        exp,
        qos,
        retain,
        ids,
        tf,
        sel,
    ) = row
    msg = MessageRecord(topic, payload, mqos, bool(mretain), decode_properties(props), pub, exp)
    sub_ids = tuple(int(x) for x in ids.split(",")) if ids else ()
    return OutgoingRecord(cid, seq, MessageState(state), pid, msg, qos, bool(retain), sub_ids, tf, sel)
