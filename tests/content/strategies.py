"""Reusable Hypothesis strategies for content filters and events (shared by every engine's tests).

Everything is drawn from small pools so that values in events collide with literals in
selectors (equalities, bounds, prefixes hit) and so that type mismatches (a number compared
with a string, a boolean with a number) and missing attributes happen often.

* :func:`selector_texts` -- random selector TEXT covering the whole language (comparisons,
  BETWEEN, [NOT] IN with mixed kinds, [NOT] LIKE in every form incl. ESCAPE, AND/OR/NOT,
  parentheses, literal-on-the-left comparisons); keep ``max_leaves`` small, the DNF grows
  exponentially with nested OR under AND.
* :func:`filters` -- compiled :class:`content.Filter` values of such texts.
* :func:`event_values`, :func:`events` -- typed events over :data:`ATTRS` (missing ones too).
"""

from __future__ import annotations

from hypothesis import strategies as st

from content import Filter, compile
from content._predicate import Scalar

__all__ = [
    "ATTRS",
    "FLOATS",
    "INTS",
    "STRINGS",
    "event_values",
    "events",
    "events_sparse",
    "filters",
    "literals",
    "selector_texts",
]

ATTRS = ("a", "b", "c", "s.t")
INTS = (-1, 0, 1, 2, 3)
FLOATS = (-0.5, 0.0, 0.5, 1.0, 2.5)
STRINGS = ("", "a", "b", "ab", "ba", "abc", "a%", "_b", "it's")


def _lit(v: Scalar) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


def event_values() -> st.SearchStrategy[Scalar]:
    """One typed event value: int, float, str or bool from the shared pools."""
    return st.one_of(
        st.sampled_from(INTS),
        st.sampled_from(FLOATS),
        st.sampled_from(STRINGS),
        st.booleans(),
    )


def events() -> st.SearchStrategy[dict[str, Scalar]]:
    """An event: most of :data:`ATTRS` (each missing with probability ~1/5), typed values."""
    present = st.sampled_from([True, True, True, True, False])
    return st.tuples(*(st.tuples(present, event_values()) for _ in ATTRS)).map(
        lambda cells: {a: v for a, (keep, v) in zip(ATTRS, cells, strict=True) if keep}
    )


def events_sparse() -> st.SearchStrategy[dict[str, Scalar]]:
    """An event with any subset of :data:`ATTRS` (often few or none)."""
    return st.dictionaries(st.sampled_from(ATTRS), event_values(), max_size=len(ATTRS))


def literals() -> st.SearchStrategy[str]:
    """A literal as selector text (numbers, strings with quotes, booleans)."""
    return event_values().map(_lit)


_ident = st.sampled_from(ATTRS)
_ordered_lit = st.one_of(st.sampled_from(INTS), st.sampled_from(FLOATS), st.sampled_from(STRINGS)).map(_lit)
_pattern_chars = st.sampled_from(["a", "b", "%", "_", "'"])


@st.composite
def _comparison(draw: st.DrawFn) -> str:
    attr = draw(_ident)
    op = draw(st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">="]))
    lit = draw(literals()) if op in ("=", "<>", "!=") else draw(_ordered_lit)
    if draw(st.booleans()):
        return f"{attr} {op} {lit}"
    flipped = {"=": "=", "<>": "<>", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}[op]
    return f"{lit} {flipped} {attr}"


@st.composite
def _between(draw: st.DrawFn) -> str:
    attr = draw(_ident)
    pool = draw(st.sampled_from([INTS + FLOATS, STRINGS]))
    lo, hi = draw(st.sampled_from(pool)), draw(st.sampled_from(pool))
    neg = "NOT " if draw(st.booleans()) else ""
    return f"{attr} {neg}BETWEEN {_lit(lo)} AND {_lit(hi)}"


@st.composite
def _in(draw: st.DrawFn) -> str:
    attr = draw(_ident)
    members = draw(st.lists(literals(), min_size=1, max_size=4))
    neg = "NOT " if draw(st.booleans()) else ""
    return f"{attr} {neg}IN ({', '.join(members)})"


@st.composite
def _like(draw: st.DrawFn) -> str:
    attr = draw(_ident)
    neg = "NOT " if draw(st.booleans()) else ""
    form = draw(st.sampled_from(["prefix", "suffix", "contains", "exact", "general", "escape"]))
    core = "".join(draw(st.lists(st.sampled_from(["a", "b", "'"]), max_size=3)))
    if form == "prefix":
        pattern = core + "%"
    elif form == "suffix":
        pattern = "%" + core
    elif form == "contains":
        pattern = "%" + core + "%"
    elif form == "exact":
        pattern = core
    elif form == "general":
        pattern = "".join(draw(st.lists(_pattern_chars, max_size=5)))
    else:
        lit = "".join(draw(st.lists(st.sampled_from(["a", "!%", "!_", "!!"]), max_size=3)))
        shape = draw(st.sampled_from(["{}%", "%{}", "%{}%", "{}"]))
        escaped = shape.format(lit).replace("'", "''")
        return f"{attr} {neg}LIKE '{escaped}' ESCAPE '!'"
    return f"{attr} {neg}LIKE '{pattern.replace(chr(39), chr(39) * 2)}'"


def _atoms() -> st.SearchStrategy[str]:
    return st.one_of(_comparison(), _comparison(), _between(), _in(), _like())


def selector_texts(max_leaves: int = 5) -> st.SearchStrategy[str]:
    """Random selector text over the whole language (always syntactically valid)."""

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, st.sampled_from([" AND ", " OR ", " and ", " or "]), inner).map(
                lambda t: f"({t[0]}{t[1]}{t[2]})"
            ),
            inner.map(lambda s: f"NOT ({s})"),
            inner.map(lambda s: f"NOT {s}" if not s.startswith("NOT") else f"({s})"),
        )

    return st.recursive(_atoms(), extend, max_leaves=max_leaves)


def filters(max_leaves: int = 5) -> st.SearchStrategy[Filter]:
    """Compiled filters of :func:`selector_texts` (DNF size limit never reached)."""
    return selector_texts(max_leaves).map(compile)
