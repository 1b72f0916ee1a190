"""Fresh, authenticated cluster messages (docs/cluster.md, "Security"; issue 37, item 2).

Sans-IO: the functions and classes here take bytes, ids and the time, and answer bytes or a
:class:`Refusal`; the overlay (:mod:`cluster._overlay`) and the node's ``authenticate`` hook
(:mod:`cluster._node`) do the I/O.  Two kinds of messages are protected by the cluster's
shared secret, both the same way: a MAC over the sender id, the destination id, a timestamp
and a random nonce, checked in this order:

1. the MAC (constant-time compare): ``bad_mac`` (wrong secret, tampered, or not ours);
2. the destination is this node: ``wrong_destination`` (a message captured on its way to one
   member and replayed to another);
3. the timestamp is within :data:`WINDOW` seconds of the receiver's clock: ``stale`` (the
   members' clocks are assumed within :data:`WINDOW` seconds of each other: NTP);
4. the (sender, nonce) pair was not accepted before inside the window: ``replayed``.

**Link tokens.**  A link is an MQTT 5 connection whose client id is ``$cluster/<sender id>``;
its password (:func:`make_token`) is::

    <sender id hex>.<destination id hex>.<unix time ms>.<nonce hex>.<HMAC-SHA256 hex>

with the HMAC keyed by the secret over ``"siftmq-link-v2|" client id "|" sender "|" destination
"|" time "|" nonce``; the sender must be the one of the client id.  :class:`TokenChecker`,
built with the local node id, refuses a token for another node, outside the window or seen
before.  (MQTT 5 enhanced authentication would make it an interactive challenge; the broker
does not implement AUTH exchanges, so the challenge is the clock window plus the nonce cache.)

**Overlay datagrams.**  Every Kademlia datagram is sealed (:func:`seal`) as::

    tag (16 bytes: HMAC-SHA256 truncated, over everything after it)
    version (1) | sender id (20) | destination id (20) | unix time ms (8) | nonce (12)
    | reply-to nonce (12: the request's nonce in a reply, zeros in a request) | rpcudp body

:class:`DatagramGuard` opens them.  A reply is bound to its request: it is accepted only if
its RPC id (rpcudp's ``msg_id``, in the body) is one this node is waiting for, its reply-to
nonce is that request's nonce and it comes from the node the request was addressed to
(``unsolicited`` otherwise), so a captured reply cannot answer another request.

*First contact.*  A node joining through a seed address (``--join``, and the refresh's
lookups through the seeds) does not know the seed's id: it sends a ``PING`` with the zero
destination.  A zero destination is accepted for a ``PING`` request only, and such a ping is
answered (with this node's id, which is how the joiner learns it) but does not make the
sender a member: membership (and with it the MQTT link) follows from its next request, which
is addressed to this node's id.  So a captured first-contact ping replayed to any member
makes it answer the replayer's address, and nothing else.

**Bounded memory.**  The nonces of accepted messages are kept while they could still be
inside the window (:class:`NonceCache`), at most ``limit`` of them: when full, the oldest is
forgotten and every message not newer than it is refused as ``stale`` from then on (so
forgetting never lets a replay in; under that load a message delayed more than the cache's
span is refused).  The cache lives in memory only, so a checker refuses every message stamped
before it was built (``since``, default its construction): no replay across a restart.  O(1)
amortised per message.

What this does not do: encrypt (without TLS on the cluster listener the traffic is readable);
stop a member (anyone holding the secret) from lying; stop an attacker on the cluster network
from dropping or delaying messages within the window.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DATAGRAM_OVERHEAD",
    "WINDOW",
    "ZERO_ID",
    "DatagramGuard",
    "NonceCache",
    "Opened",
    "Refusal",
    "TokenChecker",
    "datagram_key",
    "make_token",
    "seal",
]

#: seconds a token or datagram stays valid either side of the verifier's clock
WINDOW: Final = 60.0
#: the destination id of a first-contact PING (the seed's id is not known yet)
ZERO_ID: Final = bytes(20)
_NO_NONCE: Final = bytes(12)
_MAX_SEEN: Final = 100_000
_TAG: Final = 16
_VERSION: Final = 2
_HEADER: Final = struct.Struct(">B20s20sQ12s12s")
#: bytes a sealed datagram adds to rpcudp's body
DATAGRAM_OVERHEAD: Final = _TAG + _HEADER.size
#: rpcudp's request kind byte, then its 20-byte msg_id, then msgpack ``["ping", [...]]``
_REQUEST: Final = 0
_RESPONSE: Final = 1
_PING: Final = b"\x92\xa4ping"


class Refusal(enum.StrEnum):
    """Why a token or a datagram was refused (the label of its counter)."""

    MALFORMED = "malformed"  # not parseable (or no token at all)
    BAD_MAC = "bad_mac"
    WRONG_DESTINATION = "wrong_destination"
    STALE = "stale"
    REPLAYED = "replayed"
    UNSOLICITED = "unsolicited"  # a reply to no request of ours (datagrams only)


def _counters() -> dict[Refusal, int]:
    return dict.fromkeys(Refusal, 0)


class NonceCache:
    """The (sender, nonce) pairs accepted inside the window, at most ``limit`` of them.

    :meth:`admit` refuses a stamp outside ``window`` of ``now`` or not newer than the newest
    stamp forgotten for room (``floor``), and a pair seen before; else remembers it.
    O(1) amortised (each pair is inserted and evicted once)."""

    def __init__(self, window: float = WINDOW, limit: int = _MAX_SEEN, since: float = float("-inf")) -> None:
        self.window = window
        self.limit = limit
        #: stamps up to this are refused: the newest forgotten, or the start of this process
        #: (the nonces of its previous life are not known: no replay across a restart)
        self.floor = since - 0.002  # stamps are whole ms: one sent just after ``since`` passes
        self._seen: OrderedDict[tuple[bytes, bytes], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, sender: bytes, nonce: bytes, stamp: float, now: float) -> Refusal | None:
        if abs(now - stamp) > self.window or stamp <= self.floor:
            return Refusal.STALE
        seen = self._seen
        # in arrival order; expired ones are refused by the window anyway
        while seen and next(iter(seen.values())) < now - self.window:
            seen.popitem(last=False)
        key = (sender, nonce)
        if key in seen:
            return Refusal.REPLAYED
        while len(seen) >= self.limit:
            _, old = seen.popitem(last=False)
            self.floor = max(self.floor, old)
            if stamp <= self.floor:
                return Refusal.STALE
        seen[key] = stamp
        return None


# ---------------------------------------------------------------- link tokens
def _token_mac(secret: bytes, *fields: str) -> str:
    """HMAC over the client id, sender, destination, time and nonce (in that order)."""
    msg = "|".join(("siftmq-link-v2", *fields)).encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def make_token(secret: bytes, client_id: str, dest: str, now: float | None = None) -> bytes:
    """A fresh password for the CONNECT of ``client_id`` (``$cluster/<sender id hex>``) to
    the node ``dest`` (its id, hex). O(1)."""
    sender = client_id.removeprefix("$cluster/")
    stamp = str(int((time.time() if now is None else now) * 1000))
    nonce = secrets.token_hex(12)
    mac = _token_mac(secret, client_id, sender, dest, stamp, nonce)
    return f"{sender}.{dest}.{stamp}.{nonce}.{mac}".encode()


_TOKEN_WHY: Final = {
    Refusal.MALFORMED: "malformed cluster token",
    Refusal.BAD_MAC: "bad cluster token (wrong secret?)",
    Refusal.WRONG_DESTINATION: "cluster token for another node (replayed from another link?)",
    Refusal.STALE: "cluster token outside the clock window (clocks apart?)",
    Refusal.REPLAYED: "replayed cluster token",
}


class TokenChecker:
    """Verifies the link tokens addressed to node ``me`` (hex id) and remembers their nonces
    inside the window (bounded memory); ``refused`` counts the refusals by reason."""

    def __init__(
        self,
        secret: bytes,
        me: str,
        window: float = WINDOW,
        limit: int = _MAX_SEEN,
        since: float | None = None,
    ) -> None:
        self.secret = secret
        self.me = me
        self.refused = _counters()
        self.last_refusal: Refusal | None = None
        # tokens stamped before ``since`` (default: now) are stale (NonceCache.floor)
        self._nonces = NonceCache(window, limit, time.time() if since is None else since)

    def check(self, client_id: str, token: bytes | None, now: float | None = None) -> str | None:
        """None when ``token`` is valid for ``client_id`` here, else why not (O(1) amortised)."""
        why = self._check(client_id, token, time.time() if now is None else now)
        self.last_refusal = why
        if why is None:
            return None
        self.refused[why] += 1
        if token is None:
            return "no cluster token"
        return _TOKEN_WHY[why]

    def _check(self, client_id: str, token: bytes | None, now: float) -> Refusal | None:
        if token is None:
            return Refusal.MALFORMED
        try:
            sender, dest, stamp, nonce, mac = token.decode("ascii").split(".")
            when = int(stamp) / 1000
        except (UnicodeDecodeError, ValueError):
            return Refusal.MALFORMED
        if not hmac.compare_digest(mac, _token_mac(self.secret, client_id, sender, dest, stamp, nonce)):
            return Refusal.BAD_MAC
        if client_id != f"$cluster/{sender}":
            return Refusal.BAD_MAC  # a member's token under another member's client id
        if dest != self.me:
            return Refusal.WRONG_DESTINATION
        return self._nonces.admit(sender.encode(), nonce.encode(), when, now)


# ---------------------------------------------------------------- overlay datagrams
def datagram_key(secret: bytes) -> bytes:
    """The MAC key of the overlay's datagrams (not the links' key: separate domains)."""
    return hashlib.sha256(b"siftmq-cluster-udp-v2|" + secret).digest()


def _tag(key: bytes, signed: bytes) -> bytes:
    return hmac.new(key, signed, hashlib.sha256).digest()[:_TAG]


def seal(
    key: bytes,
    sender: bytes,
    dest: bytes,
    body: bytes,
    *,
    now: float,
    nonce: bytes | None = None,
    reply_to: bytes = _NO_NONCE,
) -> bytes:
    """The datagram carrying rpcudp's ``body`` from ``sender`` to ``dest`` (ids, 20 bytes;
    :data:`ZERO_ID` for a first-contact ping). O(len(body))."""
    nonce = secrets.token_bytes(12) if nonce is None else nonce
    signed = _HEADER.pack(_VERSION, sender, dest, int(now * 1000), nonce, reply_to) + body
    return _tag(key, signed) + signed


@dataclass(frozen=True, slots=True)
class Opened:
    """An accepted datagram: who sent it, its nonce, and rpcudp's body."""

    sender: bytes
    dest: bytes
    nonce: bytes
    body: bytes

    @property
    def first_contact(self) -> bool:
        """A ping to the zero destination: answered, the sender not admitted as a member."""
        return self.dest == ZERO_ID


