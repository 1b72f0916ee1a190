"""Whole messages in the landing zone (issue 29, ``Bridge(messages=[topic filters])``): the
row kept per message and the matcher of the topics to keep (moved out of bridge/_writer.py).

:class:`_TopicMatcher` answers with one regular expression per group of filters and caches the
answer per topic (bounded): O(1) per publication once a topic was seen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["_MessageRow", "_TopicMatcher"]


@dataclass(frozen=True, slots=True)
class _MessageRow:
    """One whole message of a topic the bridge was asked to land (``Bridge(messages=...)``)."""

    time: float
    message_id: int
    publisher_id: str | None
    topic: str
    payload: bytes
    qos: int
    retained: bool


def _filter_pattern(topic_filter: str) -> str:
    """A regular expression for an MQTT topic filter (``+`` one level, ``#`` the rest)."""
    if not topic_filter or "\x00" in topic_filter:
        raise ValueError(f"invalid topic filter {topic_filter!r}")
    levels = topic_filter.split("/")
    parts: list[str] = []
    for i, level in enumerate(levels):
        if level == "#" and i == len(levels) - 1:
            return "/".join(parts) + ("(/.*)?" if parts else ".*")
        if level == "+":
            parts.append("[^/]*")
        elif "+" in level or "#" in level:
            raise ValueError(f"invalid topic filter {topic_filter!r}: a wildcard must fill a level")
        else:
            parts.append(re.escape(level))
    return "/".join(parts)


class _TopicMatcher:
    """Does a topic match one of the filters (MQTT rules: a filter starting with a wildcard does
    not match ``$`` topics)?  Answers are cached per topic (the cache is bounded)."""

    def __init__(self, filters: tuple[str, ...]) -> None:
        self.filters = filters
        plain = [_filter_pattern(f) for f in filters if f[:1] not in "+#"]
        wild = [_filter_pattern(f) for f in filters if f[:1] in "+#"]
        self._plain = re.compile("|".join(f"(?:{p})" for p in plain) + r"\Z") if plain else None
        self._wild = re.compile("|".join(f"(?:{p})" for p in wild) + r"\Z") if wild else None
        self._cache: dict[str, bool] = {}

    def __call__(self, topic: str) -> bool:
        hit = self._cache.get(topic)
        if hit is None:
            hit = bool(self._plain is not None and self._plain.match(topic)) or bool(
                self._wild is not None and not topic.startswith("$") and self._wild.match(topic)
            )
            if len(self._cache) >= 10_000:
                self._cache.clear()
            self._cache[topic] = hit
        return hit
