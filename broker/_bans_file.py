"""The admin API's bans read at start (docs/admin.md, "Bans"): from the store's ``bans`` table,
else from the ``bans_file`` of a broker without a store.  Apart from :mod:`broker._admin` so
that a broker's start does not import the HTTP listener's modules (h11) when it has no HTTP
listener (issue 42: libraries imported at first use; tests/broker/test_footprint.py)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from broker.core import Ban, BanKind, canonical

if TYPE_CHECKING:
    from broker._broker import Broker

__all__ = ["load_bans"]

log = logging.getLogger("broker.admin")


async def load_bans(broker: Broker) -> None:
    """Read the stored bans into ``core.bans`` at start: the store's ``bans`` table, else the
    ``bans_file`` (a file that cannot be read is logged and ignored: the broker starts)."""
    store = broker.core.journal.store
    if store is not None:
        rows = await asyncio.to_thread(store.bans)
    elif broker.config.bans_file is not None:
        path = Path(broker.config.bans_file)
        try:
            rows = orjson.loads(await asyncio.to_thread(path.read_bytes))
        except FileNotFoundError:
            return
        except (OSError, orjson.JSONDecodeError) as exc:
            log.error("bans file %s cannot be read, starting without bans: %s", path, exc)
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
            log.error("bad ban %r ignored: %s", row, exc)
