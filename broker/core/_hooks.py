"""What the broker reports about itself: the records its hooks receive, and the calls of the
core (:class:`CoreHooks`; public as :mod:`broker.hooks`, whose :class:`~broker.hooks.Hooks`
adds the broker's lifecycle calls ``start``, ``attach``, ``ready``, ``stopping``, ``stop``).
Defined in the core because the core calls them: the core imports nothing of the app level.

The bridge (``bridge/``) and any embedding program observe the broker through these frozen,
slotted records.  They are built on the hot path only when a hook is registered, and a hook
must not block: it appends the record to a buffer and returns (the bridge's writer turns
buffers into files off the event loop).  Times are ``time.time()`` seconds (UTC epoch).

Two forms of the delivery records.  ``on_delivery``/``on_publication`` receive one frozen record
per delivery and per publication (convenient, about 1-2 microseconds each on the hot path).
``on_deliveries`` is the batched form for recorders such as the bridge: one call per routed
publication with the message itself and one plain tuple (:data:`DeliveryEntry`) per subscriber
written during its fan-out, the clock read once per call; the hook stores what it needs and
expands it into rows off the event loop.  A recorder should store scalars (and the entry tuples,
which hold only scalars) rather than the message: objects kept for a while become long-lived for
CPython's cyclic GC and make it run full collections on the event loop (the bridge measured
0.13-0.16 s of them per 1.8 s at 100k deliveries/s; see docs/bridge.md).  The broker builds
only what the registered hooks override.

Message hooks (issue 39): ``on_publish`` sees a client's PUBLISH before it is routed and may
keep it, drop it (the publisher gets an MQTT 5 reason code), replace its topic, payload or
properties, and add derived messages the broker publishes after it (:class:`PublishDecision`;
docs/broker.md, "Message hooks").

Composite subscriptions (issue 16, docs/composite.md) have records of their own:
``on_composite_change`` (a client's composite subscription added or removed), one
``on_composite_event`` per composite event the engine produces (however many subscribers it
is delivered to; its deliveries also appear as ``$composite/<name>`` publications in
``on_deliveries``), and ``on_composite_loss`` with the buffered components the engine counted
as expired (window) or dropped (cap).  The engine counts those lazily (docs/composite.md, "How
it works"): when a subscription consumes past them, when it is unsubscribed or snapshotted, and
at the latest when the broker's sweep visits it (every subscription within about
``subscriptions / 2000`` seconds, while a hook overrides ``on_composite_loss``); the broker sums
them per subscription and atom and reports the sums at its next tick (0.25 s), after an
unsubscribe and at its stop.  A loss record therefore carries the counts of one subscription
and one atom over a period, and the sum of all of them is exact.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeAlias

from broker.packets import NO_PROPERTIES, Properties, ReasonCode

if TYPE_CHECKING:
    from broker.core._deliverylog import DeliveryLog
    from broker.values import Message

__all__ = [
    "DROP_REASONS",
    "AuthRequest",
    "AuthUnavailable",
    "AuthVerdict",
    "CompositeAction",
    "CompositeChange",
    "CompositeEventRecord",
    "CompositeLoss",
    "CoreHooks",
    "Delivery",
    "DeliveryEntry",
    "DerivedMessage",
    "Publication",
    "PublishAction",
    "PublishContext",
    "PublishDecision",
    "SubscriptionAction",
    "SubscriptionChange",
]

DeliveryEntry: TypeAlias = tuple[str, str, str | None, int, bool]
"""One delivery of a message in :meth:`Hooks.on_deliveries`: (subscriber id, the topic filter
of the subscription that matched, its selector or None, QoS of this delivery, retained flag)."""


AuthVerdict: TypeAlias = bool | Awaitable[bool | None] | None
"""What :meth:`Hooks.authenticate` returns: True (allow), False (deny), None (no opinion), or
an awaitable of one of them when the decision takes time (a password hash, an auth service):
the broker then holds the CONNECT, awaits it off its protocol core, and goes on when it is
done (docs/security.md, "Password checks off the event loop")."""


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """Everything the broker knows about a CONNECT when it asks who the client is: what
    :meth:`Hooks.authenticate_request` receives (built once per CONNECT, and only when some
    registered hook overrides that method: old-style hooks cost nothing more).

    ``listener`` is the local address the connection came in on (``"host:port"``, the
    socket's ``sockname``; ``""`` without a socket) and ``listener_port`` its port: it tells
    a plain listener from a TLS one.  The certificate fields are set on a TLS listener whose
    client presented a verified certificate (``require_client_cert``): ``certificate`` is
    ``ssl.SSLObject.getpeercert()`` (a dict), ``certificate_der`` the DER bytes when the
    transport exposes its SSL object, ``certificate_subject`` the subject as an RFC 4514
    string (``"CN=alice,O=Example"``).  ``identity`` is True when the user name was taken
    from that certificate (``use_identity_as_username``)."""

    client_id: str
    username: str | None
    password: bytes | None
    address: str | None  # the peer's IP address (None: unknown)
    peer: object  # the peer's socket address as the transport gives it (``peername``)
    listener: str
    listener_port: int | None
    protocol_version: int  # 3 (MQTT 3.1), 4 (3.1.1) or 5
    certificate: dict[str, object] | None = None
    certificate_der: bytes | None = None
    certificate_subject: str | None = None
    identity: bool = False


class AuthUnavailable(Exception):
    """Raised by :meth:`Hooks.authenticate` (or by the awaitable it returned) when it cannot
    decide now -- its checks are saturated, its auth service is unreachable: the CONNECT is
    refused with 0x88 Server unavailable (MQTT 3.1.1: return code 3) and counted in
    ``$SYS/broker/connections/refused/auth_busy``, and it does not count as a failed login.
    Any other exception of a hook refuses the CONNECT as not authorized (0x87 / 5)."""


class SubscriptionAction(enum.Enum):
    SUBSCRIBE = "subscribe"
    UNSUBSCRIBE = "unsubscribe"
    PARTIAL_UNSUBSCRIBE = "partial_unsubscribe"
    SESSION_END = "session_end"
    TAKEOVER = "takeover"


class CompositeAction(enum.Enum):
    SUBSCRIBE = "subscribe"  # also a re-subscription of the same name (it replaces the old one)
    UNSUBSCRIBE = "unsubscribe"
    SESSION_END = "session_end"  # the client's session ended (clean session, clean start)
    EXPIRED = "expired"  # the client's session expired (its expiry interval elapsed)


@dataclass(frozen=True, slots=True)
class CompositeChange:
    """A client's composite subscription ``$composite/<name>`` added or removed."""

    time: float
    client_id: str
    name: str
    action: CompositeAction
    expression: str  # canonical (for a removal: the expression it had)
    window: float | None  # seconds; None when the subscription is matched elsewhere (cluster)
    max_buffer: int | None  # the cap per atom; None as for window
    qos: int  # granted (for a removal: the QoS it had)
    subscriptions: int  # the client's resulting number of composite subscriptions


@dataclass(frozen=True, slots=True)
class CompositeEventRecord:
    """One composite event: a composite subscription (expression, window, max_buffer) was
    satisfied and its consumed components went to every subscriber of it."""

    time: float
    expression: str  # canonical
    window: float
    max_buffer: int
    subscribers: tuple[tuple[str, str], ...]  # (client id, name) of each delivery
    begin: float  # earliest component's arrival (engine time = the broker's wall clock)
    end: float  # latest component's arrival (the publication that completed it)
    components: int
    completion: float  # end - begin, seconds
    buffered: int  # instances the subscription still buffers after the event (all atoms)


@dataclass(frozen=True, slots=True)
class CompositeLoss:
    """Buffered components of one composite subscription and one atom that the engine counted
    as gone since the previous record: ``expired`` (older than the window) or ``dropped``
    (pushed out by the cap while live).  Every loss is in exactly one record."""

    time: float  # when reported (the broker's tick, an unsubscribe, its stop)
    expression: str
    window: float
    max_buffer: int
    element: str  # the atom (canonical text)
    expired: int
    dropped: int


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message delivered to one subscriber (one record per subscriber, per message)."""

    time: float
    message_id: int  # broker-wide id of the publication (same for all its deliveries)
    publisher_id: str | None  # client id, or None for messages published from code
    subscriber_id: str
    topic: str
    subscription_filter: str  # the topic filter of the subscription that matched
    content_filter: str | None  # its selector, or None
    qos: int  # the QoS of this delivery
    retained: bool
    payload_size: int
    latency: float  # seconds from receipt of the PUBLISH to the write to the subscriber


@dataclass(frozen=True, slots=True)
class Publication:
    """One message accepted by the broker, with its fan-out."""

    time: float
    message_id: int
    publisher_id: str | None
    topic: str
    payload_size: int
    qos: int
    retained: bool
    deliveries: int


@dataclass(frozen=True, slots=True)
class SubscriptionChange:
    """A change to one client's subscription list."""

    time: float
    client_id: str
    action: SubscriptionAction
    topic_filter: str | None  # None for session_end / takeover
    content_filter: str | None
    qos: int | None
    entries: int  # the client's resulting number of entries (subscriptions + negative entries)


class PublishAction(enum.Enum):
    """What a :meth:`Hooks.on_publish` decision does with the publication."""

    KEEP = "keep"  # route it as it is (extra messages still published)
    DROP = "drop"  # route nothing; the publisher gets ``reason`` (MQTT 5 PUBACK / PUBREC)
    REPLACE = "replace"  # route it with the given topic / payload / properties


#: the reason codes a hook may drop a publication with (MQTT 5 PUBACK/PUBREC): 0x83
#: Implementation specific error (the default), 0x87 Not authorized, 0x99 Payload format
#: invalid, 0x80 Unspecified error, 0x97 Quota exceeded, 0x90 Topic Name invalid
DROP_REASONS: Final = frozenset(
    {
        ReasonCode.UNSPECIFIED_ERROR,
        ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR,
        ReasonCode.NOT_AUTHORIZED,
        ReasonCode.TOPIC_NAME_INVALID,
        ReasonCode.QUOTA_EXCEEDED,
        ReasonCode.PAYLOAD_FORMAT_INVALID,
    }
)


@dataclass(frozen=True, slots=True)
class PublishContext:
    """A client's PUBLISH as :meth:`Hooks.on_publish` sees it (after the broker's own checks,
    the publisher's ACL check of ``topic``, and the previous hooks' changes)."""

    client_id: str
    username: str | None  # the authenticated user name, None if there is none
    protocol_level: int  # 3, 4 (3.1.1) or 5
    topic: str  # topic aliases resolved
    payload: bytes
    qos: int
    retain: bool
    properties: Properties  # without topic alias and subscription identifiers


@dataclass(frozen=True, slots=True)
class DerivedMessage:
    """A message a hook asks the broker to publish as itself (no publisher, no ACL check of
    the publisher; its topic must be a valid topic name), after the original is routed."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PublishDecision:
    """The answer of :meth:`Hooks.on_publish`; build it with :meth:`keep`, :meth:`drop` or
    :meth:`replace` (returning None is :meth:`keep` without extra messages)."""

    action: PublishAction
    reason: ReasonCode = ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR  # DROP only
    topic: str | None = None  # REPLACE: None keeps the current value
    payload: bytes | None = None
    properties: Properties | None = None
    extra: tuple[DerivedMessage, ...] = ()

    def __post_init__(self) -> None:
        if self.reason not in DROP_REASONS:
            raise ValueError(f"a dropped publication's reason must be one of {sorted(DROP_REASONS)}")

    @staticmethod
    def keep(extra: tuple[DerivedMessage, ...] | list[DerivedMessage] = ()) -> PublishDecision:
        """Route the publication unchanged (and publish ``extra`` after it)."""
        return PublishDecision(PublishAction.KEEP, extra=tuple(extra))

    @staticmethod
    def drop(reason: ReasonCode = ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR) -> PublishDecision:
        """Route nothing: an MQTT 5 publisher's PUBACK/PUBREC carries ``reason`` (one of
        :data:`DROP_REASONS`); MQTT 3.1.1 has no refusal: acknowledged, dropped."""
        return PublishDecision(PublishAction.DROP, reason)

    @staticmethod
    def replace(
        topic: str | None = None,
        payload: bytes | None = None,
        properties: Properties | None = None,
        extra: tuple[DerivedMessage, ...] | list[DerivedMessage] = (),
    ) -> PublishDecision:
        """Route the publication with a new topic, payload and/or properties (None: as it
        was); a new topic is checked and authorized for the publisher like its own."""
        return PublishDecision(
            PublishAction.REPLACE, topic=topic, payload=payload, properties=properties, extra=tuple(extra)
        )


class CoreHooks:
    """The calls of the broker's core to its hooks (the observer and policy interface);
    subclass :class:`broker.hooks.Hooks`, which adds the broker's lifecycle calls.

    ``Broker(hooks=[...])`` registers instances.  The broker builds a record and calls an
    ``on_*`` method only when some registered hook overrides it, so unused hooks cost nothing
    on the hot path.  ``on_*`` methods run on the event loop and must not block or raise
    (an exception is logged and counted, never propagated into the broker).

    ``authenticate``/``authorize`` return True (allow), False (deny) or None (no opinion);
    the first hook with an opinion decides, and with no opinion the broker's own
    configuration decides.  ``authenticate`` may also return an awaitable of its opinion
    (:data:`AuthVerdict`): the CONNECT waits for it, nothing else waits.  A client's user
    name is *authenticated* when an ``authenticate`` hook said True to its CONNECT (or the
    listener took it from a verified client certificate, ``use_identity_as_username``);
    ``authorize`` receives the user name only then, else None: a name a client merely
    claims never selects rights (docs/security.md, "Who is a user").
    """

    def on_connect(self, client_id: str, username: str | None, protocol_level: int) -> None:
        """A client's CONNECT was accepted."""

    def hold_connack(self, client_id: str, clean_start: bool, release: Callable[[bool], None]) -> bool:
        """A CONNECT was accepted and its session attached: return True to hold its CONNACK,
        and everything the connection would send after it, until ``release(present)`` is
        called, once, on the event loop (``present`` True: the hook brought the session's
        state in meanwhile, and the CONNACK says "session present").  The hook bounds the
        wait itself.  A persisted session's CONNACK then also waits for the store's commit.
        The cluster uses it to fetch a session from another node (docs/cluster.md)."""
        return False

    def on_disconnect(self, client_id: str, reason: str) -> None:
        """A client's network connection ended (``reason`` is human readable)."""

    def on_subscription_change(self, change: SubscriptionChange) -> None:
        """A subscription was added, removed, partially removed, or a session ended."""

    def on_publication(self, publication: Publication) -> None:
        """A message was accepted and routed (after fan-out, with its delivery count)."""

    def on_delivery(self, delivery: Delivery) -> None:
        """A message was written to one subscriber."""

    def on_deliveries(
        self, time: float, message: Message, deliveries: list[DeliveryEntry], routes: int
    ) -> None:
        """Batched form of ``on_publication`` + ``on_delivery`` (one call per publication).

        Called once per routed publication after its fan-out, with ``routes`` its number of
        routes (``Publication.deliveries``) and ``deliveries`` the entries written to
        subscribers' connections during the fan-out (queued or dropped routes are not in it),
        possibly empty.  A delivery written later (a queued QoS 1/2 message, a retained message
        on SUBSCRIBE, a resumed session) comes in its own call with ``routes == -1`` (no
        publication).  ``time`` is ``time.time()`` read once after the writes: each entry's
        broker latency is ``time - message.received``, an upper bound of the write time for
        every entry of the call and exact for the last.  The list is not reused by the broker
        and must not be modified (several hooks may receive it).
        """

    def on_composite_change(self, change: CompositeChange) -> None:
        """A composite subscription was added or removed (``on_subscription_change`` also
        reports it, as the filter ``$composite/<name>`` with the expression as selector)."""

    def on_composite_event(self, event: CompositeEventRecord) -> None:
        """The engine produced one composite event (called once per event, before its
        deliveries are written)."""

    def on_composite_loss(self, loss: CompositeLoss) -> None:
        """Buffered components were counted as expired or dropped (see the module docstring
        for when)."""

    def delivery_log(self) -> DeliveryLog | None:
        """A columnar log the core appends this hook's delivery records to, instead of calling
        :meth:`on_deliveries` (same records; see ``broker.core._deliverylog``).  Called once
        when the broker is built; the default None means "call on_deliveries".  For recorders
        that hand records to another thread: no interpreted call per publication and nothing
        kept that CPython's cyclic GC tracks."""
        return None

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> AuthVerdict:
        """Allow or deny a CONNECT: True, False, None (no opinion), or an awaitable of one of
        them for a check that takes time (it must not block the event loop: run a slow hash
        in a thread, as :class:`broker.auth.FileAuth` does; raise :class:`AuthUnavailable`
        to refuse with "server unavailable").  The CONNECT is held until it is done (the
        listener's ``connect_timeout`` still applies) and the hooks after this one are asked
        only if it says None.  Failed logins count towards the per-address back-off
        (``BrokerConfig.auth_failures``)."""
        return None

    def on_publish(self, ctx: PublishContext) -> PublishDecision | None:
        """A client's PUBLISH, before it is routed: keep (None), drop or replace it, or add
        derived messages (:class:`PublishDecision`).  Synchronous and on the hot path of every
        client PUBLISH: it must be fast and must not block.  Hooks run in registration order,
        each seeing the previous one's result; a drop ends the chain.  An exception drops the
        publication (fail-closed, 0x83) and counts in ``hook_errors``.  Only PUBLISHes of
        network clients pass here (not wills, ``Broker.publish``, cluster peers' copies, nor
        the derived messages themselves)."""
        return None

    def authenticate_request(self, request: AuthRequest) -> AuthVerdict:
        """The new-style form of :meth:`authenticate`: the same answers, given the whole
        :class:`AuthRequest` (peer address, listener, protocol version, client certificate).
        The broker calls this method; its default calls :meth:`authenticate` with the
        request's client id, user name and password, so a hook overrides one or the other
        (old-style hooks keep working unchanged)."""
        return self.authenticate(request.client_id, request.username, request.password)

    def authorize(self, client_id: str, username: str | None, action: str, topic: str) -> bool | None:
        """Allow or deny ``action`` ("publish", "subscribe" or "receive") on a topic name or
        filter; ``username`` is the *authenticated* user name, None if there is none."""
        return None

    def authorize_ahead(  # noqa: PLR0917 (positional, as authorize)
        self, client_id: str, username: str | None, action: str, topic: str, qos: int, retain: bool
    ) -> Awaitable[None] | None:
        """Asked before the broker processes a client's PUBLISH (``action`` "publish", its
        topic, QoS and retain flag) or each filter of a SUBSCRIBE ("subscribe", the filter
        without a ``$filter/`` prefix, the requested QoS): None when :meth:`authorize` can
        decide at once (this runs for every PUBLISH: answer in O(1)), or an awaitable, which
        holds the connection (nothing more read, its packets kept in order) until it is done;
        then the packet is processed, this method asked again first.  For a hook whose
        decisions live elsewhere (``broker.authn.HttpAuthz``; broker/core/_ahead.py)."""
        return None