@dataclass(frozen=True, slots=True)
class _Pending:
    dest: bytes
    nonce: bytes
    sent: float


class DatagramGuard:
    """Seals this node's datagrams and opens the ones it receives (see the module docstring).

    ``me`` is this node's id.  Requests sent are remembered by RPC id until their reply comes,
    :meth:`forget` (timeout) or :data:`WINDOW` passes.  ``refused`` counts the datagrams
    dropped, by reason.  O(1) amortised per datagram besides the MAC over its bytes."""

    def __init__(
        self,
        key: bytes,
        me: bytes,
        window: float = WINDOW,
        limit: int = _MAX_SEEN,
        since: float | None = None,
    ) -> None:
        self.key = key
        self.me = me
        self.window = window
        self.refused = _counters()
        # datagrams stamped before ``since`` (default: now) are stale (NonceCache.floor)
        self._nonces = NonceCache(window, limit, time.time() if since is None else since)
        self._pending: dict[bytes, _Pending] = {}

    def request(self, body: bytes, dest: bytes, now: float) -> bytes:
        """Seal an rpcudp request ``body`` to node ``dest`` (``ZERO_ID``: unknown) and wait
        for its reply."""
        nonce = secrets.token_bytes(12)
        if len(body) >= 21:
            pending = self._pending
            if len(pending) >= self._nonces.limit:  # RPCs never forgotten (a bug): drop the oldest
                del pending[next(iter(pending))]
            pending[body[1:21]] = _Pending(dest, nonce, now)
        return seal(self.key, self.me, dest, body, now=now, nonce=nonce)

    def reply(self, body: bytes, request: Opened, now: float) -> bytes:
        """Seal rpcudp's reply ``body`` to the accepted ``request``."""
        return seal(self.key, self.me, request.sender, body, now=now, reply_to=request.nonce)

    def forget(self, msg_id: bytes, now: float) -> None:
        """A request given up (its timeout); also drops the requests older than the window."""
        pending = self._pending
        pending.pop(msg_id, None)
        while pending:
            first = next(iter(pending))
            if pending[first].sent >= now - self.window:
                break
            del pending[first]

    def pending(self) -> int:
        return len(self._pending)

    def open(self, data: bytes, now: float) -> Opened | Refusal:
        """The datagram ``data`` if it is authentic, for this node, fresh and new (and, for a
        reply, bound to a request of ours), else why not (counted in ``refused``)."""
        why = self._open(data, now)
        if isinstance(why, Refusal):
            self.refused[why] += 1
        return why

    def _open(self, data: bytes, now: float) -> Opened | Refusal:
        if len(data) < DATAGRAM_OVERHEAD + 21:
            return Refusal.MALFORMED
        signed = data[_TAG:]
        if not hmac.compare_digest(data[:_TAG], _tag(self.key, signed)):
            return Refusal.BAD_MAC
        version, sender, dest, stamp, nonce, reply_to = _HEADER.unpack_from(signed)
        body = signed[_HEADER.size :]
        kind = body[0]
        if version != _VERSION or kind not in {_REQUEST, _RESPONSE}:
            return Refusal.MALFORMED
        if dest != self.me and not (dest == ZERO_ID and kind == _REQUEST and body[21:27] == _PING):
            return Refusal.WRONG_DESTINATION
        why = self._nonces.admit(sender, nonce, stamp / 1000, now)
        if why is not None:
            return why
        if kind == _RESPONSE:
            msg_id = body[1:21]
            sent = self._pending.get(msg_id)
            if (
                sent is None
                or not hmac.compare_digest(sent.nonce, reply_to)
                or sent.dest not in {ZERO_ID, sender}
            ):
                return Refusal.UNSOLICITED
            del self._pending[msg_id]
        elif reply_to != _NO_NONCE:
            return Refusal.MALFORMED
        return Opened(sender, dest, nonce, body)
