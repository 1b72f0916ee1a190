"""Topic names and filters, the topic tree, and negative entries (seed 002, the IBM patent).

* ``validate_topic`` / ``validate_filter`` / ``InvalidTopic``: MQTT rules, plus the patent's
  extended syntax ('#' at any level) on request (``topics._validate``).
* ``matches`` / ``includes`` / ``overlaps``: exact for the extended syntax, with the '$' rule
  (``topics._match``; the patent's topicIncludes / topicOverlaps, Fig. 2 and 3).
* ``TopicSet``: one subscriber's list of positive and negative entries, seed 002 Fig. 4 and 8
  (``topics._topicset``).
* ``SubscriptionIndex``: every client's MQTT subscriptions (opaque options), negative entries
  (partial unsubscribe) and shared subscriptions in one topic tree (``topics._index``).
* ``RetainedTree``: retained messages by topic name, searched by filter (``topics._retained``).

This package imports nothing from ``broker`` or ``bridge``.  Design notes: ``docs/topics.md``.

Seam (docs/architecture.md, "Seams"): this module is the package's public face, for users,
for ``composite`` and for the broker; nobody outside ``topics`` imports its
``_``-modules (``tests/test_layers.py``). Stable: the names in ``__all__`` (the contract's
``validate_*``, ``matches``, ``includes``, ``overlaps``, ``TopicSet``; the index and retained
tree the broker uses, within a release).
"""

from __future__ import annotations

from topics._index import (
    Entry,
    MatchResult,
    SubscribeOutcome,
    Subscription,
    SubscriptionIndex,
    UnsubscribeOutcome,
)
from topics._match import includes, matches, overlaps
from topics._retained import RetainedTree
from topics._topicset import TopicSet
from topics._validate import MAX_TOPIC_BYTES, InvalidTopic, validate_filter, validate_topic

__all__ = [
    "MAX_TOPIC_BYTES",
    "Entry",
    "InvalidTopic",
    "MatchResult",
    "RetainedTree",
    "SubscribeOutcome",
    "Subscription",
    "SubscriptionIndex",
    "TopicSet",
    "UnsubscribeOutcome",
    "includes",
    "matches",
    "overlaps",
    "validate_filter",
    "validate_topic",
]
