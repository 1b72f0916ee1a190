"""``RetainedTree``: retained messages by topic name, searchable by topic filter.

A topic tree (one node per level of a retained topic name, literal children in a dict) whose
nodes hold the value retained at that name.  ``match(filter)`` walks the tree along the filter
(MQTT 3.1.1 section 3.3.1.3 / MQTT 5 section 3.8.4: a new subscription receives the retained
messages its filter matches) instead of testing every retained topic: a literal level follows
one child, '+' every child, '#' the whole subtree; '+' and '#' in the first level skip names
starting with '$' (MQTT 5 section 4.7.2).

Complexity: ``set``/``get``/``delete`` O(levels); ``match`` O(nodes on the matching paths),
which is the output size for literal filters and the visited subtree for wildcards (never the
whole tree unless the filter is '#').  Empty nodes are pruned on ``delete``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Generic, TypeVar

from topics._validate import validate_filter

__all__ = ["RetainedTree"]

V = TypeVar("V")


class _RNode(Generic[V]):
    __slots__ = ("children", "has", "topic", "value")

    def __init__(self) -> None:
        self.children: dict[str, _RNode[V]] | None = None
        self.has = False
        self.topic = ""
        self.value: V | None = None


class RetainedTree(Generic[V]):
    """Retained values by topic name (``topic`` arguments must be valid topic names)."""

    def __init__(self) -> None:
        self._root: _RNode[V] = _RNode()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def set(self, topic: str, value: V) -> None:
        """Retain ``value`` at ``topic`` (replacing any previous one)."""
        n = self._root
        intern = sys.intern
        for lv in topic.split("/"):
            ch = n.children
            if ch is None:
                ch = n.children = {}
            c = ch.get(lv)
            if c is None:
                c = ch[intern(lv)] = _RNode()
            n = c
        if not n.has:
            self._count += 1
            n.has = True
            n.topic = topic
        n.value = value

    def _find(self, topic: str) -> _RNode[V] | None:
        n: _RNode[V] | None = self._root
        for lv in topic.split("/"):
            assert n is not None
            ch = n.children
            if ch is None:
                return None
            n = ch.get(lv)
            if n is None:
                return None
        return n

    def get(self, topic: str) -> V | None:
        """The value retained at ``topic``, or None."""
        n = self._find(topic)
        return n.value if n is not None and n.has else None

    def delete(self, topic: str) -> bool:
        """Forget the value at ``topic``; True if there was one."""
        path: list[tuple[_RNode[V], str]] = []
        n = self._root
        for lv in topic.split("/"):
            ch = n.children
            c = None if ch is None else ch.get(lv)
            if c is None:
                return False
            path.append((n, lv))
            n = c
        if not n.has:
            return False
        n.has = False
        n.value = None
        n.topic = ""
        self._count -= 1
        for parent, lv in reversed(path):
            if n.has or n.children is not None:
                break
            ch = parent.children
            assert ch is not None
            del ch[lv]
            if not ch:
                parent.children = None
            n = parent
        return True

    def children(self, prefix: str | None) -> list[tuple[str, bool, bool]]:
        """The levels right below ``prefix`` (None = the top level; ``"a/b"``: the levels of
        ``a/b/...``) as ``(level, retained here, has levels below)``, sorted by level; empty
        when nothing is retained under ``prefix``. O(children) plus the sort (the
        dashboard's topic browser)."""
        n = self._root if prefix is None else self._find(prefix)
        if n is None or n.children is None:
            return []
        return sorted((k, c.has, c.children is not None) for k, c in n.children.items())

    def match(self, topic_filter: str) -> Iterator[tuple[str, V]]:
        """``(topic, value)`` for every retained topic ``topic_filter`` matches.

        The result is collected before it is returned, so the caller may delete while
        iterating.  Raises :class:`topics.InvalidTopic` for an invalid (or extended) filter.
        """
        validate_filter(topic_filter)
        out: list[tuple[str, V]] = []
        levels = topic_filter.split("/")
        last = len(levels)
        stack: list[tuple[_RNode[V], int]] = [(self._root, 0)]
        while stack:
            n, i = stack.pop()
            if i == last:
                if n.has:
                    out.append((n.topic, n.value))  # type: ignore[arg-type]
                continue
            lv = levels[i]
            ch = n.children
            if lv == "#":
                if i > 0 and n.has:  # '#' matches zero levels: "a/#" matches "a"
                    out.append((n.topic, n.value))  # type: ignore[arg-type]
                if ch is None:
                    continue
                sub = [c for k, c in ch.items() if not (i == 0 and k[:1] == "$")]
                while sub:
                    c = sub.pop()
                    if c.has:
                        out.append((c.topic, c.value))  # type: ignore[arg-type]
                    if c.children is not None:
                        sub.extend(c.children.values())
            elif ch is None:
                continue
            elif lv == "+":
                for k, c in ch.items():
                    if not (i == 0 and k[:1] == "$"):
                        stack.append((c, i + 1))
            else:
                nc = ch.get(lv)
                if nc is not None:
                    stack.append((nc, i + 1))
        return iter(out)

    def _check(self) -> None:
        """Invariants: counts, stored topic names equal the node paths, no empty nodes."""
        count = 0
        stack: list[tuple[_RNode[V], str | None]] = [(self._root, None)]
        while stack:
            n, path = stack.pop()
            if path is not None:
                assert n.has or n.children is not None, f"empty node {path!r} not pruned"
            if n.has:
                count += 1
                assert n.topic == path
            else:
                assert n.value is None and n.topic == ""
            if n.children is not None:
                assert n.children
                for lv, c in n.children.items():
                    stack.append((c, lv if path is None else f"{path}/{lv}"))
        assert count == self._count
