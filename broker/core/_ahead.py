"""Authorization fetched ahead of a packet (issue 39): hold a connection until a hook knows.

The ``authorize`` hooks answer at once (a PUBLISH cannot wait for them on the hot path).  A
hook whose decisions live elsewhere (``broker.authn.HttpAuthz``: an HTTP service) overrides
:meth:`broker.hooks.Hooks.authorize_ahead`, which the core asks *before* it processes a
PUBLISH (action ``publish``, the message's topic, QoS and retain flag) or a SUBSCRIBE (action
``subscribe``, each filter with its requested QoS).  The hook answers None when its
``authorize`` can decide at once (its cache knows: O(1)), or an awaitable: then the
connection is held as a paused publisher is (``Core.block``: nothing more is read from its
socket, this packet and the ones after it wait in ``pending`` in order) until the awaitable
completes, and the packet is processed then (the hook is asked again first, and answers from
what it fetched).  The awaitable's outcome is the hook's business (it fails closed); an
exception from it is counted as a hook error and the connection goes on (its ``authorize``
decides, e.g. denies).

Costs: a broker without such a hook pays one empty-list test per read; with one, one call per
PUBLISH/SUBSCRIBE (a dict probe in the hook when it knows).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.core._session import ConnectionState
from broker.packets import Publish, Subscribe
from broker.values import split_filter_prefix

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from broker.core._connection import Connection

__all__ = ["held_for"]

log = logging.getLogger("broker")


def _asks(conn: Connection, p: object) -> list[tuple[str, str, int, bool]] | None:
    """(action, topic or filter, qos, retain) of what ``p`` will be authorised for, as the core
    will ask ``authorize``; None for another packet. O(filters)."""
    if type(p) is Publish:
        topic = p.topic
        alias = p.properties.topic_alias
        if not topic and alias is not None:
            topic = conn.alias_in.get(alias, "")
        if not topic:
            return None  # the core refuses it (unknown alias) without asking
        return [("publish", topic, p.qos, p.retain)]
    if type(p) is Subscribe:
        asks = []
        for req in p.subscriptions:
            try:
                _, full = split_filter_prefix(req.topic_filter)
            except ValueError:
                continue  # refused as invalid before authorisation
            asks.append(("subscribe", full, req.qos, False))
        return asks
    return None


def held_for(conn: Connection, p: object) -> bool:
    """Ask the ``authorize_ahead`` hooks about ``p``; True when one must fetch first: then
    ``conn`` is blocked until it has (the caller keeps ``p`` and the packets after it in
    ``pending``). O(hooks x filters) plus the hooks' probes."""
    asks = _asks(conn, p)
    if not asks:
        return False
    core = conn.core
    s = conn.session
    if s is None or conn.state is not ConnectionState.CONNECTED:
        return False  # before the CONNECT is accepted: the core refuses these packets
    user = s.verified_username
    waits: list[Awaitable[None]] = []
    for h in core.obs.ahead:
        for action, topic, qos, retain in asks:
            try:
                w = h.authorize_ahead(s.client_id, user, action, topic, qos, retain)
            except Exception:
                core.stats.hook_errors += 1
                log.exception("hook %s.authorize_ahead failed", type(h).__name__)
                continue
            if w is not None:
                waits.append(w)
    if not waits:
        return False
    run = core.await_check
    if run is None:  # a bare core cannot await: go on, ``authorize`` decides (fails closed)
        for w in waits:
            close = getattr(w, "close", None)
            if close is not None:
                close()
        return False
    core.block(conn)
    left = [len(waits)]

    def done(outcome: object) -> None:
        if isinstance(outcome, Exception):
            core.stats.hook_errors += 1
            log.error("authorize_ahead: %s", outcome)
        left[0] -= 1
        if left[0] == 0 and conn.blockers > 0:
            core.unblock(conn)  # resumed at the flush that follows: ``p`` is processed then

    for w in waits:
        run(w, done)
    return True
