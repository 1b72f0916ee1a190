"""Listeners: the broker's sockets (TCP, TLS, WebSocket) and their admission limits.

Issue 7, items 2-4.  ``BrokerConfig.effective_listeners()`` lists :class:`Listener` records;
:func:`open_listeners` binds each record's sockets and reads them with our own accept loop
(:class:`~broker.net._accept.Acceptor`: counted, backed-off answers when the process runs out
of descriptors, issue 27), with an
``ssl.SSLContext`` when the record has a certificate (TLS is the event loop's -- on the
default asyncio loop the standard library's TLS protocol with a 17 KiB instead of a 256 KiB
buffer, :class:`_LeanTLS`; client certificates are verified against ``cafile``) and with
the protocol class of its kind:
:class:`~broker.net._transport.MQTTProtocol` for ``tcp``,
:class:`~broker.net._websocket.WebSocketProtocol` for ``ws``.  Both feed the same sans-IO
``Connection`` machine.

A reload (``broker._reload``) re-reads the TLS files into new contexts
(:func:`prepare_tls_reload`) and, only when every one loaded, hands them to the accept path
(:meth:`TlsReload.apply`): later handshakes use them, accepted connections keep their own.

Admission (checked at accept, answered at CONNECT by ``MQTTProtocol._screen``):

* ``max_connections`` -- open network connections across all listeners; the one over the
  limit gets CONNACK 0x97 Quota exceeded (MQTT 5) / 3 Server unavailable (3.1.1).
  Refusing at CONNECT rather than at accept tells the client why (a bare close makes
  clients retry at once); a socket that never sends CONNECT is closed by the core's
  CONNECT deadline.
* ``connection_rate``/``connection_burst`` -- a token bucket per source IP (refilled at
  ``connection_rate`` tokens per second up to ``connection_burst``; one token per
  connection); an empty bucket gives CONNACK 0x9F Connection rate exceeded (MQTT 5) /
  3 Server unavailable (3.1.1).  O(1) per accept; buckets that have refilled are purged
  when the table doubles (amortised O(1)), so the table is bounded by the sources seen
  within ``connection_burst / connection_rate`` seconds.
* anonymous clients (no user name) -- refused with CONNACK 0x87 / 5 Not authorized on a
  listener whose ``anonymous`` is False (by default: every listener not bound to a
  loopback address).  The hooks and ``BrokerConfig.allow_anonymous`` still apply after.
* peers only (``Listener.peers_only``, the cluster's link listener) -- a CONNECT whose client
  id is not a cluster link's (``$cluster/<node>``) gets CONNACK 0x87 / 5 Not authorized,
  counted in ``refused_non_peer`` and logged (rate-limited); the core then refuses a link
  whose token the cluster does not verify (``broker.core._internal.internal_refusal``).

Each refusal is counted in ``Core.stats`` and published under
``$SYS/broker/connections/refused/``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from asyncio import sslproto
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker._config import BrokerConfig, Listener
from broker._logging import address, fields
from broker.core import Core
from broker.net._accept import Acceptor, bind
from broker.net._admission import ConnectionLimits, ListenerPolicy
from broker.net._lean import LeanProtocol
from broker.net._transport import MQTTProtocol

if TYPE_CHECKING:
    import ssl

__all__ = [
    "OpenListener",
    "TlsReload",
    "close_listeners",
    "open_listeners",
    "prepare_tls_reload",
    "ssl_context",
    "wait_closed",
]

log = logging.getLogger("broker")


@dataclass(frozen=True, slots=True)
class OpenListener:
    """A listener and its accept loops, one per bound address (``port``: the bound port,
    useful with port 0)."""

    listener: Listener
    acceptors: tuple[Acceptor, ...]
    port: int


def ssl_context(listener: Listener) -> ssl.SSLContext:
    """The server TLS context of a listener (TLS 1.2+; client certificates if ``cafile``,
    checked against the revocation list ``crlfile`` if any: issue 39 item 6)."""
    assert listener.certfile is not None
    import ssl  # with a TLS listener only: OpenSSL is ~4.5 MB (broker/_sslhook.py)

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(listener.certfile, listener.keyfile)
    if listener.cafile is not None:
        ctx.load_verify_locations(listener.cafile)
        ctx.verify_mode = ssl.CERT_REQUIRED if listener.require_client_cert else ssl.CERT_OPTIONAL
    if listener.crlfile is not None:  # a revoked client certificate fails the handshake
        ctx.load_verify_locations(listener.crlfile)
        ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    return ctx


class _LeanTLS(sslproto.SSLProtocol):
    """The standard library's TLS protocol with a 17 KiB buffer instead of 256 KiB.

    On the default asyncio loop every TLS connection holds a ``bytearray(max_size)`` read
    buffer, zeroed and so resident: 280 KiB per idle TLS client measured (docs/security.md,
    "Memory per idle connection").  A TLS record carries at most 16 KiB of plaintext, and
    the protocol reads in a loop until the buffer comes back short, so 17 KiB loses nothing
    but a few more ``recv`` calls on bulk input.  Other loops (uvloop) keep their own TLS.
    """

    max_size = 17 * 1024


class _LeanTLSFactory:
    """The protocol factory of a TLS listener on the default loop: a :class:`_LeanTLS` over
    a new MQTT protocol, with the context in ``ctx`` *when the connection is accepted* (a
    reload replaces ``ctx``; connections made before keep the context they were made with)."""

    __slots__ = ("ctx", "loop", "make")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, make: Callable[[], MQTTProtocol], ctx: ssl.SSLContext
    ) -> None:
        self.loop = loop
        self.make = make
        self.ctx = ctx

    def __call__(self) -> asyncio.BaseProtocol:
        # waiter None: no one awaits the handshake (sslproto checks for None; typeshed says Future)
        return _LeanTLS(self.loop, self.make(), self.ctx, None, server_side=True)  # type: ignore[arg-type]


async def open_listeners(core: Core, registry: set[MQTTProtocol], config: BrokerConfig) -> list[OpenListener]:
    """Open every listener of ``config`` (the broker's, which ``core.config`` reads through
    ``CoreConfig``); on an error close those opened and raise."""
    limits = ConnectionLimits(config, core.stats)
    opened: list[OpenListener] = []
    try:
        for listener in config.effective_listeners():
            opened.append(await open_listener(core, registry, listener, limits))  # noqa: PERF401 (closed on error)
    except BaseException:
        await close_listeners(opened)
        raise
    return opened


async def open_listener(
    core: Core, registry: set[MQTTProtocol], listener: Listener, limits: ConnectionLimits
) -> OpenListener:
    """Open one listener (the broker's own, or one a plugin adds: ``Broker.listen``)."""
    loop = asyncio.get_running_loop()
    policy = ListenerPolicy(
        limits,
        listener.anonymous,
        listener.use_identity_as_username,
        listener.slow_consumer_policy,
        proxy=listener.proxy_protocol,
        peers_only=listener.peers_only,
        name=listener.name,
    )
    make: Callable[[], MQTTProtocol]
    if listener.kind == "ws":
        from broker.net._websocket import WebSocketProtocol  # websockets: only with a ws listener

        make = functools.partial(WebSocketProtocol, core, policy, registry, listener.ws_path)
    else:
        make = functools.partial(MQTTProtocol, core, policy, registry)
    factory: Callable[[], asyncio.BaseProtocol] = make
    ctx = ssl_context(listener) if listener.tls else None
    if ctx is not None and isinstance(loop, asyncio.BaseEventLoop):
        factory = _LeanTLSFactory(loop, make, ctx)
        ctx = None  # TLS by _LeanTLS over a plain server
    socks = await bind(listener.host, listener.port, core.config.listen_backlog)
    # plain MQTT over TCP: a LeanProtocol per connection (the listener's poller registers it)
    lean = (
        functools.partial(LeanProtocol, core, policy) if listener.kind == "tcp" and not listener.tls else None
    )
    acceptors = tuple(Acceptor(loop, sock, factory, ctx, core, limits, lean) for sock in socks)
    for a in acceptors:
        a.start()
    port = socks[0].getsockname()[1]
    log.info(
        "listening on %s:%d (%s)",
        listener.host,
        port,
        listener.kind + "+tls" * listener.tls + "+proxy" * listener.proxy_protocol,
        extra=fields("broker.listening", address=address((listener.host, port))),
    )
    return OpenListener(listener, acceptors, port)


async def close_listeners(opened: list[OpenListener]) -> None:
    """Stop accepting on every listener (open connections are not touched)."""
    for o in opened:
        for a in o.acceptors:
            a.close()


async def wait_closed(opened: list[OpenListener]) -> None:
    """Nothing to wait for: an acceptor's socket is closed by ``close_listeners``."""


@dataclass(frozen=True, slots=True)
class TlsReload:
    """New server contexts for the TLS listeners, read and checked but not yet in use
    (:func:`prepare_tls_reload`); :meth:`apply` puts them in."""

    contexts: tuple[tuple[OpenListener, ssl.SSLContext], ...]

    def apply(self) -> None:
        """Every later TLS handshake of these listeners uses the new context; connections
        already accepted keep theirs (an ``SSLObject`` copies its context's certificate and
        key when it is made).  O(listeners)."""
        for opened, ctx in self.contexts:
            for a in opened.acceptors:
                if isinstance(a.factory, _LeanTLSFactory):
                    a.factory.ctx = ctx  # the default loop: _LeanTLS gets it per connection
                else:
                    a.ssl = ctx  # other loops (uvloop): connect_accepted_socket(ssl=...)


def prepare_tls_reload(opened: list[OpenListener]) -> TlsReload:
    """Read the certificate, key and CA files of every TLS listener again into NEW contexts.

    A new context rather than ``load_cert_chain`` on the one in use: that call replaces the
    certificate before it reads the key, so a key that fails to load (or does not match)
    would leave the listener's context half-changed; with new contexts a broken file leaves
    every listener as it was.  Raises ``ValueError`` naming the file that failed.
    O(listeners), each a few file reads.
    """
    out: list[tuple[OpenListener, ssl.SSLContext]] = []
    for o in opened:
        li = o.listener
        if not li.tls:
            continue
        try:
            ctx = ssl_context(li)
        except OSError as exc:  # ssl.SSLError included (a subclass)
            files = ", ".join(f for f in (li.certfile, li.keyfile, li.cafile, li.crlfile) if f is not None)
            raise ValueError(f"{files}: {exc}") from exc
        out.append((o, ctx))
    return TlsReload(tuple(out))
