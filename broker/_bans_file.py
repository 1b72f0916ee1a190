"""The admin API's bans read at start (docs/admin.md, "Bans"): from the store's ``bans`` table,
else from the ``bans_file`` of a broker without a store; and the two things a new ban does
whoever made it (the admin API, or another node of the cluster: cluster/_node.py): it is saved
(:func:`save_ban`) and the connected clients it matches are disconnected (:func:`enforce_ban`).
Apart from :mod:`broker._admin` so that a broker's start does not import the HTTP listener's
modules (h11) when it has no HTTP listener (issue 42: libraries imported at first use;
tests/broker/test_footprint.py)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from broker._files import private_dir, write_private
from broker._logging import cut
from broker.core import Ban, BanKind, canonical
from broker.packets import ReasonCode

if TYPE_CHECKING:
    from broker._broker import Broker

__all__ = ["enforce_ban", "load_bans", "save_ban"]

log = logging.getLogger("broker.admin")


async def load_bans(broker: Broker) -> None:
    """Read the stored bans into ``core.bans`` at start: the store's ``bans`` table, else the
    ``bans_file`` (a file that cannot be read is logged and ignored: the broker starts).
    orjson is imported when there is a file to read, and the file is read in a thread only
    when it exists (issue 42 item 1: the light broker without bans loads neither orjson nor
    the loop's executor, a thread and ``concurrent.futures.thread``)."""
    store = broker.core.journal.store
    if store is not None:
        rows = await asyncio.to_thread(store.bans)
    elif broker.config.bans_file is not None:
        path = Path(broker.config.bans_file)
        # no ban saved yet: no executor thread started for nothing (one stat, at start)
        if not path.exists():  # noqa: ASYNC240 (before any client connects)
            return
        try:
            raw = await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.error("bans file %s cannot be read, starting without bans: %s", path, exc)
            return
        import orjson

        try:
            rows = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            log.error("bans file %s cannot be read, starting without bans: %s", path, exc)
            return
        if not isinstance(rows, list):
            log.error("bans file %s is not a JSON array of bans, starting without bans", path)
            return
    else:
        return
    for row in rows:
        try:
            kind, value, expires_at, reason, created_at = row
            broker.core.bans.add(
                Ban(BanKind(kind), canonical(BanKind(kind), value), expires_at, reason, created_at)
            )
        except (TypeError, ValueError) as exc:
            log.error("bad ban %s ignored: %s", cut(repr(row)), cut(str(exc)))


def save_ban(broker: Broker, changed: Ban, gone: bool) -> None:
    """Persist one ban change: a row of the store's ``bans`` table, or the whole ``bans_file``
    rewritten (atomically, 0600; O(bans)); nothing without either.  OSError when the file
    cannot be written (the change stays in memory)."""
    import orjson

    store = broker.core.journal.store
    kind = changed.kind.value
    if store is not None:
        row = (kind, changed.value, changed.expires_at, changed.reason, changed.created_at)
        store.ban(kind, changed.value, None if gone else row)
    elif broker.config.bans_file is not None:
        rows = [(b.kind.value, b.value, b.expires_at, b.reason, b.created_at) for b in broker.core.bans.all()]
        path = Path(broker.config.bans_file)
        private_dir(path.parent)  # the data directory (0700) when nothing else made it
        write_private(path, orjson.dumps(rows, option=orjson.OPT_INDENT_2))


def enforce_ban(broker: Broker, ban: Ban, now: float) -> list[str]:
    """Disconnect the connected clients ``ban`` matches (MQTT 5 DISCONNECT 0x98 Administrative
    action: 0x8A Banned is a CONNACK code only, MQTT 5 section 3.14.2.1); their client ids.
    O(sessions)."""
    core = broker.core
    kicked = []
    for s in list(core.sessions.values()):
        conn = s.conn
        if conn is not None and core.bans.match(s.client_id, s.username, conn.peer, now) is ban:
            conn.disconnect(
                ReasonCode.ADMINISTRATIVE_ACTION, "banned" + (f": {ban.reason}" if ban.reason else "")
            )
            kicked.append(s.client_id)
    core.flush()
    return kicked
