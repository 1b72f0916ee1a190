"""What the dashboard shows, read from the core (issue 28, item 2; docs/dashboard.md).

Plain functions from :class:`~broker.core._core.Core` state to JSON-ready dicts, no I/O, no
awaits: they run on the broker's loop between two callbacks, so what they read is
consistent. Each is bounded by the page it answers, not by the broker's size where it can
be: lists are paginated (``offset``/``limit``, at most :data:`MAX_LIMIT` rows), rows are
built for the page only; a search is one pass over the client ids (10,000 clients: a few
milliseconds; docs/dashboard.md has the measured page times).

Nothing here exposes a password or a message payload the caller may not read: payloads
(retained messages only; queued and in-flight messages show their topic and QoS) go through
the ``may_read(topic)`` callable the caller passes (the dashboard user's ACL ``receive``
rights), and sessions never carry passwords.
"""

from __future__ import annotations

import os
import re
import resource
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, TypeAlias

from broker.core import ATOM_CLIENT, PUBREL_SENT, ConnectionState, Session, SubOptions
from topics import Entry

if TYPE_CHECKING:
    from broker.core import Core, Message

__all__ = [
    "CHUNK",
    "MAX_LIMIT",
    "PAYLOAD_PREVIEW",
    "Steps",
    "address",
    "client_detail",
    "client_page",
    "client_row",
    "composite_rows",
    "memory_rss",
    "overview",
    "page_bounds",
    "payload_view",
    "subscription_page",
    "topic_level",
]

#: most rows one list request returns
MAX_LIMIT = 500
#: clients one step of a list scan visits before it lets the loop run (``Steps``)
CHUNK = 2000

#: a scan over every client, in steps: the caller runs ``next()`` until ``StopIteration``
#: (whose ``value`` is the answer), letting the event loop run between steps, so a search
#: over 100,000 clients never holds the broker's loop for long (``Dashboard._run_steps``)
Steps: TypeAlias = Generator[None, None, dict[str, Any]]
#: bytes of a retained payload shown
PAYLOAD_PREVIEW = 2048
#: in-flight and queued messages listed per client (the counts are always complete)
DETAIL_ROWS = 50

