"""Log lines for people and for machines (issue 38, item 6; docs/operations.md, "Logs").

``siftmq serve --log-format text`` (the default) writes the classic line
``<time> <LEVEL> <logger>: <message>``; ``--log-format json`` (``[serve] log_format = "json"``)
writes one JSON object per line with stable keys:

* ``time`` -- ISO 8601, UTC, milliseconds (``2026-11-29T02:31:41.123Z``);
* ``level`` -- ``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``, ``CRITICAL``;
* ``logger`` -- the logger's name (``broker``, ``siftmq.cluster``, ...);
* ``event`` -- a short stable identifier of what happened (``client.connected``,
  ``client.refused``, ``client.disconnected``, ``limit.topic_levels``, ``store.failed``,
  ``cluster.link_up``, ...; :data:`EVENTS`), ``log`` for a line no site named;
* ``message`` -- the human text, the same as the text format's;
* when the site knows them: ``client_id``, ``address``, ``reason``; ``exception`` with the
  traceback of ``log.exception``.

A log site names its event and fields through ``extra=`` (:func:`fields` builds the dict);
the text format ignores them, so both formats say the same thing. Rate limiting happens
before a record exists (``Core.log_limit``: at most one line per kind every 10 s; the rule of
every rate-limited site is :class:`LogLimiter`'s), so it is the same in both formats.

Client input in a line (issue: a 64 KiB client id made a 64 KiB warning): a client id, user
name, topic, filter, selector, or an answer of a remote service is never logged as it came.
:func:`shown` is its ``repr`` cut to :data:`SHOWN` characters (with the full length said);
:func:`bounded` keeps a short printable string as it is (``client c1: ...`` stays readable) and
shows anything else through :func:`shown`, so a client id can neither be long nor carry a line
break that forges another line.  :func:`fields` bounds the ``client_id`` and ``reason`` it is
given the same way, and ``Core.log_limit`` bounds its client id and its text.  O(:data:`SHOWN`).

The formatter is a plain :class:`logging.Formatter` over ``orjson`` (a dependency already):
an application embedding :class:`broker.Broker` that wants these lines installs it on its own
handler (``handler.setFormatter(JsonFormatter())``); the broker never configures logging by
itself, only ``siftmq serve`` does (:func:`configure`). Formatting a record is O(its message
and traceback); nothing is computed for records below the configured level.
"""

from __future__ import annotations

import logging
import sys
from enum import Enum
from typing import IO, Any, Final

__all__ = [
    "EVENTS",
    "FIELDS",
    "SHOWN",
    "TEXT_FORMAT",
    "HeldRecords",
    "JsonFormatter",
    "LogFormat",
    "LogLimiter",
    "address",
    "bounded",
    "configure",
    "fields",
    "shown",
]

#: characters of client input (a client id, a filter, a selector) echoed in a log line or a
#: reason string
SHOWN: Final = 100
#: characters of a log text built around client input (an exception's message)
TEXT_SHOWN: Final = 500


def shown(text: str) -> str:
    """``repr`` of client input, cut to :data:`SHOWN` characters: never echo unbounded input.
    O(:data:`SHOWN`)."""
    return repr(text) if len(text) <= SHOWN else repr(text[:SHOWN]) + f"... ({len(text)} characters)"


def bounded(text: str | None) -> str | None:
    """``text`` itself when it is at most :data:`SHOWN` printable characters (a client id as
    clients name themselves), else :func:`shown` (cut, quoted, line breaks escaped); None stays
    None. O(:data:`SHOWN`)."""
    if text is None or (len(text) <= SHOWN and text.isprintable()):
        return text
    return shown(text)


