"""``matches``, ``includes`` and ``overlaps`` for MQTT filters and the extended syntax of seed 002.

A filter is a sequence of levels separated by '/': a literal level matches itself, '+' matches
exactly one level, '#' matches zero or more levels.  In MQTT '#' is the last level; in the
patent's syntax (seed 002, "背景技术", "#/雇员") it may stand anywhere.  The '$' rule (MQTT 5
section 4.7.2): a filter whose first level is a wildcard never matches a topic whose name starts
with '$'.  The meaning of a filter ``f`` is the set ``M(f)`` of topic names it matches (topic
names have at least one level).

* ``matches(f, t)``: ``t`` is in ``M(f)``.
* ``includes(x, y)`` (the patent's topicIncludes, Fig. 2): ``M(y)`` is a subset of ``M(x)``;
  ``y`` may be a plain topic name.
* ``overlaps(x, y)`` (the patent's topicOverlaps, Fig. 3): ``M(x)`` and ``M(y)`` intersect.

Where we deviate from the patent: the patent decides inclusion "level by level" and overlap by
building one example topic from the two patterns.  Both are wrong once '#' may stand in the
middle ("#/a/#" includes "a/#/a", which no level-by-level walk sees), so both are decided
exactly here.  Filters are regular languages over the alphabet of level strings, and every
level string that is not a literal of ``x`` or ``y`` behaves identically in both (at the first
level it matters only whether it starts with '$').  The alphabet therefore reduces to the
literals of both filters plus two fresh symbols (one starting with '$', one not), and inclusion
and overlap are decided by exploring the product of the two determinised level automata
(subset construction, breadth first, memoised).  That is exact; it is linear for MQTT filters
and in the worst case exponential in the number of levels after a middle '#' (containment of
such patterns is coNP-hard), which only extended-syntax filters can reach.

Filters with '#' only as the last level (all MQTT filters) take a direct level-by-level path
(O(levels)); the automaton is used only when a '#' stands elsewhere.  Arguments are not
validated (call :func:`topics.validate_filter` first); every function is pure.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

__all__ = ["includes", "matches", "overlaps"]

_WILD = ("+", "#")
# Symbols standing for "any level string that is not a literal of either filter".  U+0000 never
# occurs in a valid filter, so these cannot collide with a literal.
_FRESH = "\x00"
_FRESH_DOLLAR = "$\x00"


def _simple(f: str) -> bool:
    """True when '#' occurs at most once and only as the last level (MQTT syntax)."""
    k = f.find("#")
    return k < 0 or k == len(f) - 1


def matches(topic_filter: str, topic: str) -> bool:
    """True when ``topic`` is matched by ``topic_filter`` (extended syntax allowed).

    O(levels) for MQTT filters; O(levels x filter levels) with a middle '#'.
    """
    if topic_filter == topic:
        # identical strings: a plain topic matches itself; a filter with wildcards used as a
        # topic name is matched by itself level-for-level ('+' and '#' match themselves).
        return True
    fl = topic_filter.split("/")
    if topic[:1] == "$" and fl[0] in _WILD:
        return False
    tl = topic.split("/")
    if _simple(topic_filter):
        n = len(fl)
        if fl[-1] == "#":
            n -= 1
            if len(tl) < n:
                return False
        elif len(tl) != n:
            return False
        for i in range(n):
            a = fl[i]
            if a != "+" and a != tl[i]:
                return False
        return True
    return _nfa_match(fl, tl)


def _closure(pat: Sequence[str], states: set[int]) -> frozenset[int]:
    n = len(pat)
    out = set(states)
    stack = list(states)
    while stack:
        s = stack.pop()
        if s < n and pat[s] == "#" and s + 1 not in out:
            out.add(s + 1)
            stack.append(s + 1)
    return frozenset(out)


def _step(pat: Sequence[str], states: frozenset[int], sym: str) -> frozenset[int]:
    n = len(pat)
    nxt: set[int] = set()
    for s in states:
        if s < n:
            p = pat[s]
            if p == "#":
                nxt.add(s)
            elif p in ("+", sym):
                nxt.add(s + 1)
    return _closure(pat, nxt) if nxt else frozenset()


def _first(pat: Sequence[str], sym: str) -> frozenset[int]:
    """States after the first level ``sym`` (applies the '$' rule)."""
    if sym[:1] == "$" and pat[0] in _WILD:
        return frozenset()
    return _step(pat, _closure(pat, {0}), sym)


def _nfa_match(fl: Sequence[str], tl: Sequence[str]) -> bool:
    states = _first(fl, tl[0])
    for sym in tl[1:]:
        if not states:
            return False
        states = _step(fl, states, sym)
    return len(fl) in states


def _alphabet(x: Sequence[str], y: Sequence[str]) -> list[str]:
    lits = {a for a in x if a not in _WILD}
    lits.update(a for a in y if a not in _WILD)
    return sorted(lits)


def _explore(x: Sequence[str], y: Sequence[str], want_overlap: bool) -> bool:
    """Breadth-first search of the product automaton.

    ``want_overlap``: is there a topic in M(x) and M(y)?  Otherwise: is there a topic in M(y)
    but not in M(x) (a counterexample to inclusion)?
    """
    alpha = _alphabet(x, y)
    nx, ny = len(x), len(y)
    seen: set[tuple[frozenset[int], frozenset[int]]] = set()
    queue: deque[tuple[frozenset[int], frozenset[int]]] = deque()
    for sym in [*alpha, _FRESH, _FRESH_DOLLAR]:
        pair = (_first(x, sym), _first(y, sym))
        if pair not in seen:
            seen.add(pair)
            queue.append(pair)
    alpha.append(_FRESH)
    while queue:
        xs, ys = queue.popleft()
        if not ys or (want_overlap and not xs):
            continue
        if ny in ys and (nx in xs) == want_overlap:
            return True
        for sym in alpha:
            pair = (_step(x, xs, sym), _step(y, ys, sym))
            if pair not in seen:
                seen.add(pair)
                queue.append(pair)
    return False


def includes(x: str, y: str) -> bool:
    """The patent's topicIncludes(x, y): every topic matched by ``y`` is matched by ``x``.

    ``y`` may be a plain topic name (then this is ``matches(x, y)``).  Exact; O(levels) for
    MQTT filters.
    """
    if x == y:
        return True
    xl = x.split("/")
    yl = y.split("/")
    if xl[0] in _WILD and yl[0][:1] == "$":
        return False  # y yields '$' topics (or, '$' literal first, only those); x never does
    if not (_simple(x) and _simple(y)):
        return not _explore(xl, yl, want_overlap=False)
    if yl[0] == "#":
        # y is "#": every non-'$' topic of one or more levels.  Only "#" and "+/#" cover it.
        return xl == ["+", "#"]
    nx = len(xl)
    for i, b in enumerate(yl):
        if i == nx:
            return False  # y has more levels than x can take
        a = xl[i]
        if a == "#":
            return True
        if b == "#":
            return False  # y matches the prefix alone (zero levels); x needs a level here
        if a not in ("+", b):
            return False  # literal vs '+' or a different literal
    # y exhausted: x must accept the end here
    return len(yl) == nx or (len(yl) == nx - 1 and xl[-1] == "#")


def overlaps(x: str, y: str) -> bool:
    """The patent's topicOverlaps(x, y): some topic is matched by both ``x`` and ``y``.

    Exact; O(levels) for MQTT filters.
    """
    if x == y:
        return True
    xl = x.split("/")
    yl = y.split("/")
    xw = xl[0] in _WILD
    yw = yl[0] in _WILD
    if (xw and not yw and yl[0][:1] == "$") or (yw and not xw and xl[0][:1] == "$"):
        return False
    if not (_simple(x) and _simple(y)):
        return _explore(xl, yl, want_overlap=True)
    nx, ny = len(xl), len(yl)
    for i in range(min(nx, ny)):
        a = xl[i]
        b = yl[i]
        if a == "#" or b == "#":
            return True
        if a not in (b, "+") and b != "+":
            return False
    if nx == ny:
        return True
    # one is a strict prefix of the other: overlap iff the longer one's next level is '#'
    # ('#' matches zero levels) and it is its last
    longer = xl if nx > ny else yl
    k = min(nx, ny)
    return longer[k] == "#"