_PROTOCOL = {3: "3.1", 4: "3.1.1", 5: "5.0"}

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def memory_rss() -> int:
    """Resident set size of this process in bytes (Linux: /proc; elsewhere the peak)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def page_bounds(offset: str | None, limit: str | None, default: int = 100) -> tuple[int, int]:
    """``offset``/``limit`` query values -> ints (ValueError with the reason when bad)."""
    try:
        off = int(offset) if offset else 0
        lim = int(limit) if limit else default
    except ValueError:
        raise ValueError("offset and limit must be integers") from None
    if off < 0 or not 1 <= lim <= MAX_LIMIT:
        raise ValueError(f"offset must be >= 0 and limit between 1 and {MAX_LIMIT}")
    return off, lim


def overview(core: Core, now: float, rss: int) -> dict[str, Any]:
    """The overview page: counters, gauges and the ``$SYS`` values they come from."""
    st = core.stats
    sys = core.sys_values(now)
    return {
        "node": core.node,
        "uptime": int(now - core.started),
        "clients_connected": int(sys["$SYS/broker/clients/connected"]),
        "connections": len(core.connections),
        "sessions": len(core.sessions),
        "subscriptions": len(core.router.index),
        "retained": len(core.router.retained),
        "messages_received": st.messages_received,
        "messages_sent": st.messages_sent,
        "messages_internal": st.messages_internal,
        "bytes_received": st.bytes_received,
        "bytes_sent": st.bytes_sent,
        "publishers_paused": st.publishers_paused,
        "slow_consumers": st.slow_consumers,
        "dropped": {
            "qos0_slow": st.dropped_qos0_slow,
            "qos0_ingress": st.dropped_qos0_ingress,
            "queue_full": st.dropped_queue_full,
            "publish_dropped": st.publish_dropped,
            "queue_overflow": st.queue_overflow,
            "receive_denied": st.receive_denied,
        },
        "memory_rss": rss,
        "sys": sys,
    }


_PEER = re.compile(r"\('([^']*)', (\d+)")


def address(peer: str) -> str:
    """A connection's peer (``str`` of the socket's peername) as ``host:port``."""
    m = _PEER.match(peer)
    if m is None:
        return peer
    host, port = m.groups()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def client_row(core: Core, s: Session) -> dict[str, Any]:
    conn = s.conn
    connected = conn is not None and conn.state is ConnectionState.CONNECTED
    return {
        "client_id": s.client_id,
        "connected": connected,
        "protocol": "in-process" if s.sink is not None else _PROTOCOL.get(s.version, str(s.version)),
        "address": address(str(conn.peer)) if conn is not None else None,
        "username": s.username,
        "subscriptions": core.router.index.entry_count(s.client_id),
        "inflight": len(s.inflight),
        "queued": len(s.queue),
        "persistent": s.expiry_interval > 0,
        "slow": bool(conn is not None and conn.slow),
        "paused": bool(conn is not None and conn.blockers),
    }


def client_page(core: Core, query: str, offset: int, limit: int) -> Steps:
    """Clients whose id, user name or address contains ``query`` (case-insensitive), sorted
    by id; one page of rows. A generator of :data:`CHUNK`-client steps (:data:`Steps`)."""
    q = query.lower()
    ids = sorted(core.sessions)
    if q:
        found = []
        for start in range(0, len(ids), CHUNK):
            if start:
                yield  # between chunks only: a small broker's scan never waits
            sessions = core.sessions
            for cid in ids[start : start + CHUNK]:
                s = sessions.get(cid)
                if s is not None and (
                    q in cid.lower()
                    or (s.username is not None and q in s.username.lower())
                    or (s.conn is not None and q in address(str(s.conn.peer)))
                ):
                    found.append(cid)
        ids = found
    page = [core.sessions[cid] for cid in ids[offset : offset + limit] if cid in core.sessions]
    return {
        "total": len(ids),
        "offset": offset,
        "limit": limit,
        "clients": [client_row(core, s) for s in page],
    }


def client_detail(core: Core, client_id: str, now: float) -> dict[str, Any] | None:
    """One client in full (None: no such session)."""
    s = core.sessions.get(client_id)
    if s is None:
        return None
    out = client_row(core, s)
    conn = s.conn
    out["keep_alive"] = conn.keep_alive if conn is not None else None
    out["clean_start"] = conn.clean_start if conn is not None else None
    out["expiry_interval"] = s.expiry_interval
    out["expires_in"] = None if s.expires_at is None else max(0.0, round(s.expires_at - now, 1))
    out["will_topic"] = s.will.topic if s.will is not None else None
    out["subscription_list"] = [
        {
            "filter": e.topic_filter,
            "negative": not e.positive,
            "qos": e.options.qos if e.options is not None else None,
            "selector": e.options.selector if e.options is not None else None,
            "no_local": e.options.no_local if e.options is not None else None,
            "subscription_id": e.options.subscription_id if e.options is not None else None,
        }
        for e in core.router.index.entries(client_id)
    ]
    out["composites"] = core.composite.subscriptions_of(client_id)
    out["inflight_list"] = [
        {
            "packet_id": pid,
            "topic": o.msg.topic,
            "qos": o.qos,
            "state": "pubrel" if o.state == PUBREL_SENT else "publish",
        }
        for pid, o in list(s.inflight.items())[:DETAIL_ROWS]
    ]
    out["queued_list"] = [{"topic": o.msg.topic, "qos": o.qos} for o in list(s.queue)[:DETAIL_ROWS]]
    return out


def subscription_page(core: Core, query: str, offset: int, limit: int) -> Steps:
    """Every client's entries (subscriptions with their content selectors, shared ones, and
    negative entries of partial unsubscribes) whose filter, selector or client id contains
    ``query``; one page, sorted by client id then age. A generator of :data:`CHUNK`-client
    steps; without a query only the page's clients' entries are built."""
    q = query.lower()
    index = core.router.index
    rows: list[tuple[str, Entry[SubOptions]]] = []
    total = 0
    ids = sorted(core.sessions)
    for start in range(0, len(ids), CHUNK):
        if start:
            yield  # between chunks only: a small broker's scan never waits
        for cid in ids[start : start + CHUNK]:
            if not q:
                n = index.entry_count(cid)
                if offset + limit <= total or total + n <= offset:
                    total += n  # outside the page: counted, not built
                    continue
                entries = index.entries(cid)
            elif q in cid.lower():
                entries = index.entries(cid)
            else:
                entries = [
                    e
                    for e in index.entries(cid)
                    if q in e.topic_filter.lower()
                    or (
                        e.options is not None
                        and e.options.selector is not None
                        and q in e.options.selector.lower()
                    )
                ]
            for e in entries:
                if offset <= total < offset + limit:
                    rows.append((cid, e))
                total += 1
    return {
        "total": total,
        "offset": offset,
        "limit": limit,
        "subscriptions": [
            {
                "client_id": cid,
                "filter": e.topic_filter,
                "negative": not e.positive,
                "qos": e.options.qos if e.options is not None else None,
                "selector": e.options.selector if e.options is not None else None,
            }
            for cid, e in rows
        ],
        "composites": composite_rows(core),
    }


def composite_rows(core: Core, limit: int = MAX_LIMIT) -> list[dict[str, Any]]:
    """Composite subscriptions with their buffers (instances buffered per atom)."""
    comp = core.composite
    out: list[dict[str, Any]] = []
    for cid, names in sorted(comp.clients.items()):
        if cid.startswith(ATOM_CLIENT):
            continue
        for name in sorted(names):
            key = (cid, name)
            st = comp.engine.subscription(key)
            if st is None:
                delegated = comp.delegated.get(key)
                out.append(
                    {
                        "client_id": cid,
                        "name": name,
                        "expression": delegated and delegated[0],
                        "delegated": True,
                    }
                )
                continue
            buffers = comp.engine.buffers(key) or {}
            out.append(
                {
                    "client_id": cid,
                    "name": name,
                    "expression": st.expression,
                    "window": st.window,
                    "max_buffer": st.max_buffer,
                    "buffered": st.buffered,
                    "events": st.events,
                    "dropped": st.dropped,
                    "expired": st.expired,
                    "buffers": {atom: len(parts) for atom, parts in buffers.items()},
                    "delegated": False,
                }
            )
            if len(out) >= limit:
                return out
    return out


def payload_view(payload: bytes) -> dict[str, Any]:
    """A retained payload for display: text when it is UTF-8, else hex (first bytes)."""
    head = payload[:PAYLOAD_PREVIEW]
    try:
        return {"text": head.decode("utf-8"), "size": len(payload), "truncated": len(payload) > len(head)}
    except UnicodeDecodeError:
        return {"hex": head[:256].hex(), "size": len(payload), "truncated": len(payload) > 256}


def topic_level(
    core: Core, prefix: str | None, offset: int, limit: int, may_read: Callable[[str], bool]
) -> dict[str, Any]:
    """One level of the retained-topic tree below ``prefix`` (None: the top), with the
    retained message of each level that has one; a payload only where ``may_read`` allows."""
    tree = core.router.retained
    levels = tree.children(prefix)
    rows = []
    for name, has, below in levels[offset : offset + limit]:
        topic = name if prefix is None else f"{prefix}/{name}"
        row: dict[str, Any] = {"level": name, "topic": topic, "children": below, "retained": None}
        if has:
            msg: Message | None = tree.get(topic)
            if msg is not None:
                row["retained"] = _retained(msg, may_read)
        rows.append(row)
    here = None
    if prefix is not None:
        msg = tree.get(prefix)
        here = None if msg is None else _retained(msg, may_read)
    return {
        "prefix": prefix,
        "total": len(levels),
        "offset": offset,
        "limit": limit,
        "levels": rows,
        "retained": here,
    }


def _retained(msg: Message, may_read: Callable[[str], bool]) -> dict[str, Any]:
    out: dict[str, Any] = {"qos": msg.qos, "size": len(msg.payload)}
    if may_read(msg.topic):
        out["payload"] = payload_view(msg.payload)
    else:
        out["hidden"] = "your ACL does not allow reading this topic"
    return out
