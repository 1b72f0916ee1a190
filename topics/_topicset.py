"""``TopicSet``: one subscriber's subscription list with positive and negative entries.

Seed 002 (IBM patent CN1953426), Fig. 4 (list maintenance) and Fig. 8 (matching).  The list is
ordered oldest first; a topic is matched by the newest entry whose filter matches it, and that
entry decides (positive: deliver, negative: do not).

Fig. 4, SUBSCRIBE f (steps 41-45):
  1. remove every entry, positive or negative, that ``f`` includes (41, 42);
  2. append ``+f`` unless ``f`` is included in some positive entry and overlaps no negative
     entry (43, 45, 44) -- then the list already delivers all of ``f``.
Fig. 4, UNSUBSCRIBE f (steps 46-49):
  1. remove every entry that ``f`` includes (46, 47);
  2. append ``-f`` only when ``f`` overlaps a remaining positive entry (48, 49).
After either, negative entries at the start of the list are dropped (they can never decide).

Meaning (set algebra, checked by the property tests): after any sequence of operations,
``matches(t)`` is true iff the last operation whose filter matches ``t`` was a subscribe.
Each step preserves it: removing entries that ``f`` includes only changes the verdict for
topics in ``f``, which the new entry (or, when it is dropped, a covering positive entry that
no negative entry shadows inside ``f``) decides the right way.

Deviation from the patent: ``includes``/``overlaps`` are exact (see ``topics._match``), not
the patent's example-topic construction; filters use the extended syntax ('#' at any level).

Complexity: subscribe/unsubscribe O(n) include/overlap tests for a list of n entries;
``matches`` O(n) filter matches, newest first, stopping at the first matching entry.
"""

from __future__ import annotations

from topics._match import includes, matches, overlaps
from topics._validate import validate_filter

__all__ = ["TopicSet"]


class TopicSet:
    """One subscriber's list of positive and negative entries (seed 002, Fig. 4 and Fig. 8).

    Filters use the extended syntax ('#' at any level); invalid filters raise
    :class:`topics.InvalidTopic`.
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[tuple[str, bool]] = []

    @property
    def entries(self) -> list[tuple[str, bool]]:
        """A copy of the list: ``(filter, positive)`` pairs, oldest first."""
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        body = ", ".join(("+" if p else "-") + f for f, p in self._entries)
        return f"TopicSet([{body}])"

    def subscribe(self, topic_filter: str) -> None:
        """Fig. 4, left-hand side (steps 41-45)."""
        validate_filter(topic_filter, extended=True)
        f = topic_filter
        kept = [e for e in self._entries if not includes(f, e[0])]  # steps 41, 42
        covered = False
        shadowed = False
        for g, positive in kept:
            if positive:
                covered = covered or includes(g, f)  # step 43
            elif overlaps(g, f):  # step 45
                shadowed = True
                break
        if not covered or shadowed:
            kept.append((f, True))  # step 44
        self._entries = kept
        self._drop_leading_negatives()

    def unsubscribe(self, topic_filter: str) -> None:
        """Fig. 4, right-hand side (steps 46-49)."""
        validate_filter(topic_filter, extended=True)
        f = topic_filter
        kept = [e for e in self._entries if not includes(f, e[0])]  # steps 46, 47
        if any(positive and overlaps(g, f) for g, positive in kept):  # step 48
            kept.append((f, False))  # step 49
        self._entries = kept
        self._drop_leading_negatives()

    def _drop_leading_negatives(self) -> None:
        entries = self._entries
        k = 0
        while k < len(entries) and not entries[k][1]:
            k += 1
        if k:
            del entries[:k]

    def matches(self, topic: str) -> bool:
        """Fig. 8: the newest entry whose filter matches ``topic`` decides."""
        for f, positive in reversed(self._entries):
            if matches(f, topic):
                return positive
        return False

    def _check(self) -> None:
        """Invariants: valid filters, no leading negative entry, no entry includes an older
        one (an older entry included by a newer one would have been removed)."""
        entries = self._entries
        assert not entries or entries[0][1], "leading negative entry"
        for i, (f, _) in enumerate(entries):
            validate_filter(f, extended=True)
            for g, _ in entries[:i]:
                assert not includes(f, g), f"{f!r} includes the older entry {g!r}"
