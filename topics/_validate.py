"""Validation of topic names and topic filters (MQTT 3.1.1 section 4.7, MQTT 5 section 4.7).

``validate_topic`` checks a PUBLISH topic name, ``validate_filter`` a SUBSCRIBE topic filter.
``extended=True`` accepts the syntax of seed 002 (IBM patent CN1953426, "背景技术": "#" may
stand at any level, so "#/雇员" matches "开发/雇员"), where the MQTT rule "'#' is the last
level" is dropped.  Every error is an :class:`InvalidTopic` whose message names the problem
and its position (a character offset into the string).

Both checks are O(length of the string); names that are ASCII and free of wildcards and NUL
(the common case on the publish path) take three C-level scans.
"""

from __future__ import annotations

__all__ = ["MAX_TOPIC_BYTES", "InvalidTopic", "validate_filter", "validate_topic"]

MAX_TOPIC_BYTES = 65_535


class InvalidTopic(ValueError):
    """A topic name or topic filter breaks the rules; the message says what and where.

    ``position`` is the character offset of the problem (``None`` when it concerns the whole
    string, e.g. its length).
    """

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


def _show(s: str) -> str:
    return repr(s) if len(s) <= 60 else repr(s[:57]) + "..."


def _common(s: object, what: str) -> str:
    if not isinstance(s, str):
        raise InvalidTopic(f"{what} must be str, not {type(s).__name__}")
    if not s:
        raise InvalidTopic(f"{what} is empty (at least one character is required)", 0)
    if "\x00" in s:
        pos = s.index("\x00")
        raise InvalidTopic(f"{what} {_show(s)} contains U+0000 at position {pos}", pos)
    if s.isascii():
        if len(s) > MAX_TOPIC_BYTES:
            raise InvalidTopic(f"{what} is {len(s)} bytes long (at most {MAX_TOPIC_BYTES})")
        return s
    try:
        n = len(s.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidTopic(
            f"{what} {_show(s)} is not valid UTF-8 (lone surrogate at position {exc.start})", exc.start
        ) from None
    if n > MAX_TOPIC_BYTES:
        raise InvalidTopic(f"{what} is {n} bytes long in UTF-8 (at most {MAX_TOPIC_BYTES})")
    return s


def validate_topic(name: str) -> None:
    """Check a PUBLISH topic name: 1..65,535 UTF-8 bytes, no U+0000, no '+' or '#'.

    Raises :class:`InvalidTopic`.
    """
    _common(name, "topic name")
    if "+" in name or "#" in name:
        pos = min(i for i in (name.find("+"), name.find("#")) if i >= 0)
        raise InvalidTopic(
            f"topic name {_show(name)} contains the wildcard {name[pos]!r} at position {pos}"
            " (wildcards are only allowed in topic filters)",
            pos,
        )


def validate_filter(topic_filter: str, extended: bool = False) -> None:
    """Check a topic filter: the rules of :func:`validate_topic` except that '+' and '#' are
    allowed when each occupies a whole level, and '#' must be the last level unless
    ``extended`` (seed 002 syntax, '#' at any level).

    Raises :class:`InvalidTopic`.
    """
    f = _common(topic_filter, "topic filter")
    if "+" not in f and "#" not in f:
        return
    pos = 0
    levels = f.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if level in ("+", "#"):
            if level == "#" and i != last and not extended:
                raise InvalidTopic(
                    f"topic filter {_show(f)}: '#' must be the last level (position {pos})", pos
                )
        else:
            for ch in ("+", "#"):
                k = level.find(ch)
                if k >= 0:
                    raise InvalidTopic(
                        f"topic filter {_show(f)}: {ch!r} must occupy a whole level (position {pos + k})",
                        pos + k,
                    )
        pos += len(level) + 1