def cut(text: str, limit: int = TEXT_SHOWN) -> str:
    """A log text that may carry client input (an exception's message) cut to ``limit``
    characters, saying so. O(limit)."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


#: the format of ``--log-format text`` (unchanged since the first release)
TEXT_FORMAT: Final = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
#: optional keys a log site may give (``extra=fields(...)``), copied when not None
FIELDS: Final = ("client_id", "address", "reason")
#: the events the broker and its packages name (documentation; a site may add its own)
EVENTS: Final = frozenset(
    {
        "broker.listening",
        "broker.stopped",
        "broker.idle_collection",
        "client.connected",
        "client.refused",
        "client.disconnected",
        "client.malformed",
        "client.protocol_violation",
        "limit.",  # limit.<kind> of Core.log_limit: limit.topic_levels, limit.queue, ...
        "store.failed",
        "store.recovered",
        "store.sweep_failed",
        "hook.failed",
        "reload.done",
        "reload.failed",
        "cluster.link_up",
        "cluster.link_down",
        "cluster.link_refused",
    }
)


class LogLimiter:
    """The one rule of every rate-limited log site: at most one line per ``interval``
    seconds per kind (``Core.log_limit``, the HTTP listener, an uplink bridge, the cluster
    overlay); the counters count every event, the log says one of them.  A site whose line
    is costly to build asks :meth:`due` first and builds it only then.  O(1) per call, one
    float per kind ever seen (a site's kinds are a fixed small set)."""

    __slots__ = ("_last", "interval")

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last: dict[object, float] = {}  # kind -> the time of its last line

    def due(self, kind: object, now: float) -> bool:
        """Whether a line of ``kind`` may be logged at ``now`` (monotonic seconds); a True
        answer starts the kind's next interval (the caller logs the line). O(1)."""
        last = self._last.get(kind)
        if last is None or now - last >= self.interval:
            self._last[kind] = now
            return True
        return False


class LogFormat(Enum):
    """``--log-format``: lines for people (``text``) or one JSON object per line (``json``)."""

    TEXT = "text"
    JSON = "json"


def fields(
    event: str, client_id: str | None = None, address: str | None = None, reason: str | None = None
) -> dict[str, Any]:
    """The ``extra=`` of a log call naming its event and what it knows (the client id
    :func:`bounded`, the reason :func:`cut`). O(:data:`TEXT_SHOWN`)."""
    return {
        "event": event,
        "client_id": bounded(client_id),
        "address": address,
        "reason": None if reason is None else cut(reason),
    }


def address(peer: object) -> str | None:
    """A socket's peer name as ``host:port`` (``[host]:port`` for IPv6); None when unknown. O(1)."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = str(peer[0]), peer[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(peer) if peer else None


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring for the keys). O(message).
    ``datetime`` and ``orjson`` are imported when one is made (``--log-format json``): the
    text log does not load them (issue 42 item 1)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from datetime import UTC, datetime

        import orjson

        self._utc = UTC
        self._timestamp = datetime.fromtimestamp
        self._dumps = orjson.dumps

    def format(self, record: logging.LogRecord) -> str:
        stamp = self._timestamp(record.created, self._utc).isoformat(timespec="milliseconds")
        out: dict[str, Any] = {
            "time": stamp[:-6] + "Z",
            "level": record.levelname,
            "logger": record.name,
            "event": getattr(record, "event", None) or "log",
            "message": record.getMessage(),
        }
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = str(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return self._dumps(out, default=str).decode()


class HeldRecords(logging.Handler):
    """Records logged before the log format is known (a plugin's load warning while the
    command line is parsed), handed to the configured handlers later by :meth:`replay`, so
    that with ``--log-format json`` those lines are JSON too. O(records held)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def replay(self) -> None:
        """Log the held records again (through the root's handlers now, or Python's last
        resort when there are none), once."""
        records, self.records = self.records, []
        for record in records:
            logging.getLogger(record.name).handle(record)


def configure(level: str | int, log_format: LogFormat, stream: IO[str] | None = None) -> logging.Handler:
    """The root logger writes ``log_format`` lines at ``level`` to ``stream`` (stderr); a
    handler installed before (by an earlier call) is replaced, not doubled. With JSON,
    ``warnings`` go through logging too (logger ``py.warnings``)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_siftmq", False):
            root.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._siftmq = True  # type: ignore[attr-defined]
    handler.setFormatter(JsonFormatter() if log_format is LogFormat.JSON else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(level)
    # Python's warnings (a library's DeprecationWarning) become records: JSON lines as well
    logging.captureWarnings(log_format is LogFormat.JSON)
    return handler
