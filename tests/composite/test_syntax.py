"""The composite language: parsing, quoting, selectors, error positions, limits, canonical form."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import content
from composite import (
    MAX_ATOMS,
    MAX_DEPTH,
    MAX_EXPRESSION_LENGTH,
    Atom,
    CompositeSyntaxError,
    Expr,
    Op,
    canonical,
    parse,
)
from tests.content.strategies import selector_texts


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("(A|B)&C", "(A | B) & C"),
        ("C & (B | A)", "(A | B) & C"),
        ("a&b|c", "(a & b) | c"),  # '&' binds tighter than '|'
        ("a|b&c", "a | (b & c)"),
        ("a & a", "a"),
        ("(a|b) | (c|(d))", "a | b | c | d"),
        ("((a))", "a"),
        ("(a & b) & (c & (d | e))", "a & b & c & (d | e)"),
        ("(a|b)&(b|a)", "a | b"),
        ("sensors/+/temp & sensors/#", "sensors/# & sensors/+/temp"),
        ("'x&y/#' | \"a b/(x)\"", '"a b/(x)" | "x&y/#"'),
        ('"quoted""name"', '"quoted""name"'),
        ("'it''s'", '"it\'s"'),
        ("'plain'", "plain"),
        ("a[temp>3]", "a[temp > 3]"),
        ("a [ 3 < temp ]", "a[temp > 3]"),
        ("a[x=1 or y=2]", "a[(x = 1) OR (y = 2)]"),
        ("a[name = 'a]b'] & b", "a[name = 'a]b'] & b"),
        ('a["we ird" = 1]', 'a["we ird" = 1]'),
        ("a[x > 1] & a[1 < x]", "a[x > 1]"),
        ("a[x > 1] | a", "a | a[x > 1]"),
        ("é/ü & $SYS/x", "$SYS/x & é/ü"),
    ],
)
def test_canonical(text: str, want: str) -> None:
    assert canonical(text) == want
    assert canonical(want) == want
    assert parse(text) == parse(want)


def test_atoms_and_structure() -> None:
    x = parse("(A|B)&(C|D)")
    assert isinstance(x, Op) and x.op == "&"
    assert [str(y) for y in x.operands] == ["A | B", "C | D"]
    assert [a.text for a in x.atoms()] == ["A", "B", "C", "D"]
    a = parse('"s p"[t >= 2]')
    assert isinstance(a, Atom)
    assert a.topic == "s p" and a.selector == "t >= 2"
    assert a.filter is not None and a.filter.matches({"t": 3}) and not a.filter.matches({"t": 1})
    assert parse("a").filter is None


@pytest.mark.parametrize(
    ("text", "fragment", "position"),
    [
        ("", "empty expression", 0),
        ("   ", "empty expression", 3),
        ("a &", "expected an atom but found end of input", 3),
        ("a & | b", "expected an atom but found '|'", 4),
        ("(a", "expected ')' to close '(' at 0", 2),
        ("a)", "unbalanced ')'", 1),
        ("()", "expected an atom inside '('", 1),
        ("a b", "expected '&', '|' or end of input but found 'b'", 2),
        ("a & [x>1]", "expected a topic filter before '['", 4),
        ("a[", "never closed", 1),
        ("a[]", "empty selector", 2),
        ("a[ x > ]", "bad selector: expected a value after '>'", 7),
        ("ab[x = 'open]", "unterminated string in selector", 7),
        ("xy & a[x ~ 1]", "bad selector: unexpected character '~'", 9),
        ("a/#/b", "'#' must be the last level", 2),
        ("ok | a/b+", "'+' must occupy a whole level", 8),
        ('ok | "a/#/b"', "'#' must be the last level", 8),
        ('ok | "q""/#/b"', "'#' must be the last level", 10),
        ("'unterminated", "unterminated quoted topic filter", 0),
        ("a & $share/g/x", "'$share/'", 4),
        ("$filter/x>1/a", "'$filter/'", 0),
        ("b|$composite/n", "'$composite/'", 2),
        ('""', "empty", 0),
        ("a]", "found ']'", 1),
    ],
)
def test_errors_with_positions(text: str, fragment: str, position: int) -> None:
    with pytest.raises(CompositeSyntaxError) as info:
        parse(text)
    assert fragment in str(info.value)
    assert info.value.position == position
    assert isinstance(info.value, ValueError)


def test_error_pickles() -> None:
    import pickle

    with pytest.raises(CompositeSyntaxError) as info:
        parse("a &")
    again = pickle.loads(pickle.dumps(info.value))
    assert again.position == 3 and str(again) == str(info.value)


def test_limits() -> None:
    ok = " | ".join(f"t{i}" for i in range(MAX_ATOMS))
    assert len(parse(ok).atoms()) == MAX_ATOMS
    with pytest.raises(CompositeSyntaxError, match=f"more than {MAX_ATOMS} atoms") as info:
        parse(ok + " | extra")
    assert info.value.position == len(ok) + 3
    deep = "(" * MAX_DEPTH + "a" + ")" * MAX_DEPTH
    assert canonical(deep) == "a"
    with pytest.raises(CompositeSyntaxError, match="nested more than") as info:
        parse("(" * (MAX_DEPTH + 1) + "a" + ")" * (MAX_DEPTH + 1))
    assert info.value.position == MAX_DEPTH
    with pytest.raises(CompositeSyntaxError, match="longer than") as info:
        parse("a" * (MAX_EXPRESSION_LENGTH + 1))
    assert info.value.position == 0
    # alternating operators nest in the canonical text even without parentheses in the source
    alt = "x0"
    for i in range(1, MAX_DEPTH + 2):
        alt = f"({alt} {'&|'[i % 2]} y{i})"
    with pytest.raises(CompositeSyntaxError, match="nested more than"):
        parse(alt)


def test_type_error() -> None:
    with pytest.raises(TypeError):
        parse(b"a")  # type: ignore[arg-type]


# ---------------------------------------------------------------- round trip (Hypothesis)

_LEVEL_CHARS = st.sampled_from(["a", "b", "é", " ", "&", "|", "(", ")", "[", "]", "'", '"', "$", "x"])


@st.composite
def topic_filters(draw: st.DrawFn) -> str:
    n = draw(st.integers(1, 3))
    levels = []
    for i in range(n):
        kind = draw(st.sampled_from(["text", "text", "+", "#"]))
        if kind == "#" and i < n - 1:
            kind = "+"
        levels.append(kind if kind != "text" else "".join(draw(st.lists(_LEVEL_CHARS, max_size=3))))
    topic = "/".join(levels)
    if not topic or topic.startswith("$"):
        topic = "t" + topic
    return topic


def _write_topic(topic: str, rnd: random.Random) -> str:
    bare_ok = topic and not any(c.isspace() or c in "&|()[]\"'" for c in topic)
    style = rnd.choice(["bare", "'", '"']) if bare_ok else rnd.choice(["'", '"'])
    if style == "bare":
        return topic
    return style + topic.replace(style, style * 2) + style


@st.composite
def trees(draw: st.DrawFn, depth: int = 3) -> tuple[object, ...]:
    """A random tree: ('atom', topic, selector|None) or (op, [children])."""
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        topic = draw(st.one_of(st.sampled_from(["a", "b", "c/+", "d/#"]), topic_filters()))
        selector = draw(st.one_of(st.none(), selector_texts(2)))
        return ("atom", topic, selector)
    op = draw(st.sampled_from(["&", "|"]))
    return (op, tuple(draw(trees(depth - 1)) for _ in range(draw(st.integers(1, 3)))))


def write(tree: tuple[object, ...], rnd: random.Random) -> str:
    """Source text for ``tree`` in a random but faithful style (spacing, quoting, parens)."""
    sp = lambda: rnd.choice(["", " ", "  ", "\t"])  # noqa: E731
    if tree[0] == "atom":
        _, topic, selector = tree
        assert isinstance(topic, str)
        out = _write_topic(topic, rnd)
        if selector is not None:
            out += sp() + "[" + sp() + str(selector) + sp() + "]"
        return out
    op, kids = tree
    assert isinstance(kids, tuple)
    inner = (sp() + str(op) + sp()).join(write(k, rnd) for k in kids)
    return "(" + sp() + inner + sp() + ")"


def holds(tree: tuple[object, ...], present: frozenset[str]) -> bool:
    if tree[0] == "atom":
        _, topic, selector = tree
        return Atom(str(topic), None if selector is None else str(selector)).text in present
    op, kids = tree
    assert isinstance(kids, tuple)
    vals = [holds(k, present) for k in kids]
    return all(vals) if op == "&" else any(vals)


def expr_holds(x: Expr, present: frozenset[str]) -> bool:
    if isinstance(x, Atom):
        return x.text in present
    vals = [expr_holds(y, present) for y in x.operands]
    return all(vals) if x.op == "&" else any(vals)


_A = ("atom", "a", None)
_AS = ("atom", "a", "-1 = a")
_LEFT = ("&", (("&", (_A, _AS)), ("&", (_A, _AS, _AS)), ("&", (_AS, _AS))))
_RIGHT = ("&", (("&", (_A, _AS)), ("&", (_A, _A, _AS)), _AS))
_WIDE = ("&", (_LEFT, _RIGHT))


@given(tree=trees(), seed=st.integers(0, 2**32 - 1))
@example(tree=_WIDE, seed=75)  # duplicated operands once went over MAX_ATOMS
def test_round_trip(tree: tuple[object, ...], seed: int) -> None:
    rnd = random.Random(seed)
    text = write(tree, rnd)
    x = parse(text)
    assert parse(x.text) == x
    assert canonical(x.text) == x.text
    # any other writing of the same tree, and a reordering of it, has the same canonical form
    assert canonical(write(tree, rnd)) == x.text
    assert canonical(write(_shuffled(tree, rnd), rnd)) == x.text
    # the canonical form means the same: equal truth value for every set of present atoms
    atoms = [a.text for a in x.atoms()]
    for bits in itertools.islice(itertools.product([False, True], repeat=len(atoms)), 64):
        present = frozenset(a for a, b in zip(atoms, bits, strict=True) if b)
        assert expr_holds(x, present) == holds(tree, present)


def _shuffled(tree: tuple[object, ...], rnd: random.Random, dups: bool = True) -> tuple[object, ...]:
    """``tree`` with its operands reordered and, with ``dups``, some duplicated; duplicates
    are left out when they would write more than MAX_ATOMS atoms (a fresh-clone run found a
    27-atom tree whose duplicated operands went over the limit)."""
    if tree[0] == "atom":
        return tree
    op, kids = tree
    assert isinstance(kids, tuple)
    new = [_shuffled(k, rnd, dups) for k in kids]
    rnd.shuffle(new)
    if dups and rnd.random() < 0.3:
        new.append(new[0])  # a duplicate operand
    out = (op, tuple(new))
    if dups and _count_atoms(out) > MAX_ATOMS:
        return _shuffled(tree, rnd, dups=False)
    return out


def _count_atoms(tree: tuple[object, ...]) -> int:
    if tree[0] == "atom":
        return 1
    kids = tree[1]
    assert isinstance(kids, tuple)
    return sum(_count_atoms(k) for k in kids)


@given(selector=selector_texts(3))
def test_selector_normal_form(selector: str) -> None:
    """Atoms with equivalent selectors are one atom; the selector text is the normal form."""
    x = parse(f"t[{selector}]")
    assert isinstance(x, Atom)
    if x.filter is not None:
        assert x.filter.clauses == content.compile(selector).clauses
        assert parse(f"t [ {x.selector} ]") == x
